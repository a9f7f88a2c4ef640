"""Text classification with ``transformers.Trainer`` the way a notebook writes it: a
BERT classifier built from a config, a Dataset that tokenizes its sentences when an item
is asked for (a word-hashing tokenizer in Python: per-item CPU work in the loader), and
TrainingArguments set from the command line (``--fp16``, ``--bf16``, ``--accum``,
``--workers``). ``--predict`` runs ``Trainer.predict`` over the data set again and again
instead of training (inference through the Trainer).

A TrainerCallback stops training after ``--seconds`` and counts the optimizer steps (the
script's own truth, --out).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from _truth import Truth  # noqa: E402
from transformers import (  # noqa: E402
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

p = argparse.ArgumentParser()
p.add_argument("--hidden", type=int, default=768)
p.add_argument("--layers", type=int, default=12)
p.add_argument("--seq", type=int, default=128)
p.add_argument("--batch", type=int, default=32, help="per_device_train_batch_size")
p.add_argument("--accum", type=int, default=1, help="gradient_accumulation_steps")
p.add_argument("--workers", type=int, default=0, help="dataloader_num_workers")
p.add_argument("--fp16", action="store_true")
p.add_argument("--bf16", action="store_true")
p.add_argument("--clean-passes", type=int, default=1,
               help="how many times each sentence is normalized before hashing (CPU per item)")
p.add_argument("--samples", type=int, default=200_000)
p.add_argument("--predict", action="store_true", help="Trainer.predict, no training")
p.add_argument("--save-every", type=int, default=0,
               help="save_strategy='steps' with this save_steps (0: save_strategy='no')")
p.add_argument("--grad-ckpt", action="store_true",
               help="TrainingArguments(gradient_checkpointing=True)")
p.add_argument("--lora", type=int, default=0,
               help="LoRA of this rank on the attention's query and value (peft), the rest "
                    "frozen")
p.add_argument("--stop-each-rank", action="store_true",
               help="with --predict under torchrun: each rank stops on its own clock, not "
                    "agreeing; a rank that starts one more round than the others waits in "
                    "its gather for ever (how fw_hf_predict_ddp_hang was made)")
p.add_argument("--seconds", type=float, default=45.0)
p.add_argument("--out")
a = p.parse_args()

truth = Truth(a.out)
WORDS = [f"w{i}" for i in range(5000)] + ["the", "a", "of", "and", "to", "in", "is", "was"]
VOCAB = 30522


class Sentences(torch.utils.data.Dataset):
    """Synthetic sentences, made from their index and tokenized on demand."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        rng = random.Random(i)
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(a.seq // 2, a.seq * 2)))
        for _ in range(a.clean_passes):  # lower-case, strip punctuation, squeeze spaces
            text = " ".join("".join(c for c in w.lower() if c.isalnum()) for w in text.split())
        ids = [101] + [1000 + zlib.crc32(w.encode()) % (VOCAB - 1000) for w in text.split()]
        ids = ids[: a.seq - 1] + [102]
        mask = [1] * len(ids) + [0] * (a.seq - len(ids))
        ids = ids + [0] * (a.seq - len(ids))
        return {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask),
                "labels": torch.tensor(i % 4)}


class Stop(TrainerCallback):
    def on_train_begin(self, args, state, control, **kw):  # noqa: ANN001, ANN003
        self.t0 = time.monotonic()

    def on_step_end(self, args, state, control, **kw):  # noqa: ANN001, ANN003
        truth.data["steps"] = state.global_step
        if time.monotonic() - self.t0 > a.seconds:
            control.should_training_stop = True

    def on_save(self, args, state, control, **kw):  # noqa: ANN001, ANN003
        truth.data["saves"] = truth.data.get("saves", 0) + 1


model = BertForSequenceClassification(BertConfig(
    hidden_size=a.hidden, num_hidden_layers=a.layers, num_attention_heads=max(1, a.hidden // 64),
    intermediate_size=4 * a.hidden, max_position_embeddings=max(512, a.seq), num_labels=4))
if a.lora:
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(model, LoraConfig(task_type="SEQ_CLS", r=a.lora, lora_alpha=2 * a.lora,
                                             target_modules=["query", "value"]))
args = TrainingArguments(
    output_dir=tempfile.mkdtemp(prefix="ckpt-", dir="."), per_device_train_batch_size=a.batch,
    per_device_eval_batch_size=a.batch, gradient_accumulation_steps=a.accum,
    dataloader_num_workers=a.workers, fp16=a.fp16, bf16=a.bf16, max_steps=10**7,
    gradient_checkpointing=a.grad_ckpt,
    learning_rate=3e-5, logging_steps=100, report_to=[], disable_tqdm=True,
    **({"save_strategy": "steps", "save_steps": a.save_every, "save_total_limit": 2}
       if a.save_every else {"save_strategy": "no"}))
data = Sentences(a.samples)
trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[Stop()])
if a.predict:
    t0 = time.monotonic()
    rounds = 0
    small = torch.utils.data.Subset(data, range(4096))
    def go_on() -> bool:
        """Whether to predict another round: on every rank alike, unless told otherwise."""
        more = time.monotonic() - t0 < a.seconds
        dist = torch.distributed
        if a.stop_each_rank or not (dist.is_available() and dist.is_initialized()):
            return more
        flag = torch.tensor([int(more)], device=trainer.args.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())

    while go_on():
        trainer.predict(small)
        rounds += 1
    truth.write(predict_rounds=rounds, batch=a.batch)
else:
    trainer.train()
    truth.write(micro_batches=a.accum, batch=a.batch)
print("done", file=sys.stderr)

"""A small GPT-2 trained by the Hugging Face Trainer as run_clm-style scripts do, on random
tokens, on the CPU or a GPU.

What users write and this copies:

- ``--dynamic``: samples of random length (``--min-len`` to ``--seq``), padded to the
  longest of each batch by a collator (DataCollatorWithPadding's way): the steps' time and
  the allocator's reservations vary with each batch's longest sample.
- ``--preprocess-seconds``: the model is put on the GPU first, then the dataset is
  "tokenized" on the CPU for this long (a ``datasets.map`` in one process) before
  ``trainer.train()``: a GPU held and idle while the host works.
- ``--metrics``: ``compute_metrics`` without ``preprocess_logits_for_metrics``, so the
  Trainer keeps every evaluation batch's logits on the GPU until the evaluation ends.

A TrainerCallback counts the steps and times the evaluations (the script's truth, --out).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=24)
p.add_argument("--batch", type=int, default=8)
p.add_argument("--accum", type=int, default=1)
p.add_argument("--eval-batch", type=int, default=8)
p.add_argument("--eval-every", type=int, default=0, help="steps (0: never)")
p.add_argument("--eval-samples", type=int, default=64)
p.add_argument("--hidden", type=int, default=64)
p.add_argument("--layers", type=int, default=2)
p.add_argument("--heads", type=int, default=2)
p.add_argument("--vocab", type=int, default=1000)
p.add_argument("--seq", type=int, default=64)
p.add_argument("--min-len", type=int, default=None, help="with --dynamic (default: seq // 8)")
p.add_argument("--dynamic", action="store_true")
p.add_argument("--preprocess-seconds", type=float, default=0.0)
p.add_argument("--metrics", action="store_true")
p.add_argument("--bf16", action="store_true")
p.add_argument("--workers", type=int, default=0)
p.add_argument("--seconds", type=float, default=None,
               help="stop training after this long (the Trainer stops at a step's end)")
p.add_argument("--out")
a = p.parse_args()

from _truth import Truth  # noqa: E402
from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

truth = Truth(a.out)
torch.manual_seed(0)
min_len = a.min_len or max(1, a.seq // 8)


class Texts(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(n)
        lengths = (torch.randint(min_len, a.seq + 1, (n,), generator=g) if a.dynamic
                   else torch.full((n,), a.seq))
        self.rows = [torch.randint(5, a.vocab, (int(k),), generator=g) for k in lengths]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.rows[i]}


def pad(batch: list[dict]) -> dict:
    """Pad to the batch's longest sample; labels -100 on the padding."""
    n = max(len(b["input_ids"]) for b in batch)
    ids = torch.zeros(len(batch), n, dtype=torch.long)
    mask = torch.zeros(len(batch), n, dtype=torch.long)
    for i, b in enumerate(batch):
        k = len(b["input_ids"])
        ids[i, :k] = b["input_ids"]
        mask[i, :k] = 1
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def accuracy(pred) -> dict:  # noqa: ANN001
    logits, labels = pred.predictions, pred.label_ids
    guess = logits[:, :-1].argmax(-1)
    gold = labels[:, 1:]
    keep = gold != -100
    return {"accuracy": float((guess[keep] == gold[keep]).mean())}


class Clock(TrainerCallback):
    def on_step_end(self, args, state, control, **kw):  # noqa: ANN001
        truth.data["steps"] = state.global_step
        if a.seconds is not None and time.time() - truth.t0 > a.seconds:
            control.should_training_stop = True
        truth.eval_begins()

    def on_evaluate(self, args, state, control, **kw):  # noqa: ANN001
        truth.eval_ends()

    def on_step_begin(self, args, state, control, **kw):  # noqa: ANN001
        truth._eval_t0 = None


config = GPT2Config(vocab_size=a.vocab, n_positions=a.seq, n_embd=a.hidden, n_layer=a.layers,
                    n_head=a.heads)
model = GPT2LMHeadModel(config)
if torch.cuda.is_available():
    model.to("cuda")  # as scripts do before preparing their data

if a.preprocess_seconds > 0:  # the dataset's tokenization, on one CPU core, GPU held idle
    t0 = time.perf_counter()
    acc = 0
    while time.perf_counter() - t0 < a.preprocess_seconds:
        acc += sum(hash(str(i)) & 7 for i in range(20000))
    truth.data["preprocess_seconds"] = time.perf_counter() - t0

n_train = a.steps * a.batch * a.accum
args = TrainingArguments(
    output_dir=os.path.join(os.environ.get("TMPDIR", "/tmp"), f"hfclm-{os.getpid()}"),
    max_steps=a.steps, per_device_train_batch_size=a.batch,
    gradient_accumulation_steps=a.accum, per_device_eval_batch_size=a.eval_batch,
    eval_strategy="steps" if a.eval_every else "no", eval_steps=a.eval_every or None,
    logging_steps=1000, save_strategy="no", report_to=[], learning_rate=1e-4,
    dataloader_num_workers=a.workers, use_cpu=not torch.cuda.is_available(), bf16=a.bf16,
    disable_tqdm=True, seed=0)
trainer = Trainer(model=model, args=args, train_dataset=Texts(min(n_train, 20_000)),
                  eval_dataset=Texts(a.eval_samples) if a.eval_every else None,
                  data_collator=pad, compute_metrics=accuracy if a.metrics else None,
                  callbacks=[Clock()])
trainer.train()
truth.write(micro_batches=a.accum, batch=a.batch, eval_batch=a.eval_batch)
print("trained", truth.data["steps"], "steps", file=sys.stderr)

"""A tiny BERT fine-tuned by the Hugging Face Trainer on random tokens, on the CPU or a GPU.

What a user writes: TrainingArguments with evaluation every few steps, gradient
accumulation, and a small eval batch. A TrainerCallback times the evaluations (the
script's own truth, --out). ``--tf32-new-api before|after`` sets TF32 through torch's
``fp32_precision`` API before or after the hook attaches (transformers 5 does so itself
for tf32=True); ``before`` attaches explicitly (run it without ``gpuwatch run``).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=24)
p.add_argument("--accum", type=int, default=4)
p.add_argument("--batch", type=int, default=8)
p.add_argument("--eval-batch", type=int, default=4)
p.add_argument("--eval-every", type=int, default=8)
p.add_argument("--eval-samples", type=int, default=512)
p.add_argument("--hidden", type=int, default=32)
p.add_argument("--layers", type=int, default=2)
p.add_argument("--seq", type=int, default=32)
p.add_argument("--tf32-new-api", choices=["before", "after"], default=None)
p.add_argument("--bf16", action="store_true")
p.add_argument("--tf32-arg", action="store_true", help="TrainingArguments(tf32=True)")
p.add_argument("--compile", action="store_true")
p.add_argument("--grad-ckpt", action="store_true")
p.add_argument("--eval-epoch", action="store_true",
               help='eval_strategy="epoch" (eval_steps left as --eval-every, unused)')
p.add_argument("--train-samples", type=int, default=None,
               help="samples an epoch (default: steps x batch x accum, one epoch)")
p.add_argument("--workers", type=int, default=0)
p.add_argument("--seconds", type=float, default=None,
               help="stop training after this long (the Trainer stops at a step's end)")
p.add_argument("--evaluate-first", action="store_true",
               help="trainer.evaluate() before trainer.train() (a baseline's metrics)")
p.add_argument("--debug-overflow", action="store_true",
               help='TrainingArguments(debug="underflow_overflow")')
p.add_argument("--no-find-unused", action="store_true",
               help="TrainingArguments(ddp_find_unused_parameters=False) (under torchrun)")
p.add_argument("--empty-cache-steps", type=int, default=None,
               help="TrainingArguments(torch_empty_cache_steps=N)")
p.add_argument("--gc-every", type=int, default=0,
               help="a TrainerCallback that calls gc.collect() every N steps")
p.add_argument("--lr", type=float, default=1e-4, help="TrainingArguments(learning_rate=...)")
p.add_argument("--max-grad-norm", type=float, default=1.0,
               help="TrainingArguments(max_grad_norm=...) (0: no clipping)")
p.add_argument("--runs", type=int, default=1,
               help="train this many models one after another, each by a Trainer of its "
                    "own, the earlier Trainers kept (a sweep keeping its results); run k "
                    "(from 0) at k + 1 times --batch")
p.add_argument("--fp16-first", action="store_true",
               help="with --runs: the first run in fp16 (a GradScaler), the others as --bf16 says")
p.add_argument("--subclass", action="store_true",
               help="the script's own Trainer subclass (a compute_loss of its own, as "
                    "class-weighted or custom losses are written)")
p.add_argument("--read-ms", type=float, default=0.0,
               help="each sample waits this long in __getitem__, its CPU idle (a dataset "
                    "reading from a network filesystem or an object store)")
p.add_argument("--decode-ms", type=float, default=0.0,
               help="each sample also keeps its CPU busy this long in __getitem__ (what "
                    "decompressing or decoding a read costs)")
p.add_argument("--out")
a = p.parse_args()

if a.tf32_new_api == "before":
    torch.backends.fp32_precision = "tf32"
    import gpuwatch.torch

    gpuwatch.torch.attach()

from _truth import Truth, trainer_clock  # noqa: E402
from transformers import (  # noqa: E402
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

if a.tf32_new_api == "after":
    torch.backends.fp32_precision = "tf32"

truth = Truth(a.out)
torch.manual_seed(0)


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(n)
        self.ids = torch.randint(5, 1000, (n, a.seq), generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        if a.read_ms:
            time.sleep(a.read_ms / 1000)
        if a.decode_ms:
            end = time.perf_counter() + a.decode_ms / 1000
            while time.perf_counter() < end:
                pass
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(a.seq, dtype=torch.long),
                "labels": self.labels[i]}


Clock = trainer_clock(truth, a.seconds)


class Collect(TrainerCallback):
    """What a loop "freeing memory" does: a full collection every N steps."""

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003
        if state.global_step % a.gc_every == 0:
            gc.collect()


config = BertConfig(vocab_size=1000, hidden_size=a.hidden, num_hidden_layers=a.layers,
                    num_attention_heads=2, intermediate_size=2 * a.hidden,
                    max_position_embeddings=a.seq)


def make_args(fp16: bool = False, batch: int = a.batch) -> TrainingArguments:
    return TrainingArguments(
        output_dir=os.path.join(os.environ.get("TMPDIR", "/tmp"), f"hf-{os.getpid()}"),
        max_steps=a.steps, per_device_train_batch_size=batch,
        gradient_accumulation_steps=a.accum, per_device_eval_batch_size=a.eval_batch,
        eval_strategy="epoch" if a.eval_epoch else "steps", eval_steps=a.eval_every,
        logging_steps=1000, save_strategy="no", report_to=[], learning_rate=a.lr,
        max_grad_norm=a.max_grad_norm, dataloader_num_workers=a.workers,
        use_cpu=not torch.cuda.is_available(), bf16=a.bf16 and not fp16, fp16=fp16,
        torch_compile=a.compile, tf32=True if a.tf32_arg else None,
        gradient_checkpointing=a.grad_ckpt, disable_tqdm=True, seed=0,
        debug="underflow_overflow" if a.debug_overflow else "",
        ddp_find_unused_parameters=False if a.no_find_unused else None,
        torch_empty_cache_steps=a.empty_cache_steps)


class WeightedTrainer(Trainer):
    """The script's own Trainer: its loss computed here (the Trainer's loop runs it)."""

    def compute_loss(self, model, inputs, return_outputs=False, **kwargs):  # noqa: ANN001, ANN003, ANN201
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        loss = torch.nn.functional.cross_entropy(outputs.logits, labels,
                                                 weight=torch.tensor([1.0, 2.0],
                                                                     device=labels.device))
        return (loss, outputs) if return_outputs else loss


trainers, steps = [], 0
for run in range(a.runs):
    batch = a.batch * (run + 1)
    trainer = (WeightedTrainer if a.subclass else Trainer)(model=BertForSequenceClassification(config),
                      args=make_args(fp16=a.fp16_first and run == 0, batch=batch),
                      train_dataset=Tokens(a.train_samples or a.steps * batch * a.accum),
                      eval_dataset=Tokens(a.eval_samples),
                      callbacks=[Clock()] + ([Collect()] if a.gc_every else []))
    trainers.append(trainer)
    if a.evaluate_first:
        t = time.perf_counter()
        trainer.evaluate()
        truth.data["first_eval_seconds"] = time.perf_counter() - t
    trainer.train()
    steps += truth.data["steps"]
truth.data["steps"] = steps
truth.write(micro_batches=a.accum, batch=a.batch, eval_batch=a.eval_batch)
print("trained", truth.data["steps"], "steps", file=sys.stderr)

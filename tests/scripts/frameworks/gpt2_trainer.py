"""GPT-2 built from a config and trained by the Hugging Face Trainer on random tokens.

Knobs as flags: precision, batch, workers, accumulation, TF32, and ``--eval-every N``:
evaluation and a checkpoint every N steps with ``load_best_model_at_end`` (the Trainer
then needs save_steps a multiple of eval_steps). A TrainerCallback stops training after
``--seconds`` and counts the steps (the truth, --out).
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch.utils.data import Dataset
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

p = argparse.ArgumentParser()
p.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "bf16"])
p.add_argument("--batch", type=int, default=8)
p.add_argument("--seq", type=int, default=512)
p.add_argument("--layers", type=int, default=12)
p.add_argument("--embd", type=int, default=768)
p.add_argument("--workers", type=int, default=0)
p.add_argument("--accum", type=int, default=1)
p.add_argument("--seconds", type=float, default=60)
p.add_argument("--tf32", action="store_true")
p.add_argument("--output-dir", default="/tmp/o", help="the Trainer's (checkpoints)")
p.add_argument("--eval-every", type=int, default=0)
p.add_argument("--out", help="write the steps counted here (JSON)")
a = p.parse_args()


class Tokens(Dataset):
    def __init__(self, n: int, seq: int, vocab: int) -> None:
        self.n, self.seq, self.vocab = n, seq, vocab

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        g = torch.Generator().manual_seed(i)
        ids = torch.randint(0, self.vocab, (self.seq,), generator=g)
        return {"input_ids": ids, "labels": ids.clone()}


class StopAfter(TrainerCallback):
    def __init__(self) -> None:
        self.t0: float | None = None
        self.steps = 0

    def on_step_end(self, args, state, control, **kw):  # noqa: ANN001, ANN201
        self.steps += 1
        if self.t0 is None:
            self.t0 = time.time()
        if time.time() - self.t0 > a.seconds:
            control.should_training_stop = True


cfg = GPT2Config(n_layer=a.layers, n_embd=a.embd, n_head=max(1, a.embd // 64),
                 n_positions=a.seq)
model = GPT2LMHeadModel(cfg)
evaluating = dict(eval_strategy="steps", eval_steps=a.eval_every, save_strategy="steps",
                  save_steps=a.eval_every, load_best_model_at_end=True,
                  metric_for_best_model="loss", per_device_eval_batch_size=8)
args = TrainingArguments(output_dir=a.output_dir, per_device_train_batch_size=a.batch,
                         gradient_accumulation_steps=a.accum, max_steps=10**6,
                         logging_steps=20, report_to=[],
                         **({} if a.eval_every else dict(save_strategy="no")),
                         fp16=a.precision == "fp16", bf16=a.precision == "bf16",
                         tf32=a.tf32 or None, dataloader_num_workers=a.workers,
                         learning_rate=1e-4, **(evaluating if a.eval_every else {}))
stop = StopAfter()
Trainer(model=model, args=args, train_dataset=Tokens(10**6, a.seq, cfg.vocab_size),
        eval_dataset=Tokens(512, a.seq, cfg.vocab_size), callbacks=[stop]).train()
if a.out:
    with open(a.out, "w") as f:
        json.dump({"steps": stop.steps, "batch": a.batch}, f)

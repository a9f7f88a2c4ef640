"""The Hugging Face Trainer with ``auto_find_batch_size=True`` on a GPT-2 built from a config.

It starts at a per-device batch too big for the card; on each CUDA out-of-memory error
accelerate's finder retries at 0.9 of the batch until one fits. A TrainerCallback records
the batch size each attempt began with and counts the steps after the first (the truth,
--out), stopping training after ``--seconds``.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=1024, help="where the finder starts")
p.add_argument("--seq", type=int, default=512)
p.add_argument("--seconds", type=float, default=40)
p.add_argument("--out", help="write the steps and the batch sizes tried here (JSON)")
a = p.parse_args()


class Tokens(Dataset):
    def __len__(self) -> int:
        return 10**7

    def __getitem__(self, i: int) -> dict:
        ids = torch.randint(0, 50257, (a.seq,))
        return {"input_ids": ids, "labels": ids}


class Clock(TrainerCallback):
    def __init__(self) -> None:
        self.t0: float | None = None
        self.steps = 0
        self.batch_sizes: list[int] = []

    def on_train_begin(self, args, state, control, **kw):  # noqa: ANN001, ANN201
        self.batch_sizes.append(state.train_batch_size)

    def on_step_end(self, args, state, control, **kw):  # noqa: ANN001, ANN201
        self.steps += 1
        self.t0 = self.t0 or time.time()
        if time.time() - self.t0 > a.seconds:
            control.should_training_stop = True


clock = Clock()
args = TrainingArguments("/tmp/autobatch", per_device_train_batch_size=a.batch,
                         auto_find_batch_size=True, bf16=True, max_steps=100000,
                         logging_steps=50, save_strategy="no", report_to=[],
                         dataloader_num_workers=4)
Trainer(model=GPT2LMHeadModel(GPT2Config(n_positions=a.seq)), args=args, train_dataset=Tokens(),
        callbacks=[clock]).train()
if a.out:
    with open(a.out, "w") as f:
        json.dump({"steps": clock.steps, "batch_sizes": clock.batch_sizes}, f)

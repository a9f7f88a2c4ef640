"""The Hugging Face Trainer finding its batch size: ``TrainingArguments(auto_find_batch_size=True)``
starts at ``--batch`` and, on CUDA out-of-memory, tries again at 90 % of it (accelerate's
``find_executable_batch_size``), until a batch runs.

On the CPU the memory is played by the model: the tensor its forward saves for backward
costs one unit a sample, the card holds ``--budget`` units, and a backward over more than
``--fits`` samples raises ``torch.OutOfMemoryError``, as a CUDA allocation would. A forward
that finds the saved tensors of earlier attempts still alive has their units taken: what
a failed attempt leaves held is what the next one cannot use (on a GPU, a graph kept alive
by a reference to its loss holds the activations on the card). With nothing held, the
Trainer settles on the largest batch under ``--fits``.

The truth (--out): every batch size the Trainer tried and the steps it trained."""

from __future__ import annotations

import argparse
import gc
import json
import time
import weakref

import torch
from torch.utils.data import Dataset
from transformers import Trainer, TrainerCallback, TrainingArguments

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=64)
p.add_argument("--budget", type=int, default=100, help="units (samples) the card holds")
p.add_argument("--fits", type=int, default=40, help="the largest batch whose backward fits")
p.add_argument("--steps", type=int, default=6)
p.add_argument("--out")
a = p.parse_args()

saved: list[tuple[weakref.ref, int]] = []  # each forward's saved tensor, and its units


def held() -> int:
    return sum(units for ref, units in saved if ref() is not None)


class Activations(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # noqa: ANN001, ANN205
        units = x.shape[0]
        if held() + units > a.budget:
            gc.collect()  # what the Trainer's retry also does before trying again
        if held() + units > a.budget:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {units} units; {held()} of "
                f"{a.budget} are held")
        kept = x * 1.0
        saved.append((weakref.ref(kept), units))
        ctx.save_for_backward(kept)
        return x

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001, ANN205
        (kept,) = ctx.saved_tensors
        if kept.shape[0] > a.fits:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate the gradients of {kept.shape[0]} "
                f"samples")
        return grad


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict:
        out = Activations.apply(self.lin(x))
        return {"loss": torch.nn.functional.mse_loss(out.mean(-1), labels)}


class Rows(Dataset):
    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int) -> dict:
        return {"x": torch.randn(8), "labels": torch.randn(())}


class Clock(TrainerCallback):
    def __init__(self) -> None:
        self.tried: list[int] = []
        self.steps = 0

    def on_train_begin(self, args, state, control, **kw):  # noqa: ANN001, ANN201
        self.tried.append(state.train_batch_size)

    def on_step_end(self, args, state, control, **kw):  # noqa: ANN001, ANN201
        self.steps += 1


clock = Clock()
t0 = time.time()
args = TrainingArguments(output_dir="autobatch_out", per_device_train_batch_size=a.batch,
                         auto_find_batch_size=True, max_steps=a.steps, save_strategy="no",
                         report_to=[], logging_steps=1000, use_cpu=not torch.cuda.is_available(),
                         dataloader_num_workers=0)
Trainer(model=Model(), args=args, train_dataset=Rows(), callbacks=[clock]).train()
if a.out:
    with open(a.out, "w") as f:
        json.dump({"tried": clock.tried, "trained_batch": clock.tried[-1],
                   "steps": clock.steps, "wall_seconds": time.time() - t0}, f)

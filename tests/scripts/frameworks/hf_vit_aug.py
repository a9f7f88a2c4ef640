"""A Hugging Face ViT trained by the Trainer on images augmented in the Dataset.

Each sample is a random 256x256 image, cropped at random to 224 and blurred by a 5x5
convolution on the CPU: the workers' work (``--workers``, the Trainer's
dataloader_num_workers). A TrainerCallback counts the steps (the truth, --out) and stops
training after ``--seconds``.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset
from transformers import (
    Trainer,
    TrainerCallback,
    TrainingArguments,
    ViTConfig,
    ViTForImageClassification,
)

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=128)
p.add_argument("--workers", type=int, default=2)
p.add_argument("--seconds", type=float, default=40)
p.add_argument("--out", help="write the steps counted here (JSON)")
a = p.parse_args()
BLUR = torch.ones(3, 1, 5, 5) / 25


class Augmented(Dataset):
    def __len__(self) -> int:
        return 10**6

    def __getitem__(self, i: int) -> dict:
        img = torch.rand(3, 256, 256)
        top, left = torch.randint(0, 32, (2,)).tolist()
        img = img[:, top:top + 224, left:left + 224]
        img = F.conv2d(img[None], BLUR, padding=2, groups=3)[0]
        img = (img - 0.5) / 0.25
        return {"pixel_values": img, "labels": i % 10}


class Clock(TrainerCallback):
    def __init__(self) -> None:
        self.t0: float | None = None
        self.steps = 0

    def on_step_end(self, args, state, control, **kw):  # noqa: ANN001, ANN201
        self.steps += 1
        self.t0 = self.t0 or time.time()
        if time.time() - self.t0 > a.seconds:
            control.should_training_stop = True


cfg = ViTConfig(image_size=224, patch_size=16, hidden_size=384, num_hidden_layers=12,
                num_attention_heads=6, intermediate_size=1536, num_labels=10)
clock = Clock()
args = TrainingArguments("/tmp/vit_aug", per_device_train_batch_size=a.batch, bf16=True,
                         dataloader_num_workers=a.workers, max_steps=100000, save_strategy="no",
                         logging_steps=20, report_to=[], remove_unused_columns=False)
Trainer(model=ViTForImageClassification(cfg), args=args, train_dataset=Augmented(),
        callbacks=[clock]).train()
if a.out:
    with open(a.out, "w") as f:
        json.dump({"steps": clock.steps, "batch": a.batch, "workers": a.workers}, f)

"""Accelerate's cv_example, roughly: a torchvision ResNet-50 from scratch on synthetic
uint8 images augmented in the Dataset (RandomResizedCrop, flip, ColorJitter), fp16 mixed
precision, gradient accumulation through accelerator.accumulate()."""
import argparse
import json
import time

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, Dataset
from torchvision import models
from torchvision.transforms import v2

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=128)
p.add_argument("--workers", type=int, default=4)
p.add_argument("--accum", type=int, default=2)
p.add_argument("--mixed", default="fp16")
p.add_argument("--seconds", type=float, default=40)
p.add_argument("--out")
a = p.parse_args()
t0 = time.time()

class Synthetic(Dataset):
    def __init__(self):
        self.tf = v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip(),
                              v2.ColorJitter(0.4, 0.4, 0.4), v2.ToDtype(torch.float32, scale=True),
                              v2.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    def __len__(self):
        return 100_000
    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        img = torch.randint(0, 256, (3, 256, 256), dtype=torch.uint8, generator=g)
        return self.tf(img), i % 1000

accelerator = Accelerator(mixed_precision=a.mixed, gradient_accumulation_steps=a.accum)
model = models.resnet50(num_classes=1000)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
dl = DataLoader(Synthetic(), batch_size=a.batch, shuffle=True, num_workers=a.workers, drop_last=True)
model, opt, dl = accelerator.prepare(model, opt, dl)
crit = torch.nn.CrossEntropyLoss()
steps = micro = 0
model.train()
for _epoch in range(100):
    for x, y in dl:
        with accelerator.accumulate(model):
            loss = crit(model(x), y)
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
        micro += 1
        if accelerator.sync_gradients:
            steps += 1
        if time.time() - t0 > a.seconds:
            break
    else:
        continue
    break
accelerator.wait_for_everyone()
if a.out:
    with open(a.out, "w") as f:
        json.dump({"steps": steps, "micro_batches": micro, "wall_seconds": time.time() - t0}, f)

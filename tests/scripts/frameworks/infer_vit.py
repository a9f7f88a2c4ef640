"""Batch inference as a script writes it: a torchvision ViT-B/16 in eval(), fp32, under
torch.no_grad(), over a DataLoader of synthetic images (batch 32, 2 workers)."""
import argparse
import json
import time

import torch
from torch.utils.data import DataLoader, Dataset
from torchvision import models

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=32)
p.add_argument("--workers", type=int, default=2)
p.add_argument("--seconds", type=float, default=35)
p.add_argument("--out")
a = p.parse_args()
t0 = time.time()

class Images(Dataset):
    def __len__(self):
        return 1_000_000
    def __getitem__(self, i):
        return torch.rand(3, 224, 224)

model = models.vit_b_16().cuda().eval()
n = 0
with torch.no_grad():
    for x in DataLoader(Images(), batch_size=a.batch, num_workers=a.workers):
        model(x.cuda(non_blocking=True)).argmax(-1).cpu()
        n += 1
        if time.time() - t0 > a.seconds:
            break
if a.out:
    with open(a.out, "w") as f:
        json.dump({"batches": n, "wall_seconds": time.time() - t0}, f)

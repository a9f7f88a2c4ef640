"""A CNN starved by CPU-heavy augmentation: 3 DataLoader workers all pegged doing
per-sample numpy work, the GPU mostly idle; prefetching hides the wait in bursts."""

import argparse
import time

import numpy as np
import torch
from _truth import Truth, timed
from torch import nn
from torch.utils.data import DataLoader, Dataset

p = argparse.ArgumentParser()
p.add_argument("--seconds", type=float, default=50)
p.add_argument("--batch", type=int, default=64)
p.add_argument("--workers", type=int, default=3)
p.add_argument("--aug-ms", type=float, default=6.0, help="CPU augmentation per sample")
p.add_argument("--truth")
a = p.parse_args()
dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class Augmented(Dataset):
    def __len__(self):
        return 10**6

    def __getitem__(self, i):
        rng = np.random.default_rng(i)
        img = rng.random((3, 128, 128), dtype=np.float32)
        end = time.perf_counter() + a.aug_ms / 1000
        while time.perf_counter() < end:  # colour jitter, blur, rotation... in numpy
            img = np.clip(img * 1.01 - 0.005, 0, 1)
        return torch.from_numpy(img.copy()), i % 100


def conv(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                         nn.ReLU(inplace=True))


model = nn.Sequential(conv(3, 32), conv(32, 64), nn.MaxPool2d(2), conv(64, 128), nn.MaxPool2d(2),
                      conv(128, 256), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                      nn.Linear(256, 100)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
loader = DataLoader(Augmented(), batch_size=a.batch, shuffle=True, num_workers=a.workers,
                    pin_memory=True, persistent_workers=a.workers > 0)
truth = Truth(a.truth, script="starved_cnn", batch=a.batch, workers=a.workers, aug_ms=a.aug_ms)
end = time.time() + a.seconds
for (x, y), wait, first in timed(loader, truth):
    x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    truth.step(wait, first)
    if time.time() > end:
        break
truth.end = "exited"

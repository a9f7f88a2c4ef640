"""A GAN-style loop: two optimizers per iteration, 16-iteration epochs, DataLoader workers
rebuilt every epoch (persistent_workers=False) with a costly worker start (an index opened
in worker_init_fn, as file-backed datasets do), and a print with .item() every iteration."""

import argparse
import time

import torch
from _truth import Truth, timed
from torch import nn
from torch.utils.data import DataLoader, Dataset

p = argparse.ArgumentParser()
p.add_argument("--seconds", type=float, default=50)
p.add_argument("--batch", type=int, default=64)
p.add_argument("--workers", type=int, default=4)
p.add_argument("--worker-start-s", type=float, default=0.6)
p.add_argument("--truth")
a = p.parse_args()
dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class Faces(Dataset):
    def __len__(self):
        return 16 * a.batch

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.rand(3, 64, 64, generator=g) * 2 - 1


def open_index(_worker_id):
    time.sleep(a.worker_start_s)  # e.g. opening an LMDB/HDF5 index per worker


def block(cin, cout, up):
    conv = nn.ConvTranspose2d(cin, cout, 4, 2, 1) if up else nn.Conv2d(cin, cout, 4, 2, 1)
    return nn.Sequential(conv, nn.BatchNorm2d(cout), nn.ReLU() if up else nn.LeakyReLU(0.2))


G = nn.Sequential(nn.ConvTranspose2d(100, 256, 4, 1, 0), nn.BatchNorm2d(256), nn.ReLU(),
                  block(256, 128, True), block(128, 64, True), block(64, 32, True),
                  nn.ConvTranspose2d(32, 3, 4, 2, 1), nn.Tanh()).to(dev)
D = nn.Sequential(nn.Conv2d(3, 32, 4, 2, 1), nn.LeakyReLU(0.2), block(32, 64, False),
                  block(64, 128, False), block(128, 256, False), nn.Conv2d(256, 1, 4, 1, 0),
                  nn.Flatten()).to(dev)
optG = torch.optim.Adam(G.parameters(), 2e-4, betas=(0.5, 0.999))
optD = torch.optim.Adam(D.parameters(), 2e-4, betas=(0.5, 0.999))
bce = nn.BCEWithLogitsLoss()
loader = DataLoader(Faces(), batch_size=a.batch, shuffle=True, num_workers=a.workers,
                    persistent_workers=False, worker_init_fn=open_index, drop_last=True)
truth = Truth(a.truth, script="gan", batch=a.batch, workers=a.workers,
              worker_start_s=a.worker_start_s)
end = time.time() + a.seconds
epoch = 0
while time.time() < end:
    for i, (real, wait, first) in enumerate(timed(loader, truth)):
        real = real.to(dev, non_blocking=True)
        z = torch.randn(a.batch, 100, 1, 1, device=dev)
        fake = G(z)
        optD.zero_grad()
        lossD = bce(D(real), torch.ones(a.batch, 1, device=dev)) + \
            bce(D(fake.detach()), torch.zeros(a.batch, 1, device=dev))
        lossD.backward()
        optD.step()
        optG.zero_grad()
        lossG = bce(D(fake), torch.ones(a.batch, 1, device=dev))
        lossG.backward()
        optG.step()
        print(f"[{epoch}][{i}/16] Loss_D: {lossD.item():.4f} Loss_G: {lossG.item():.4f}")
        truth.step(wait, first)
    epoch += 1
truth.end = "exited"

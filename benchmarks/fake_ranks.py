#!/usr/bin/env python3
"""A training job's load on one GPU, for watching the daemon beside it (bench_tick.py):
N processes ("ranks"), each training a Linear(64, 64) on CUDA from a DataLoader of W
workers (persistent; each sample takes 20 ms to make). Runs until killed.

    python3 benchmarks/fake_ranks.py 8 4 &    # 8 ranks of 4 workers on GPU 0
    python3 benchmarks/bench_tick.py --repeat-gpus 8 --interval 1 --rss-seconds 120
    pkill -f fake_ranks.py
"""

from __future__ import annotations

import subprocess
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Samples(Dataset):
    def __len__(self) -> int:
        return 10**9

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.02)
        return torch.randn(64)


def rank(workers: int) -> None:
    model = torch.nn.Linear(64, 64).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Samples(), batch_size=8, num_workers=workers, persistent_workers=True)
    for x in loader:
        loss = model(x.cuda()).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()


if __name__ == "__main__":
    if len(sys.argv) > 3:
        rank(int(sys.argv[2]))
    else:
        ranks, workers = int(sys.argv[1]), int(sys.argv[2])
        procs = [subprocess.Popen([sys.executable, __file__, str(ranks), str(workers), "rank"])
                 for _ in range(ranks)]
        for p in procs:
            p.wait()

"""Two-rank DDP (start with torchrun --nproc_per_node 2). --slow-rank R gives rank R an input
pipeline too slow for the GPU (fewer workers, more CPU per sample), so every rank runs at
its pace: the others wait for it inside the gradient all-reduce. Without --slow-rank the
ranks are balanced (the twin to compare against)."""

import argparse
import os
import time

import torch
import torch.distributed as dist
from _truth import Truth, timed
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

p = argparse.ArgumentParser()
p.add_argument("--seconds", type=float, default=50)
p.add_argument("--batch", type=int, default=64)
p.add_argument("--workers", type=int, default=4)
p.add_argument("--cpu-ms", type=float, default=0.2, help="CPU per sample, balanced ranks")
p.add_argument("--slow-rank", type=int, default=-1)
p.add_argument("--slow-cpu-ms", type=float, default=3.0)
p.add_argument("--slow-workers", type=int, default=1)
p.add_argument("--truth")
a = p.parse_args()

dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
rank, local = dist.get_rank(), int(os.environ.get("LOCAL_RANK", 0))
dev = torch.device(f"cuda:{local}" if torch.cuda.is_available() else "cpu")
if dev.type == "cuda":
    torch.cuda.set_device(dev)
slow = rank == a.slow_rank
cpu_ms = a.slow_cpu_ms if slow else a.cpu_ms
workers = a.slow_workers if slow else a.workers


class Tokens(Dataset):
    def __len__(self):
        return 10**7

    def __getitem__(self, i):
        end = time.perf_counter() + cpu_ms / 1000
        x = 0.0
        while time.perf_counter() < end:  # tokenising / decoding on the CPU
            x += 1.0
        tok = torch.randint(0, 8192, (256,))
        return tok, tok.roll(-1)


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(8192, 768)
        layer = nn.TransformerEncoderLayer(768, 12, 3072, batch_first=True, norm_first=True)
        self.enc = nn.TransformerEncoder(layer, 6)
        self.head = nn.Linear(768, 8192)

    def forward(self, x):
        return self.head(self.enc(self.emb(x)))


model = DDP(LM().to(dev), device_ids=[local] if dev.type == "cuda" else None)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=dev.type == "cuda")
loader = DataLoader(Tokens(), batch_size=a.batch, num_workers=workers, pin_memory=True,
                    persistent_workers=True)
truth = Truth(a.truth, script="ddp", batch=a.batch, workers=workers, cpu_ms=cpu_ms, slow=slow,
              world_size=dist.get_world_size())
end = time.time() + a.seconds
stop = torch.zeros(1, device=dev)
for (x, y), wait, first in timed(loader, truth):
    x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
    with torch.autocast(dev.type, dtype=torch.bfloat16):
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    truth.step(wait, first)
    if len(truth.steps) % 20 == 0:  # all ranks agree when to stop
        stop.fill_(float(time.time() > end))
        dist.all_reduce(stop)
        if stop.item() > 0:
            break
truth.end = "exited"
dist.destroy_process_group()

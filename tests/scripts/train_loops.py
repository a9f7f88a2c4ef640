"""Training loops shaped like third-party scripts, for the hook's step-counting tests.

- ``manual``: pytorch/examples word_language_model's shape: an LSTM, no DataLoader, no
  ``torch.optim``: parameters updated by hand (``p.data.add_(p.grad, alpha=-lr)``); an
  evaluation pass (no backward) every ``--eval-every`` iterations. ``--reentrant`` runs the
  LSTM under reentrant checkpointing, whose backward() runs a nested backward().
- ``gan``: DCGAN's shape: conv nets, two optimizers, three backward() calls per iteration,
  short epochs over a DataLoader with ``persistent_workers=False`` (new workers each epoch);
  ``--new-loader`` builds the DataLoader anew inside the epoch loop, as many notebooks do.
- ``accumulate``: gradient accumulation: ``--accumulate`` backward() calls per optimizer step.

Each writes its own ground truth to ``--out`` (one JSON line per iteration, the trace's step
field names; ``first_batch`` true on an epoch's first iteration, whose data wait includes
creating the epoch's iterator). ``--pause`` sleeps before the first iteration (after the
model is built), so tests can see what is reported before any step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

p = argparse.ArgumentParser()
p.add_argument("loop", choices=["manual", "gan", "accumulate"])
p.add_argument("--steps", type=int, default=20, help="iterations (manual, accumulate)")
p.add_argument("--epochs", type=int, default=3, help="epochs (gan)")
p.add_argument("--epoch-batches", type=int, default=4, help="batches per epoch (gan)")
p.add_argument("--workers", type=int, default=2)
p.add_argument("--accumulate", type=int, default=4)
p.add_argument("--eval-every", type=int, default=5)
p.add_argument("--reentrant", action="store_true")
p.add_argument("--channels-last", action="store_true")
p.add_argument("--pause", type=float, default=0.0)
p.add_argument("--new-loader", action="store_true", help="gan: a DataLoader built each epoch")
p.add_argument("--out", default=None)
a = p.parse_args()

torch.manual_seed(0)
out = open(a.out, "w") if a.out else None  # noqa: SIM115 - closed at the end
n = 0


def record(t0: float, wait: float, first: float | None = None) -> None:
    """One iteration's ground truth: started at ``t0``, ``wait`` s blocked on data,
    ``first`` s of it creating an epoch's iterator and fetching its first batch."""
    global n
    if out:
        out.write(json.dumps({"t": time.time(), "kind": "step", "step": n, "pid": os.getpid(),
                              "step_seconds": time.perf_counter() - t0,
                              "data_wait_seconds": wait, "first_batch": first is not None,
                              "first_batch_wait_seconds": first}) + "\n")
    n += 1


class Images(Dataset):
    def __len__(self) -> int:
        return 8 * a.epoch_batches

    def __getitem__(self, i: int):
        time.sleep(0.002)  # a little loading work, so the workers' start shows
        return torch.randn(3, 16, 16, generator=torch.Generator().manual_seed(i))


if a.loop == "manual":
    ntoken, lr = 50, 0.5
    data = torch.randint(0, ntoken, (400, 8))

    class RNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(ntoken, 16)
            self.rnn = nn.LSTM(16, 16)
            self.dec = nn.Linear(16, ntoken)

        def forward(self, x):
            e = self.emb(x)
            if a.reentrant:
                h = torch.utils.checkpoint.checkpoint(lambda t: self.rnn(t)[0], e,
                                                      use_reentrant=True)
            else:
                h = self.rnn(e)[0]
            return self.dec(h)

    model = RNN()
    crit = nn.CrossEntropyLoss()
    if a.pause:
        time.sleep(a.pause)
    for i in range(a.steps):
        t0 = time.perf_counter()
        x, y = data[i:i + 10], data[i + 1:i + 11]
        model.train()
        model.zero_grad()
        loss = crit(model(x).view(-1, ntoken), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        for q in model.parameters():
            q.data.add_(q.grad, alpha=-lr)
        record(t0, 0.0)
        if a.eval_every and i % a.eval_every == a.eval_every - 1:
            model.eval()
            with torch.no_grad():
                crit(model(data[:10]).view(-1, ntoken), data[1:11].reshape(-1))
elif a.loop == "gan":
    G = nn.Sequential(nn.ConvTranspose2d(8, 3, 16), nn.Tanh())
    D = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.LeakyReLU(0.2), nn.Flatten(),
                      nn.Linear(4 * 16 * 16, 1))
    if a.channels_last:
        G, D = G.to(memory_format=torch.channels_last), D.to(memory_format=torch.channels_last)
    optD = torch.optim.Adam(D.parameters(), lr=2e-4)
    optG = torch.optim.Adam(G.parameters(), lr=2e-4)
    loader = DataLoader(Images(), batch_size=8, num_workers=a.workers,
                        persistent_workers=False)
    if a.pause:
        time.sleep(a.pause)
    t0 = time.perf_counter()
    end_wait = 0.0  # the last next() of an epoch: it shuts the epoch's workers down
    for _epoch in range(a.epochs):
        t_iter = time.perf_counter()
        if a.new_loader:
            loader = DataLoader(Images(), batch_size=8, num_workers=a.workers)
        it = iter(loader)
        first: float | None = 0.0
        while True:
            t_next = time.perf_counter()
            try:
                x = next(it)
            except StopIteration:
                end_wait = time.perf_counter() - t_next
                del it  # as a `for` loop's end does
                break
            t1 = time.perf_counter()
            wait = t1 - t_next
            if first is not None:
                first = t1 - t_iter
                wait = first + end_wait
            D.zero_grad()
            errD_real = -D(x).mean()
            errD_real.backward()
            fake = G(torch.randn(8, 8, 1, 1))
            errD_fake = D(fake.detach()).mean()
            errD_fake.backward()
            optD.step()
            G.zero_grad()
            errG = -D(fake).mean()
            errG.backward()
            optG.step()
            print(f"loss {errG.item():.4f}", flush=True)  # the .item() DCGAN prints
            record(t0, wait, first)
            first = None
            t0 = time.perf_counter()
else:  # accumulate
    model = nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if a.pause:
        time.sleep(a.pause)
    for _i in range(a.steps):
        t0 = time.perf_counter()
        for _k in range(a.accumulate):
            model(torch.randn(4, 16)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        record(t0, 0.0)
if out:
    out.close()
if "gpuwatch.job.hook.core" in sys.modules:  # attached, by `gpuwatch run`
    from gpuwatch.job.hook import core as hook

    print("gpuwatch-hook-stats " + json.dumps(hook.stats()), file=sys.stderr)

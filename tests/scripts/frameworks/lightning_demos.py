"""Lightning's own language-model demos, unchanged, as a user trying Lightning would run them:

- ``--model transformer``: ``lightning.pytorch.demos.transformer.LightningTransformer`` (a
  2-layer Transformer, SGD, ``DataLoader(dataset)``: the default batch of 1) fitted by
  ``Trainer`` with its defaults but for ``max_time`` and the devices;
- ``--model lstm``: ``lightning.pytorch.demos.lstm.LightningLSTM`` (a 4-layer LSTM, SGD, its
  batches made by a ``batch_sampler``, ``SequenceSampler(dataset, batch_size=20)``: the
  DataLoader's own ``batch_size`` is None);
- ``--model fabric``: the loop of Lightning's README for Fabric (``Fabric(devices=...)``,
  ``fabric.setup``, ``fabric.setup_dataloaders``, ``fabric.backward``) around the same demo
  ``Transformer``, at ``--batch`` and ``--precision``, with ``--accum`` micro-batches per
  step under ``fabric.no_backward_sync``.

The demos read ``./data/wikitext-2.txt``, which they would download; here it is written
first: a deterministic text of Zipf-distributed words (so every rank of a DDP run makes the
same one). Where ``requests`` is not installed (the demo's loader asks for it before it
looks for the file), the demo's own ``train_dataloader`` is used with ``download=False``. The script's own truth (steps, --out) is written by global rank 0.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# the launcher of a multi-GPU run starts this script again in the directory chosen below
sys.argv[0] = os.path.abspath(sys.argv[0])

import torch  # noqa: E402
from _truth import Truth, lightning_clock  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--model", choices=("transformer", "lstm", "fabric"), default="transformer")
p.add_argument("--devices", type=int, default=1)
p.add_argument("--seconds", type=float, default=40.0)
p.add_argument("--words", type=int, default=400_000, help="length of the text")
p.add_argument("--batch", type=int, default=1, help="fabric: the DataLoader's batch_size")
p.add_argument("--accum", type=int, default=1, help="fabric: micro-batches per step")
p.add_argument("--precision", default="32-true", help="fabric: Fabric(precision=...)")
p.add_argument("--cpu", action="store_true")
p.add_argument("--out")
a = p.parse_args()
if a.out:
    a.out = os.path.abspath(a.out)

truth = Truth(a.out)
accelerator = "cpu" if a.cpu or not torch.cuda.is_available() else "gpu"


def write_text(root: str, words: int) -> None:
    path = os.path.join(root, "data", "wikitext-2.txt")
    if os.path.exists(path):
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    rnd = random.Random(0)
    vocab = [f"w{i}" for i in range(8000)]
    weights = [1.0 / (i + 1) for i in range(len(vocab))]
    out, left = [], words
    while left > 0:
        n = min(left, rnd.randint(8, 60))
        out.append(" " + " ".join(rnd.choices(vocab, weights, k=n)) + " \n")
        left -= n
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w", encoding="utf8") as f:
        f.writelines(out)
    os.replace(tmp, path)


root = os.path.join(tempfile.gettempdir(), f"gpuwatch-demo-text-{a.words}")
os.makedirs(root, exist_ok=True)
write_text(root, a.words)
os.chdir(root)

if a.model == "fabric":
    import lightning as L  # noqa: E402
    from lightning.pytorch.demos import Transformer, WikiText2  # noqa: E402
    from torch.utils.data import DataLoader  # noqa: E402

    fabric = L.Fabric(accelerator=accelerator, devices=a.devices, precision=a.precision)
    fabric.launch()
    dataset = WikiText2(download=False)
    dataloader = fabric.setup_dataloaders(DataLoader(dataset, batch_size=a.batch,
                                                     shuffle=True))
    model = Transformer(vocab_size=dataset.vocab_size)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = fabric.setup(model, optimizer)
    model.train()
    t_end = time.perf_counter() + a.seconds
    steps, micro, done = 0, 0, False
    while not done:
        for inputs, target in dataloader:
            micro += 1
            accumulating = micro % a.accum != 0
            with fabric.no_backward_sync(model, enabled=accumulating):
                output = model(inputs, target)
                loss = torch.nn.functional.nll_loss(output, target.view(-1))
                fabric.backward(loss / a.accum)
            if not accumulating:
                optimizer.step()
                optimizer.zero_grad()
                steps += 1
            # every rank stops at the same step: rank 0's clock decides for all
            if micro % (50 * a.accum) == 0:
                done = fabric.broadcast(time.perf_counter() >= t_end, src=0)
                if done:
                    break
        else:
            done = fabric.broadcast(time.perf_counter() >= t_end, src=0)
    if fabric.global_rank == 0:
        truth.data["steps"] = steps
        truth.write(micro_batches=a.accum, batch=a.batch)
    print("trained", steps, "steps", file=sys.stderr)
else:
    import lightning.pytorch as pl  # noqa: E402

    if a.model == "transformer":
        from lightning.pytorch.demos.transformer import LightningTransformer as Demo
    else:
        from lightning.pytorch.demos.lstm import LightningLSTM as Demo

    from lightning.pytorch.demos import transformer as demo_text

    class Local(Demo):
        def prepare_data(self) -> None:
            pass  # the demo would download the text (written above)

    if not demo_text._REQUESTS_AVAILABLE:
        # the demo's WikiText2() checks for requests before it looks for the file: where
        # requests is not installed, the demo's own loader with download=False
        from lightning.pytorch.demos.lstm import SequenceSampler
        from torch.utils.data import DataLoader

        def train_dataloader(self):  # noqa: ANN001, ANN202
            dataset = demo_text.WikiText2(download=False)
            if a.model == "transformer":
                return DataLoader(dataset)
            return DataLoader(dataset, batch_sampler=SequenceSampler(dataset, batch_size=20))

        Local.train_dataloader = train_dataloader

    trainer = pl.Trainer(max_epochs=-1, max_time={"seconds": a.seconds},
                         accelerator=accelerator, devices=a.devices,
                         callbacks=[lightning_clock(truth)()])
    trainer.fit(Local())
    if trainer.global_rank == 0:
        truth.write(micro_batches=1, batch=1 if a.model == "transformer" else 20)
    print("trained", trainer.global_step, "steps", file=sys.stderr)

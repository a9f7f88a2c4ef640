"""A small Transformer language model trained by Lightning on random tokens.

Knobs as flags: ``--precision`` (Lightning's), micro-batch, ``accumulate_grad_batches``,
workers, and ``--matmul`` for ``torch.set_float32_matmul_precision`` (``high``: FP32
matmuls as TF32, what Lightning's own hint at start-up suggests). Training stops after
``--seconds``; the steps are counted (the truth, --out).
"""

from __future__ import annotations

import argparse
import json
import time

import lightning as L  # noqa: N812
import torch
from torch.utils.data import DataLoader, Dataset

p = argparse.ArgumentParser()
p.add_argument("--precision", default="bf16-mixed")
p.add_argument("--batch", type=int, default=2)
p.add_argument("--accum", type=int, default=16)
p.add_argument("--workers", type=int, default=2)
p.add_argument("--seq", type=int, default=512)
p.add_argument("--width", type=int, default=1024)
p.add_argument("--layers", type=int, default=8)
p.add_argument("--seconds", type=float, default=60)
p.add_argument("--matmul", default=None)
p.add_argument("--out", help="write the steps counted here (JSON)")
a = p.parse_args()
if a.matmul:
    torch.set_float32_matmul_precision(a.matmul)
V = 32000


class Tokens(Dataset):
    def __len__(self) -> int:
        return 10**6

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.randint(0, V, (a.seq + 1,))


class LM(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(V, a.width)
        layer = torch.nn.TransformerEncoderLayer(a.width, a.width // 64, 4 * a.width,
                                                 batch_first=True, norm_first=True)
        self.body = torch.nn.TransformerEncoder(layer, a.layers)
        self.head = torch.nn.Linear(a.width, V)
        self.t0: float | None = None
        self.steps = 0

    def training_step(self, batch: torch.Tensor, i: int) -> torch.Tensor:
        x, y = batch[:, :-1], batch[:, 1:]
        mask = torch.nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device)
        h = self.body(self.emb(x), mask=mask, is_causal=True)
        loss = torch.nn.functional.cross_entropy(self.head(h).flatten(0, 1), y.flatten())
        self.log("loss", loss, prog_bar=True)
        return loss

    def on_train_batch_end(self, *args: object) -> None:
        self.steps += 1
        if self.t0 is None:
            self.t0 = time.time()
        if time.time() - self.t0 > a.seconds:
            self.trainer.should_stop = True

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=3e-4)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(Tokens(), batch_size=a.batch, num_workers=a.workers, shuffle=True)


lm = LM()
L.Trainer(accelerator="gpu" if torch.cuda.is_available() else "cpu", devices=1,
          precision=a.precision, accumulate_grad_batches=a.accum, max_epochs=1,
          enable_checkpointing=False, logger=False, enable_model_summary=False).fit(lm)
if a.out:
    with open(a.out, "w") as f:
        json.dump({"micro_batches": lm.steps, "batch": a.batch}, f)

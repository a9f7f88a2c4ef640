"""Lightning as people write it when they want a metric the framework does not give: a
transformer-encoder classifier in bf16-mixed whose on_train_batch_end callback keeps the
batches' predictions and every 50 batches computes a "metric" over them on the CPU in
pure Python (~1.5 s), while the GPU waits. ``--val-every N`` also validates every N
batches (``val_check_interval=N``) on ``--val-samples`` at ``--val-batch``, timed."""
import argparse
import json
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=64)
p.add_argument("--every", type=int, default=50)
p.add_argument("--metric-seconds", type=float, default=1.5)
p.add_argument("--val-every", type=int, default=0,
               help="validate every N training batches (val_check_interval=N; 0: never)")
p.add_argument("--val-samples", type=int, default=2048)
p.add_argument("--val-batch", type=int, default=8)
p.add_argument("--seconds", type=float, default=45)
p.add_argument("--out")
a = p.parse_args()
t0 = time.time()
truth = {"metric_seconds": 0.0, "metrics": 0}


class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(32000, 512)
        layer = torch.nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
        self.enc = torch.nn.TransformerEncoder(layer, 6)
        self.head = torch.nn.Linear(512, 2)

    def forward(self, x):
        return self.head(self.enc(self.emb(x)).mean(1))

    def training_step(self, b, i):
        x, y = b
        logits = self(x)
        loss = torch.nn.functional.cross_entropy(logits, y)
        self.log("loss", loss)
        return {"loss": loss, "preds": logits.argmax(-1).detach(), "y": y}

    def validation_step(self, b, i):
        x, y = b
        return torch.nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


class HostMetric(Callback):
    """Keeps each batch's predictions; every `every` batches, a metric in pure Python."""

    def __init__(self):
        self.preds, self.ys = [], []

    def on_train_batch_end(self, trainer, module, outputs, batch, i):
        self.preds.append(outputs["preds"].cpu())
        self.ys.append(outputs["y"].cpu())
        if (i + 1) % a.every == 0:
            m0 = time.perf_counter()
            preds = torch.cat(self.preds).tolist()
            ys = torch.cat(self.ys).tolist()
            score = 0.0
            while time.perf_counter() - m0 < a.metric_seconds:  # a slow metric
                score += sum(1.0 for p_, y_ in zip(preds, ys, strict=True) if p_ == y_) / len(ys)
            self.preds, self.ys = [], []
            truth["metric_seconds"] += time.perf_counter() - m0
            truth["metrics"] += 1
        if time.time() - t0 > a.seconds:
            trainer.should_stop = True

    def on_validation_start(self, trainer, module):
        self.v0 = time.perf_counter()

    def on_validation_end(self, trainer, module):
        truth["eval_seconds"] = truth.get("eval_seconds", 0.0) + time.perf_counter() - self.v0
        truth["evals"] = truth.get("evals", 0) + 1


def data(n):
    return TensorDataset(torch.randint(0, 32000, (n, 128)), torch.randint(0, 2, (n,)))


validating = dict(val_check_interval=a.val_every, num_sanity_val_steps=0) if a.val_every \
    else dict(limit_val_batches=0)
tr = L.Trainer(accelerator="gpu", devices=1, precision="bf16-mixed", max_epochs=100,
               log_every_n_steps=10, callbacks=[HostMetric()], enable_progress_bar=False,
               enable_checkpointing=False, logger=False, **validating)
val = DataLoader(data(a.val_samples), batch_size=a.val_batch, num_workers=2, pin_memory=True,
                 persistent_workers=True) if a.val_every else None
tr.fit(Net(), DataLoader(data(200_000), batch_size=a.batch, shuffle=True, num_workers=4,
                         pin_memory=True, persistent_workers=True), val)
truth.update(steps=tr.global_step, wall_seconds=time.time() - t0)
if a.out:
    with open(a.out, "w") as f:
        json.dump(truth, f)

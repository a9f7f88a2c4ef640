"""Lightning: a transformer-encoder classifier in 16-mixed, validating every 40 steps and
saving every 40 steps (ModelCheckpoint, every checkpoint kept), 4 workers."""
import argparse
import json
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=64)
p.add_argument("--seconds", type=float, default=45)
p.add_argument("--precision", default="16-mixed")
p.add_argument("--out")
a = p.parse_args()
t0 = time.time()

class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(32000, 768)
        layer = torch.nn.TransformerEncoderLayer(768, 12, 3072, batch_first=True)
        self.enc = torch.nn.TransformerEncoder(layer, 12)
        self.head = torch.nn.Linear(768, 2)
    def forward(self, x):
        return self.head(self.enc(self.emb(x)).mean(1))
    def training_step(self, b, i):
        x, y = b
        loss = torch.nn.functional.cross_entropy(self(x), y)
        self.log("loss", loss)
        return loss
    def validation_step(self, b, i):
        x, y = b
        self.log("val_loss", torch.nn.functional.cross_entropy(self(x), y))
    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4)

class Stop(Callback):
    def on_train_batch_end(self, trainer, *args):
        if time.time() - t0 > a.seconds:
            trainer.should_stop = True

def data(n):
    return TensorDataset(torch.randint(0, 32000, (n, 128)), torch.randint(0, 2, (n,)))

tr = L.Trainer(accelerator="gpu", devices=1, precision=a.precision, max_epochs=100,
               val_check_interval=40, limit_val_batches=20, log_every_n_steps=10,
               callbacks=[ModelCheckpoint(dirpath="/tmp/n_ckpt", every_n_train_steps=40, save_top_k=-1), Stop()],
               enable_progress_bar=False)
tr.fit(Net(), DataLoader(data(100_000), batch_size=a.batch, shuffle=True, num_workers=4),
       DataLoader(data(4096), batch_size=a.batch, num_workers=4))
if a.out:
    with open(a.out, "w") as f:
        json.dump({"steps": tr.global_step, "wall_seconds": time.time() - t0}, f)

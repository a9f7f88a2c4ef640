"""Lightning: fit a ResNet-18 on 64x64 images (bf16-mixed, 4 workers) for a while, then
trainer.test() over a large test set, as a tutorial ends."""
import argparse
import json
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader, Dataset
from torchvision import models

p = argparse.ArgumentParser()
p.add_argument("--seconds", type=float, default=25)
p.add_argument("--test-samples", type=int, default=200_000)
p.add_argument("--out")
a = p.parse_args()
t0 = time.time()

class Images(Dataset):
    def __init__(self, n):
        self.n = n
    def __len__(self):
        return self.n
    def __getitem__(self, i):
        return torch.randn(3, 64, 64), i % 10

class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.m = models.resnet18(num_classes=10)
    def training_step(self, b, i):
        x, y = b
        loss = torch.nn.functional.cross_entropy(self.m(x), y)
        self.log("loss", loss)
        return loss
    def test_step(self, b, i):
        x, y = b
        self.log("test_acc", (self.m(x).argmax(-1) == y).float().mean())
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

truth = {}
class Clock(Callback):
    def on_train_batch_end(self, trainer, *args):
        if time.time() - t0 > a.seconds:
            trainer.should_stop = True
    def on_test_start(self, *args):
        self.t = time.perf_counter()
    def on_test_end(self, *args):
        truth["test_seconds"] = time.perf_counter() - self.t

tr = L.Trainer(accelerator="gpu", devices=1, precision="bf16-mixed", max_epochs=100,
               enable_progress_bar=False, enable_checkpointing=False, callbacks=[Clock()])
net = Net()
tr.fit(net, DataLoader(Images(1_000_000), batch_size=256, shuffle=True, num_workers=4))
truth["steps"] = tr.global_step
tr.test(net, DataLoader(Images(a.test_samples), batch_size=256, num_workers=4))
truth["wall_seconds"] = time.time() - t0
if a.out:
    with open(a.out, "w") as f:
        json.dump(truth, f)

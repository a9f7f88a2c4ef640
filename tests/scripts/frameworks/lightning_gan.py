"""A GAN in Lightning's manual optimization, in the shape of Lightning's own GAN example
(``automatic_optimization = False``, ``self.optimizers()``, ``toggle_optimizer``,
``manual_backward``): each batch steps the generator's Adam, then the discriminator's,
each after its own ``backward()``, on synthetic 28x28 images; a validation of the
discriminator at each epoch's end (``--val``). ``--iterable`` streams the images from an
``IterableDataset`` (no length: the loader's epochs end where the stream does).

The script's own clock (--out): iterations (one per batch, two optimizer steps each;
Lightning's ``global_step`` counts both), the samples they trained on, the validations'
seconds. Runs until ``--seconds``, on the GPU if there is one."""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
from _truth import Truth, lightning_clock  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--seconds", type=float, default=10.0)
p.add_argument("--batch", type=int, default=64)
p.add_argument("--samples", type=int, default=6400, help="an epoch's")
p.add_argument("--workers", type=int, default=2)
p.add_argument("--latent", type=int, default=64)
p.add_argument("--val", action="store_true")
p.add_argument("--iterable", action="store_true")
p.add_argument("--out")
a = p.parse_args()
truth = Truth(a.out)
torch.manual_seed(0)
PIXELS = 28 * 28


def mlp(*widths: int) -> torch.nn.Sequential:
    layers: list[torch.nn.Module] = []
    for i, (w_in, w_out) in enumerate(zip(widths, widths[1:], strict=False)):
        layers.append(torch.nn.Linear(w_in, w_out))
        if i < len(widths) - 2:
            layers.append(torch.nn.LeakyReLU(0.2))
    return torch.nn.Sequential(*layers)


class GAN(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.generator = torch.nn.Sequential(mlp(a.latent, 256, 512, PIXELS), torch.nn.Tanh())
        self.discriminator = mlp(PIXELS, 512, 256, 1)
        self.iterations = 0
        self.samples = 0

    def adversarial(self, logits: torch.Tensor, real: bool) -> torch.Tensor:
        target = torch.ones_like(logits) if real else torch.zeros_like(logits)
        return torch.nn.functional.binary_cross_entropy_with_logits(logits, target)

    def training_step(self, batch: tuple[torch.Tensor], _i: int) -> None:
        (images,) = batch
        opt_g, opt_d = self.optimizers()
        z = torch.randn(images.shape[0], a.latent, device=self.device)
        self.toggle_optimizer(opt_g)
        fake = self.generator(z)
        g_loss = self.adversarial(self.discriminator(fake), True)
        self.manual_backward(g_loss)
        opt_g.step()
        opt_g.zero_grad()
        self.untoggle_optimizer(opt_g)
        self.toggle_optimizer(opt_d)
        d_loss = (self.adversarial(self.discriminator(images), True)
                  + self.adversarial(self.discriminator(fake.detach()), False)) / 2
        self.manual_backward(d_loss)
        opt_d.step()
        opt_d.zero_grad()
        self.untoggle_optimizer(opt_d)
        self.iterations += 1
        self.samples += images.shape[0]

    def validation_step(self, batch: tuple[torch.Tensor], _i: int) -> torch.Tensor:
        (images,) = batch
        return self.adversarial(self.discriminator(images), True)

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        return [torch.optim.Adam(self.generator.parameters(), lr=2e-4, betas=(0.5, 0.999)),
                torch.optim.Adam(self.discriminator.parameters(), lr=2e-4, betas=(0.5, 0.999))]


class Stream(torch.utils.data.IterableDataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):  # noqa: ANN204
        info = torch.utils.data.get_worker_info()
        k, w = (0, 1) if info is None else (info.id, info.num_workers)
        g = torch.Generator().manual_seed(k)
        for _ in range(k, self.n, w):
            yield (torch.rand(PIXELS, generator=g) * 2 - 1,)


def loader(n: int, shuffle: bool) -> torch.utils.data.DataLoader:
    data = Stream(n) if a.iterable else \
        torch.utils.data.TensorDataset(torch.rand(n, PIXELS) * 2 - 1)
    return torch.utils.data.DataLoader(data, batch_size=a.batch,
                                       shuffle=shuffle and not a.iterable,
                                       num_workers=a.workers, persistent_workers=a.workers > 0)


class Stop(pl.Callback):
    def on_train_batch_end(self, trainer, *_args) -> None:  # noqa: ANN001
        if time.time() - truth.t0 > a.seconds:
            trainer.should_stop = True


model = GAN()
trainer = pl.Trainer(max_epochs=10_000, accelerator="auto", devices=1, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, num_sanity_val_steps=0,
                     limit_val_batches=1.0 if a.val else 0,
                     callbacks=[lightning_clock(truth)(), Stop()])
trainer.fit(model, loader(a.samples, True), loader(a.samples // 4, False) if a.val else None)
truth.write(steps=model.iterations, samples=model.samples, global_step=trainer.global_step)
print("trained", model.iterations, "iterations", file=sys.stderr)

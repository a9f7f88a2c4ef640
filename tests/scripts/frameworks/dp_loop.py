"""A hand-written loop that spreads a timm ResNet over every GPU with
``torch.nn.DataParallel`` (one process, the replicas run in threads, the batch scattered
from and the outputs gathered on GPU 0), as older tutorials write it; ``--ddp`` runs the
same loop as one torchrun rank per GPU with ``DistributedDataParallel`` at the same
per-GPU batch, for comparison. bf16 autocast, AdamW, uint8 images from DataLoader workers,
normalized on the GPU. The loop's own clock is the truth (--out).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from _truth import Truth  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--seconds", type=float, default=45.0)
p.add_argument("--batch", type=int, default=128, help="per GPU")
p.add_argument("--model", default="resnet50")
p.add_argument("--workers", type=int, default=8)
p.add_argument("--ddp", action="store_true", help="one torchrun rank per GPU instead")
p.add_argument("--no-cudnn-benchmark", action="store_true")
p.add_argument("--cpu", action="store_true", help="a tiny CNN on the CPU (the tests)")
p.add_argument("--out")
a = p.parse_args()

truth = Truth(a.out)
if a.cpu:
    dev, n_gpu = torch.device("cpu"), 1
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=4), torch.nn.ReLU(),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                torch.nn.Linear(8, 100))
    size = 32
else:
    import timm

    torch.backends.cudnn.benchmark = not a.no_cudnn_benchmark
    if a.ddp:
        torch.distributed.init_process_group("nccl")
        local = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local)
        dev, n_gpu = torch.device("cuda", local), 1
    else:
        dev, n_gpu = torch.device("cuda", 0), torch.cuda.device_count()
    model = timm.create_model(a.model, pretrained=False, num_classes=100).to(dev)
    size = 224
if a.ddp:
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index])
else:
    model = torch.nn.DataParallel(model)  # on the CPU it calls the module as it is
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)


class Images(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 1 << 20

    def __getitem__(self, i: int):  # noqa: ANN204
        g = torch.Generator().manual_seed(i)
        return torch.randint(0, 256, (3, size, size), dtype=torch.uint8, generator=g), i % 100


sampler = (torch.utils.data.distributed.DistributedSampler(Images()) if a.ddp else None)
loader = torch.utils.data.DataLoader(
    Images(), batch_size=a.batch * n_gpu, num_workers=a.workers, pin_memory=not a.cpu,
    sampler=sampler, shuffle=sampler is None, persistent_workers=a.workers > 0,
    drop_last=True)
end = time.monotonic() + a.seconds
steps = 0
for x, y in loader:
    x = x.to(dev, non_blocking=True).float().div_(255)
    y = y.to(dev, non_blocking=True)
    with torch.autocast(dev.type, dtype=torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    steps += 1
    if a.ddp:  # every rank stops at the same step: a rank left in an all-reduce hangs
        if steps % 10 == 0:
            late = torch.tensor([float(time.monotonic() > end)], device=dev)
            torch.distributed.all_reduce(late, op=torch.distributed.ReduceOp.MAX)
            if late.item():
                break
    elif time.monotonic() > end:
        break
truth.write(steps=steps, batch=a.batch * n_gpu, gpus=n_gpu)
print("trained", steps, "steps", file=sys.stderr)
if a.ddp:
    torch.distributed.destroy_process_group()

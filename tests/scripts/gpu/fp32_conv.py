"""ResNet-50 in fp32 the way pytorch/examples/imagenet trains it: no autocast, cuDNN's
default TF32 for convolutions (so the FP32 pipe looks idle), SGD with momentum. Data is
synthetic and already on the GPU in batches, so the GPU stays busy."""

import argparse
import time

import torch
from _truth import Truth
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--seconds", type=float, default=50)
p.add_argument("--batch", type=int, default=64)
p.add_argument("--truth")
a = p.parse_args()
dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")

try:
    import torchvision

    model = torchvision.models.resnet50(weights=None)
except ImportError:  # a CPU dev box without torchvision: a small stand-in conv net
    model = nn.Sequential(nn.Conv2d(3, 16, 7, 4, 3), nn.BatchNorm2d(16), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 1000))
model = model.to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
crit = nn.CrossEntropyLoss()
x = torch.randn(a.batch, 3, 224, 224, device=dev)
y = torch.randint(0, 1000, (a.batch,), device=dev)
truth = Truth(a.truth, script="fp32_conv", batch=a.batch,
              cudnn_tf32=torch.backends.cudnn.allow_tf32,
              matmul_tf32=torch.backends.cuda.matmul.allow_tf32)
end = time.time() + a.seconds
i = 0
while time.time() < end:
    loss = crit(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    i += 1
    if i % 10 == 0:
        loss.item()  # the example's meters read the loss every print_freq steps
    truth.step()
truth.end = "exited"

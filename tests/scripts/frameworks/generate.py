"""A process that only serves a model: a tiny GPT-2 answering one prompt at a time with
``model.generate`` under ``torch.no_grad`` (no backward, no optimizer), as a
notebook's or a service's inference loop does.

``--device-map auto`` loads it the way a model too large for one GPU is loaded,
``from_pretrained(..., device_map="auto", max_memory=...)``, with each GPU allowed
``--gpu-mib`` MiB, so its layers are spread over every GPU (accelerate's dispatch: one
process, the GPUs in turn)."""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from _truth import Truth  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--seconds", type=float, default=30.0)
p.add_argument("--batch", type=int, default=1)
p.add_argument("--new-tokens", type=int, default=16)
p.add_argument("--width", type=int, default=64)
p.add_argument("--layers", type=int, default=2)
p.add_argument("--device-map", choices=("none", "auto"), default="none")
p.add_argument("--gpu-mib", type=int, default=0, help="max_memory per GPU for device_map")
p.add_argument("--out")
a = p.parse_args()

truth = Truth(a.out)
torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
config = GPT2Config(n_embd=a.width, n_layer=a.layers, n_head=max(2, a.width // 64),
                    vocab_size=1000, n_positions=128)
if a.device_map == "auto":
    import tempfile

    with tempfile.TemporaryDirectory() as where:
        GPT2LMHeadModel(config).save_pretrained(where)
        gpus = torch.cuda.device_count()
        memory = {i: f"{a.gpu_mib}MiB" for i in range(gpus)} if a.gpu_mib else None
        model = GPT2LMHeadModel.from_pretrained(where, device_map="auto",
                                                max_memory=memory).eval()
    print("device map:", sorted(set(getattr(model, "hf_device_map", {}).values()), key=str),
          file=sys.stderr)
else:
    model = GPT2LMHeadModel(config).to(device).eval()
calls = 0
end = time.monotonic() + a.seconds
with torch.no_grad():
    while time.monotonic() < end:
        prompt = torch.randint(0, 1000, (a.batch, 8), device=device)
        model.generate(prompt, max_new_tokens=a.new_tokens, do_sample=False, pad_token_id=0)
        calls += 1
truth.write(generate_calls=calls, batch=a.batch)
print("generated", calls, "times", file=sys.stderr)

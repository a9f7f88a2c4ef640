"""Inference the way many scripts write it: no DataLoader, no generate(). A BERT encoder
(transformers, built from a config: no download) is switched to eval mode and fed slices
of a token tensor already on the GPU, ``--batch`` rows per forward pass, under
``torch.inference_mode()``, its pooled output kept. ``--bf16`` casts the model first.

The script's own truth (--out): the forward passes made and the rows they held.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from _truth import Truth  # noqa: E402
from transformers import BertConfig, BertModel  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--hidden", type=int, default=768)
p.add_argument("--layers", type=int, default=12)
p.add_argument("--seq", type=int, default=128)
p.add_argument("--rows", type=int, default=8192, help="rows scored per round")
p.add_argument("--batch", type=int, default=32, help="rows per forward pass")
p.add_argument("--bf16", action="store_true")
p.add_argument("--seconds", type=float, default=30.0)
p.add_argument("--out")
a = p.parse_args()

truth = Truth(a.out)
device = "cuda" if torch.cuda.is_available() else "cpu"
config = BertConfig(hidden_size=a.hidden, num_hidden_layers=a.layers,
                    num_attention_heads=max(1, a.hidden // 64), intermediate_size=4 * a.hidden,
                    vocab_size=30522)
model = BertModel(config).to(device)
if a.bf16:
    model = model.to(torch.bfloat16)
model.eval()
ids = torch.randint(1000, 30000, (a.rows, a.seq), device=device)
mask = torch.ones_like(ids)
passes = rows = rounds = 0
end = time.monotonic() + a.seconds
with torch.inference_mode():
    while time.monotonic() < end:
        kept = []
        for i in range(0, a.rows, a.batch):
            out = model(input_ids=ids[i:i + a.batch], attention_mask=mask[i:i + a.batch])
            kept.append(out.pooler_output)
            passes += 1
            rows += min(a.batch, a.rows - i)
            if time.monotonic() >= end:
                break
        torch.cat(kept).float().mean().item()
        rounds += 1
truth.write(passes=passes, rows=rows, rounds=rounds, batch=a.batch)
print("scored", rows, "rows in", passes, "forward passes", file=sys.stderr)

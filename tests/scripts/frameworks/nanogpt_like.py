"""A loop laid out as nanoGPT's train.py (written here from its shape, not its code): a
GPT-2-small-sized model of its own (12 layers, 768 wide, 1024 tokens, flash attention
through scaled_dot_product_attention), batches drawn by get_batch() from a memmap of
tokens with torch.randint (no DataLoader), pinned and copied non_blocking, bf16 autocast,
fused AdamW, gradient accumulation over ``--accum`` micro-steps, loss.item() every 10
optimizer steps, and estimate_loss() every ``--eval-every`` steps: ``--eval-iters``
forward passes on train and val batches under torch.no_grad() with model.eval()."""
import argparse
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _truth import Truth  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=12)
p.add_argument("--accum", type=int, default=5)
p.add_argument("--block", type=int, default=1024)
p.add_argument("--layers", type=int, default=12)
p.add_argument("--width", type=int, default=768)
p.add_argument("--eval-every", type=int, default=50)
p.add_argument("--eval-iters", type=int, default=20)
p.add_argument("--seconds", type=float, default=45)
p.add_argument("--data", default="/tmp/nanogpt_like_tokens.bin")
p.add_argument("--out")
a = p.parse_args()
truth = Truth(a.out)
dev = "cuda"
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
if not os.path.exists(a.data):
    np.random.default_rng(0).integers(0, 50257, 50_000_000, dtype=np.uint16).tofile(a.data)


def get_batch(split):
    data = np.memmap(a.data, dtype=np.uint16, mode="r")
    n = len(data) * 9 // 10
    lo, hi = (0, n) if split == "train" else (n, len(data))
    ix = torch.randint(lo, hi - a.block - 1, (a.batch,))
    x = torch.stack([torch.from_numpy(data[i:i + a.block].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + a.block].astype(np.int64)) for i in ix])
    return (x.pin_memory().to(dev, non_blocking=True), y.pin_memory().to(dev, non_blocking=True))


class Block(nn.Module):
    def __init__(self, w, heads):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(w), nn.LayerNorm(w)
        self.qkv, self.proj = nn.Linear(w, 3 * w), nn.Linear(w, w)
        self.fc, self.out = nn.Linear(w, 4 * w), nn.Linear(4 * w, w)
        self.heads = heads

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(50304, a.width), nn.Embedding(a.block, a.width)
        self.blocks = nn.ModuleList(Block(a.width, 12) for _ in range(a.layers))
        self.ln = nn.LayerNorm(a.width)
        self.head = nn.Linear(a.width, 50304, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


model = GPT().to(dev)
for m in model.modules():
    if isinstance(m, (nn.Linear, nn.Embedding)):
        nn.init.normal_(m.weight, std=0.02)
opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1,
                        fused=True)
ctx = torch.autocast("cuda", dtype=torch.bfloat16)


@torch.no_grad()
def estimate_loss():
    model.eval()
    out = {}
    for split in ("train", "val"):
        losses = torch.zeros(a.eval_iters)
        for k in range(a.eval_iters):
            x, y = get_batch(split)
            with ctx:
                losses[k] = model(x, y).item()
        out[split] = losses.mean().item()
    model.train()
    return out


x, y = get_batch("train")
step = 0
t0 = time.time()
while time.time() - t0 < a.seconds:
    lr = 6e-4 * min(1.0, (step + 1) / 100) * (0.5 + 0.5 * math.cos(math.pi * min(step, 5000) / 5000))
    for g in opt.param_groups:
        g["lr"] = lr
    if step % a.eval_every == 0 and step > 0:
        truth.eval_begins()
        losses = estimate_loss()
        truth.eval_ends()
        print(f"step {step}: train {losses['train']:.4f} val {losses['val']:.4f}", flush=True)
    for _micro in range(a.accum):
        with ctx:
            loss = model(x, y) / a.accum
        x, y = get_batch("train")  # the next batch while the GPU works
        loss.backward()
        truth.data["micro_batches"] += 1
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    step += 1
    truth.data["steps"] = step
    if step % 10 == 0:
        print(f"iter {step}: loss {loss.item() * a.accum:.4f}", flush=True)
torch.cuda.synchronize()
truth.write(batch=a.batch, accum=a.accum)

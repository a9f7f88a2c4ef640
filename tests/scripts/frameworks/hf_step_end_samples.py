"""A Trainer run with a TrainerCallback that every 40 steps writes "samples" for a person
to read: the host decodes and formats a batch's worth of text in pure Python (~1.2 s)
while the GPU waits. A small GPT-2 from its config on random tokens, batch 16, bf16."""
import argparse
import json
import time

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=16)
p.add_argument("--every", type=int, default=40)
p.add_argument("--sample-seconds", type=float, default=1.2)
p.add_argument("--seconds", type=float, default=45)
p.add_argument("--out")
a = p.parse_args()
t0 = time.time()


class Tokens(Dataset):
    def __init__(self, n, seq=256):
        g = torch.Generator().manual_seed(n)
        self.ids = torch.randint(0, 50257, (n, seq), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


truth = {"steps": 0, "sample_seconds": 0.0, "samples": 0}
vocab = [f"tok{i}" for i in range(50257)]


class Samples(TrainerCallback):
    def on_step_end(self, args, state, control, **kw):
        truth["steps"] = state.global_step
        if state.global_step % a.every == 0:
            s0 = time.perf_counter()
            ids = torch.randint(0, 50257, (16, 256)).tolist()
            lines = []
            while time.perf_counter() - s0 < a.sample_seconds:  # "decode" and format
                lines = [" ".join(vocab[t] for t in row).title() for row in ids]
            truth["sample_seconds"] += time.perf_counter() - s0
            truth["samples"] += 1
            del lines
        if time.time() - t0 > a.seconds:
            control.should_training_stop = True


model = GPT2LMHeadModel(GPT2Config(n_layer=6, n_embd=512, n_head=8))
args = TrainingArguments(output_dir="/tmp/n_samples", per_device_train_batch_size=a.batch,
                         bf16=True, logging_steps=10, save_strategy="no", max_steps=100000,
                         dataloader_num_workers=2, report_to=[], learning_rate=3e-4)
tr = Trainer(model=model, args=args, train_dataset=Tokens(100_000), callbacks=[Samples()])
tr.train()
truth["wall_seconds"] = time.time() - t0
if a.out:
    with open(a.out, "w") as f:
        json.dump(truth, f)

"""A Trainer run as a tutorial writes it: a small GPT-2 from its config on random tokens,
micro-batch 4 with 8 accumulation steps, bf16, evaluating every 25 steps at batch 32."""
import argparse
import json
import time

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=4)
p.add_argument("--accum", type=int, default=8)
p.add_argument("--eval-steps", type=int, default=25)
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

truth = {"steps": 0, "eval_seconds": 0.0, "evals": 0}
class Clock(TrainerCallback):
    def on_step_end(self, args, state, control, **kw):
        truth["steps"] = state.global_step
        self.e0 = time.perf_counter()
        if time.time() - t0 > a.seconds:
            control.should_training_stop = True
    def on_evaluate(self, args, state, control, **kw):
        truth["eval_seconds"] += time.perf_counter() - self.e0
        truth["evals"] += 1

model = GPT2LMHeadModel(GPT2Config(n_layer=6, n_embd=512, n_head=8))
args = TrainingArguments(output_dir="/tmp/n_gpt", per_device_train_batch_size=a.batch,
                         gradient_accumulation_steps=a.accum, per_device_eval_batch_size=32,
                         bf16=True, eval_strategy="steps", eval_steps=a.eval_steps,
                         logging_steps=5, save_strategy="no", max_steps=100000,
                         dataloader_num_workers=2, report_to=[], learning_rate=3e-4)
tr = Trainer(model=model, args=args, train_dataset=Tokens(200_000), eval_dataset=Tokens(512),
             callbacks=[Clock()])
tr.train()
truth["wall_seconds"] = time.time() - t0
if a.out:
    with open(a.out, "w") as f:
        json.dump(truth, f)

"""The Trainer trains a small BERT classifier, then evaluates and predicts over a test set
(the common end of a fine-tuning script)."""
import argparse
import json
import time

import torch
from torch.utils.data import Dataset
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

p = argparse.ArgumentParser()
p.add_argument("--seconds", type=float, default=25)
p.add_argument("--test", type=int, default=16384)
p.add_argument("--out")
a = p.parse_args()
t0 = time.time()

class Texts(Dataset):
    def __init__(self, n, seq=128):
        g = torch.Generator().manual_seed(n)
        self.ids = torch.randint(1000, 30000, (n, seq), generator=g)
        self.y = torch.randint(0, 2, (n,), generator=g)
    def __len__(self):
        return len(self.ids)
    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]), "labels": self.y[i]}

truth = {}
class Clock(TrainerCallback):
    def on_step_end(self, args, state, control, **kw):
        truth["steps"] = state.global_step
        if time.time() - t0 > a.seconds:
            control.should_training_stop = True

model = BertForSequenceClassification(BertConfig(hidden_size=512, num_hidden_layers=6, num_attention_heads=8, intermediate_size=2048))
args = TrainingArguments(output_dir="/tmp/n_bert", per_device_train_batch_size=32, per_device_eval_batch_size=8,
                         bf16=True, eval_strategy="no", save_strategy="no", max_steps=100000,
                         logging_steps=50, report_to=[], dataloader_num_workers=2)
tr = Trainer(model=model, args=args, train_dataset=Texts(100_000), callbacks=[Clock()])
tr.train()
e0 = time.perf_counter()
tr.evaluate(Texts(2048))
tr.predict(Texts(a.test))
truth["after_seconds"] = time.perf_counter() - e0
truth["wall_seconds"] = time.time() - t0
if a.out:
    with open(a.out, "w") as f:
        json.dump(truth, f)

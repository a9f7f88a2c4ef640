"""A tiny T5 fine-tuned by the Hugging Face ``Seq2SeqTrainer`` on random token pairs, its
evaluations generating (``predict_with_generate=True``), on the CPU or a GPU.

What a user of the summarization or translation examples writes: evaluation every few
steps that runs ``generate()`` on each batch. ``--evaluate-first`` calls
``trainer.evaluate()`` before ``trainer.train()`` (a baseline's metrics);
``--eval-on-start`` sets ``eval_on_start=True`` (the Trainer evaluates once before its
first step, its optimizer already built). A TrainerCallback times the evaluations inside
training (the script's own truth, --out); the evaluation before training is timed apart
(``first_eval_seconds``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=40)
p.add_argument("--batch", type=int, default=8)
p.add_argument("--eval-batch", type=int, default=8)
p.add_argument("--eval-every", type=int, default=20)
p.add_argument("--eval-samples", type=int, default=64)
p.add_argument("--gen-len", type=int, default=24, help="generation_max_length")
p.add_argument("--width", type=int, default=64, help="d_model")
p.add_argument("--layers", type=int, default=2)
p.add_argument("--seq", type=int, default=32)
p.add_argument("--evaluate-first", action="store_true")
p.add_argument("--eval-on-start", action="store_true")
p.add_argument("--no-eval", action="store_true",
               help='eval_strategy="no": no evaluation inside training (nor at its end)')
p.add_argument("--bf16", action="store_true")
p.add_argument("--workers", type=int, default=0)
p.add_argument("--seconds", type=float, default=None,
               help="stop training after this long (the Trainer stops at a step's end)")
p.add_argument("--out")
a = p.parse_args()

from _truth import Truth, trainer_clock  # noqa: E402
from transformers import (  # noqa: E402
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    T5Config,
    T5ForConditionalGeneration,
)

truth = Truth(a.out)
torch.manual_seed(0)
VOCAB = 1000


class Pairs(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(n)
        self.x = torch.randint(5, VOCAB, (n, a.seq), generator=g)
        self.y = torch.randint(5, VOCAB, (n, a.seq // 2), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.x[i], "attention_mask": torch.ones(a.seq, dtype=torch.long),
                "labels": self.y[i]}


Clock = trainer_clock(truth, a.seconds, first_eval=a.eval_on_start)


def lengths(ev) -> dict:  # noqa: ANN001
    """compute_metrics: the generated lengths (the predictions are token ids)."""
    preds = ev.predictions
    return {"gen_len": float((preds > 1).sum() / max(len(preds), 1))}


config = T5Config(vocab_size=VOCAB, d_model=a.width, d_kv=a.width // 8, d_ff=4 * a.width,
                  num_layers=a.layers, num_heads=8, decoder_start_token_id=0,
                  pad_token_id=0, eos_token_id=1)
model = T5ForConditionalGeneration(config)
args = Seq2SeqTrainingArguments(
    output_dir=os.path.join(os.environ.get("TMPDIR", "/tmp"), f"s2s-{os.getpid()}"),
    max_steps=a.steps, per_device_train_batch_size=a.batch,
    per_device_eval_batch_size=a.eval_batch, eval_strategy="no" if a.no_eval else "steps",
    eval_steps=a.eval_every,
    eval_on_start=a.eval_on_start, predict_with_generate=True,
    generation_max_length=a.gen_len, logging_steps=1000, save_strategy="no", report_to=[],
    learning_rate=1e-4, dataloader_num_workers=a.workers, bf16=a.bf16,
    use_cpu=not torch.cuda.is_available(), disable_tqdm=True, seed=0)
trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=Pairs(a.steps * a.batch),
                         eval_dataset=Pairs(a.eval_samples), callbacks=[Clock()],
                         compute_metrics=lengths)
if a.evaluate_first:
    t = time.perf_counter()
    trainer.evaluate()
    truth.data["first_eval_seconds"] = time.perf_counter() - t
trainer.train()
truth.write(batch=a.batch, eval_batch=a.eval_batch)
print("trained", truth.data["steps"], "steps", file=sys.stderr)

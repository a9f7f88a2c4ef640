"""TRL's trainers on a small GPT-2 from its config, on text without a download (a word-level
tokenizer over _words.py's list), on the CPU or a GPU, ``--trainer``:

- ``sft``: ``SFTTrainer`` on plain text (``SFTConfig``: its own defaults, e.g. the loss
  over every token, ``max_length``), evaluating every ``--eval-every`` steps;
- ``grpo``: ``GRPOTrainer`` with a reward function of the completion's length: each step
  generates ``--generations`` completions per prompt with the policy itself
  (``generate()`` under ``no_grad`` inside the training step), scores them and trains on
  them.

A TrainerCallback counts the steps and times the evaluations (the script's truth, --out);
for grpo also the generation's seconds (``generate_seconds``, ``generate_calls``; the
first call's alone, ``generate_first_seconds``), which are the steps' own work."""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--trainer", choices=["sft", "grpo"], default="sft")
p.add_argument("--steps", type=int, default=20)
p.add_argument("--batch", type=int, default=8)
p.add_argument("--accum", type=int, default=1)
p.add_argument("--eval-every", type=int, default=0, help="steps (0: never)")
p.add_argument("--eval-batch", type=int, default=8)
p.add_argument("--eval-samples", type=int, default=64)
p.add_argument("--generations", type=int, default=4, help="grpo: completions per prompt")
p.add_argument("--new-tokens", type=int, default=16, help="grpo: completion length")
p.add_argument("--hidden", type=int, default=64)
p.add_argument("--layers", type=int, default=2)
p.add_argument("--seq", type=int, default=64)
p.add_argument("--bf16", action="store_true")
p.add_argument("--workers", type=int, default=0)
p.add_argument("--seconds", type=float, default=None)
p.add_argument("--out")
a = p.parse_args()

from _truth import Truth, trainer_clock  # noqa: E402
from _words import WORDS, sentence  # noqa: E402
from datasets import Dataset  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast  # noqa: E402

truth = Truth(a.out)
torch.manual_seed(0)
rng = random.Random(0)

vocab = {w: i for i, w in enumerate(["<pad>", "<unk>", "<eos>", *WORDS])}
core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", unk_token="<unk>",
                              eos_token="<eos>", bos_token="<eos>")
tok.padding_side = "left"
model = GPT2LMHeadModel(GPT2Config(vocab_size=len(vocab), n_embd=a.hidden, n_layer=a.layers,
                                   n_head=2, n_positions=max(256, a.seq + 1), bos_token_id=2,
                                   eos_token_id=2, pad_token_id=0))
Clock = trainer_clock(truth, a.seconds)
common = dict(output_dir=os.path.join(os.environ.get("TMPDIR", "/tmp"), f"trl-{os.getpid()}"),
              max_steps=a.steps, per_device_train_batch_size=a.batch,
              gradient_accumulation_steps=a.accum, per_device_eval_batch_size=a.eval_batch,
              eval_strategy="steps" if a.eval_every else "no", eval_steps=a.eval_every or None,
              logging_steps=1000, save_strategy="no", report_to=[], bf16=a.bf16,
              use_cpu=not torch.cuda.is_available(), dataloader_num_workers=a.workers,
              disable_tqdm=True, seed=0)

if a.trainer == "sft":
    from trl import SFTConfig, SFTTrainer

    n = a.steps * a.batch * a.accum
    train = Dataset.from_dict({"text": [sentence(rng, a.seq) for _ in range(n)]})
    evals = Dataset.from_dict({"text": [sentence(rng, a.seq) for _ in range(a.eval_samples)]})
    trainer = SFTTrainer(model=model, processing_class=tok, train_dataset=train,
                         eval_dataset=evals if a.eval_every else None,
                         args=SFTConfig(max_length=a.seq, **common), callbacks=[Clock()])
else:
    from trl import GRPOConfig, GRPOTrainer

    calls = {"n": 0, "s": 0.0, "first": 0.0}
    orig = model.generate

    def generate(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        t = time.perf_counter()
        try:
            return orig(*args, **kwargs)
        finally:
            took = time.perf_counter() - t
            if not calls["n"]:
                calls["first"] = took
            calls["n"] += 1
            calls["s"] += took

    model.generate = generate

    def longer(completions, **kw):  # noqa: ANN001, ANN003, ANN202
        return [float(len(c.split())) for c in completions]

    prompts = Dataset.from_dict({"prompt": [sentence(rng, 8) for _ in range(a.steps * a.batch)]})
    trainer = GRPOTrainer(model=model, processing_class=tok, reward_funcs=longer,
                          train_dataset=prompts,
                          args=GRPOConfig(num_generations=a.generations,
                                          max_completion_length=a.new_tokens, **common),
                          callbacks=[Clock()])
trainer.train()
extra = {"batch": a.batch, "micro_batches": a.accum}
if a.trainer == "grpo":
    extra.update(generate_calls=calls["n"], generate_seconds=calls["s"],
                 generate_first_seconds=calls["first"])
truth.write(**extra)
print("trained", truth.data["steps"], "steps", file=sys.stderr)

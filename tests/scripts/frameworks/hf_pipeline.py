"""Inference the way the Hugging Face docs first show it: a text-classification
``pipeline`` fed a list of sentences, one sentence per forward pass (the pipeline's
default ``batch_size=1``; ``--batch`` sets it). The model is a BERT classifier built from a
config and the tokenizer a WordPiece one over a word list (_words.py: no download).
The pipeline runs its own DataLoader (``num_workers``, ``--workers``), under
``torch.inference_mode``: no backward, no optimizer.

``--stream`` feeds it a generator instead of a list: the pipeline then hands back its
iterator, which this loop drives (the pipeline's ``__call__`` is no longer on the stack).

The script's own truth (--out): how many sentences were classified, and in how many
rounds over the list.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from _truth import Truth  # noqa: E402
from _words import sentence, word_tokenizer  # noqa: E402
from transformers import (  # noqa: E402
    BertConfig,
    BertForSequenceClassification,
    pipeline,
)

p = argparse.ArgumentParser()
p.add_argument("--hidden", type=int, default=768)
p.add_argument("--layers", type=int, default=12)
p.add_argument("--batch", type=int, default=1, help="the pipeline's batch_size")
p.add_argument("--workers", type=int, default=0, help="the pipeline's num_workers")
p.add_argument("--sentences", type=int, default=2000, help="sentences per round")
p.add_argument("--words", type=int, default=40, help="words per sentence")
p.add_argument("--stream", action="store_true", help="a generator in, an iterator out")
p.add_argument("--seconds", type=float, default=30.0)
p.add_argument("--out")
a = p.parse_args()

truth = Truth(a.out)
rng = random.Random(0)
tokenizer = word_tokenizer()
config = BertConfig(hidden_size=a.hidden, num_hidden_layers=a.layers,
                    num_attention_heads=max(1, a.hidden // 64),
                    intermediate_size=4 * a.hidden, vocab_size=tokenizer.vocab_size,
                    num_labels=2)
model = BertForSequenceClassification(config).eval()
device = 0 if torch.cuda.is_available() else -1
classify = pipeline("text-classification", model=model, tokenizer=tokenizer, device=device)
texts = [sentence(rng, a.words) for _ in range(a.sentences)]
done = rounds = 0
end = time.monotonic() + a.seconds
while time.monotonic() < end:
    feed = (t for t in texts) if a.stream else texts
    for _ in classify(feed, batch_size=a.batch, num_workers=a.workers):
        done += 1
    rounds += 1
truth.write(sentences=done, rounds=rounds, batch=a.batch)
print("classified", done, "sentences in", rounds, "rounds", file=sys.stderr)

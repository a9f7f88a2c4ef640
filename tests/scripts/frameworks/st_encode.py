"""Embedding a corpus with sentence-transformers: ``SentenceTransformer.encode(sentences,
batch_size=...)`` (its default batch is 32), its own loop over slices of the sentences:
no DataLoader, no generate(). The model is a BERT saved here from a config with a
WordPiece tokenizer over a word list (no download); sentence-transformers wraps it with
mean pooling, as it does any plain Hugging Face checkpoint.

The script's own truth (--out): sentences encoded, encode() calls, and the forward passes
those made (one per batch of each call).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from _truth import Truth  # noqa: E402
from _words import sentence, word_tokenizer  # noqa: E402
from sentence_transformers import SentenceTransformer  # noqa: E402
from transformers import BertConfig, BertModel  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--hidden", type=int, default=384)
p.add_argument("--layers", type=int, default=6)
p.add_argument("--batch", type=int, default=32, help="encode()'s batch_size")
p.add_argument("--sentences", type=int, default=4096, help="sentences per encode() call")
p.add_argument("--words", type=int, default=40, help="words per sentence")
p.add_argument("--seconds", type=float, default=30.0)
p.add_argument("--out")
a = p.parse_args()

truth = Truth(a.out)
rng = random.Random(0)
with tempfile.TemporaryDirectory() as where:
    tokenizer = word_tokenizer(where)
    config = BertConfig(hidden_size=a.hidden, num_hidden_layers=a.layers,
                        num_attention_heads=max(1, a.hidden // 64),
                        intermediate_size=4 * a.hidden, vocab_size=tokenizer.vocab_size)
    checkpoint = os.path.join(where, "bert")
    BertModel(config).save_pretrained(checkpoint)
    tokenizer.save_pretrained(checkpoint)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = SentenceTransformer(checkpoint, device=device)
texts = [sentence(rng, rng.randint(a.words // 2, a.words)) for _ in range(a.sentences)]
done = calls = passes = 0
end = time.monotonic() + a.seconds
while time.monotonic() < end:
    model.encode(texts, batch_size=a.batch, convert_to_tensor=True)
    done += len(texts)
    calls += 1
    passes += math.ceil(len(texts) / a.batch)
truth.write(sentences=done, calls=calls, passes=passes, batch=a.batch)
print("encoded", done, "sentences in", calls, "calls", file=sys.stderr)

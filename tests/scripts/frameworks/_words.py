"""Text without a download: a word list, sentences drawn from it, and a WordPiece
tokenizer over it (the scripts that run a BERT on text share these)."""

from __future__ import annotations

import os
import random
import tempfile

WORDS = [f"w{i}" for i in range(5000)]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def word_tokenizer(where: str | None = None):  # noqa: ANN201 (transformers' type)
    """A ``BertTokenizerFast`` over ``WORDS``; its vocab file is written to ``where`` (a
    temporary folder when None, gone once the tokenizer has read it)."""
    from transformers import BertTokenizerFast

    if where is None:
        with tempfile.TemporaryDirectory() as tmp:
            return word_tokenizer(tmp)
    vocab = os.path.join(where, "vocab.txt")
    with open(vocab, "w") as f:
        f.write("\n".join([*SPECIAL, *WORDS]) + "\n")
    return BertTokenizerFast(vocab_file=vocab)


def sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))

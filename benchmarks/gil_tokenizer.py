"""A pure-Python subword tokenizer of the BERT kind: the GIL-bound per-item work that
graph-level worker processes are for (threads cannot run it in parallel).

Basic tokenization as BERT's reference code does it (NFD accent stripping, punctuation
split, character by character), then greedy longest-match WordPiece against the sample's
vocabulary; ids are positions in the vocabulary, unknown pieces map to 1.
"""

from __future__ import annotations

import unicodedata
from functools import lru_cache
from pathlib import Path

import torch

VOCAB = Path(__file__).resolve().parent.parent / "examples/data/text-sample/vocab.txt"


@lru_cache(maxsize=4)
def _vocab(path: str) -> dict[str, int]:
    words = Path(path).read_text(encoding="utf-8").split()
    table = {w.lower(): i + 2 for i, w in enumerate(words)}
    for ch in map(chr, range(32, 127)):
        table.setdefault(ch, len(table) + 2)
    return table


def _basic(text: str) -> list[str]:
    text = "".join(c for c in unicodedata.normalize("NFD", text.lower())
                   if unicodedata.category(c) != "Mn")
    words: list[str] = []
    current: list[str] = []
    for ch in text:
        if ch.isspace() or unicodedata.category(ch).startswith("P") or ch in "$+<=>^`|~":
            if current:
                words.append("".join(current))
                current = []
            if not ch.isspace():
                words.append(ch)
        else:
            current.append(ch)
    if current:
        words.append("".join(current))
    return words


def wordpiece(item: dict, *, vocab: str = str(VOCAB), max_piece: int = 16) -> dict:
    table = _vocab(vocab)
    ids: list[int] = []
    for word in _basic(item["text"]):
        start = 0
        while start < len(word):
            end = min(len(word), start + max_piece)
            while end > start and word[start:end] not in table:
                end -= 1
            if end == start:
                ids.append(1)
                start += 1
            else:
                ids.append(table[word[start:end]])
                start = end
    return {"input_ids": torch.tensor(ids or [1], dtype=torch.long), "index": item["index"]}

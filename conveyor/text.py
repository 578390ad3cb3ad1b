"""Built-in map functions for text: a byte-level and a whitespace/vocabulary tokenizer.

Both take a record (a dict such as ``read_jsonl`` yields, or a bare string) and return
``{"input_ids": 1-D torch.long tensor, ...}`` carrying the record's ``index`` and ``label``
when it has them, ready for ``bucket_batch`` (``length: input_ids``) and ``pad_collate``.
Any user function that returns ids as a list or a 1-D tensor in a field works the same way.

- ``byte_tokenize``: the UTF-8 bytes of the text are the ids (0..255); no vocabulary file.
  ``add_bos``/``add_eos`` add ids 256/257 by default.
- ``vocab_tokenize``: whitespace split, ids from a vocabulary file (one token per line, the
  id is the line number), unknown tokens map to ``unk``. The file is read once per path and
  kept (per process), so a map over millions of records reads it once.

``max_length`` truncates to at most that many ids, specials included (an ``eos`` stays last).
A record without the field, or whose field is not a string, raises ``SampleError`` naming the
record's file and line when it has them.
"""

from __future__ import annotations

import functools
from typing import Any

import fsspec
import torch

from conveyor.errors import SampleError

BOS_ID = 256
EOS_ID = 257
CARRIED = ("index", "label", "file", "line")


def _where(item: Any) -> str:
    if isinstance(item, dict):
        if "file" in item and "line" in item:
            return f"{item['file']}:{item['line']}"
        if "path" in item:
            return str(item["path"])
        if "index" in item:
            return f"item {item['index']}"
    return "item"


def _text(item: Any, field: str) -> str:
    if isinstance(item, str):
        return item
    if not isinstance(item, dict) or field not in item:
        raise SampleError(f"{_where(item)}: no field {field!r} to tokenize"
                          + (f" (fields: {', '.join(map(str, item))})" if isinstance(item, dict) else ""))
    text = item[field]
    if not isinstance(text, str):
        raise SampleError(f"{_where(item)}: field {field!r} is {type(text).__name__}, expected a string")
    return text


def _out(item: Any, ids: torch.Tensor) -> dict[str, Any]:
    out: dict[str, Any] = {"input_ids": ids}
    if isinstance(item, dict):
        for key in CARRIED:
            if key in item:
                out[key] = item[key]
    return out


def _check_max_length(max_length: int | None, specials: int) -> None:
    if max_length is not None and (not isinstance(max_length, int) or max_length <= specials):
        raise ValueError(f"{max_length=} must be an int > {specials} (the special tokens it keeps)")


def _assemble(body: torch.Tensor, bos: int | None, eos: int | None, max_length: int | None) -> torch.Tensor:
    n_special = (bos is not None) + (eos is not None)
    if max_length is not None and body.numel() > max_length - n_special:
        body = body[: max_length - n_special]
    if not n_special:
        return body
    parts = ([torch.tensor([bos], dtype=torch.long)] if bos is not None else []) + [body] + (
        [torch.tensor([eos], dtype=torch.long)] if eos is not None else [])
    return torch.cat(parts)


def byte_tokenize(item: Any, *, field: str = "text", max_length: int | None = None, add_bos: bool = False,
                  add_eos: bool = False, bos_id: int = BOS_ID, eos_id: int = EOS_ID) -> dict[str, Any]:
    """UTF-8 bytes as token ids.

    Args:
        item: a record with a text field, or a string.
        field: the record's text field.
        max_length: keep at most this many ids (specials included); ``None`` keeps all.
        add_bos: start with ``bos_id``.
        add_eos: end with ``eos_id`` (kept last when truncating).
        bos_id: id of the start token (default 256, just past the byte range).
        eos_id: id of the end token (default 257).

    Returns:
        ``{"input_ids": LongTensor[n], "index", "label", "file", "line"}`` (those the item has).

    Example:
        >>> byte_tokenize({"text": "hé", "index": 7})["input_ids"].tolist()
        [104, 195, 169]
        >>> byte_tokenize("abc", max_length=3, add_eos=True)["input_ids"].tolist()
        [97, 98, 257]
    """
    _check_max_length(max_length, add_bos + add_eos)
    data = _text(item, field).encode("utf-8")
    body = torch.frombuffer(bytearray(data), dtype=torch.uint8).long() if data else torch.empty(0, dtype=torch.long)
    ids = _assemble(body, bos_id if add_bos else None, eos_id if add_eos else None, max_length)
    return _out(item, ids)


@functools.lru_cache(maxsize=16)
def load_vocab(path: str) -> dict[str, int]:
    """The vocabulary at ``path`` (local or any fsspec URL) as token -> id, read once per path.

    One token per line; the id is the 0-based line number. A token given twice keeps its first id.
    """
    with fsspec.open(path, "r", encoding="utf-8") as f:
        lines = [ln.rstrip("\r") for ln in f.read().split("\n")]  # not splitlines: \x85, \u2028 are tokens
    vocab: dict[str, int] = {}
    for i, tok in enumerate(lines):
        if tok and tok not in vocab:
            vocab[tok] = i
    if not vocab:
        raise ValueError(f"vocabulary file {path!r} is empty")
    return vocab


def vocab_tokenize(item: Any, *, vocab: str, field: str = "text", max_length: int | None = None,
                   unk: str = "<unk>", bos: str | None = None, eos: str | None = None,
                   lowercase: bool = False) -> dict[str, Any]:
    """Whitespace tokens mapped to ids through a vocabulary file.

    Args:
        item: a record with a text field, or a string.
        vocab: path or URL of the vocabulary (one token per line, id = line number).
        field: the record's text field.
        max_length: keep at most this many ids (specials included).
        unk: the token that unknown words map to; it must be in the vocabulary.
        bos: a start token (e.g. ``"<bos>"``) to add, or ``None``.
        eos: an end token to add (kept last when truncating), or ``None``.
        lowercase: lowercase the text before the lookup.

    Example:
        >>> vocab_tokenize("the cat", vocab="examples/data/text-sample/vocab.txt")["input_ids"].shape
        torch.Size([2])
    """
    table = load_vocab(str(vocab))
    specials = []
    for name, tok in (("unk", unk), ("bos", bos), ("eos", eos)):
        if tok is not None and tok not in table:
            raise ValueError(f"{name}={tok!r} is not in the vocabulary {vocab!r}")
        specials.append(None if tok is None else table[tok])
    unk_id, bos_id, eos_id = specials
    _check_max_length(max_length, (bos is not None) + (eos is not None))
    text = _text(item, field)
    if lowercase:
        text = text.lower()
    get = table.get
    body = torch.tensor([get(tok, unk_id) for tok in text.split()], dtype=torch.long)
    return _out(item, _assemble(body, bos_id, eos_id, max_length))

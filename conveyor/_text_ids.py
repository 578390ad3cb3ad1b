"""How the text fns turn records into ids: the text field, UTF-8, provenance, dtypes, truncation.

The shared helpers of :mod:`conveyor.text`: a record's text (a dict's field or a bare string,
refused with a ``SampleError`` naming the record's ``file:line`` when it has none or it is not
valid Unicode), the output record carrying the input's ``index``, ``label``, ``file``,
``line`` (or ``row``), the integer dtypes ids may take, ``max_length`` truncation with the
special ids, the byte tokenizer's one-buffer batches and the vocabulary lookup, and the
Hugging Face ``tokenizers`` import with its checks on special tokens and dtypes.
"""

from __future__ import annotations

import itertools
from itertools import repeat
from operator import contains
from typing import Any

import numpy as np
import torch

from conveyor.errors import SampleError

CARRIED = ("index", "label", "file", "line")
ROW = "row"  # read_parquet's provenance in place of read_jsonl's line: carried where there is no line
ID_DTYPES = ("int64", "int32", "int16", "uint8")
# each dtype with its largest id, made once: np.iinfo on every call was a third of byte_tokenize's time
_ID_TYPES = {name: (np.dtype(name), int(np.iinfo(name).max)) for name in ID_DTYPES}


def _where(item: Any) -> str:
    if isinstance(item, dict):
        if "file" in item and "line" in item:
            return f"{item['file']}:{item['line']}"
        if "file" in item and "row" in item:  # read_parquet's provenance
            return f"{item['file']} row {item['row']}"
        if "path" in item:
            return str(item["path"])
        if "index" in item:
            return f"item {item['index']}"
    return "item"


def _text(item: Any, field: str) -> str:
    if isinstance(item, str):
        return item
    if isinstance(item, list):
        raise SampleError(f"expected a record (a dict with {field!r}) or a string, got a list of {len(item)}")
    if not isinstance(item, dict) or field not in item:
        raise SampleError(f"{_where(item)}: no field {field!r} to tokenize"
                          + (f" (fields: {', '.join(map(str, item))})" if isinstance(item, dict) else ""))
    text = item[field]
    if not isinstance(text, str):
        raise SampleError(f"{_where(item)}: field {field!r} is "
                          f"{'null' if text is None else type(text).__name__}, expected a string")
    return text


def _utf8(item: Any, text: str, field: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise SampleError(f"{_where(item)}: field {field!r} is not valid Unicode ({exc.reason} at "
                          f"character {exc.start}); no tokenizer can encode it") from None


def _check_unicode(item: Any, text: str, field: str) -> None:
    if not text.isascii():
        _utf8(item, text, field)


def _out(item: Any, ids: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"input_ids": ids}
    if isinstance(item, dict):
        for key in CARRIED:
            if key in item:
                out[key] = item[key]
        if ROW in item and "line" not in item:
            out[ROW] = item[ROW]
    return out


def _outs(items: list, ids: list) -> list[dict[str, Any]]:
    """``_out`` of each item and its ids, for a list (the carried keys looked up once per key)."""
    if items and type(items[0]) is dict and "index" in items[0] and "file" in items[0] and "line" in items[0]:
        try:  # what read_jsonl gives, in dict displays (half the time of filling dicts key by key)
            if "label" in items[0]:
                return [{"input_ids": x, "index": item["index"], "label": item["label"], "file": item["file"],
                         "line": item["line"]} for item, x in zip(items, ids)]
            return [{"input_ids": x, "index": item["index"], "file": item["file"], "line": item["line"]}
                    if "label" not in item else _out(item, x) for item, x in zip(items, ids)]
        except (KeyError, TypeError):  # an item without one of them, or not a dict
            pass
    outs: list[dict[str, Any]] = [{"input_ids": x} for x in ids]
    if items and type(items[0]) is dict:
        for key in CARRIED:
            for item, out in zip(items, outs):
                if type(item) is dict and key in item:
                    out[key] = item[key]
        for item, out in zip(items, outs):
            if type(item) is dict and ROW in item and "line" not in item:
                out[ROW] = item[ROW]
    elif items:
        return [_out(item, x) for item, x in zip(items, ids)]
    return outs


def _views(buf: np.ndarray, lengths: list[int]) -> list[np.ndarray]:
    """``buf`` cut into consecutive views of ``lengths``."""
    ends = list(itertools.accumulate(lengths))
    return [buf[e - n:e] for n, e in zip(lengths, ends)]


def ids_dtype(dtype: str, top: int, what: str) -> np.dtype:
    """The numpy dtype named ``dtype`` (one of ``ID_DTYPES``), checked to hold ids up to
    ``top`` (``what`` says where that id comes from)."""
    if dtype not in ID_DTYPES:
        raise ValueError(f"dtype={dtype!r} must be one of {', '.join(ID_DTYPES)}")
    dt, most = _ID_TYPES[dtype]
    if top > most:
        raise ValueError(f"dtype={dtype!r} cannot hold id {top} ({what}); use a wider one")
    return dt


def _check_max_length(max_length: int | None, specials: int) -> None:
    if max_length is not None and (not isinstance(max_length, int) or max_length <= specials):
        raise ValueError(f"{max_length=} must be an int > {specials} (the special tokens it keeps)")


def _assemble(body: torch.Tensor, bos: int | None, eos: int | None, max_length: int | None) -> torch.Tensor:
    n_special = (bos is not None) + (eos is not None)
    if max_length is not None and body.numel() > max_length - n_special:
        body = body[: max_length - n_special]
    if not n_special:
        return body
    parts = ([torch.tensor([bos], dtype=body.dtype)] if bos is not None else []) + [body] + (
        [torch.tensor([eos], dtype=body.dtype)] if eos is not None else [])
    return torch.cat(parts)


def _byte_dtype(dtype: str, add_bos: bool, add_eos: bool, bos_id: int, eos_id: int) -> np.dtype:
    specials = [(i, n) for i, n, on in ((bos_id, "bos_id", add_bos), (eos_id, "eos_id", add_eos)) if on]
    top, what = max(specials + [(255, "a byte")])
    return ids_dtype(dtype, top, what)


def _item_bytes(item: Any, field: str) -> bytes:
    """One record's text as UTF-8, or an error naming the record."""
    text = item.get(field) if type(item) is dict else item
    if type(text) is not str:
        text = _text(item, field)  # raises, naming the record
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return _utf8(item, text, field)  # raises, naming the record


def _byte_batch(items: list, field: str, max_length: int | None, bos: int | None,
                eos: int | None, dtype: np.dtype) -> list[dict[str, Any]]:
    """``byte_tokenize`` of a list: every text's bytes in one buffer of ``dtype``, a view each."""
    buf, lengths = _byte_buffer(items, field, max_length, bos, eos, dtype)
    return _outs(items, _views(buf, lengths))


def carried(items: list) -> tuple[str, ...] | None:
    """The keys the records of ``items`` copy from them, after ``input_ids`` (``IdsBlock.carried``):
    those of the first item, where every item is a dict and none has one the first lacks; an
    item without one of them gets another record (whoever reads the keys from the items finds
    it missing). None where that is not so: the records then say.

    Example:
        >>> carried([{"text": "a", "index": 0, "file": "f", "line": 1}]), carried([{"index": 0}, {"label": 1}])
        (('index', 'file', 'line'), None)
    """
    if not items or type(items[0]) is not dict:
        return None
    first = items[0]
    keys = tuple(k for k in CARRIED if k in first)
    if "line" not in first:
        keys += (ROW,) if ROW in first else ()
        others: tuple[str, ...] = tuple(k for k in CARRIED + (ROW,) if k not in keys)
    else:
        others = tuple(k for k in CARRIED if k not in keys)  # (a row is not carried beside a line)
    if not _DICT.issuperset(map(type, items)):  # (_outs copies keys of other mappings only at times)
        return None
    for key in others:
        if any(map(contains, items, repeat(key))):
            return None
    return keys


_DICT = frozenset({dict})


def _block_records(items: list, buf: np.ndarray, lengths: np.ndarray) -> list[dict[str, Any]]:
    """The records a batch tokenizer gives for ``items``, from its buffer and lengths (an ``IdsBlock``'s)."""
    return _outs(items, _views(buf, lengths.tolist()))


def _byte_buffer(items: list, field: str, max_length: int | None, bos: int | None,
                 eos: int | None, dtype: np.dtype) -> tuple[np.ndarray, list[int]]:
    """Every text's bytes (and specials) in one buffer of ``dtype``, and each text's count."""
    keep = None if max_length is None else max_length - (bos is not None) - (eos is not None)
    try:  # the common case at C speed: dicts whose field is a str (str.encode refuses anything else)
        datas = list(map(str.encode, [item[field] for item in items]))
    except (KeyError, TypeError, AttributeError, UnicodeEncodeError):
        datas = [_item_bytes(item, field) for item in items]  # raises, naming the record
    if keep is not None:
        datas = [d[:keep] for d in datas]  # a bytes no longer than keep is itself
    if bos is None and eos is None:
        lengths = list(map(len, datas))
        body = np.frombuffer(bytearray().join(datas), np.uint8)  # (writable, unlike a bytes' buffer)
        buf = body if dtype == np.uint8 else body.astype(dtype)
    else:  # a byte held for each special id in the join, then widened and overwritten: one
        # pass, where a mask of the body's places and a masked copy were three
        extra = (bos is not None) + (eos is not None)
        lengths = [len(d) + extra for d in datas]
        joined = bytearray(extra).join([b"", *datas, b""])  # held, text, held, text, held
        front, back = eos is not None, bos is not None  # (the held byte before the first text is an eos's)
        buf = np.frombuffer(joined, np.uint8)[front:len(joined) - back].astype(dtype)
        ends = np.cumsum(lengths, dtype=np.int64)
        if bos is not None:
            buf[ends - np.asarray(lengths, dtype=np.int64)] = bos
        if eos is not None:
            buf[ends - 1] = eos
    return buf, lengths


def _vocab_ids(item: Any, table: dict[str, int], field: str, max_length: int | None, unk_id: int,
               bos_id: int | None, eos_id: int | None, lowercase: bool) -> dict[str, Any]:
    text = _text(item, field)
    _check_unicode(item, text, field)
    if lowercase:
        text = text.lower()
    get = table.get
    body = torch.tensor([get(tok, unk_id) for tok in text.split()], dtype=torch.long)
    return _out(item, _assemble(body, bos_id, eos_id, max_length))


def _tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError:
        raise ImportError("conveyor.text:hf_tokenize needs Hugging Face tokenizers: "
                          "pip install 'conveyor[text]' (or pip install tokenizers)") from None
    return tokenizers


def _hf_specials(tok: Any, max_length: int | None, add_special_tokens: Any) -> None:
    """``max_length`` must leave room past the special tokens the tokenizer adds: where it does
    not, tokenizers does not truncate at all (max_length 1 with [CLS] and [SEP] kept every id)."""
    if max_length is not None and add_special_tokens:
        _check_max_length(max_length, tok.num_special_tokens_to_add(False))


def _hf_dtype(tok: Any, dtype: str) -> np.dtype:
    return ids_dtype(dtype, tok.get_vocab_size(with_added_tokens=True) - 1, "the tokenizer's largest id")

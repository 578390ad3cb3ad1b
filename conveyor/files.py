"""Built-in map functions for plain files: read bytes, text, or a vector of numbers.

Each takes a record from ``list_files`` (``{"path", "label", "index"}``) and returns a dict
that keeps ``label`` and ``index``. Paths may be local or any fsspec URL. A file that cannot
be read or parsed raises ``SampleError`` naming it.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from conveyor.errors import SampleError
from conveyor.storage import read_url

_SPLIT = re.compile(r"[,\s]+")


def read_bytes(item: dict[str, Any]) -> bytes:
    """The raw bytes of ``item["bytes"]`` if present, else of the file at ``item["path"]``."""
    if isinstance(item, dict) and item.get("bytes") is not None:
        return item["bytes"]
    path = item.get("path") if isinstance(item, dict) else None
    if not isinstance(path, str):  # a batch (a list), a collated batch (a list of paths), no record at all
        got = f"a {type(item).__name__}" if not isinstance(item, dict) else f"'path' {path!r:.80}"
        raise SampleError(f"expected a file record with a 'path' string (from list_files), got {got}")
    if "://" in path and not path.startswith("file://"):  # retried, its errors naming the URL
        return read_url(path)
    try:
        with open(path.removeprefix("file://"), "rb") as f:
            return f.read()
    except OSError as exc:
        raise SampleError(f"cannot read {path}: {exc.strerror or exc}") from exc


def read_text(item: dict[str, Any], *, encoding: str = "utf-8") -> dict[str, Any]:
    """``{"text", "label", "index"}`` from a text file.

    Example:
        >>> read_text({"bytes": b"hi", "label": 0, "index": 3})["text"]
        'hi'
    """
    data = read_bytes(item)
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as exc:
        raise SampleError(f"{item.get('path', '<bytes>')}: not {encoding} text ({exc.reason} at "
                          f"byte {exc.start})") from exc
    return {"text": text, "label": item.get("label", -1), "index": item.get("index", -1)}


def read_numbers(item: dict[str, Any], *, dtype: str = "float32") -> dict[str, Any]:
    """``{"x": 1-D tensor, "label", "index"}`` from a file of numbers separated by commas or spaces.

    Example:
        >>> read_numbers({"bytes": b"1, 2 3", "index": 0})["x"].tolist()
        [1.0, 2.0, 3.0]
    """
    text = read_text(item)["text"]
    fields = [f for f in _SPLIT.split(text.strip()) if f]
    try:
        values = [float(f) for f in fields]
    except ValueError as exc:
        raise SampleError(f"{item.get('path', '<bytes>')}: not a list of numbers ({exc})") from exc
    if not values:
        raise SampleError(f"{item.get('path', '<bytes>')}: no numbers in the file")
    return {"x": torch.tensor(values, dtype=getattr(torch, dtype)), "label": item.get("label", -1),
            "index": item.get("index", -1)}


for _fn in (read_bytes, read_text, read_numbers):
    _fn.per_sample = True  # type: ignore[attr-defined]  # one record in, one out (conveyor/graphs/fn_args.py)
del _fn

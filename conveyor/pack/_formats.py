"""``conveyor pack --from mds|litdata SRC DST``: re-pack an MDS or LitData dataset as conveyor's
own tar shards (WebDataset layout, with ``index.json``), for users who want to.

Each sample becomes members ``{index:09d}.{field}``, one per field, in the dataset's order:
bytes (JPEG/PNG images among them) as they are, strings as UTF-8, numbers and booleans as
their text, arrays (numpy; tensors) as ``.npy`` files, dicts and lists as JSON (anything else,
or what JSON cannot hold, pickled when ``allow_pickle``, else an error naming the field). A field named
``cls`` (or the one named by ``label``) is written as ``cls``, the class number ``read_tar``
turns into an int. Field names are lower-cased; one with a dot or a slash is an error naming it.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import tempfile
from typing import Any

import numpy as np

from conveyor.errors import ConveyorError, SampleError
from conveyor.nodes import ListLitdata, ListMds, ReadSamples
from conveyor.pack._samples import join_url
from conveyor.pack._tar import INDEX_FORMAT, INDEX_NAME, _readable, _ShardWriter, _tar_size, clear_destination
from conveyor.storage import Storage, is_local, parse_size, redact

KINDS = ("mds", "litdata")


def _encode(value: Any, where: str, allow_pickle: bool = False) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bool, int, float)):
        return str(value).encode()
    if hasattr(value, "numpy") and hasattr(value, "dtype"):  # a torch tensor
        value = value.numpy()
    if isinstance(value, np.ndarray):
        buf = io.BytesIO()
        np.save(buf, value, allow_pickle=False)
        return buf.getvalue()
    if isinstance(value, (dict, list, tuple)):
        try:
            return json.dumps(value).encode()
        except TypeError as exc:
            if not allow_pickle:
                raise SampleError(f"{where}: not JSON ({exc}); with allow_pickle it is pickled") from None
    if allow_pickle:
        return pickle.dumps(value)
    raise SampleError(f"{where}: a {type(value).__name__} has no file form in a tar shard")


def pack_from(kind: str, src: str, dst: str, *, shard_size: int | str = "256MB", prefix: str = "shard",
              overwrite: bool = False, label: str | None = None, allow_pickle: bool = False,
              storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Re-pack the ``kind`` (``"mds"`` or ``"litdata"``) dataset at ``src`` as tar shards under
    ``dst``; returns the index written beside them.

    Example:
        >>> pack_from("mds", "tests/fixtures/formats/mds/plain", "/tmp/t", allow_pickle=True)  # doctest: +SKIP
        {'format': 'conveyor-shards/1', 'samples': 12, ...}
    """
    if kind not in KINDS:
        raise ValueError(f"{kind=} must be one of {KINDS}")
    limit = parse_size(shard_size)
    lister = (ListMds if kind == "mds" else ListLitdata)(url=src, storage_options=storage_options)
    samples = ReadSamples(lister, storage_options=storage_options, allow_pickle=allow_pickle, where=f"pack --from {kind}")
    storage = Storage(storage_options=storage_options)
    try:
        clear_destination(storage, dst, prefix, overwrite, storage_options)
        tmpdir = dst if is_local(dst) else tempfile.gettempdir()
        writer = _ShardWriter(storage, dst, prefix, tmpdir)
        names: set[str] = set()
        n = 0
        try:
            for i, sample in enumerate(samples):
                key = f"{sample['index']:09d}" if isinstance(sample.get("index"), int) else f"{i:09d}"
                fields = []
                for name, value in sample.items():
                    if name in ("__url__",) or (name == "index" and label != "index"):
                        continue
                    field = "cls" if name == label else name.lower()
                    if "." in field or "/" in field or not field:
                        raise ConveyorError(f"pack: {redact(src, storage_options)}: field {name!r} cannot "
                                            "name a tar member (no dots or slashes)")
                    fields.append((field, _encode(value, f"pack: {sample['__url__']}: field {name!r}", allow_pickle)))
                need = sum(_tar_size(len(d)) for _, d in fields)
                if writer.samples and writer.bytes + need > limit:
                    writer.close()
                if writer._tar is None:
                    writer.open(i)
                writer.add_fields(key, fields)
                names.update(f for f, _ in fields)
                n += 1
            writer.close()
        except BaseException:
            writer.abort()
            raise
        index = {"format": INDEX_FORMAT, "layout": "webdataset", "fields": sorted(names), "shard_size": limit,
                 "samples": n, "classes": [], "shards": writer.shards, "from": kind}
        fd, tmp = tempfile.mkstemp(prefix=".index-", suffix=".json", dir=tmpdir)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(index, indent=1, sort_keys=True) + "\n")
        _readable(tmp)
        storage.put_file(tmp, join_url(dst, INDEX_NAME))
        if os.path.exists(tmp):
            os.remove(tmp)
        return index
    finally:
        samples.close()
        storage.close()

"""Opening LMDB environments to read, shared by ``list_lmdb`` and ``read_lmdb``.

Environments are opened read-only and without LMDB's lock file (``lock=False``): readers
never block one another or a reader of another process, and nothing is written into the
environment's folder, so it may live on read-only storage. The price, stated in the README:
nothing may write the environment while it is read. Local disk only (LMDB memory-maps the
file). One handle per path and process: a worker process started by fork or spawn opens its
own, as LMDB requires.

A data file shorter than the pages its own meta page says it has (copied short, a download
cut off) would be mapped all the same, and the first read past its end kills the process
with SIGBUS, without a word: ``open_env`` reads the two meta pages first (the last page's
number and the page size, from the newer of them) and refuses such a file with a
``SourceError`` naming it and both sizes.
"""

from __future__ import annotations

import os
import struct
import threading
from typing import Any

from conveyor.errors import SourceError

_MAGIC = 0xBEEFC0DE
# a meta page (64-bit LMDB): a 16-byte page header, then mm_magic, mm_version, mm_address,
# mm_mapsize and two MDB_db of 48 bytes (the first one's md_pad holds the page size), then
# mm_last_pg and mm_txnid
_HEAD = 16
_MAGIC_AT, _PSIZE_AT, _LAST_AT = _HEAD, _HEAD + 24, _HEAD + 120
_META_BYTES = _LAST_AT + 16
_ENVS: dict[tuple[int, str], Any] = {}
_LOCK = threading.Lock()


def lmdb_module() -> Any:
    try:
        import lmdb
    except ImportError as exc:  # pragma: no cover - lmdb is in the lmdb and test extras
        raise SourceError("LMDB ops need the lmdb package: pip install 'conveyor[lmdb]'") from exc
    return lmdb


def _meta(f: Any, offset: int) -> tuple[int, int, int] | None:
    """(page size, last page, txnid) of the meta page at ``offset``; None where there is none."""
    f.seek(offset)
    raw = f.read(_META_BYTES)
    if len(raw) < _META_BYTES or struct.unpack_from("<I", raw, _MAGIC_AT)[0] != _MAGIC:
        return None
    psize = struct.unpack_from("<I", raw, _PSIZE_AT)[0]
    last, txnid = struct.unpack_from("<QQ", raw, _LAST_AT)
    return psize, last, txnid


def check_size(path: str) -> None:
    """Raise ``SourceError`` when the data file at ``path`` (a folder or the file) is shorter
    than its meta pages say; a file they cannot be read from is left to LMDB to refuse."""
    data = os.path.join(path, "data.mdb") if os.path.isdir(path) else path
    try:
        with open(data, "rb") as f:
            first = _meta(f, 0)
            if first is None or first[0] < _META_BYTES:
                return
            second = _meta(f, first[0])
            size = os.fstat(f.fileno()).st_size
    except OSError:
        return  # no such file: lmdb.open says so
    psize, last, _ = max((m for m in (first, second) if m is not None), key=lambda m: m[2])
    need = (last + 1) * psize
    if size < need:
        raise SourceError(f"the LMDB data file {data!r} is truncated: it has {size} bytes, its meta page "
                          f"says {need} ({last + 1} pages of {psize}); copy it again whole")


def open_env(path: str) -> Any:
    """The read-only environment at ``path`` (a folder with data.mdb, or the file itself)."""
    if "://" in path and not path.startswith("file://"):
        raise SourceError(f"LMDB is read from local disk only, got {path!r}: copy it to a local folder")
    path = path.removeprefix("file://")
    key = (os.getpid(), path)
    env = _ENVS.get(key)
    if env is not None:
        return env
    lmdb = lmdb_module()
    with _LOCK:
        env = _ENVS.get(key)
        if env is None:
            if not os.path.exists(path):
                raise SourceError(f"no LMDB environment at {path!r} (no such file or folder)")
            check_size(path)
            try:
                env = lmdb.open(path, readonly=True, lock=False, readahead=False, subdir=os.path.isdir(path),
                                max_readers=1024)
            except lmdb.Error as exc:
                raise SourceError(f"cannot open the LMDB environment {path!r}: {exc}") from exc
            _ENVS[key] = env
    return env


def key_text(key: bytes) -> str | bytes:
    """A key as text where it is UTF-8, else as it is."""
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError:
        return key

"""Opening LMDB environments to read, shared by ``list_lmdb`` and ``read_lmdb``.

Environments are opened read-only and without LMDB's lock file (``lock=False``): readers
never block one another or a reader of another process, and nothing is written into the
environment's folder, so it may live on read-only storage. The price, stated in the README:
nothing may write the environment while it is read. Local disk only (LMDB memory-maps the
file). One handle per path and process: a worker process started by fork or spawn opens its
own, as LMDB requires.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from conveyor.errors import SourceError

_ENVS: dict[tuple[int, str], Any] = {}
_LOCK = threading.Lock()


def lmdb_module() -> Any:
    try:
        import lmdb
    except ImportError as exc:  # pragma: no cover - lmdb is in the lmdb and test extras
        raise SourceError("LMDB ops need the lmdb package: pip install 'conveyor[lmdb]'") from exc
    return lmdb


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

"""``LocalCache``: remote objects (or byte ranges of them) kept in a local folder, bounded in
bytes, least recently used evicted first. Objects are assumed immutable while cached."""

from __future__ import annotations

import hashlib
import logging
import os
import threading

from conveyor.errors import SourceError

log = logging.getLogger("conveyor.storage")  # the package's name: its modules are private


class LocalCache:
    """Remote objects (or byte ranges of them) kept in a local folder, at most ``max_bytes``.

    Files are written whole then renamed into place, so that a reader never sees half a file
    (several processes may share the folder). Reading a file marks it used; when the folder
    grows past ``max_bytes`` the least recently used files go first. A folder that cannot be
    made is a ``SourceError`` naming it; one that cannot be written any more (a full disk, a
    folder removed by a tmp cleaner, a read-only mount) is a warning, once, and the reads go
    on uncached: the cache only saves requests.
    """

    def __init__(self, directory: str, max_bytes: int):
        if max_bytes <= 0:
            raise ValueError(f"{max_bytes=} must be > 0")
        self.dir = os.path.abspath(os.path.expanduser(directory))
        self.max_bytes = max_bytes
        try:
            os.makedirs(self.dir, exist_ok=True)
        except OSError as exc:
            raise SourceError(f"cache folder {self.dir}: cannot make it ({exc.strerror or exc}); "
                              "give a writable folder as cache, or leave cache out") from exc
        self._warned = False
        self._lock = threading.Lock()
        self._total = sum(e.stat().st_size for e in os.scandir(self.dir)
                          if e.is_file() and not e.name.startswith("."))

    def _path(self, key: str) -> str:
        return os.path.join(self.dir, hashlib.sha256(key.encode()).hexdigest()[:40])

    def get(self, key: str) -> bytes | None:
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:  # not cached, or evicted meanwhile
            return None
        try:
            os.utime(path)  # used: evicted last
        except OSError:  # a read-only cache (a warmed one shared read-only), or evicted since
            pass
        return data

    def put(self, key: str, data: bytes) -> None:
        if len(data) > self.max_bytes:
            return
        path = self._path(key)
        tmp = os.path.join(self.dir, f".{os.path.basename(path)}.{os.getpid()}.{threading.get_ident()}")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except OSError as exc:  # the data was read: serve it uncached
            try:
                os.remove(tmp)
            except OSError:  # never made, or the folder is gone
                pass
            with self._lock:
                warn, self._warned = not self._warned, True
            if warn:
                log.warning("cache folder %s cannot be written (%s); reading on without caching "
                            "what it cannot keep", self.dir, exc.strerror or exc)
            return
        with self._lock:
            self._total += len(data)
            if self._total > self.max_bytes:
                self._evict()

    def _evict(self) -> None:
        entries = []
        for e in os.scandir(self.dir):
            if e.is_file() and not e.name.startswith("."):
                st = e.stat()
                entries.append((st.st_mtime, st.st_size, e.path))
        entries.sort()
        total = sum(size for _, size, _ in entries)
        for _, size, path in entries:
            if total <= self.max_bytes * 0.9:
                break
            try:
                os.remove(path)
            except OSError:  # removed by another process
                pass
            total -= size
        self._total = total


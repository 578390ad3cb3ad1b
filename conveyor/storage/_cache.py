"""``LocalCache``: remote objects (or byte ranges of them) kept in a local folder, bounded in
bytes, least recently used evicted first, shared safely by several processes.

Keys name a version of an object: ``Storage`` keys each entry by the URL, the object's size and
its ETag (and the byte range), so that an object re-packed under the same name is a new key and
its old bytes are never served (they age out as any unused entry does).

Several processes (the ranks of a node, their worker copies) may share one folder:

* an entry is written to a temporary file, then renamed into place: a reader never sees half
  of one;
* a reader holds a shared ``flock`` on the entry while it reads it; eviction takes an exclusive
  one without waiting and leaves an entry it cannot lock (being read) for later: an entry some
  process has open is never removed, and nobody ever waits on another process's read;
* the folder's total is kept in ``.size`` and eviction runs under an exclusive ``flock`` on
  ``.lock``, held only while the folder is scanned and the oldest entries removed;
* used entries get their modification time refreshed (``atime`` is often not kept: noatime,
  relatime mounts), and the oldest go first.

A folder that cannot be made is a ``SourceError`` naming it. A disk that fills up before the
cache reaches its bound (``ENOSPC``, ``EDQUOT``: the disk is smaller than ``cache_size``, or
other files filled it) evicts this cache's least recently used entries until the new one
fits, with one warning naming the folder: the cache goes on, bounded by its disk. When nothing
of its own is left to evict (every entry being read, or the disk full of other files) it is a
``SourceError`` naming the folder, the bytes that did not fit and the bytes free: a cache asked
for and silently not kept would fetch every epoch again, unseen. A folder that cannot be
written for another reason (removed by a tmp cleaner, a read-only mount: a warmed cache shared
read-only) is a warning, once, naming it, and the reads go on uncached.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import threading
from typing import Callable

from conveyor.errors import SourceError

log = logging.getLogger("conveyor.storage")  # the package's name: its modules are private

_LOCK, _SIZE = ".lock", ".size"


def _write_file(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


class LocalCache:
    """Remote objects (or byte ranges of them) kept in a local folder, at most ``max_bytes``.

    Args:
        directory: the folder (made if missing); several processes may share it.
        max_bytes: the bound of the folder's entries, in bytes; eviction brings the total
            back under 90 % of it.
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
        self._warned: set[str] = set()
        self._lock = threading.Lock()
        self.evicted = 0  # entries this process removed

    def _path(self, key: str) -> str:
        return os.path.join(self.dir, hashlib.sha256(key.encode()).hexdigest()[:40])

    def _warn_once(self, what: str, text: str, *args: object) -> None:
        with self._lock:
            first = what not in self._warned
            self._warned.add(what)
        if first:
            log.warning(text, *args)

    def get(self, key: str) -> bytes | None:
        """The entry's bytes, or None (not cached, evicted meanwhile, or being evicted now)."""
        path = self._path(key)
        try:
            f = open(path, "rb")
        except OSError:  # not cached, or evicted meanwhile
            return None
        with f:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:  # being evicted this instant: read it from the source
                return None
            data = f.read()  # the lock goes with the file
        try:
            os.utime(path)  # used: evicted last
        except OSError:  # a read-only cache (a warmed one shared read-only), or evicted since
            pass
        return data

    def put(self, key: str, data: bytes) -> bool:
        """Keep ``data`` under ``key``; whether it was kept (an entry larger than the bound, or
        a folder that cannot be written, is not: a warning says so, once)."""
        if len(data) > self.max_bytes:
            self._warn_once("large", "cache folder %s: an entry of %d bytes is larger than its limit "
                            "(%d bytes) and is not kept; raise cache_size", self.dir, len(data), self.max_bytes)
            return False
        path = self._path(key)
        tmp = os.path.join(self.dir, f".{os.path.basename(path)}.{os.getpid()}.{threading.get_ident()}")
        while True:
            try:
                _write_file(tmp, data)
                os.replace(tmp, path)
                self._account(len(data))
                return True
            except OSError as exc:
                try:
                    os.remove(tmp)
                except OSError:  # never made, or the folder is gone
                    pass
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):  # the data was read: serve it uncached
                    self._warn_once("write", "cache folder %s cannot be written (%s); reading on without "
                                    "caching what it cannot keep", self.dir, exc.strerror or exc)
                    return False
                if not self._make_room(len(data)):
                    raise SourceError(
                        f"cache folder {self.dir}: the disk is full ({exc.strerror or exc}): an entry of "
                        f"{len(data)} bytes does not fit, {self._free()} bytes are free there and the cache "
                        f"holds {self.total()} bytes (of its limit {self.max_bytes}) that nothing can evict; "
                        "free space on that disk, give a cache folder with room for cache_size, or leave "
                        "cache out") from None
                self._warn_once("full", "cache folder %s: the disk filled up before the cache reached its "
                                "limit (%d bytes); its least recently used entries are evicted to keep new "
                                "ones (it holds %d bytes now): give it a disk with room for cache_size, or "
                                "lower it", self.dir, self.max_bytes, self.total())

    def _free(self) -> int | str:
        """Bytes free on the folder's disk (for this user), or '?' where it cannot be asked."""
        try:
            st = os.statvfs(self.dir)
        except OSError:
            return "?"
        return st.f_bavail * st.f_frsize

    def _make_room(self, nbytes: int) -> int:
        """Evict least recently used entries nobody reads until ``nbytes`` are freed (a disk
        that filled before the bound); the entries removed (0: nothing could be)."""
        with open(os.path.join(self.dir, _LOCK), "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            before = self.evicted
            entries = sorted(self._entries())
            total = sum(size for _, size, _ in entries)
            self._evict_entries(entries, total, lambda left: total - left >= nbytes)
            self._write_size(sum(size for _, size, _ in self._entries()))
            return self.evicted - before

    def _account(self, added: int) -> None:
        """Add ``added`` bytes to the folder's total; evict when it passes the bound."""
        with open(os.path.join(self.dir, _LOCK), "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # held for a scan at most, never for a read
            size_path = os.path.join(self.dir, _SIZE)
            try:
                with open(size_path, "rb") as f:
                    total = int(f.read() or b"0") + added
            except (OSError, ValueError):  # the first entry, or a .size lost: count the folder
                total = sum(size for _, size, _ in self._entries())
            if total > self.max_bytes:
                total = self._evict()
            self._write_size(total)

    def _write_size(self, total: int) -> None:
        """Keep the folder's total in ``.size``; where that cannot be written (a full disk),
        remove it: the next entry counts the folder again."""
        size_path = os.path.join(self.dir, _SIZE)
        tmp = f"{size_path}.{os.getpid()}.{threading.get_ident()}"
        try:
            _write_file(tmp, str(total).encode())
            os.replace(tmp, size_path)
        except OSError:
            for name in (tmp, size_path):
                try:
                    os.remove(name)
                except OSError:  # never made
                    pass

    def _entries(self) -> list[tuple[float, int, str]]:
        out = []
        for e in os.scandir(self.dir):
            if not e.name.startswith("."):
                try:
                    st = e.stat()
                except OSError:  # removed meanwhile
                    continue
                out.append((st.st_mtime, st.st_size, e.path))
        return out

    def _evict(self) -> int:
        """Remove the least recently used entries that nobody reads until the total is under
        90 % of the bound (called under ``.lock``); the total left."""
        entries = sorted(self._entries())
        total = sum(size for _, size, _ in entries)
        return self._evict_entries(entries, total, lambda left: left <= self.max_bytes * 0.9)

    def _evict_entries(self, entries: list[tuple[float, int, str]], total: int, enough: Callable[[int], bool]) -> int:
        """Remove ``entries`` (oldest first) that nobody reads until ``enough(total left)``."""
        for _, size, path in entries:
            if enough(total):
                break
            try:
                f = open(path, "rb")
            except OSError:  # removed by another process
                total -= size
                continue
            with f:
                try:
                    fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:  # some process reads it: never removed under it
                    continue
                try:
                    os.remove(path)
                except OSError:  # removed by another process
                    pass
            total -= size
            self.evicted += 1
        return total

    def total(self) -> int:
        """The bytes of the folder's entries now (a scan)."""
        return sum(size for _, size, _ in self._entries())

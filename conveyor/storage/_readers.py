"""Readers of remote objects, each read a request (or several) with a ``Storage``'s retry policy.

``_BlockReader`` reads front to back in aligned blocks, the next ones read ahead (``read_tar``,
``read_jsonl``); ``_RangeReader`` is a seekable file for formats read out of order (Parquet:
the footer, then column chunks). Their errors are conveyor's, naming the URL.
"""

from __future__ import annotations

import concurrent.futures as cf
import io
from typing import Any, Protocol

from conveyor.errors import SampleError
from conveyor.storage._errors import redact


def version_of(info: dict) -> tuple[int | None, str | None]:
    """(size, version tag) from an fsspec ``info``: S3's ETag (quotes stripped), else another
    filesystem's etag, hash or modification time; None where it gives none. Cache entries
    are keyed by it, and a manifest's records checked against it."""
    size = info.get("size")
    tag = next((info[k] for k in ("ETag", "etag", "md5Hash", "LastModified", "mtime", "last_modified")
                if info.get(k)), None)
    return (int(size) if size is not None else None, str(tag).strip('"') if tag is not None else None)


class _Reads(Protocol):
    """What a reader asks of its ``Storage``: ranged reads, calls (the size) and the options
    (to redact a URL in a message)."""

    options: dict[str, Any]

    cache: Any

    def submit(self, url: str, start: int | None = None, end: int | None = None,
               version: tuple[int | None, str | None] | None = None) -> cf.Future: ...

    def submit_call(self, url: str, sync_name: str, *args: Any, name: str | None = None,
                    timeout: float | None = -1.0, **kwargs: Any) -> cf.Future: ...

    def size(self, url: str) -> int: ...


class _BlockReader:
    """Sequential reads of a remote object in aligned blocks, the next ones read ahead.

    Block ``k`` is the request for bytes ``[k*B, (k+1)*B)`` (the server answers the last one
    short). The object's info (size, ETag: ``version``) and the first block are requested
    together, so opening costs one round trip; with a cache, the info first, as the blocks'
    cache entries are keyed by it.
    """

    def __init__(self, storage: _Reads, url: str, *, offset: int, block_size: int, read_ahead: int):
        if block_size <= 0 or read_ahead < 0:
            raise ValueError(f"{block_size=} must be > 0 and {read_ahead=} >= 0")
        self.url = url
        self._st = storage
        self._bs = block_size
        self._ahead = read_ahead
        self._pos = offset
        self._buf = memoryview(b"")
        self._buf_start = 0
        self._pending: dict[int, cf.Future] = {}
        first = offset - offset % block_size
        info = storage.submit_call(url, "info")
        self.version: tuple[int | None, str | None] | None = None
        try:
            if getattr(storage, "cache", None) is not None:
                self.version = version_of(info.result())
            self._pending[first] = storage.submit(url, first, first + block_size, self.version)
            self.version = version_of(info.result())
            self.size = int(self.version[0]) if self.version[0] is not None else 0
        except BaseException:
            self.close()
            raise
        self._requested_to = min(first + block_size, self.size)
        if first >= self.size:  # at or past the end (an empty object answers 416): not needed
            self.close()
        else:
            self._schedule(first)

    @property
    def all_requested(self) -> bool:
        """Whether every block up to the end of the object has been requested."""
        return self._requested_to >= self.size

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int) -> int:
        self._pos = pos
        return pos

    def _schedule(self, start: int) -> None:
        for i in range(self._ahead + 1):
            s = start + i * self._bs
            if s < self.size and s not in self._pending and s >= self._buf_start + len(self._buf):
                self._pending[s] = self._st.submit(self.url, s, s + self._bs, self.version)
                self._requested_to = max(self._requested_to, min(s + self._bs, self.size))

    def _block(self, start: int) -> memoryview:
        self._schedule(start)
        if start not in self._pending:  # read before (the buffer moved past it): read again
            self._pending[start] = self._st.submit(self.url, start, start + self._bs, self.version)
        for s in [s for s in self._pending if s < start]:  # a seek jumped past them
            self._pending.pop(s).cancel()
        return memoryview(self._pending.pop(start).result())

    def read(self, n: int = -1) -> bytes:
        if n < 0:
            n = self.size - self._pos
        parts = []
        while n > 0 and self._pos < self.size:
            i = self._pos - self._buf_start
            if not 0 <= i < len(self._buf):
                start = self._pos - self._pos % self._bs
                self._buf, self._buf_start = self._block(start), start
                i = self._pos - start
                if i >= len(self._buf):  # the object is shorter than its size said
                    raise SampleError(f"{redact(self.url, self._st.options)}: object ended at byte "
                                      f"{start + len(self._buf)}, expected {self.size} bytes")
            chunk = self._buf[i:i + n]
            parts.append(chunk)
            self._pos += len(chunk)
            n -= len(chunk)
        return b"".join(parts)

    def close(self) -> None:
        for fut in self._pending.values():
            fut.cancel()
        self._pending.clear()
        self._buf = memoryview(b"")


class _RangeReader(io.RawIOBase):
    """Random reads of a remote object: ``read(n)`` at the position is one request for those
    bytes (``Storage.submit``, retried), or for a large read requests of ``CHUNK`` bytes at
    once, so that no request outlasts the policy's timeout however large the read (a Parquet
    column chunk of hundreds of MB); the size is asked once, at opening."""

    CHUNK = 8 << 20

    def __init__(self, storage: _Reads, url: str):
        super().__init__()
        self.url = url
        self._st = storage
        self.version = version_of(storage.submit_call(url, "info").result())
        self.size = int(self.version[0] or 0)
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        if base + pos < 0:
            raise ValueError(f"negative seek position {base + pos}")
        self._pos = base + pos
        return self._pos

    def read(self, n: int = -1) -> bytes:
        end = self.size if n is None or n < 0 else min(self.size, self._pos + n)
        if end <= self._pos:
            return b""
        futures = [self._st.submit(self.url, s, min(s + self.CHUNK, end), self.version)
                   for s in range(self._pos, end, self.CHUNK)]
        try:
            data = b"".join(f.result() for f in futures) if len(futures) > 1 else futures[0].result()
        finally:
            for f in futures:
                f.cancel()
        if len(data) != end - self._pos:  # replaced since it was opened, or cut short
            raise SampleError(f"{redact(self.url, self._st.options)}: asked for bytes {self._pos}-{end} "
                              f"of {self.size}, got {len(data)}: the object changed or was cut short")
        self._pos = end
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

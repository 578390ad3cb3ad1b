"""fetch: read the object each record names, many at once, keeping the order.

Turns ``{"path": URL, ...}`` records into ``{"path": URL, "bytes": data, ...}`` (the other
fields are kept). Up to ``concurrency`` reads are in flight: on object storage each request
waits tens of milliseconds for the first byte, and overlapping them is what lets a remote
source keep the decoders busy. Decoding stays in the ``map`` after this node. Local paths
pass through unread unless ``read_local=True``: a local read costs microseconds, and the
decoder reads the file in its own worker thread, so one more hand-off would only cost time
(measured: ~90 µs per sample on the ImageNet sample).

Requests follow a ``RetryPolicy`` (see ``conveyor.storage``): transient failures are retried
with backoff and counted in ``stats()["retries"]``; a missing object or an exhausted retry is a
``SampleError`` naming the URL (raised, or skipped and counted with ``on_error="skip"``); a
missing bucket, denied access, no credentials or a server that cannot be reached at all is a
``SourceError``, always raised.

The state is the input's state just before the first record not yet emitted, and the count
of records emitted this epoch: what is in flight at a save is simply read again after a
restore, so nothing is lost or repeated.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import logging
from typing import Any

from torchdata.nodes import BaseNode

from conveyor.errors import SampleError, SourceError
from conveyor.nodes import capabilities as cap
from conveyor.nodes._skips import LEDGER_KEY, SkipLedger, log_skip, sample_id
from conveyor.nodes.list_files import changed_since_manifest
from conveyor.nodes.state_shape import Child, Fields, Int, LEDGER_SHAPE
from conveyor.storage import NOT_FOUND, RetryPolicy, Storage, classify

log = logging.getLogger(__name__)

ON_ERROR = ("raise", "skip")


def is_gone(exc: BaseException) -> bool:
    """Whether a read failed as the object is not there (404)."""
    return exc.__cause__ is not None and classify(exc.__cause__) == NOT_FOUND


class _Entry:
    __slots__ = ("before", "item", "future")

    def __init__(self, before: dict, item: dict, future: cf.Future):
        self.before = before
        self.item = item
        self.future = future


def _is_local(url: str) -> bool:
    return "://" not in url or url.startswith("file://")


class Fetch(BaseNode[dict]):
    """Add the bytes of the object at ``item[field]`` to each item, ``concurrency`` at a time.

    Args:
        source: records with a URL (or local path) under ``field``.
        concurrency: reads in flight, >= 1.
        field: the record field holding the URL.
        out: the field the bytes are stored under.
        policy: the retry policy (attempts, per-request timeout, backoff).
        storage_options: fsspec options (endpoint_url, key, secret, ...); never logged.
        on_error: ``"raise"`` or ``"skip"`` (a record whose object cannot be read is counted
            in ``stats()["skipped"]``); a missing bucket or denied access always raises.
        cache: a local folder to keep remote objects in, or None.
        cache_size: the cache's bound (bytes, or ``"10GB"``).
        where: text for error notes, e.g. ``"node 'fetch' (fetch) from specs/x.yaml:20"``.
        read_local: also read local paths (by default they pass through for the decoder).

    Example:
        >>> from torchdata.nodes import IterableWrapper
        >>> node = Fetch(IterableWrapper([{"path": "examples/data/numbers/a/1.txt"}]), read_local=True)
        >>> sorted(next(node))
        ['bytes', 'path']
    """

    SOURCE_KEY = "source"
    EMITTED_KEY = "emitted"
    STATE_SHAPE = Fields({SOURCE_KEY: Child(), EMITTED_KEY: Int(), LEDGER_KEY: LEDGER_SHAPE}, optional=(LEDGER_KEY,))

    def __init__(self, source: BaseNode, *, concurrency: int = 16, field: str = "path",
                 out: str = "bytes", policy: RetryPolicy | None = None,
                 storage_options: dict[str, Any] | None = None, on_error: str = "raise",
                 cache: str | None = None, cache_size: int | str = "10GB", where: str | None = None,
                 read_local: bool = False):
        super().__init__()
        if not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"{concurrency=} must be an int >= 1")
        if on_error not in ON_ERROR:
            raise ValueError(f"{on_error=} must be one of {ON_ERROR}")
        self.source = source
        self.concurrency = concurrency
        self.field = field
        self.out = out
        self.on_error = on_error
        self.where = where or "fetch"
        self.read_local = read_local
        self.storage = Storage(storage_options=storage_options, policy=policy, cache=cache,
                               cache_size=cache_size, threads=concurrency)
        self.skipped = 0
        self.ledger = SkipLedger()
        self._emitted = 0
        self._window: collections.deque[_Entry] = collections.deque()
        self._source_done = False

    def __repr__(self) -> str:
        return f"Fetch(concurrency={self.concurrency}, field={self.field!r}, out={self.out!r})"

    def count(self) -> int | None:
        """Items per epoch when the input knows its own (one out per record in)."""
        return cap.count(self.source)

    def stats(self) -> dict[str, int]:
        return {**self.storage.stats.as_dict(), "skipped": self.skipped}

    def _cancel(self) -> None:
        while self._window:
            future = self._window.popleft().future
            if future is not None:
                future.cancel()

    def close(self) -> None:
        self._cancel()
        self.storage.close()

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self._cancel()
        self._source_done = False
        self.skipped = 0
        self.storage.stats.clear()
        if initial_state is None:
            self.source.reset()
            self._emitted = 0
        else:
            self.source.reset(initial_state[self.SOURCE_KEY])
            self._emitted = initial_state[self.EMITTED_KEY]
            self.ledger.load(initial_state.get(LEDGER_KEY))

    def _fill(self) -> None:
        while not self._source_done and len(self._window) < self.concurrency:
            before = self.source.state_dict()
            try:
                item = next(self.source)
            except StopIteration:
                self._source_done = True
                return
            url = item.get(self.field) if isinstance(item, dict) else None
            if not isinstance(url, str):
                raise SampleError(f"{self.where}: expected a record with a URL under "
                                  f"'{self.field}', got {type(item).__name__}"
                                  + (f" with keys {sorted(item)}" if isinstance(item, dict) else ""))
            if not self.read_local and _is_local(url):
                self._window.append(_Entry(before, item, None))  # the decoder reads it
            else:
                version = (item["size"], item.get("etag")) if "manifest" in item and "size" in item else None
                self._window.append(_Entry(before, item, self.storage.submit(url, version=version)))

    def next(self) -> dict:
        while True:
            self._fill()
            if not self._window:
                raise StopIteration
            entry = self._window[0]
            if entry.future is None:
                self._window.popleft()
                self._emitted += 1
                return entry.item
            try:
                data = entry.future.result()
                changed = changed_since_manifest(entry.item, len(data), None)
            except SampleError as exc:
                changed = changed_since_manifest(entry.item, None, None, gone=is_gone(exc))
                if changed:
                    self._window.popleft()
                    raise SourceError(changed + f" (in {self.where})") from exc
                self._window.popleft()
                if self.on_error == "raise":
                    exc.add_note(f"in {self.where}")
                    raise
                self.skipped += 1
                self.ledger.add(sample_id(entry.item), exc)
                self._emitted += 1  # a skipped record counts as handled: it is not read again
                log_skip(log, self.skipped, f"{self.where}: skipped a record ({exc})")
                continue
            except Exception as exc:  # SourceError and anything unexpected: never skipped
                exc.add_note(f"in {self.where}")
                raise
            if changed:
                self._window.popleft()
                raise SourceError(changed + f" (in {self.where})")
            self._window.popleft()
            self._emitted += 1
            self._fill()  # the next reads start before the caller works on this one
            return {**entry.item, self.out: data}

    def get_state(self) -> dict:
        before = self._window[0].before if self._window else self.source.state_dict()
        return {self.SOURCE_KEY: before, self.EMITTED_KEY: self._emitted, LEDGER_KEY: self.ledger.state()}

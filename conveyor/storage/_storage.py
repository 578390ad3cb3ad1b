"""``Storage``: every remote read (and ``conveyor pack``'s writes) with one retry policy, one set
of counters, a timeout per request and errors that name the URL.

Async filesystems (s3fs, gcsfs, http) run their requests as coroutines on fsspec's IO loop, many
at once without a thread each; synchronous ones (local disk) on a small thread pool. A failure
is classified (``_errors``): a transient one is retried with capped exponential backoff and
jitter, the rest become a ``SourceError`` (the whole source: no bucket, denied, no server) or a
``SampleError`` (one object). ``read_url`` is one shared ``Storage`` per process, for map
functions handed a path and no ``storage_options``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import logging
import os
import random
import threading
import time
from typing import Any, Awaitable, Callable

from conveyor.errors import SampleError, SourceError
from conveyor.storage import _listing
from conveyor.storage._cache import LocalCache
from conveyor.storage._errors import (DENIED, NO_BUCKET, NOT_FOUND, TRANSIENT, classify, describe, no_connection,
                                      no_credentials, redact)
from conveyor.storage._filesystems import filesystem, is_local, protocol_of
from conveyor.storage._policy import RetryPolicy, StorageStats, parse_size
from conveyor.storage._readers import _BlockReader, _RangeReader, version_of

log = logging.getLogger("conveyor.storage")  # the package's name: its modules are private


def _retrieve(task: asyncio.Future) -> None:
    """Mark a finished task's exception as seen. ``run_coroutine_threadsafe`` copies a task's
    outcome to its future only if nobody cancelled that future; when a reader cancels the reads
    in flight (``Fetch`` does, once one read fails), a read that failed in the meantime would
    otherwise print ~100 lines of "Task exception was never retrieved" at exit, after the error
    that matters."""
    if not task.cancelled():
        task.exception()


class Storage:
    """Reads (and for ``conveyor pack``, writes) objects with one retry policy and one set of
    counters. Made by a node; ``close()`` stops its threads and cancels what is in flight.

    Args:
        storage_options: fsspec options (endpoint_url, key, secret, ...). Never logged.
        policy: the retry policy.
        cache: a local folder for a ``LocalCache`` of remote reads (keyed by URL, size and ETag),
            or None.
        cache_size: its bound, e.g. ``"10GB"``.
        threads: size of the thread pool used for synchronous filesystems.
    """

    def __init__(self, *, storage_options: dict[str, Any] | None = None,
                 policy: RetryPolicy | None = None, cache: str | None = None,
                 cache_size: int | str = "10GB", threads: int = 16):
        self.options = dict(storage_options or {})
        self.policy = policy or RetryPolicy()
        self.stats = StorageStats()
        self.cache = LocalCache(cache, parse_size(cache_size)) if cache else None
        self._threads = threads
        self._pool: cf.ThreadPoolExecutor | None = None
        self._fs: dict[str, tuple[Any, str]] = {}
        self._rng = random.Random()  # jitter: timing only, never data
        self._lock = threading.Lock()

    def __repr__(self) -> str:  # never the options: they may hold secrets
        return f"Storage(policy={self.policy!r}, cache={self.cache.dir if self.cache else None!r})"

    # -- plumbing
    def resolve(self, url: str) -> tuple[Any, str]:
        """``(fs, path)``; one filesystem per protocol."""
        protocol = protocol_of(url)
        with self._lock:
            if protocol not in self._fs:
                try:
                    fs, path = filesystem(url, self.options, self.policy)
                    connect = getattr(fs, "connect", None)
                    if getattr(fs, "async_impl", False) and callable(connect):
                        connect()  # make the client now, outside every request's timeout
                except Exception as exc:  # "Invalid endpoint: host:9000", ProfileNotFound...
                    if not (isinstance(exc, (ValueError, TypeError))
                            or type(exc).__module__.startswith(("botocore", "aiobotocore"))):
                        raise
                    hint = (" (an endpoint URL needs its scheme: http://host:port or https://...)"
                            if "endpoint" in str(exc).lower() else "")
                    raise SourceError(f"{redact(url, self.options)}: cannot make a client to read it: "
                                      f"{describe(exc, self.options)}{hint}; check AWS_ENDPOINT_URL and "
                                      "the other AWS_* variables (AWS_PROFILE...), or storage_options in the spec") from exc
                self._fs[protocol] = (fs, path)
            fs = self._fs[protocol][0]
        return fs, fs._strip_protocol(url)  # local: an absolute path

    def _pool_get(self) -> cf.ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = cf.ThreadPoolExecutor(self._threads, thread_name_prefix="conveyor-io")
            return self._pool

    def error(self, url: str, exc: BaseException, attempts: int = 1) -> Exception:
        """The conveyor error for a failed request on ``url`` (redacted, naming the URL)."""
        kind = classify(exc)
        what = describe(exc, self.options)
        url = redact(url, self.options)
        if kind == NO_BUCKET:
            return SourceError(f"{url}: the bucket does not exist ({what})")
        if kind == DENIED:
            why = "no credentials to sign the request with" if no_credentials(exc) else "access denied"
            return SourceError(f"{url}: {why} ({what}); check the credentials (AWS_* "
                               "variables, ~/.aws, or storage_options in the spec, on every node "
                               "that reads; anon: true for a public bucket)")
        if kind == NOT_FOUND:
            return SampleError(f"{url}: no such object ({what})")
        if kind == TRANSIENT and no_connection(exc):  # the server, not this object: never skipped
            return SourceError(f"{url}: cannot reach the server, {attempts} attempt(s), the last with "
                               f"{what}; check the endpoint (AWS_ENDPOINT_URL, storage_options "
                               "endpoint_url) and that the server is up")
        if kind == TRANSIENT:
            return SampleError(f"{url}: failed after {attempts} attempt(s), the last with {what}")
        return SampleError(f"{url}: {what}")

    def _retry_or_raise(self, url: str, exc: BaseException, attempt: int, optional: bool = False) -> float:
        """The delay before the next attempt, or raise the conveyor error (``optional``: a
        missing object was only looked for, such as an ``index.json``: not a failed request)."""
        kind = classify(exc)
        if kind != TRANSIENT or attempt + 1 >= self.policy.attempts:
            if not (optional and kind == NOT_FOUND):
                self.stats.add("failed")
            raise self.error(url, exc, attempt + 1) from exc
        self.stats.add("retries")
        delay = self.policy.delay(attempt, self._rng)
        log.debug("retrying %s in %.2fs (attempt %d of %d failed: %s)", redact(url, self.options),
                  delay, attempt + 1, self.policy.attempts, describe(exc, self.options))
        return delay

    async def _run_async(self, url: str, make: Callable[[], Awaitable[Any]],
                         timeout: float | None = -1.0, optional: bool = False) -> Any:
        task = asyncio.current_task()
        if task is not None:  # a read cancelled as it fails is not then logged by asyncio at exit
            task.add_done_callback(_retrieve)
        timeout = self.policy.timeout if timeout == -1.0 else timeout
        for attempt in range(self.policy.attempts):
            self.stats.add("requests")
            try:
                return await asyncio.wait_for(make(), timeout)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # classified: retried or raised as a conveyor error
                await asyncio.sleep(self._retry_or_raise(url, exc, attempt, optional))
        raise AssertionError("unreachable")

    def _run_sync(self, url: str, fn: Callable[[], Any], optional: bool = False) -> Any:
        for attempt in range(self.policy.attempts):
            self.stats.add("requests")
            try:
                return fn()
            except Exception as exc:  # classified: retried or raised as a conveyor error
                time.sleep(self._retry_or_raise(url, exc, attempt, optional))
        raise AssertionError("unreachable")

    def submit_call(self, url: str, sync_name: str, *args: Any, name: str | None = None,
                    timeout: float | None = -1.0, optional: bool = False, **kwargs: Any) -> cf.Future:
        """Start ``fs.<sync_name>(path, ...)`` (or its coroutine) with the retry policy; a future
        of its result. Errors name ``name`` (default: ``url``); ``timeout`` replaces the
        policy's for the whole call (None: only the per-request socket timeouts, for calls made
        of many requests such as a listing); ``optional``: the object may well not exist (an
        index looked for), so its absence is not counted as a failed request."""
        fs, path = self.resolve(url)
        if getattr(fs, "async_impl", False):
            coro_fn = getattr(fs, "_" + sync_name)
            return asyncio.run_coroutine_threadsafe(
                self._run_async(name or url, lambda: coro_fn(path, *args, **kwargs), timeout, optional),
                fs.loop)
        if is_local(url):  # no waiting worth a thread
            done: cf.Future = cf.Future()
            try:
                done.set_result(self._run_sync(name or url,
                                               lambda: getattr(fs, sync_name)(path, *args, **kwargs), optional))
            except Exception as exc:  # handed to whoever reads the future
                done.set_exception(exc)
            return done
        return self._pool_get().submit(self._run_sync, name or url,
                                       lambda: getattr(fs, sync_name)(path, *args, **kwargs), optional)

    def call(self, url: str, sync_name: str, *args: Any, name: str | None = None,
             timeout: float | None = -1.0, **kwargs: Any) -> Any:
        """``submit_call(...).result()``: run it now."""
        return self.submit_call(url, sync_name, *args, name=name, timeout=timeout, **kwargs).result()

    # -- reads
    def submit(self, url: str, start: int | None = None, end: int | None = None,
               version: tuple[int | None, str | None] | None = None) -> cf.Future:
        """Start reading ``url`` (bytes ``[start, end)``); a future of the bytes, or of the error.

        With a cache, a remote object's entries are keyed by its ``version`` (size, ETag) as well
        as the URL and range, so that an object replaced under the same name is read anew: the
        version given (a manifest's), else asked of the server first (one HEAD request)."""
        fs, path = self.resolve(url)
        cached = self.cache is not None and not is_local(url)
        if getattr(fs, "async_impl", False):
            read = self._cached_async if cached else self._read_async
            return asyncio.run_coroutine_threadsafe(read(fs, url, path, start, end, version), fs.loop)
        read_sync = self._cached_sync if cached else self._read_sync
        return self._pool_get().submit(read_sync, fs, url, path, start, end, version)

    @staticmethod
    def _key(url: str, version: tuple[int | None, str | None], start: int | None, end: int | None) -> str:
        return f"{url}|{version[0]}|{version[1]}|{start}|{end}"

    async def _read_async(self, fs: Any, url: str, path: str, start: int | None, end: int | None,
                          version: Any = None) -> bytes:
        data = await self._run_async(url, lambda: fs._cat_file(path, start=start, end=end))
        self.stats.add("bytes", len(data))
        return data

    async def _cached_async(self, fs: Any, url: str, path: str, start: int | None, end: int | None,
                            version: tuple[int | None, str | None] | None) -> bytes:
        assert self.cache is not None
        if version is None:
            version = version_of(await self._run_async(url, lambda: fs._info(path)))
        key = self._key(url, version, start, end)
        loop = asyncio.get_running_loop()
        data = await loop.run_in_executor(None, self.cache.get, key)
        if data is not None:
            self.stats.add("cache_hits")
            return data
        data = await self._read_async(fs, url, path, start, end)
        await loop.run_in_executor(None, self.cache.put, key, data)
        return data

    def _read_sync(self, fs: Any, url: str, path: str, start: int | None, end: int | None,
                   version: Any = None) -> bytes:
        data = self._run_sync(url, lambda: fs.cat_file(path, start=start, end=end))
        self.stats.add("bytes", len(data))
        return data

    def _cached_sync(self, fs: Any, url: str, path: str, start: int | None, end: int | None,
                     version: tuple[int | None, str | None] | None) -> bytes:
        assert self.cache is not None
        if version is None:
            version = version_of(self._run_sync(url, lambda: fs.info(path)))
        key = self._key(url, version, start, end)
        data = self.cache.get(key)
        if data is not None:
            self.stats.add("cache_hits")
            return data
        data = self._read_sync(fs, url, path, start, end)
        self.cache.put(key, data)
        return data

    def read(self, url: str, start: int | None = None, end: int | None = None) -> bytes:
        """The bytes of ``url`` (or of ``[start, end)``), with retries."""
        return self.submit(url, start, end).result()

    def size(self, url: str) -> int:
        return int(self.call(url, "size"))

    def version(self, url: str) -> tuple[int | None, str | None]:
        """(size, ETag) of ``url``: one HEAD request (``version_of``)."""
        return version_of(self.call(url, "info"))

    # -- listings and readers
    def glob_root(self, url: str) -> str:
        """The part of the glob ``url`` before its first wildcard, up to a ``/``, in the form
        ``glob`` gives its matches: every match starts with it and a ``/``."""
        return _listing.glob_root(self, url)

    def glob(self, url: str, *, folder_markers: bool = False, infos: dict[str, dict] | None = None) -> list[str]:
        """Files matching ``url`` (a glob: ``*``, ``?``, ``[...]``, ``**``), sorted, as full URLs
        (plain paths when local); with ``folder_markers``, folder markers too, ending in ``/``.
        See ``conveyor.storage._listing.glob``.

        Raises:
            SourceError: nothing matches (naming the URL, and a missing bucket or folder).
        """
        return _listing.glob(self, url, folder_markers=folder_markers, infos=infos)

    def open_sequential(self, url: str, *, offset: int = 0, block_size: int = 8 << 20,
                        read_ahead: int = 2) -> Any:
        """A reader for reading ``url`` front to back from ``offset``: ``read(n)``, ``seek``,
        ``tell``, ``close``. Local files are opened directly; remote ones are read in blocks of
        ``block_size``, ``read_ahead`` blocks in flight, each with the retry policy."""
        if is_local(url):
            try:
                f = open(url.removeprefix("file://"), "rb", buffering=1 << 20)
            except OSError as exc:
                raise self.error(url, exc) from exc
            f.seek(offset)
            return f
        return _BlockReader(self, url, offset=offset, block_size=block_size, read_ahead=read_ahead)

    def open_random(self, url: str) -> "_RangeReader":
        """A seekable, read-only file of ``url`` for formats read out of order (Parquet: the
        footer, then column chunks): each ``read(n)`` is one ranged request with the retry
        policy, its errors conveyor's (naming the URL)."""
        return _RangeReader(self, url)

    def open_sequential_async(self, url: str, **kwargs: Any) -> cf.Future:
        """``open_sequential`` on a background thread: a future of the reader (its size and
        first blocks requested meanwhile)."""
        return self._pool_get().submit(self.open_sequential, url, **kwargs)

    # -- writes (conveyor pack)
    def put_file(self, local_path: str, url: str) -> None:
        """Upload a local file to ``url`` whole, retried as a whole on transient failures."""
        if is_local(url):
            os.makedirs(os.path.dirname(os.path.abspath(url)) or ".", exist_ok=True)
            os.replace(local_path, url)
            return
        fs, path = self.resolve(url)
        self._run_sync(url, lambda: fs.put_file(local_path, path))

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


_SHARED: dict[int, Storage] = {}  # per process (a Storage's filesystems do not cross a fork)
_SHARED_LOCK = threading.Lock()


def read_url(url: str) -> bytes:
    """The bytes of the remote ``url`` through one ``Storage`` of this process: credentials and
    endpoint from the environment (AWS_* variables, ~/.aws), the default retry policy, errors
    as ``Storage`` raises them (``SampleError`` naming the URL; ``SourceError`` for a missing
    bucket, denied access, no credentials, a server out of reach). For map functions handed a
    path and no ``storage_options`` (``conveyor.image``, ``conveyor.files``)."""
    pid = os.getpid()
    with _SHARED_LOCK:
        storage = _SHARED.get(pid)
        if storage is None:
            _SHARED.clear()
            storage = _SHARED[pid] = Storage()
    return storage.read(url)

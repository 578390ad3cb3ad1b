"""Object storage access for nodes: fsspec with our retry policy, error kinds, secret redaction.

Every remote read a node makes goes through a ``Storage``: it resolves a URL to an fsspec
filesystem (any protocol; S3 through s3fs), runs each request with a timeout, retries the
transient failures of object storage (HTTP 500/503, SlowDown and other throttling, reset or
dropped connections, timeouts) with capped exponential backoff and jitter, counts what it did
(``stats``), and turns the permanent failures into conveyor errors that name the URL at once:

* no such bucket, access denied, bad or no credentials: ``SourceError`` (the whole source is
  unusable);
* no such object, a corrupt or other permanent failure of one object: ``SampleError``;
* a transient failure that outlived its attempts: ``SampleError`` saying how many were made,
  but ``SourceError`` when the server could not be reached at all (connection refused, a name
  that does not resolve): that is about the server, not one object, and is never skipped.

s3fs and botocore retry on their own; for filesystems made here both are turned down to a
single attempt (s3fs ``retries``, botocore ``total_max_attempts``) so that the policy is ours
and every retry is counted. Socket timeouts come from ``RetryPolicy.timeout`` unless the spec's
``storage_options.config_kwargs`` sets them. Async filesystems (s3fs, gcsfs, http) run their
requests as coroutines on fsspec's IO loop, many at once without a thread each; synchronous
ones (local disk) on a small thread pool.

Secrets: ``storage_options`` are never logged, put in messages or in state. ``redact`` takes
any text and replaces the secret values it knows (from the options and the AWS environment
variables) and URL passwords with ``***``; every message built here goes through it. The error
kinds and the redaction live in ``conveyor/storage_errors.py``.

An optional ``LocalCache`` keeps remote objects (or ranges) in a local folder, bounded in
bytes, least recently used evicted first. Objects are assumed immutable while cached.

Example:
    >>> st = Storage(policy=RetryPolicy(attempts=3, timeout=10))
    >>> data = st.read("examples/data/numbers/a/1.txt")            # doctest: +SKIP
    >>> st.stats.as_dict()["retries"]                               # doctest: +SKIP
    0
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import hashlib
import io
import logging
import os
import random
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import fsspec
from fsspec.utils import glob_translate

from conveyor.errors import SampleError, SourceError
from conveyor.storage_errors import unknown_options
from conveyor.storage_errors import (DENIED, NO_BUCKET, NOT_FOUND, PERMANENT, TRANSIENT, classify,  # noqa: F401
                                     describe, no_connection, no_credentials, redact,
                                     secret_values)

log = logging.getLogger(__name__)


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)b?\s*$", re.I)
_UNITS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}


# ----- sizes ------------------------------------------------------------------------------

def parse_size(value: int | str) -> int:
    """Bytes from an int or a string like ``"256MB"``, ``"1.5GiB"``, ``"500k"`` (k = 1000, ki = 1024).

    Raises:
        ValueError: the value is not a size.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"size {value!r} must be >= 0")
        return value
    m = _SIZE.match(str(value))
    if not m:
        raise ValueError(f"expected a size such as 256MB, 1GiB or a number of bytes, got {value!r}")
    number, unit, binary = m.groups()
    return int(float(number) * (1024 if binary else 1000) ** _UNITS[unit.lower()])


# ----- policy and counters ----------------------------------------------------------------

@dataclass(frozen=True)
class RetryPolicy:
    """How requests are retried.

    Args:
        attempts: tries per request, >= 1 (transient failures only are tried again).
        timeout: seconds a request may take in all (also the socket read timeout).
        backoff: the first delay in seconds; each retry doubles it, up to ``backoff_max``.
        backoff_max: the cap on one delay.

    The delay before retry ``i`` is drawn uniformly from ``[d/2, d]`` with
    ``d = min(backoff_max, backoff * 2**i)`` (jitter spreads out clients that failed together).
    """

    attempts: int = 5
    timeout: float = 30.0
    backoff: float = 0.1
    backoff_max: float = 5.0

    def __post_init__(self) -> None:
        if not isinstance(self.attempts, int) or self.attempts < 1:
            raise ValueError(f"attempts={self.attempts!r} must be an int >= 1")
        if not self.timeout > 0:
            raise ValueError(f"timeout={self.timeout!r} must be > 0 seconds")
        if self.backoff < 0 or self.backoff_max < self.backoff:
            raise ValueError(f"backoff={self.backoff!r}, backoff_max={self.backoff_max!r}: need "
                             "0 <= backoff <= backoff_max")

    def delay(self, retry: int, rng: random.Random) -> float:
        d = min(self.backoff_max, self.backoff * (2 ** retry))
        return rng.uniform(d / 2, d)


class StorageStats:
    """Thread-safe counters: requests made, retries, failures given up on, bytes, cache hits."""

    FIELDS = ("requests", "retries", "failed", "bytes", "cache_hits")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(self.FIELDS, 0)

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n

    def clear(self) -> None:
        with self._lock:
            self._counts = dict.fromkeys(self.FIELDS, 0)

    def as_dict(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


# ----- local cache ------------------------------------------------------------------------

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


# ----- filesystems ------------------------------------------------------------------------

def protocol_of(url: str) -> str:
    return url.split("://", 1)[0].split("::")[-1] if "://" in url else "file"


def _local_files(root: str, depth: int | None = None) -> list[str]:
    """Every file below the local folder ``root`` (at most ``depth`` folders down: 1 is the
    files in ``root``; None: all), symlinked folders followed as ImageFolder's
    ``os.walk(followlinks=True)`` follows them (fsspec's listing takes a link to a folder for
    a file and lists nothing below it); a link back to a folder it is inside is not followed
    again (what is below it is listed already), so a link loop ends. A folder that cannot be
    read is a ``SourceError`` naming it."""
    if not os.path.isdir(root):
        return []  # no such folder: the caller says so
    out: list[str] = []
    broken: list[str] = []
    st = os.stat(root)
    stack = [(root, frozenset({(st.st_dev, st.st_ino)}))]  # a folder and the real folders it is in
    while stack:
        folder, inside = stack.pop()
        if depth is not None and len(inside) > depth:
            continue  # deeper than the pattern reaches
        try:
            entries = list(os.scandir(folder))
        except OSError as exc:
            raise SourceError(f"cannot list {folder}: {exc.strerror or exc}") from exc
        for entry in entries:
            try:
                is_dir = entry.is_dir()  # through a link
            except OSError:
                is_dir = False
            if not is_dir:
                out.append(entry.path)  # a file, a link to one, or a broken link (its read says so)
                if entry.is_symlink() and not os.path.exists(entry.path):
                    broken.append(entry.path)
                continue
            try:
                st = os.stat(entry.path)
            except OSError as exc:  # gone since, or a link to a folder this user cannot reach
                raise SourceError(f"cannot list {entry.path}: {exc.strerror or exc}") from exc
            if (st.st_dev, st.st_ino) not in inside:
                stack.append((entry.path, inside | {(st.st_dev, st.st_ino)}))
    if broken:  # a link to a class folder that moved would otherwise just not match */**
        log.warning("listing %s: %d broken symbolic link(s), e.g. %s", root, len(broken), min(broken))
    return out


_ONE_CHAR_SET = re.compile(r"\[([^!^])\]")  # [[] is "[", []] is "]", [x] is "x": no wildcard


def fixed_part(path: str) -> tuple[str, bool]:
    """The text ``path`` matches literally before its first wildcard (``*``, ``?``, a set of
    characters), and whether it has one. A one-character set is that character: ``run[[]1]``
    is the folder ``run[1]``, so that an escaped name still lists from its own folder."""
    out, i = [], 0
    while i < len(path):
        c = path[i]
        if c in "*?":
            return "".join(out), True
        if c == "[":
            one = _ONE_CHAR_SET.match(path, i)
            if one is None:
                return "".join(out), True
            out.append(one.group(1))
            i = one.end()
            continue
        out.append(c)
        i += 1
    return "".join(out), False


def single_slashes(url: str) -> str:
    """``url`` with each run of ``/`` in its path made one (``root/`` + ``/*/*``, from a root
    given with a trailing slash): a listing never returns such paths, so a glob that has them
    would match nothing. The ``//`` after a protocol stays."""
    head, sep, path = url.rpartition("://")
    return head + sep + re.sub(r"(?<=.)/{2,}", "/", path)


def is_folder_marker(path: str) -> bool:
    """Whether a listed object is a folder marker (a key ending in ``/``), not a file."""
    return path.endswith("/")


def is_local(url: str) -> bool:
    return protocol_of(url) in ("file", "local")


def _s3_options(options: dict[str, Any], policy: RetryPolicy) -> dict[str, Any]:
    config = {"connect_timeout": min(policy.timeout, 10.0), "read_timeout": policy.timeout,
              "retries": {"total_max_attempts": 1}, "max_pool_connections": 128}
    config.update(options.get("config_kwargs") or {})
    # no listings cache: a listing filled it, and an object's size (read_tar's, read_parquet's
    # first request) then came from there, stale once the object was replaced (shards packed
    # again into the same folder); every listing here is a fresh one anyway
    return {"use_listings_cache": False, **options, "config_kwargs": config,
            "max_concurrency": options.get("max_concurrency", 1)}


def filesystem(url: str, storage_options: dict[str, Any] | None = None,
               policy: RetryPolicy | None = None) -> tuple[Any, str]:
    """``(fs, path)`` for ``url``; for S3 with the library's own retries turned off (see above)."""
    options = dict(storage_options or {})
    protocol = protocol_of(url)
    bad = unknown_options(protocol, options)
    if bad:
        raise SourceError("; ".join(f"storage_options: {protocol} has no option '{k}'{hint}" for k, hint in bad)
                          + f" (reading {redact(url, options)})")
    if protocol in ("s3", "s3a"):
        options = _s3_options(options, policy or RetryPolicy())
    fs, path = fsspec.core.url_to_fs(url, **options)
    if protocol in ("s3", "s3a"):
        fs.retries = 1  # s3fs's own loop: one attempt (ours retries, and counts)
    return fs, path


def _walks(fs: Any) -> bool:
    """Whether ``fs.find`` is fsspec's generic one, built on ``walk`` (which takes ``on_error``)."""
    from fsspec.asyn import AsyncFileSystem
    from fsspec.spec import AbstractFileSystem

    if getattr(fs, "async_impl", False):
        return type(fs)._find is AsyncFileSystem._find
    return type(fs).find is AbstractFileSystem.find


def _full_url(fs: Any, path: str, like: str) -> str:
    if is_local(like):
        return path
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return path if "://" in path else f"{protocol}://{path}"


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
        cache: a local folder for a ``LocalCache`` of remote reads, or None.
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

    def _retry_or_raise(self, url: str, exc: BaseException, attempt: int) -> float:
        """The delay before the next attempt, or raise the conveyor error."""
        if classify(exc) != TRANSIENT or attempt + 1 >= self.policy.attempts:
            self.stats.add("failed")
            raise self.error(url, exc, attempt + 1) from exc
        self.stats.add("retries")
        delay = self.policy.delay(attempt, self._rng)
        log.debug("retrying %s in %.2fs (attempt %d of %d failed: %s)", redact(url, self.options),
                  delay, attempt + 1, self.policy.attempts, describe(exc, self.options))
        return delay

    async def _run_async(self, url: str, make: Callable[[], Awaitable[Any]],
                         timeout: float | None = -1.0) -> Any:
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
                await asyncio.sleep(self._retry_or_raise(url, exc, attempt))
        raise AssertionError("unreachable")

    def _run_sync(self, url: str, fn: Callable[[], Any]) -> Any:
        for attempt in range(self.policy.attempts):
            self.stats.add("requests")
            try:
                return fn()
            except Exception as exc:  # classified: retried or raised as a conveyor error
                time.sleep(self._retry_or_raise(url, exc, attempt))
        raise AssertionError("unreachable")

    def submit_call(self, url: str, sync_name: str, *args: Any, name: str | None = None,
                    timeout: float | None = -1.0, **kwargs: Any) -> cf.Future:
        """Start ``fs.<sync_name>(path, ...)`` (or its coroutine) with the retry policy; a future
        of its result. Errors name ``name`` (default: ``url``); ``timeout`` replaces the
        policy's for the whole call (None: only the per-request socket timeouts, for calls made
        of many requests such as a listing)."""
        fs, path = self.resolve(url)
        if getattr(fs, "async_impl", False):
            coro_fn = getattr(fs, "_" + sync_name)
            return asyncio.run_coroutine_threadsafe(
                self._run_async(name or url, lambda: coro_fn(path, *args, **kwargs), timeout),
                fs.loop)
        if is_local(url):  # no waiting worth a thread
            done: cf.Future = cf.Future()
            try:
                done.set_result(self._run_sync(name or url,
                                               lambda: getattr(fs, sync_name)(path, *args, **kwargs)))
            except Exception as exc:  # handed to whoever reads the future
                done.set_exception(exc)
            return done
        return self._pool_get().submit(self._run_sync, name or url,
                                       lambda: getattr(fs, sync_name)(path, *args, **kwargs))

    def call(self, url: str, sync_name: str, *args: Any, name: str | None = None,
             timeout: float | None = -1.0, **kwargs: Any) -> Any:
        """``submit_call(...).result()``: run it now."""
        return self.submit_call(url, sync_name, *args, name=name, timeout=timeout, **kwargs).result()

    # -- reads
    def submit(self, url: str, start: int | None = None, end: int | None = None) -> cf.Future:
        """Start reading ``url`` (bytes ``[start, end)``); a future of the bytes, or of the error."""
        key = f"{url}|{start}|{end}"
        if self.cache is not None:
            data = self.cache.get(key)
            if data is not None:
                self.stats.add("cache_hits")
                done: cf.Future = cf.Future()
                done.set_result(data)
                return done
        fs, path = self.resolve(url)
        if getattr(fs, "async_impl", False):
            return asyncio.run_coroutine_threadsafe(self._read_async(fs, url, path, start, end, key),
                                                    fs.loop)
        return self._pool_get().submit(self._read_sync, fs, url, path, start, end, key)

    async def _read_async(self, fs: Any, url: str, path: str, start: int | None, end: int | None,
                          key: str) -> bytes:
        data = await self._run_async(url, lambda: fs._cat_file(path, start=start, end=end))
        self.stats.add("bytes", len(data))
        if self.cache is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.cache.put, key, data)
        return data

    def _read_sync(self, fs: Any, url: str, path: str, start: int | None, end: int | None,
                   key: str) -> bytes:
        data = self._run_sync(url, lambda: fs.cat_file(path, start=start, end=end))
        self.stats.add("bytes", len(data))
        if self.cache is not None and not is_local(url):
            self.cache.put(key, data)
        return data

    def read(self, url: str, start: int | None = None, end: int | None = None) -> bytes:
        """The bytes of ``url`` (or of ``[start, end)``), with retries."""
        return self.submit(url, start, end).result()

    def size(self, url: str) -> int:
        return int(self.call(url, "size"))

    def glob_root(self, url: str) -> str:
        """The part of the glob ``url`` before its first wildcard, up to a ``/``, in the form
        ``glob`` gives its matches: every match starts with it and a ``/``."""
        fs, path = self.resolve(single_slashes(url))
        fixed, wild = fixed_part(path)
        root = fixed.rsplit("/", 1)[0] if wild else fixed
        return _full_url(fs, root.rstrip("/"), url)

    def glob(self, url: str, *, folder_markers: bool = False) -> list[str]:
        """Files matching ``url`` (a glob: ``*``, ``?``, ``[...]``, ``**``), sorted, as full URLs
        (plain paths when local).

        Object storage has folder markers, empty objects named ``prefix/`` (the AWS console's
        "Create folder", and many sync tools, make them); s3fs lists them as files. They are
        folders, not files: left out, or with ``folder_markers`` kept in the list, ending in
        ``/`` (``is_folder_marker``), for a caller that counts folders (empty class folders).

        One recursive listing under the glob's fixed prefix (on S3 a flat, paginated listing:
        one request per 1000 keys, not one per folder), matched against the pattern; a pattern
        one level below it (``root/*.tar``) lists only that folder's own entries. Unlike
        fsspec's ``glob``, a folder that fails to list is an error (retried when transient),
        never silently left out.

        Raises:
            SourceError: nothing matches (naming the URL, and a missing bucket or folder).
        """
        url = single_slashes(url)
        fs, path = self.resolve(url)
        fixed, wild = fixed_part(path)
        if not wild:
            try:
                info = self.call(_full_url(fs, fixed, url), "info")
            except SampleError as exc:
                if exc.__cause__ is None or classify(exc.__cause__) != NOT_FOUND:
                    raise SourceError(str(exc)) from exc.__cause__
                info = {"type": "directory"}  # nothing there: said below
            files = [fixed] if info.get("type") != "directory" else []
        else:
            root = fixed.rsplit("/", 1)[0] if "/" in fixed else ""
            root_url = url[:len(url) - len(path)] + root if not is_local(url) else root
            pattern = re.compile(glob_translate(path))
            if is_local(url):
                # as deep below root as the pattern's /s reach (an escape adds none), or any depth
                depth = None if "**" in path else path.count("/") - root.count("/")
                files = sorted(p for p in _local_files(root or "/", depth) if pattern.match(p))
            else:
                kwargs: dict[str, Any] = {"detail": True}
                if _walks(fs):
                    kwargs["on_error"] = "raise"  # fsspec's walk leaves failed folders out by default
                try:
                    # a listing is a request per 1000 keys: each has the socket timeouts, the
                    # whole has none (a big bucket takes long)
                    if "**" not in path and path.count("/") - root.count("/") == 1:
                        # root/*.tar: the one folder's own entries (a delimited listing), not
                        # every key of the tree below it (shards beside 1.28M loose images)
                        listed = self.call(root_url or url, "ls", name=url, timeout=None, detail=True)
                        found = {info["name"]: info for info in listed}
                    else:
                        found = self.call(root_url or url, "find", name=url, timeout=None, **kwargs)
                except SampleError as exc:  # listing a folder is not about one sample
                    if exc.__cause__ is None or classify(exc.__cause__) != NOT_FOUND:
                        raise SourceError(str(exc)) from exc.__cause__
                    found = {}  # no such folder: said below
                files = sorted(p for p, info in found.items()
                               if info.get("type") != "directory" and pattern.match(p)
                               and (folder_markers or not is_folder_marker(p)))
        if any(not is_folder_marker(p) for p in files):
            return [_full_url(fs, p, url) for p in files]
        # the folder the pattern lists from (a URL without wildcards: that URL), never cut
        # into its "proto://bucket" (s3://bucket named "s3:/" as what does not exist)
        head, sep, rest = url.rpartition("://")
        folder = re.split(r"[*?\[]", rest, maxsplit=1)[0]
        if wild and "/" in folder:
            folder = folder.rsplit("/", 1)[0]
        root = head + sep + folder.rstrip("/") if folder.strip("/") else url
        try:
            exists = bool(self.call(root, "exists"))
        except SourceError:
            raise
        except Exception:  # only for a better message; the listing itself said nothing matched
            exists = True
        where = f" ({redact(root, self.options)} does not exist)" if not exists else ""
        brackets = ("; '[' in a path starts a set of characters to match: write '[[]' for a "
                    "'[' in a folder's name") if "[" in path else ""
        raise SourceError(f"no file matches {redact(url, self.options)!r}{where}; check the "
                          f"path, the glob and the bucket{brackets}")

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


class _BlockReader:
    """Sequential reads of a remote object in aligned blocks, the next ones read ahead.

    Block ``k`` is the request for bytes ``[k*B, (k+1)*B)`` (the server answers the last one
    short). The object's size and the first block are requested together, so opening costs
    one round trip.
    """

    def __init__(self, storage: Storage, url: str, *, offset: int, block_size: int, read_ahead: int):
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
        size = storage.submit_call(url, "size")
        self._pending[first] = storage.submit(url, first, first + block_size)
        try:
            self.size = int(size.result())
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
                self._pending[s] = self._st.submit(self.url, s, s + self._bs)
                self._requested_to = max(self._requested_to, min(s + self._bs, self.size))

    def _block(self, start: int) -> memoryview:
        self._schedule(start)
        if start not in self._pending:  # read before (the buffer moved past it): read again
            self._pending[start] = self._st.submit(self.url, start, start + self._bs)
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

    def __init__(self, storage: Storage, url: str):
        super().__init__()
        self.url = url
        self._st = storage
        self.size = storage.size(url)
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
        futures = [self._st.submit(self.url, s, min(s + self.CHUNK, end))
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

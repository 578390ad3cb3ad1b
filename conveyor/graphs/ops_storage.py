"""The object-storage ops as the compiler sees them: ``fetch`` and ``read_tar``.

Both read through ``conveyor.storage``: any fsspec URL, S3 through s3fs, one retry policy
(``attempts``, ``timeout`` per request, ``backoff`` doubling up to ``backoff_max``), counts in
``loader.stats()``, an optional bounded local ``cache``. ``storage_options`` (endpoint_url,
key, secret, ...) are kept out of states, digests, ``conveyor show`` and messages.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchdata.nodes import BaseNode

from conveyor.graphs.opspec import count_unless_skipping
from conveyor.graphs.ops import BuildContext, OnError, elastic_through
from conveyor.graphs.registry import OpSpec, param
from conveyor.nodes import Fetch, ReadTar
from conveyor.storage import RetryPolicy, parse_size


@dataclass(frozen=True)
class _RemoteParams:
    """What every op reading through ``conveyor.storage`` takes: the retry policy, the cache
    and the fsspec options."""

    attempts: int = param(5, min=1, doc="tries per request; only transient errors are retried")
    timeout: float = param(30.0, doc="seconds a request may take (then it is retried)")
    backoff: float = param(0.1, min=0, doc="first retry delay in seconds, doubled each retry")
    backoff_max: float = param(5.0, min=0, doc="the longest retry delay")
    cache: str | None = param(None, doc="local folder keeping what was read remotely")
    cache_size: int | str = param("10GB", doc="the cache's bound: bytes or 10GB, 500MB")
    storage_options: dict | None = param(None, doc="fsspec options (endpoint_url, ...); never logged")


@dataclass(frozen=True)
class FetchParams(_RemoteParams):
    concurrency: int = param(16, min=1, doc="object reads in flight")
    field: str = param("path", doc="the record field holding the URL")
    out: str = param("bytes", doc="the field the object's bytes go to")
    on_error: OnError = param(OnError.raise_, doc="skip: count and drop records that cannot be read")
    read_local: bool = param(False, doc="also read local paths (by default the decoder reads them)")


@dataclass(frozen=True)
class ReadTarParams(_RemoteParams):
    field: str = param("path", doc="the record field holding the shard URL")
    block_size: int | str = param("8MB", doc="bytes per request on remote shards")
    read_ahead: int = param(4, min=0, doc="blocks requested ahead of the one being read")
    index_stride: int = param(1_000_000, min=1, doc="index = shard index * stride + position")
    on_error: OnError = param(OnError.raise_, doc="skip: count and drop the rest of a bad shard, "
                                                   "or a sample missing a field")
    fields: list[str] | None = param(None, doc="fields every sample must have, e.g. "
                                               "[\"jpg;png\", cls] (; = either)")


def _policy(p: _RemoteParams) -> RetryPolicy:
    return RetryPolicy(attempts=p.attempts, timeout=p.timeout, backoff=p.backoff,
                       backoff_max=p.backoff_max)


def _check_remote(p: _RemoteParams, n_inputs: int) -> list[tuple[str, str]]:
    errors = []
    if not p.timeout > 0:
        errors.append(("timeout", f"expected a number of seconds > 0, got {p.timeout!r}"))
    if p.backoff_max < p.backoff:
        errors.append(("backoff_max", f"must be >= backoff ({p.backoff!r}), got {p.backoff_max!r}"))
    sizes = [("cache_size", p.cache_size)]
    if isinstance(p, ReadTarParams):
        sizes.append(("block_size", p.block_size))
    for name, value in sizes:
        try:
            n = parse_size(value)
        except ValueError as exc:
            errors.append((name, str(exc)))
            continue
        if n <= 0 or (name == "block_size" and n < 512):
            errors.append((name, f"expected a size of at least {512 if name == 'block_size' else 1} "
                                 f"bytes, got {value!r}"))
    if isinstance(p, ReadTarParams) and p.cache and not errors and parse_size(p.cache_size) < parse_size(p.block_size):
        errors.append(("cache_size", f"the cache ({p.cache}) must hold at least one block (block_size "
                                     f"{p.block_size!r}), got {p.cache_size!r}"))
    return errors


def _build_fetch(p: FetchParams, inputs: list[BaseNode], ctx: BuildContext) -> BaseNode:
    return Fetch(inputs[0], concurrency=p.concurrency, field=p.field, out=p.out, policy=_policy(p),
                 storage_options=p.storage_options, on_error=p.on_error.value, cache=p.cache,
                 cache_size=p.cache_size, where=ctx.where, read_local=p.read_local)


def _build_read_tar(p: ReadTarParams, inputs: list[BaseNode], ctx: BuildContext) -> BaseNode:
    return ReadTar(inputs[0], field=p.field, policy=_policy(p), storage_options=p.storage_options,
                   block_size=parse_size(p.block_size), read_ahead=p.read_ahead,
                   index_stride=p.index_stride, on_error=p.on_error.value, cache=p.cache,
                   cache_size=p.cache_size, where=ctx.where, fields=p.fields)


FETCH = OpSpec("fetch", FetchParams, _build_fetch, "one",
               "read each record's object (bytes), many at once, in order, with retries; elastic",
               _check_remote, elastic=elastic_through, length=count_unless_skipping,
               unknown_length="skips the items that fail (on_error: skip)", keeps_count="unless_skipping",
               per_record=True, safe_params=frozenset({"attempts", "timeout", "backoff", "backoff_max", "cache",
                                                       "cache_size", "concurrency"}),
               items_in='records with a URL under field (list_files records)',
               items_out="the same records with the object's bytes under out",
               example='fetch: {op: fetch, concurrency: 32}')
READ_TAR = OpSpec("read_tar", ReadTarParams, _build_read_tar, "one",
                  "samples from tar shards (WebDataset layout), streamed, resumable mid-shard; "
                  "elastic above a shard (a global order), not below one (a shard partly read)",
                  _check_remote, unknown_length="yields as many samples as its shards hold", per_record=True,
                  safe_params=frozenset({"attempts", "timeout", "backoff", "backoff_max", "cache", "cache_size",
                                         "block_size", "read_ahead"}),
                  items_in='shard records {path, index} (list_files)',
                  items_out='samples {__key__, __url__, index, <extension>: bytes, ...}',
                  example='samples: {op: read_tar, on_error: skip}')

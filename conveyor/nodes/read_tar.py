"""read_tar: stream samples out of tar shards in the WebDataset layout.

A shard is a plain tar whose members are grouped by key: ``n01440764_10026.jpg`` and
``n01440764_10026.cls`` make one sample ``{"__key__": "n01440764_10026", "jpg": b"...",
"cls": 0, ...}`` (the key is the member name up to the first dot of its base name, the field
the rest, lower-cased; a member whose base name starts with a dot, such as macOS tar's
``._NAME`` attribute files, is in no sample). Shards come from the input as records with a URL under ``field``
(``list_files`` records) and are read front to back through fsspec, a few blocks ahead,
never downloaded whole first; each block request follows the retry policy of
``conveyor.storage``.

Each sample also gets ``__url__`` (its shard) and ``index``, a stable sample id:
``shard_index * index_stride + position in the shard``, where ``shard_index`` is the shard
record's ``index`` (its place in the sorted listing), so the id does not depend on the order
shards are read in, on the rank or on the reader. ``cls`` is turned into an int (WebDataset's
class number; anything else is an error).

The state is the input's state before the current shard, the byte offset of the next sample's
first header in it, and the samples already read from it: a restore reopens that shard and
seeks there, with no replay. Once the last block of a remote shard is requested, the next
shard is opened ahead (its size and first blocks requested), so shard boundaries cost no
round trips; the state still names the shard being read. Memory: up to ``read_ahead + 1``
blocks per open shard (8 MB blocks, 4 ahead: 40 MB, and as much for the next shard).

Nothing is lost silently. A corrupt shard is a ``SampleError`` naming it and the offset: a
header that does not parse (pax records included), a member cut short, a shard that ends
without the end-of-archive marker (cut between samples, or zero bytes) or with data after it
(archives joined with ``cat``, which tar also reads only in part), and a shard whose
sample count differs from the one ``conveyor pack`` wrote in ``index.json`` beside it (read
once per folder when there is one). With ``on_error="skip"`` the rest of such a shard is
skipped and counted (``skipped_shards``); a gzip, bzip2, xz or zstd file is named as one (shards
are read uncompressed). A sample without one of the required ``fields``
(a ``.cls`` missing, a shard cut between a sample's ``.jpg`` and ``.cls``), with a ``cls``
that is not a number, or with a member that is a hard or symbolic link (``tar`` stores a file
whose inode it has stored before as a hard link, with no data) is a ``SampleError`` naming the
shard, the key and the offset, or with ``on_error="skip"`` that sample is dropped and counted (``skipped_samples``); its ``index``
stays used, so the others keep theirs.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from torchdata.nodes import BaseNode

from conveyor.errors import ConveyorError, SampleError, SourceError
from conveyor.nodes._tar import BLOCK, OpenTar, sample_problem
from conveyor.nodes._skips import LEDGER_KEY, SkipLedger, log_skip
from conveyor.nodes.list_files import changed_since_manifest
from conveyor.storage import NOT_FOUND, RetryPolicy, Storage, classify, redact
from conveyor.nodes.state_shape import Child, Fields, Int, LEDGER_SHAPE

log = logging.getLogger(__name__)

ON_ERROR = ("raise", "skip")
INDEX_NAME = "index.json"  # written by ``conveyor pack`` beside the shards


class _Next:
    """The shard after the current one: its record, and its reader when opened ahead."""

    __slots__ = ("before", "url", "index", "reader", "record")

    def __init__(self, before: dict, url: str, index: int | None, reader: Any, record: dict | None = None):
        self.before, self.url, self.index, self.reader = before, url, index, reader
        self.record = record or {}


def _close_reader(fut: Any) -> None:
    if not fut.cancelled() and fut.exception() is None:
        fut.result().close()


def _close_reader_now(reader: Any) -> None:
    try:
        reader.close()
    except OSError:  # closing a reader of an object that changed: nothing more to say
        pass


class ReadTar(BaseNode[dict]):
    """Yield the samples of the tar shards named by the input's records, shard after shard.

    Args:
        source: records with the shard's URL under ``field`` (and its listing ``index``).
        field: the record field holding the URL.
        policy: the retry policy for every block request.
        storage_options: fsspec options (endpoint_url, key, secret, ...); never logged.
        block_size: bytes per request when reading a remote shard.
        read_ahead: blocks requested ahead of the one being read.
        index_stride: samples per shard the ``index`` leaves room for.
        on_error: ``"raise"`` or ``"skip"`` (the rest of an unreadable shard, or a sample that
            lacks a field, counted).
        fields: fields every sample must have; ``"jpg;png"`` accepts either. None: no check.
        cache: a local folder to keep remote blocks in, or None.
        cache_size: the cache's bound.
        where: text for error notes.

    Example:
        >>> from torchdata.nodes import IterableWrapper
        >>> node = ReadTar(IterableWrapper([{"path": "shards/shard-000000.tar", "index": 0}]))
        >>> sorted(next(node))                                            # doctest: +SKIP
        ['__key__', '__url__', 'cls', 'index', 'jpg']
    """

    SOURCE_KEY = "source"
    OFFSET_KEY = "offset"
    POS_KEY = "pos"
    SHARDS_KEY = "shards"
    STATE_SHAPE = Fields({SOURCE_KEY: Child(), OFFSET_KEY: Int(min=-1), POS_KEY: Int(), SHARDS_KEY: Int(),
                          LEDGER_KEY: LEDGER_SHAPE}, optional=(LEDGER_KEY,))  # offset -1: no shard open

    def __init__(self, source: BaseNode, *, field: str = "path", policy: RetryPolicy | None = None,
                 storage_options: dict[str, Any] | None = None, block_size: int = 8 << 20,
                 read_ahead: int = 4, index_stride: int = 1_000_000, on_error: str = "raise",
                 cache: str | None = None, cache_size: int | str = "10GB", where: str | None = None,
                 fields: list[str] | None = None):
        super().__init__()
        if on_error not in ON_ERROR:
            raise ValueError(f"{on_error=} must be one of {ON_ERROR}")
        if not isinstance(block_size, int) or block_size < BLOCK:
            raise ValueError(f"{block_size=} must be an int >= {BLOCK}")
        if not isinstance(index_stride, int) or index_stride < 1:
            raise ValueError(f"{index_stride=} must be an int >= 1")
        if isinstance(fields, str):  # its letters would each be a required field
            raise ValueError(f"{fields=} must be a list of fields, e.g. [{fields!r}, 'cls']")
        self.source = source
        self.field = field
        self.block_size = block_size
        self.read_ahead = read_ahead
        self.index_stride = index_stride
        self.on_error = on_error
        self.where = where or "read_tar"
        self.storage = Storage(storage_options=storage_options, policy=policy, cache=cache,
                               cache_size=cache_size, threads=max(2, read_ahead + 1))
        if self.storage.cache is not None and self.storage.cache.max_bytes < block_size:
            raise SourceError(f"cache folder {self.storage.cache.dir}: its limit, cache_size {cache_size!r}, "
                              f"cannot hold one block of a shard (block_size, {block_size} bytes): raise "
                              "cache_size, lower block_size, or leave cache out")
        self.fields = [tuple(f.lower().split(";")) for f in fields or ()]
        self.skipped_shards = 0
        self.skipped_samples = 0
        self.ledger = SkipLedger()
        self._counts: dict[str, dict[str, int] | None] = {}  # folder -> index.json's counts
        self._shard: OpenTar | None = None
        self._next: _Next | None = None
        self._source_done = False
        self._shard_index = 0
        self._shards_seen = 0
        self._before: dict | None = None
        self._pos = 0

    def __repr__(self) -> str:
        return f"ReadTar(field={self.field!r}, block_size={self.block_size})"

    def stats(self) -> dict[str, int]:
        return {**self.storage.stats.as_dict(), "skipped_shards": self.skipped_shards,
                "skipped_samples": self.skipped_samples}

    def _expected(self, url: str) -> int | None:
        """The shard's sample count from ``index.json`` beside it, when there is one."""
        folder, _, name = url.rpartition("/")
        if folder not in self._counts:
            counts = None
            try:
                raw = self.storage.call(f"{folder}/{INDEX_NAME}", "cat_file", optional=True)
                index = json.loads(raw)
                counts = {s["name"]: int(s["samples"]) for s in index.get("shards", [])}
            except (SampleError, SourceError) as exc:  # no index: nothing to check against
                if classify(exc.__cause__ or exc) != NOT_FOUND:
                    log.warning("%s: cannot read %s/%s (%s); shard sample counts are not checked",
                                self.where, redact(folder, self.storage.options), INDEX_NAME,
                                redact(str(exc), self.storage.options))
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                log.warning("%s: %s/%s is not a conveyor shard index (%s); shard sample counts "
                            "are not checked", self.where, redact(folder, self.storage.options),
                            INDEX_NAME, exc)
            self._counts[folder] = counts
        counts = self._counts[folder]
        return counts.get(name) if counts else None

    def _close_shard(self) -> None:
        if self._shard is not None:
            self._shard.close()
            self._shard = None

    def _drop_next(self) -> None:
        if self._next is not None and self._next.reader is not None:
            fut = self._next.reader
            fut.cancel()
            fut.add_done_callback(_close_reader)
        self._next = None

    def close(self) -> None:
        self._close_shard()
        self._drop_next()
        self.storage.close()

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self._close_shard()
        self._drop_next()
        self._source_done = False
        self.skipped_shards = 0
        self.skipped_samples = 0
        self.storage.stats.clear()
        if initial_state is None:
            self._shards_seen = 0
            self.source.reset()
            return
        self.source.reset(initial_state[self.SOURCE_KEY])
        self.ledger.load(initial_state.get(LEDGER_KEY))
        self._shards_seen = initial_state[self.SHARDS_KEY]
        if initial_state[self.OFFSET_KEY] >= 0:
            self._open_next(initial_state[self.OFFSET_KEY], initial_state[self.POS_KEY])

    def _pull(self, prefetch: bool) -> None:
        """Take the next shard record from the input; start opening it when ``prefetch``."""
        before = self.source.state_dict()
        try:
            record = next(self.source)
        except StopIteration:
            self._source_done = True
            return
        url = record.get(self.field) if isinstance(record, dict) else record
        if not isinstance(url, str):
            raise SampleError(f"{self.where}: expected a record with a shard URL under "
                              f"'{self.field}', got {type(record).__name__}")
        index = record.get("index") if isinstance(record, dict) else None
        reader = (self.storage.open_sequential_async(url, block_size=self.block_size,
                                                     read_ahead=self.read_ahead)
                  if prefetch else None)
        self._next = _Next(before, url, index if isinstance(index, int) else None, reader,
                           record if isinstance(record, dict) else {})

    def _open_next(self, offset: int = 0, pos: int = 0) -> None:
        if self._next is None and not self._source_done:
            self._pull(prefetch=False)
        nxt, self._next = self._next, None
        if nxt is None:
            raise StopIteration
        self._before = nxt.before
        self._shard_index = nxt.index if nxt.index is not None else self._shards_seen
        self._shards_seen += 1
        self._pos = pos
        try:
            if nxt.reader is not None:  # opened ahead, at offset 0
                reader = nxt.reader.result()
            else:
                reader = self.storage.open_sequential(nxt.url, offset=offset,
                                                      block_size=self.block_size,
                                                      read_ahead=self.read_ahead)
        except SampleError as exc:
            changed = changed_since_manifest(nxt.record, None, None, gone=exc.__cause__ is not None and classify(exc.__cause__) == NOT_FOUND)
            if changed:
                raise SourceError(changed) from exc
            self._failed(exc, nxt.url)
            return
        version = getattr(reader, "version", None)
        if version is None and hasattr(reader, "fileno"):  # a local file
            version = (os.fstat(reader.fileno()).st_size, None)
        changed = changed_since_manifest(nxt.record, *(version or (None, None)))
        if changed:
            _close_reader_now(reader)
            raise SourceError(changed)
        self._shard = OpenTar(reader, nxt.url, offset)

    def _failed(self, exc: SampleError, url: str) -> None:
        self._close_shard()
        if self.on_error == "raise":
            raise exc
        self.skipped_shards += 1
        self.ledger.add(redact(url, self.storage.options) + " (the rest of the shard)", exc,
                        redact(str(exc), self.storage.options))
        log_skip(log, self.skipped_shards + self.skipped_samples,
                 f"{self.where}: skipped the rest of a shard ({redact(str(exc), self.storage.options)})")

    def next(self) -> dict:
        try:
            return self._read_sample()
        except ConveyorError as exc:
            if not any(self.where in note for note in getattr(exc, "__notes__", [])):
                exc.add_note(f"in {self.where}")
            raise

    def _read_sample(self) -> dict:
        while True:
            if self._shard is None:
                self._open_next()  # StopIteration when the input is done
                continue
            shard, at = self._shard, self._shard.offset
            try:
                sample = shard.sample()
            except SampleError as exc:
                self._failed(exc, shard.url)
                continue
            if shard.done:  # closed now: a state taken here points past this shard
                self._close_shard()
                self._check_count(shard.url, self._pos + (sample is not None))
            elif (self._next is None and not self._source_done
                  and getattr(shard.reader, "all_requested", False)):
                self._pull(prefetch=True)  # open the next remote shard while this one ends
            if sample is None:
                continue
            if self._pos >= self.index_stride:
                raise SampleError(f"{shard.url}: more than index_stride={self.index_stride} "
                                  "samples in one shard; raise index_stride")
            sample["__url__"] = shard.url
            sample["index"] = self._shard_index * self.index_stride + self._pos
            self._pos += 1
            problem = sample_problem(sample, self.fields, shard.links)
            if problem is None:
                return sample
            if shard.pending is not None:  # the shard's fault (cut short, say), not the sample's
                self._failed(shard.pending, shard.url)
                continue
            exc = SampleError(f"{shard.url}: sample {sample['__key__']!r} at byte {at}: {problem}")
            if self.on_error == "raise":
                raise exc
            self.skipped_samples += 1
            self.ledger.add(redact(f"{shard.url}#{sample['__key__']}", self.storage.options), exc,
                            redact(str(exc), self.storage.options))
            log_skip(log, self.skipped_shards + self.skipped_samples,
                     f"{self.where}: skipped a sample ({redact(str(exc), self.storage.options)})")

    def _check_count(self, url: str, read: int) -> None:
        """At the end of a shard: as many samples as ``index.json`` says, when it says."""
        expected = self._expected(url)
        if expected is not None and read != expected:
            self._failed(SampleError(f"{url}: {read} samples read, but {INDEX_NAME} lists "
                                     f"{expected}: the shard is truncated or was replaced"), url)

    def get_state(self) -> dict:
        if self._shard is None:
            source = self._next.before if self._next is not None else self.source.state_dict()
            return {self.SOURCE_KEY: source, self.OFFSET_KEY: -1, self.POS_KEY: 0,
                    self.SHARDS_KEY: self._shards_seen, LEDGER_KEY: self.ledger.state()}
        return {self.SOURCE_KEY: self._before, self.OFFSET_KEY: self._shard.offset,
                self.POS_KEY: self._pos, self.SHARDS_KEY: self._shards_seen - 1, LEDGER_KEY: self.ledger.state()}

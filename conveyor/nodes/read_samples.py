"""read_samples: the fields of each MDS or LitData sample record, read from its shard.

The input is a stream of sample records from ``list_mds`` or ``list_litdata`` (after ``shard``
and ``shuffle_buffer`` as a rule). Each comes out with the sample's columns (MDS) or its dict's
keys (LitData; a sample that is not a dict goes under ``value``) added, decoded: ints, floats,
strings, bytes, JSON, arrays (numpy; LitData tensors as torch tensors), a raw image as an
HxW[xC] uint8 array, and JPEG/PNG images as their encoded bytes, which ``conveyor.image``'s
functions decode. ``index`` stays the listing's sample id unless the dataset has a column of
that name, whose value then wins; ``__url__`` is the shard.

An uncompressed shard is read one sample at a time (one ranged read, the shard's offsets read
once), and so is a LitData chunk compressed a sample at a time (``compression_level="sample"``);
LitData's framed zstd (``optimize(compression="zstd")``'s default) a frame at a time (its header
read once, a frame one ranged read, decompressed); a shard compressed whole is read whole and
decompressed. The last ``keep`` frames or shards are kept in memory: with a global shuffle over
compressed shards, prefer ``shuffle_buffer`` (or ``conveyor pack --from``). A LitData chunk that
keeps its rows in an Arrow footer (samples of text and numbers only) is read with pyarrow.
A shard that does not match its index or is cut short is a ``SampleError`` naming it, or with
``on_error="skip"`` its samples are skipped and counted. The node keeps no position of its
own: its state is its input's, so resume is exact and elastic wherever the listing's is.
"""

from __future__ import annotations

import logging
import struct
from typing import Any

from torchdata.nodes import BaseNode

from conveyor.errors import SampleError
from conveyor.nodes._sample_formats import SampleSet, ShardReader, open_set
from conveyor.nodes._skips import LEDGER_KEY, SkipLedger, log_skip
from conveyor.nodes.state_shape import LEDGER_SHAPE, Child, Fields, Int
from conveyor.storage import RetryPolicy, Storage, redact

log = logging.getLogger(__name__)

ON_ERROR = ("raise", "skip")
KINDS = ("mds", "litdata")


class ReadSamples(BaseNode[dict]):
    """Add each sample record's decoded fields.

    Args:
        source: sample records (from ``ListMds`` or ``ListLitdata``).
        on_error: ``"raise"`` or ``"skip"`` (a shard that does not match its index, cut short).
        storage_options: fsspec options; never logged.
        policy: the retry policy for every read.
        keep: compressed shards (or frames, or Arrow footers) kept in memory, decompressed.
        allow_pickle: accept ``pkl``/``pickle`` fields.
        where: text for error notes.

    Example:
        >>> from conveyor.nodes import ListMds
        >>> node = ReadSamples(ListMds(url="tests/fixtures/formats/mds/plain"))
        >>> next(node)["label"]
        -20
    """

    SOURCE_KEY = "source"
    SKIPPED_KEY = "skipped"
    STATE_SHAPE = Fields({SOURCE_KEY: Child(), SKIPPED_KEY: Int(), LEDGER_KEY: LEDGER_SHAPE})

    def __init__(self, source: BaseNode, *, on_error: str = "raise", storage_options: dict[str, Any] | None = None,
                 policy: RetryPolicy | None = None, keep: int = 2, allow_pickle: bool = False,
                 where: str | None = None):
        super().__init__()
        if on_error not in ON_ERROR:
            raise ValueError(f"{on_error=} must be one of {ON_ERROR}")
        if not isinstance(keep, int) or keep < 1:
            raise ValueError(f"{keep=} must be an int >= 1")
        self.source, self.on_error, self.allow_pickle = source, on_error, allow_pickle
        self.where = where or "read_samples"
        self.storage = Storage(storage_options=storage_options, policy=policy)
        self.reader = ShardReader(self.storage, keep=keep)
        self._sets: dict[tuple[str, str], SampleSet] = {}
        self.skipped = 0
        self.ledger = SkipLedger()

    def stats(self) -> dict[str, int]:
        return {**self.storage.stats.as_dict(), "skipped": self.skipped}

    def close(self) -> None:
        self.storage.close()

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        if initial_state is None:
            self.source.reset()
            self.skipped = 0
        else:
            self.source.reset(initial_state[self.SOURCE_KEY])
            self.skipped = initial_state[self.SKIPPED_KEY]
            self.ledger.load(initial_state.get(LEDGER_KEY))

    def _set(self, kind: str, root: str) -> SampleSet:
        found = self._sets.get((kind, root))
        if found is None:
            found = self._sets[(kind, root)] = open_set(root, kind, self.storage, self.allow_pickle)
        return found

    def next(self) -> dict:
        while True:
            record = next(self.source)
            kind = next((k for k in KINDS if isinstance(record, dict) and k in record), None)
            if kind is None:
                raise SampleError(f"{self.where}: expects sample records {{'mds' or 'litdata', 'shard', 'pos'}} "
                                  f"(from list_mds or list_litdata), got {record!r}")
            sample_set = self._set(kind, record.pop(kind))
            shard = sample_set.shards[record.pop("shard")]
            pos = record.pop("pos")
            try:
                raw = self.reader.sample(shard, pos)
                try:
                    fields = raw if isinstance(raw, dict) else sample_set.decode(raw, shard.url)
                except (ValueError, IndexError, KeyError, TypeError, UnicodeDecodeError, EOFError,
                        struct.error) as exc:
                    raise SampleError(f"{shard.url}: sample {pos} does not decode "
                                      f"({type(exc).__name__}: {exc})") from None
            except SampleError as exc:
                if self.on_error == "raise":
                    exc.add_note(f"in {self.where}")
                    raise
                self.skipped += 1
                self.ledger.add(redact(f"{shard.url}#{pos}", self.storage.options), exc,
                                redact(str(exc), self.storage.options))
                log_skip(log, self.skipped, f"{self.where}: skipped a sample ({redact(str(exc), self.storage.options)})")
                continue
            record.update(fields)
            record["__url__"] = shard.url
            return record

    def get_state(self) -> dict:
        return {self.SOURCE_KEY: self.source.state_dict(), self.SKIPPED_KEY: self.skipped,
                LEDGER_KEY: self.ledger.state()}

"""read_lmdb: the value of each key record, read from its LMDB environment.

The input is a stream of key records (``list_lmdb``, after ``shard`` and ``shuffle_buffer``
as a rule); each comes out with its value's bytes under ``out`` (``bytes`` by default, which
``conveyor.image``'s functions and ``conveyor.files:read_bytes`` read). Reads are short
read-only transactions on a handle opened once per environment and process, without LMDB's
lock (conveyor/nodes/_lmdb.py): any number of threads and worker processes read at once.

A key that is not in the environment raises ``SampleError`` naming the environment and the
key with ``on_error="raise"``, or is skipped and counted with ``on_error="skip"``. The node
keeps no position of its own: its state is its input's.
"""

from __future__ import annotations

import logging

from torchdata.nodes import BaseNode

from conveyor.errors import SampleError
from conveyor.nodes._lmdb import open_env
from conveyor.nodes._skips import LEDGER_KEY, SkipLedger, log_skip
from conveyor.nodes.state_shape import Child, Fields, Int, LEDGER_SHAPE

log = logging.getLogger(__name__)

ON_ERROR = ("raise", "skip")


class ReadLmdb(BaseNode[dict]):
    """Add each key record's value (bytes) under ``out``.

    Args:
        source: key records ``{"lmdb": path, "key", ...}`` (from ``ListLmdb``).
        out: the field the value goes to.
        on_error: ``"raise"`` or ``"skip"`` (a missing key).

    Example:
        >>> node = ReadLmdb(ListLmdb(path="/data/imagenet.lmdb"))   # doctest: +SKIP
        >>> type(next(node)["bytes"])
        <class 'bytes'>
    """

    SOURCE_KEY = "source"
    SKIPPED_KEY = "skipped"
    STATE_SHAPE = Fields({SOURCE_KEY: Child(), SKIPPED_KEY: Int(), LEDGER_KEY: LEDGER_SHAPE}, optional=(LEDGER_KEY,))

    def __init__(self, source: BaseNode, *, out: str = "bytes", on_error: str = "raise"):
        super().__init__()
        if on_error not in ON_ERROR:
            raise ValueError(f"{on_error=} must be one of {ON_ERROR}")
        if not out:
            raise ValueError(f"{out=} must be a field name")
        self.source, self.out, self.on_error = source, out, on_error
        self.skipped = 0
        self.ledger = SkipLedger()

    def stats(self) -> dict[str, int]:
        return {"skipped": self.skipped}

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        if initial_state is None:
            self.source.reset()
            self.skipped = 0
        else:
            self.source.reset(initial_state[self.SOURCE_KEY])
            self.skipped = initial_state[self.SKIPPED_KEY]
            self.ledger.load(initial_state.get(LEDGER_KEY))

    def next(self) -> dict:
        while True:
            record = next(self.source)
            try:
                path, key = record["lmdb"], record["key"]
            except (KeyError, TypeError):
                raise SampleError(f"read_lmdb expects key records {{'lmdb', 'key'}} (from list_lmdb), "
                                  f"got {record!r}") from None
            raw = key.encode("utf-8") if isinstance(key, str) else key
            with open_env(path).begin(buffers=False) as txn:
                value = txn.get(raw)
            if value is not None:
                record[self.out] = value
                return record
            why = f"read_lmdb: {path}: no key {key!r}"
            if self.on_error == "raise":
                raise SampleError(f"{why} (set on_error: skip to count and skip missing keys)")
            self.skipped += 1
            self.ledger.add(f"{path}#{key}", "SampleError", why)
            log_skip(log, self.skipped, f"{why}; skipped")

    def get_state(self) -> dict:
        return {self.SOURCE_KEY: self.source.state_dict(), self.SKIPPED_KEY: self.skipped,
                LEDGER_KEY: self.ledger.state()}

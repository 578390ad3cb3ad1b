"""map_batches: a map whose ``fn`` takes a list of items and returns a list of results.

Where an item costs microseconds (tokenizing a line of text) the per-item Python around a
call is most of the cost, and some functions do a list at once much faster than its items one
by one (Hugging Face ``tokenizers``' ``encode_batch`` runs in Rust, in parallel; a byte
tokenizer fills one buffer for the lot). ``MapBatches`` reads ``size`` items, calls
``fn(items, **args)`` once, checks that it returned one result per item, and emits the
results one by one: downstream nodes see single items, exactly as after ``Map``.

The calls run through a ``Map`` over the lists, so ``workers``, ``method`` and the error
policy behave as in ``map``. When ``fn`` raises on a list, each item of that list is tried
alone (as a list of one) to find the bad ones: with ``on_error="raise"`` the first bad
item's exception is raised with a note naming the node; with ``on_error="skip"`` only the bad
items are skipped and counted (``stats()["skipped"]``), never their neighbours. ``fn`` gets no
``rng`` (a list has no single sample index): per-sample randomness needs ``map``.

Outputs do not depend on where lists start, so the state is the inner map's state before the
current list and how many of its results were emitted (all of them, between lists); a restore
maps that list again and drops those results. The state is as small as ``Map``'s; a restore
re-runs ``fn`` on at most one list of the saved size. The lists are cut from there at the size
of now: for a fn whose results do not depend on the batching (``batch_invariant``, as
``conveyor.text``'s tokenizers), a state saved with another ``batch`` resumes exactly.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import numpy as np
from torchdata.nodes import BaseNode

from conveyor._id_blocks import IdsBlock
from conveyor.errors import StateError
from conveyor.nodes import capabilities as cap
from conveyor.nodes._elastic import Cursor
from conveyor.nodes._skips import LEDGER_KEY, OnError, sample_id
from conveyor.nodes._workers.map_calls import Failed, parameters, stopped
from conveyor.nodes.map import ON_ERROR, Map
from conveyor.nodes.state_shape import Child, Fields, Int, LEDGER_SHAPE, Same

log = logging.getLogger(__name__)


def wants_rng(fn: Callable) -> bool:
    """Whether ``fn`` has an ``rng`` or ``generator`` parameter (per-sample randomness, which
    ``map`` gives and a batch map cannot); for a class, its ``__call__``'s."""
    params = parameters(fn.__call__ if isinstance(fn, type) else fn)
    return "rng" in params or "generator" in params


class _Lists(BaseNode[list]):
    """Lists of ``size`` consecutive items (the last may be shorter); the input's state."""

    STATE_SHAPE = Same("source")  # its state is its input's

    def __init__(self, source: BaseNode, size: int):
        super().__init__()
        self.source = source
        self.size = size

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self.source.reset(initial_state)

    def next(self) -> list:
        items = cap.take_exactly(self.source, self.size)
        if not items:
            raise StopIteration
        return items

    def get_state(self) -> dict:
        return self.source.state_dict()

    def count(self) -> int | None:
        n = cap.count(self.source)
        return None if n is None else -(-n // self.size)


_NO_IDS = IdsBlock(np.empty(0, np.int64), np.empty(0, np.int64), [], lambda items, ids, lengths: [])


class _WrongCount(TypeError):
    """``fn`` broke the contract of a batch map (not one result per item): always raised."""


class _ListCall:
    """Calls ``fn`` on a list; on an error, item by item, marking the bad ones (picklable).
    With ``block`` set (``MapBatches.next_ids``, inline only), ``fn.columns`` first: the list's
    results as one ``IdsBlock``, or where it refuses the list, the results as always."""

    def __init__(self, fn: Callable, args: dict[str, Any]):
        self.fn = fn
        self.args = dict(args)
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)
        self.block = False

    def _call(self, items: list) -> list:
        out = self.fn(items, **self.args)
        if not isinstance(out, (list, tuple)) or len(out) != len(items):
            got = f"{len(out)} results" if isinstance(out, (list, tuple)) else type(out).__name__
            raise _WrongCount(f"{self.__name__} got a list of {len(items)} items and returned {got}; "
                            "with map's batch it must return a list with one result per item")
        return list(out)

    def __call__(self, items: list) -> list | IdsBlock:
        if self.block:
            try:
                block = self.fn.columns(items, **self.args)
            except Exception:  # a bad item among them: found and named by the list's call below
                block = None
            if (type(block) is IdsBlock and len(block) == len(block.lengths) == len(items)
                    and int(block.lengths.sum()) == len(block.ids)):  # (a plug-in's block that does not add up: records)
                return block
        try:
            return self._call(items)
        except _WrongCount:
            raise
        except Exception as exc:
            if len(items) == 1:
                return [Failed(stopped(exc, self.fn, items[0]), sample=sample_id(items[0]))]
        out: list = []
        for item in items:  # find the bad items; the good ones are mapped alone
            try:
                out.extend(self._call([item]))
            except _WrongCount:
                raise
            except Exception as exc:
                out.append(Failed(stopped(exc, self.fn, item), sample=sample_id(item)))
        return out


class MapBatches(BaseNode):
    """Apply ``fn`` to lists of ``size`` items, emitting one result per item, in order.

    Args:
        source: the input stream.
        fn: ``fn(items: list, **args) -> list`` with one result per item.
        size: items per call, > 0.
        args: keyword arguments for ``fn``.
        workers: 0 runs inline; N > 0 runs the calls on N threads or processes (see ``Map``).
        method: ``"thread"`` or ``"process"``.
        on_error: ``"raise"`` or ``"skip"`` (bad items only, counted in ``stats()``).
        where: text for error notes, e.g. ``"node 'tokenize' (map) from specs/x.yaml:24"``.
        **map_kw: passed to the inner ``Map`` (``mp_context``, ``snapshot_every``, ...).

    Example:
        >>> from torchdata.nodes import IterableWrapper
        >>> list(MapBatches(IterableWrapper(range(5)), fn=lambda xs: [x * 10 for x in xs], size=2))
        [0, 10, 20, 30, 40]
    """

    INNER_KEY = "inner"
    EMITTED_KEY = "emitted"
    SKIPPED_KEY = "skipped"
    STATE_SHAPE = Fields({INNER_KEY: Child("_map"), EMITTED_KEY: Int(), SKIPPED_KEY: Int(), LEDGER_KEY: LEDGER_SHAPE},
                         optional=(LEDGER_KEY,))

    def __init__(self, source: BaseNode, *, fn: Callable, size: int, args: dict[str, Any] | None = None,
                 workers: int = 0, method: str = "thread", on_error: str = "raise",
                 where: str | None = None, **map_kw: Any):
        super().__init__()
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise ValueError(f"{size=} must be a positive int")
        if on_error not in ON_ERROR:
            raise ValueError(f"{on_error=} must be one of {ON_ERROR}")
        if wants_rng(fn):
            raise ValueError(f"{getattr(fn, '__name__', fn)!r} takes an rng or a generator, which a batch "
                             "map cannot give (a list has no single sample index): use map without batch")
        self.size = size
        self.on_error = on_error
        self.where = where or f"map {getattr(fn, '__name__', fn)!r} (batch {size})"
        self._call = _ListCall(fn, args or {})
        self._map = Map(_Lists(source, size), fn=self._call, workers=workers,
                        method=method, on_error="raise", where=self.where, **map_kw)
        self._columns = callable(getattr(fn, "columns", None)) and not workers  # (next_ids)
        self.workers, self.method = workers, method
        self.errors = OnError(on_error, self.where, log)  # for the bad items the lists hold
        self.ledger = self.errors.ledger
        self._out: list = []
        self._pos = 0
        self._rest: IdsBlock | None = None  # the list's results after _pos as a block (next_ids), not made yet
        self._before: dict | None = None  # the inner map's state before the current list

    @property
    def skipped(self) -> int:
        """Items skipped this epoch (``on_error="skip"``)."""
        return self.errors.skipped

    def set_epoch(self, epoch: int) -> None:
        self._map.set_epoch(epoch)

    def stats(self) -> dict[str, int]:
        return {"skipped": self.errors.skipped}

    def close(self) -> None:
        self._map.close()

    def worker_pids(self) -> list[int]:
        """The pids of the worker processes running ``fn`` this epoch (see ``Map``)."""
        return self._map.worker_pids()

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self._out, self._pos, self._rest = [], 0, None
        if initial_state is None:
            self.errors.skipped = 0
            self._map.reset()
            self._before = self._map.state_dict()
            return
        self.errors.skipped = initial_state[self.SKIPPED_KEY]
        self.ledger.load(initial_state.get(LEDGER_KEY))
        self._map.reset(initial_state[self.INNER_KEY])
        self._before = initial_state[self.INNER_KEY]
        emitted = initial_state[self.EMITTED_KEY]
        if emitted:  # the list being (or last) emitted when the state was taken: mapped again,
            try:     # in lists of this size (a state saved with a longer batch: whole lists skipped)
                out = next(self._map)
                while emitted > len(out):
                    emitted -= len(out)
                    self._before = self._map.state_dict()
                    out = next(self._map)
            except StopIteration:
                raise StateError(f"{self.where}: the input ended while mapping again the "
                                 f"{initial_state[self.EMITTED_KEY]} results emitted before the state was "
                                 "saved: it is not the input the state was saved from") from None
            self._out, self._pos = out, emitted
            for i in range(emitted):
                out[i] = None

    def _made(self) -> None:
        """The results left in a block (``next_ids`` took fewer than a list) made records."""
        self._out[self._pos:] = self._rest.records()  # type: ignore[union-attr]
        self._rest = None

    def next(self) -> Any:
        if self._rest is not None:
            self._made()
        while True:
            pos = self._pos
            out = self._out
            if pos >= len(out):
                before = self._map.state_dict()
                out = next(self._map)  # StopIteration ends the stream (the state stays as it was)
                self._before, self._out, self._pos, pos = before, out, 0, 0
            item = out[pos]
            out[pos] = None  # let emitted results go
            self._pos = pos + 1
            if type(item) is not Failed:
                return item
            self.errors.fail(item)

    def next_many(self, n: int) -> list:
        """Up to ``n`` results, from one list at most (nodes/capabilities.py)."""
        if self._rest is not None:
            self._made()
        if self._pos >= len(self._out):
            first = [self.next()]  # the next list (StopIteration ends the stream)
            if n == 1:
                return first
            return first + self.next_many(n - 1) if self._pos < len(self._out) else first
        out, pos = self._out, self._pos
        chunk = out[pos:pos + n]
        if Failed in map(type, chunk):  # a skipped item among them: one at a time
            return [self.next()]
        out[pos:pos + len(chunk)] = [None] * len(chunk)  # let emitted results go
        self._pos = pos + len(chunk)
        return chunk

    def ids_ready(self) -> bool:
        """Whether ``next_ids`` can give a block now: ``fn`` offers one (``columns``), it runs
        inline, and no result of a list is left to emit but in a block."""
        return self._columns and (self._pos >= len(self._out) or self._rest is not None)

    def next_ids(self, n: int) -> IdsBlock:
        """Up to ``n`` results of the next list as one ``IdsBlock`` (nodes/capabilities.py), where
        ``ids_ready``; the rest of the list is kept as a block, for the next ``next_ids`` (or made
        records by ``next`` and ``next_many``, which take them). Where ``fn`` refuses
        the list (a bad item among them), an empty block, and the list's results are left to
        ``next`` and ``next_many``, as always. The state moves as ``next_many``'s would."""
        if self._rest is not None:  # the rest of a list a call before took part of
            got, self._rest = self._rest, None
            if n < len(got):
                got, self._rest = got.split(n)
            self._pos += len(got)
            return got
        before = self._map.state_dict()
        self._call.block = True
        try:
            got = next(self._map)  # StopIteration ends the stream (the state stays as it was)
        finally:
            self._call.block = False
        if type(got) is not IdsBlock:
            self._before, self._out, self._pos = before, got, 0
            return _NO_IDS
        self._before, self._out, self._pos = before, [None] * len(got), len(got)
        if n < len(got):
            got, self._rest = got.split(n)
            self._pos = len(got)
        return got

    def get_state(self) -> dict:
        # always the state before the current list (all of whose results may be out: then a
        # restore maps it again and drops them all), so that every list the inner state counts
        # as done is a whole one of ``size`` items (elastic_input relies on it)
        return {self.INNER_KEY: self._before, self.EMITTED_KEY: self._pos,
                self.SKIPPED_KEY: self.errors.skipped, LEDGER_KEY: self.ledger.state()}

    @staticmethod
    def elastic_input(cursor: Cursor, size: int) -> Cursor:
        """Consumed input items (elastic resume): the inner map's consumed lists, whole, plus
        the results of the current list already emitted and the outputs after the state
        (only an epoch's last list is short, and it is never followed by another)."""
        if cursor.state is None:
            return cursor
        lists = Map.elastic_input(Cursor(cursor.state[MapBatches.INNER_KEY]))
        return Cursor(lists.state, lists.more * size + cursor.state[MapBatches.EMITTED_KEY] + cursor.more,
                      cursor.extra)

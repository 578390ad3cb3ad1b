"""instrument: per-node counters cheap enough to be always on.

Every built node is wrapped in a ``Counted`` node. ``Counted`` hands its inner node's state
through unchanged (a state is the same with or without instrumentation) and counts, for the
current epoch:

- ``items``: the items it emitted;
- ``seconds``: the wall time its callers spent inside the inner node's ``next()`` and
  ``reset()`` (a reset may pull items: a shuffle buffer fills its first window). In the
  same thread that includes the time of the node's inputs; a node that runs its inputs in
  another thread (``prefetch``, ``map`` with workers) only shows how long its caller blocked
  on its queue, and its inputs' time accrues in that other thread (``Counted`` measures in
  whatever thread calls it, and notes which one on the first call after each reset);
- ``work``: for ``map`` with thread workers, the time spent inside ``fn`` on the workers;
- queue samples for buffered nodes (prefetch, map with workers, worker copies): how many
  items were ready when the caller asked, sampled every few calls.

graphs/probes.py reads the last two inside the node; graphs/stats.py makes figures of them all.

Timing a call costs two ``perf_counter`` calls and a few attribute updates: ~750 ns inside
a real pipeline (text.yaml with every call timed against none, 2026-12-06: 0.37 ms an epoch
over its ~500 calls), several percent of a graph whose items cost ~20 us, nothing next to a
JPEG decode. So each thread's outermost node times its calls, with every call they make in that
thread, as often as keeps that cost near 0.5 % of their time: every call where the work is
heavy (images), one in up to 64 at random, weighted by that number, where it is light (see
``Counted``). The warm-up is short (16 calls): a text graph's outermost call is a batch of a
few dozen cheap items, so timing its first 256 calls whole timed most of a short run at
~2 us per item (benchmarks/text_throughput.py); and it ends early once the calls made 512
timed calls of the nodes below (a length-bucketing batcher's first call reads a few thousand
items). The figures are then unbiased estimates. ``conveyor bench`` and ``--trace``
attach watchers (sizing items, recording spans), and while any is attached every call is
timed. benchmarks/stats_overhead.py measures what this costs.

While a ``torch.profiler`` (or ``torch.autograd.profiler.profile``) records, every call of a
named node runs inside ``record_function("conveyor/<node>")``, so a training trace shows where
data time goes; when none records, the cost is one module-attribute check per call.
"""

from __future__ import annotations

import random
import threading
import time
import weakref
from functools import partial
from typing import Any, Callable

import torch.autograd.profiler as _profiler
from torchdata.nodes import BaseNode

from conveyor.graphs.probes import Work, queue_probe, time_map_fn
from conveyor.nodes import pull

_clock = time.perf_counter
_get_ident = threading.get_ident
_QUEUE_EVERY = 4  # a buffered node samples its queue on every 4th timed call
# an outermost node times its first calls (the warm-up), then one in "every", at
_TARGET = 0.005   # random, with the calls it makes in its thread, weighted by "every": as
_MAX_EVERY = 64   # many as keep timing near 0.5 % of the time the calls take (at most 1 in 64)
_TIMING_COST = 750e-9  # seconds one timed call costs inside a pipeline (see above; 300 ns had
                       # made text.yaml's timing cost ~1 %, not 0.5 %)
_ADAPT = 16       # timed calls between two choices of "every" (the first choice ends the warm-up),
_ADAPT_NESTED = 512  # or fewer once they made this many timed calls in their thread
_CLOCKS_PER_TIMED = 14  # a timed call costs about 14 clock reads (750 ns against ~53 ns a read, 2026-12-07)
_random = random.random
_exact = [0]      # > 0 while watchers are attached: every call is timed
_resetting = threading.local()  # depth of Counted.reset calls in progress in this thread

Watcher = Callable[["Counted", Any, float, float], None]


def _clock_cost() -> float:
    """Seconds one clock read takes now (the best of three tries of 8 reads)."""
    best = float("inf")
    for _ in range(3):
        t0 = _clock()
        for _ in range(8):
            _clock()
        best = min(best, (_clock() - t0) / 9)
    return best


def _dispatch(c: "Counted", item: Any, t0: float, t1: float) -> None:
    for watcher in c._watchers:
        watcher(c, item, t0, t1)


class _Cell:
    """Per thread: the outermost ``Counted`` running in it now, and how its call is timed."""

    __slots__ = ("tid", "root", "weight", "nested")

    def __init__(self, tid: int) -> None:
        self.tid = tid
        self.root: Counted | None = None
        self.weight = 1.0
        self.nested = 0  # timed calls made inside the root's current call


_cells: dict[int, _Cell] = {}


class Counted(BaseNode):
    """Pass-through that counts items and time; its state is its inner node's state.

    The counters run for a whole epoch (the loader zeroes them by setting ``items = 0``),
    also across resets of the inner node within the epoch.

    Calls are timed in groups (the module's docstring says why): the outermost ``Counted``
    running in a thread (the one a background thread or the caller pulls from) times its first
    ``_ADAPT`` calls (fewer when they made ``_ADAPT_NESTED`` timed calls below them), then one
    call in ``every``, drawn at random, where ``every`` (1 to ``_MAX_EVERY``) keeps the cost
    near ``_TARGET`` of the calls' time; the nodes it calls in the same thread are timed during
    exactly those calls, and each timed call counts ``every`` times, so a node's own time (its
    time minus its inputs') subtracts figures taken over the same calls. The other calls of
    nested nodes take a bare path (one check more than no wrapper). Items are always counted
    exactly, and resets always timed.

    Args:
        inner: the node to measure.
        name: the node's name in the spec: its profiler range is ``conveyor/<name>``.

    Example:
        >>> from torchdata.nodes import IterableWrapper
        >>> c = Counted(IterableWrapper(range(3)))
        >>> list(c), c.items
        ([0, 1, 2], 3)
    """

    def __init__(self, inner: BaseNode, name: str | None = None):
        super().__init__()
        self.inner = inner
        self.range_name = f"conveyor/{name}" if name else None
        # call the inner node's next() directly: its BaseNode.__next__ only checks that it was
        # reset, and this node's reset() resets it (a node with its own __next__ keeps it)
        self._direct = inner.next if type(inner).__next__ is BaseNode.__next__ else inner.__next__
        many = getattr(inner, "next_many", None)  # items in lists (nodes/capabilities.py)
        self._many: Callable[[int], list] = many if many is not None else partial(pull, self._direct)
        self._ids_ready = getattr(inner, "ids_ready", None)  # ids in one block (nodes/capabilities.py)
        self._rows_ready = getattr(inner, "rows_ready", None)  # batches of rows (nodes/capabilities.py)
        self._n = 0
        self.items_before = 0  # items of the epochs before this one (for a lifetime count)
        self.seconds = 0.0
        self.reset_seconds = 0.0  # the part of ``seconds`` spent in reset (epoch starts)
        self.tid: int | None = None  # the thread of the first call after the last reset
        self.work = Work()
        self.timed_fn = time_map_fn(inner, self.work)
        self._watchers: tuple[Watcher, ...] = ()
        self._hook: Callable[..., None] | None = None
        self._probing = False
        self._qsize: Callable[[], int] | None = None
        self.queue_capacity = 0
        self._q_countdown = 1
        self.q_n = 0
        self.q_sum = 0
        self.q_max = 0
        self._outer_n = 0  # calls as an outermost node, over the node's life
        self._every = 1    # as an outermost node: time one call in this many (see _adapt)
        self._acc_calls, self._acc_seconds, self._acc_nested = 0, 0.0, 0
        self._ref = weakref.ref(self)  # what the nodes of its group hold: a strong reference up the
        # graph would make a cycle, and a closed loader's buffers would wait for a full garbage collection
        self._unplace()

    def _unplace(self) -> None:
        self._timed = True          # False: a sampled-out call of its group (the bare path)
        self._cell: _Cell | None = None
        self._root: weakref.ref | None = None  # the outermost node whose calls this one runs in (its _ref)
        self._group: list[Counted] = []      # as an outermost node: the nodes its calls run
        self._group_timed = True

    # ----- counters -----------------------------------------------------------------------
    @property
    def items(self) -> int:
        """Items emitted this epoch. Setting it to 0 zeroes every counter (a new epoch)."""
        return self._n

    @items.setter
    def items(self, value: int) -> None:
        self.items_before += self._n
        self._n = value
        if value == 0:
            self.seconds = self.reset_seconds = 0.0
            self.work.seconds = 0.0
            self.q_n = self.q_sum = self.q_max = 0

    def raw(self) -> dict[str, Any]:
        """The counters as plain numbers (sums over epochs or copies stay meaningful)."""
        return {"items": self._n, "seconds": self.seconds, "reset_seconds": self.reset_seconds,
                "work_seconds": self.work.seconds,
                "q_n": self.q_n, "q_sum": self.q_sum, "q_max": self.q_max}

    # ----- watchers (bench, trace) ----------------------------------------------------------
    def watch(self, watcher: Watcher) -> None:
        """Call ``watcher(counted, item, t0, t1)`` after every item (t0, t1: perf_counter).

        While any node has a watcher, every call of every node is timed.
        """
        self._watchers = self._watchers + (watcher,)
        self._hook = _dispatch
        _exact[0] += 1

    def unwatch(self, watcher: Watcher) -> None:
        if watcher not in self._watchers:  # ==, not is: a bound method is made anew each time
            return
        self._watchers = tuple(w for w in self._watchers if w != watcher)
        if not self._watchers:
            self._hook = None
        _exact[0] -= 1

    # ----- the node -------------------------------------------------------------------------
    def reset(self, initial_state: dict | None = None) -> None:
        depth = getattr(_resetting, "depth", 0)
        _resetting.depth = depth + 1
        t0 = _clock()
        try:
            self.inner.reset(initial_state)
        finally:
            dt = _clock() - t0
            self.seconds += dt
            self.reset_seconds += dt
            _resetting.depth = depth
        super().reset(initial_state)  # after the inner reset: a failed one leaves both unreset
        self.tid = None
        self._unplace()
        probe = queue_probe(self.inner)
        if probe is None:
            self._probing, self._qsize = False, None
        else:
            self._qsize, self.queue_capacity = probe
            self._probing = True

    def _sample_queue(self) -> None:
        self._q_countdown -= 1
        if self._q_countdown:
            return
        self._q_countdown = _QUEUE_EVERY
        try:
            n = self._qsize()  # type: ignore[misc]
        except Exception:  # a queue that cannot say its size: stop asking
            self._probing = False
            return
        self.q_n += 1
        self.q_sum += n
        if n > self.q_max:
            self.q_max = n

    def __next__(self):
        if _profiler._is_profiler_enabled and self.range_name is not None:
            return self._profiled()
        if self._timed:
            return self._measured()
        item = self._direct()  # the bare path: a call its group does not time
        self._n += 1
        return item

    next = __next__

    def next_many(self, n: int) -> list:
        """Up to ``n`` items in one call (nodes/capabilities.py), counted as items and timed as one
        call; item by item while a watcher or a profiler wants every item."""
        if self._hook is not None or (_profiler._is_profiler_enabled and self.range_name is not None):
            return pull(self.__next__, n)
        if self._timed:
            return self._measured(n)
        items = self._many(n)
        self._n += len(items)
        return items

    def ids_ready(self) -> bool:
        """Whether the inner node gives its next items as one block of ids now (``IdsAtOnce``);
        never while a watcher or a profiler wants every item."""
        ready = self._ids_ready
        return (ready is not None and self._hook is None
                and not (_profiler._is_profiler_enabled and self.range_name is not None) and ready())

    def next_ids(self, n: int) -> Any:
        """The inner node's ``next_ids(n)``, counted as items and timed as one call, as ``next_many``."""
        many, self._many = self._many, self.inner.next_ids
        try:
            if self._timed:
                return self._measured(n)
            block = self._many(n)
            self._n += len(block)
            return block
        finally:
            self._many = many

    def rows_ready(self) -> bool:
        """Whether the inner node may give its next batch as rows (``RowsAtOnce``); never while
        a watcher or a profiler wants every item."""
        ready = self._rows_ready
        return (ready is not None and self._hook is None
                and not (_profiler._is_profiler_enabled and self.range_name is not None) and ready())

    def next_rows(self) -> Any:
        """The inner node's ``next_rows()``, counted and timed as ``next()``."""
        direct, self._direct = self._direct, self.inner.next_rows
        try:
            if self._timed:
                return self._measured()
            item = self._direct()
            self._n += 1
            return item
        finally:
            self._direct = direct

    def _profiled(self) -> Any:
        """A call inside a profiler range named after the node (while a profiler records)."""
        with _profiler.record_function(self.range_name):
            if self._timed:
                return self._measured()
            item = self._direct()
            self._n += 1
            return item

    def _place(self) -> _Cell | None:
        """Note the thread this node runs in (not while a reset pulls from it). A node placed
        in another thread before (a prefetch that moved between its thread and the caller's
        mid-epoch, nodes/prefetch.py) leaves its group first: it and the nodes it ran are
        placed anew where they run now, as after a reset (each thread times its own calls)."""
        if getattr(_resetting, "depth", 0):
            return None  # pulled by a consumer's reset (a shuffle filling its window)
        if self._cell is not None:
            self._leave()
        tid = _get_ident()
        self.tid = tid
        cell = _cells.get(tid)
        if cell is None:
            cell = _cells.setdefault(tid, _Cell(tid))
        self._cell = cell
        return cell

    def _leave(self) -> None:
        """Undo this node's placing, and that of the nodes whose calls it timed as their root."""
        for c in self._group:
            if c._root is self._ref:
                c._unplace()
        root = self._root() if self._root is not None else None
        if root is not None and self in root._group:
            root._group.remove(self)
        self._unplace()

    def _measured(self, many: int = 0) -> Any:
        if not self._BaseNode__initialized:  # type: ignore[attr-defined]
            self.reset(None)
        if self._probing:
            self._sample_queue()
        cell = self._cell
        if cell is None or cell.tid != _get_ident():
            cell = self._place()
            if cell is None:
                return self._time_call(1.0, many)
        root = cell.root
        if root is None:  # the outermost in its thread: decide for this call and its group
            self._outer_n += 1
            every = self._every
            if every == 1 or _exact[0]:  # every == 1: still warming up, or heavy calls
                weight = 1.0
            else:
                weight = float(every) if _random() * every < 1.0 else 0.0
            if (weight > 0) is not self._group_timed:
                self._group_timed = weight > 0
                for c in self._group:
                    c._timed = self._group_timed
            cell.root, cell.weight, cell.nested = self, weight, 0
            try:
                if not weight:
                    item = self._many(many) if many else self._direct()
                    self._n += len(item) if many else 1
                    return item
                t0 = _clock()
                try:
                    item = self._many(many) if many else self._direct()
                except StopIteration:
                    self.seconds += (_clock() - t0) * weight
                    raise
                t1 = _clock()
                self.seconds += (t1 - t0) * weight
                self._n += len(item) if many else 1
                self._adapt(t1 - t0, cell.nested)
                if self._hook is not None:
                    self._hook(self, item, t0, t1)
                return item
            finally:
                cell.root = None
        if self._root is not root._ref:  # first call inside this outermost node's calls
            self._join(root)
        weight = cell.weight
        if not weight:
            self._timed = False  # its group is not timed now: follow it
            item = self._many(many) if many else self._direct()
            self._n += len(item) if many else 1
            return item
        cell.nested += 1
        t0 = _clock()  # _time_call, inlined for the nested calls of a timed group
        try:
            item = self._many(many) if many else self._direct()
        except StopIteration:
            self.seconds += (_clock() - t0) * weight
            raise
        t1 = _clock()
        self.seconds += (t1 - t0) * weight
        self._n += len(item) if many else 1
        if self._hook is not None:
            self._hook(self, item, t0, t1)
        return item

    def _adapt(self, seconds: float, nested: int) -> None:
        """Every ``_ADAPT`` timed calls as an outermost node: time one call in ``every``, where
        ``every`` keeps the cost of timing (``_TIMING_COST`` per timed call, this one's and
        the ones it makes) near ``_TARGET`` of the time the calls take. On a busy machine (or
        under a profiler) everything is slower, timing too: the cost per timed call is then
        taken as ``_CLOCKS_PER_TIMED`` clock reads measured now, when that is more."""
        self._acc_calls += 1
        self._acc_seconds += seconds
        self._acc_nested += nested
        if self._acc_calls < _ADAPT and self._acc_nested < _ADAPT_NESTED:
            return
        cost = (1 + self._acc_nested / self._acc_calls) * max(_TIMING_COST, _CLOCKS_PER_TIMED * _clock_cost())
        mean = self._acc_seconds / self._acc_calls
        self._every = 1 if mean <= 0 else round(min(_MAX_EVERY, max(1.0, cost / (_TARGET * mean))))
        self._acc_calls, self._acc_seconds, self._acc_nested = 0, 0.0, 0

    def _join(self, root: "Counted") -> None:
        old = self._root() if self._root is not None else None
        if old is not None and self in old._group:
            old._group.remove(self)
        self._root = root._ref
        root._group.append(self)

    def _time_call(self, weight: float, many: int = 0) -> Any:
        t0 = _clock()
        try:
            item = self._many(many) if many else self._direct()
        except StopIteration:
            self.seconds += (_clock() - t0) * weight
            raise
        t1 = _clock()
        self.seconds += (t1 - t0) * weight
        self._n += len(item) if many else 1
        if self._hook is not None:
            self._hook(self, item, t0, t1)
        return item

    def get_state(self) -> dict:
        return self.inner.state_dict()

    def count(self) -> int | None:
        """The inner node's items per epoch, when it knows them (see nodes/shard.py)."""
        count = getattr(self.inner, "count", None)
        return count() if callable(count) else None


class BareCounted(Counted):
    """A ``Counted`` that only counts items: the baseline of benchmarks/stats_overhead.py."""

    def __next__(self):
        if not self._BaseNode__initialized:  # type: ignore[attr-defined]
            self.reset(None)
        item = self._direct()
        self._n += 1
        return item

    next = __next__

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

``node_perf`` turns these counters into what a user reads: per node, busy seconds (its own
work: its time minus its same-thread inputs' time, or ``fn`` time on the workers), wait
seconds (time spent getting items from its inputs), items/s and how full its queue ran.

Timing a call costs two ``perf_counter`` calls and a few attribute updates: ~300 ns inside
a real pipeline, several percent of a graph whose items cost ~20 us, nothing next to a JPEG
decode. So each thread's outermost node times its calls, with every call they make in that
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
from functools import partial
from typing import Any, Callable, Iterable, Mapping

import torch.autograd.profiler as _profiler
from torchdata.nodes import BaseNode

from conveyor.nodes import Map, Prefetch, WorkerCopies, pull

_clock = time.perf_counter
_QUEUE_EVERY = 4  # a buffered node samples its queue on every 4th timed call
# an outermost node times its first calls (the warm-up), then one in "every", at
_TARGET = 0.005   # random, with the calls it makes in its thread, weighted by "every": as
_MAX_EVERY = 64   # many as keep timing near 0.5 % of the time the calls take (at most 1 in 64)
_TIMING_COST = 300e-9  # seconds one timed call costs inside a pipeline (stats_overhead.py)
_ADAPT = 16       # timed calls between two choices of "every" (the first choice ends the warm-up),
_ADAPT_NESTED = 512  # or fewer once they made this many timed calls in their thread
_CLOCKS_PER_TIMED = 5  # a timed call costs about 5 clock reads (2 reads and the bookkeeping)
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


class _Work:
    """Seconds spent in a threaded map's ``fn``, summed over its worker threads."""

    __slots__ = ("seconds", "trace")

    def __init__(self) -> None:
        self.seconds = 0.0
        self.trace: Callable[[float, float], None] | None = None


class _TimedFn:
    """Wraps a threaded map's ``fn``: adds the time spent in it to a ``_Work``."""

    def __init__(self, fn: Callable, work: _Work):
        self.fn = fn
        self.work = work
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)
        self.__wrapped__ = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        t0 = _clock()
        try:
            return self.fn(*args, **kwargs)
        finally:
            t1 = _clock()
            work = self.work
            work.seconds += t1 - t0
            if work.trace is not None:
                work.trace(t0, t1)


def _time_map_fn(inner: BaseNode, work: _Work) -> bool:
    """Time ``fn`` of a map with thread workers; False where that is not possible."""
    if not isinstance(inner, Map) or inner.workers == 0 or inner.method != "thread":
        return False
    call = getattr(inner, "call", None)
    fn = getattr(call, "fn", None)
    if fn is None:
        return False
    if not isinstance(fn, _TimedFn):
        call.fn = _TimedFn(fn, work)
    return True


def _queue_probe(inner: BaseNode) -> tuple[Callable[[], int], int] | None:
    """(a callable giving the items ready, the queue's capacity) for buffered nodes.

    torchdata keeps its queues a few attributes deep; anything unexpected gives None.
    """
    try:
        if isinstance(inner, Prefetch):
            return inner.ready, int(inner.depth)
        if isinstance(inner, Map) and inner._pool is not None:
            return inner._pool.ready, int(inner._pool.window)
        if isinstance(inner, Map) and inner._pm is not None:
            it = inner._pm._it._it
            return it._out_q.qsize, int(it._max_tasks)
        if isinstance(inner, WorkerCopies):
            return inner.ready, int(inner.chunk) * inner.copies
    except (AttributeError, NotImplementedError, OSError, TypeError):
        return None
    return None


def _dispatch(c: "Counted", item: Any, t0: float, t1: float) -> None:
    for watcher in c._watchers:
        watcher(c, item, t0, t1)


class _Cell:
    """Per thread: the outermost ``Counted`` running in it now, and how its call is timed."""

    __slots__ = ("root", "weight", "nested")

    def __init__(self) -> None:
        self.root: Counted | None = None
        self.weight = 1.0
        self.nested = 0  # timed calls made inside the root's current call


_cells: dict[int, _Cell] = {}


class Counted(BaseNode):
    """Pass-through that counts items and time; its state is its inner node's state.

    The counters run for a whole epoch (the loader zeroes them by setting ``items = 0``),
    also across resets of the inner node within the epoch.

    Timing every call costs ~300 ns per item and node inside a real pipeline, several percent
    of a cheap per-item graph (benchmarks/stats_overhead.py). So calls are timed in groups:
    the outermost ``Counted`` running in a thread (the one a background thread or the caller
    pulls from) times its first ``_ADAPT`` calls (a short run is timed whole; fewer when they
    made ``_ADAPT_NESTED`` timed calls below them), then one call
    in ``every``, drawn at random, where ``every`` (1 to ``_MAX_EVERY``) keeps the cost near
    ``_TARGET`` of the calls' time; the nodes it calls in the same thread are timed during
    exactly those calls, and each timed call counts ``every`` times. Estimates stay
    unbiased, and a node's own time (its time minus its inputs') subtracts figures taken over
    the same calls. The other calls of nested nodes take a bare path (one check more than no
    wrapper). Items are always counted exactly, resets are always timed, and with a watcher
    attached (``conveyor bench``, ``--trace``) every call is timed.

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
        many = getattr(inner, "next_many", None)  # items in lists (nodes/_chunks.py)
        self._many: Callable[[int], list] = many if many is not None else partial(pull, self._direct)
        self._n = 0
        self.items_before = 0  # items of the epochs before this one (for a lifetime count)
        self.seconds = 0.0
        self.reset_seconds = 0.0  # the part of ``seconds`` spent in reset (epoch starts)
        self.tid: int | None = None  # the thread of the first call after the last reset
        self.work = _Work()
        self.timed_fn = _time_map_fn(inner, self.work)
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
        self._unplace()

    def _unplace(self) -> None:
        self._timed = True          # False: a sampled-out call of its group (the bare path)
        self._cell: _Cell | None = None
        self._root: Counted | None = None    # the outermost node whose calls this one runs in
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
        probe = _queue_probe(self.inner)
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
        """Up to ``n`` items in one call (nodes/_chunks.py), counted as items and timed as one
        call; item by item while a watcher or a profiler wants every item."""
        if self._hook is not None or (_profiler._is_profiler_enabled and self.range_name is not None):
            return pull(self.__next__, n)
        if self._timed:
            return self._measured(n)
        items = self._many(n)
        self._n += len(items)
        return items

    def _profiled(self) -> Any:
        """A call inside a profiler range named after the node (while a profiler records)."""
        with _profiler.record_function(self.range_name):
            if self._timed:
                return self._measured()
            item = self._direct()
            self._n += 1
            return item

    def _place(self) -> _Cell | None:
        """Note the thread this node runs in (not while a reset pulls from it)."""
        if getattr(_resetting, "depth", 0):
            return None  # pulled by a consumer's reset (a shuffle filling its window)
        tid = threading.get_ident()
        self.tid = tid
        cell = _cells.get(tid)
        if cell is None:
            cell = _cells.setdefault(tid, _Cell())
        self._cell = cell
        return cell

    def _measured(self, many: int = 0) -> Any:
        if not self._BaseNode__initialized:  # type: ignore[attr-defined]
            self.reset(None)
        if self._probing:
            self._sample_queue()
        cell = self._cell
        if cell is None:
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
        if self._root is not root:  # first call inside this outermost node's calls
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
        if self._root is not None and self in self._root._group:
            self._root._group.remove(self)
        self._root = root
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


# ----- from counters to per-node figures ---------------------------------------------------

def describe(inner: BaseNode) -> str:
    """How a node runs, for tables: ``"2 thread workers"``, ``"3 process copies"``, ``""``."""
    if isinstance(inner, Map) and inner.workers:
        return f"{inner.workers} {inner.method} worker{'s' if inner.workers > 1 else ''}"
    if isinstance(inner, WorkerCopies):
        return f"{inner.copies} {inner.method} copies"
    return ""


def add_raw(a: Mapping[str, Any], b: Mapping[str, Any], sign: int = 1) -> dict[str, Any]:
    """``a + b`` (or ``a - b`` with ``sign=-1``) of two ``Counted.raw()`` dicts."""
    out = dict(a)
    for k, v in b.items():
        if k == "q_max":
            out[k] = max(out.get(k, 0), v)
        else:
            out[k] = out.get(k, 0) + sign * v
    return out


def node_perf(counted: Mapping[str, Counted], inputs: Mapping[str, Iterable[str]],
              raws: Mapping[str, Mapping[str, Any]], wall: float) -> dict[str, dict[str, Any]]:
    """Per node: busy and wait seconds and fractions, items/s and queue fill.

    Args:
        counted: the graph's ``Counted`` nodes by name (for which thread each ran in).
        inputs: each node's input names (names not in ``counted`` ran in worker copies).
        raws: ``Counted.raw()`` per node, possibly summed over epochs.
        wall: the seconds the counters cover.

    ``busy_s`` is the node's own work: its time minus its same-thread inputs' time, or for a
    map with thread workers the time in ``fn`` summed over the workers (``threads`` of them
    can be busy at once); ``None`` where the work runs out of sight (process workers, worker
    copies, or a prefetch, which only moves items). ``wait_s`` is the time spent getting
    items from its inputs, in its own thread or in its background thread; ``reset_s`` is the
    part of ``busy_s`` done in resets (in the thread that started the epoch). ``thread`` names
    the thread a node ran in by the last node of that thread (the one pulled from another
    thread or by the caller): the busy shares of the nodes of one thread add up.
    """
    out: dict[str, dict[str, Any]] = {}
    for name, c in counted.items():
        raw = raws.get(name)
        if not raw:
            continue
        ins = list(inputs.get(name, ()))
        known = [i for i in ins if i in counted and raws.get(i)]
        same = [i for i in known if counted[i].tid is None or c.tid is None or counted[i].tid == c.tid]
        remote = any(i not in counted for i in ins) or isinstance(c.inner, WorkerCopies)
        threaded = remote or len(same) < len(known)
        wait_s: float | None = sum(raws[i]["seconds"] for i in known)
        threads = 1
        if c.timed_fn:
            busy_s: float | None = raw["work_seconds"]
            threads = c.inner.workers
        elif threaded:
            busy_s = None
            if remote:
                wait_s = None
        else:
            busy_s = max(0.0, raw["seconds"] - sum(raws[i]["seconds"] for i in same))
        # its own reset work (a shuffle filling its window): its inputs reset inside its reset
        reset_s = max(0.0, raw.get("reset_seconds", 0.0) - sum(raws[i].get("reset_seconds", 0.0) for i in known))
        entry: dict[str, Any] = {
            "seconds": round(raw["seconds"], 6),
            "reset_s": round(reset_s, 6),
            "busy_s": None if busy_s is None else round(busy_s, 6),
            "wait_s": None if wait_s is None else round(wait_s, 6),
            "threads": threads,
            "busy": None if busy_s is None or wall <= 0 else round(busy_s / (threads * wall), 4),
            "wait": None if wait_s is None or wall <= 0 else round(wait_s / wall, 4),
            "items_per_s": round(raw["items"] / wall, 3) if wall > 0 else 0.0,
            "runs": describe(c.inner),
            "queue": None,
            "thread": None,
        }
        if c.queue_capacity:
            n = raw["q_n"]
            entry["queue"] = {"capacity": c.queue_capacity, "samples": n,
                              "mean": round(raw["q_sum"] / n, 3) if n else None, "max": raw["q_max"]}
        out[name] = entry
    # the nodes that ran in one thread, labelled by the last of them (the one pulled from
    # another thread or by the caller): their busy shares add up to that thread's load
    groups: dict[int, list[str]] = {}
    for name, c in counted.items():
        if name in out and c.tid is not None:
            groups.setdefault(c.tid, []).append(name)
    for names in groups.values():
        fed = {i for n in names for i in inputs.get(n, ())}
        label = next((n for n in reversed(names) if n not in fed), names[-1])
        for n in names:
            out[n]["thread"] = label
    return out

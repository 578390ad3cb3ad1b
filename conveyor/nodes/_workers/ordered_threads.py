"""An ordered map over persistent threads, for ``map`` with thread workers.

torchdata's ``ParallelMapper`` starts a reader thread, N workers and a sorting thread for
every epoch and joins them at the next reset (~0.1 s: they poll a stop flag), and each item
crosses three queues. ``OrderedThreads`` keeps one set of threads for the node's life: the
caller's thread reads the input and submits up to ``window`` items ahead, then takes results
in input order, so an item crosses one queue.

Hand-offs are what a thread pool costs when an item takes about a millisecond (an
ImageNet-sized JPEG): each wake-up of a sleeping thread is a futex call and a scheduler
switch, and the woken thread then waits for the GIL held by the thread that woke it. So an
item is a bare slot, not a ``Future`` (no condition variable of its own), the workers share
one condition with the caller, and a worker wakes the caller only for the slot it waits on.
When the next result is not ready, the caller waits for the ``gather``-th pending one (results
finish about in order), then emits that many without sleeping: one wake-up per ``gather``
items instead of one per item; it waits so at most ``_GATHER_WAIT`` (10 ms), then for the
next result alone, so a slow or stuck later item never keeps a finished one back. The window is wide enough that the workers never run dry
while the caller sleeps or batches (imagenet.yaml with 4 items in flight: a worker found the
queue empty on one item in five). benchmarks/RESULTS.md, "Issue 12.3", has the measurements.

The threads are daemon threads of this module's own, not a ``ThreadPoolExecutor``'s: ``close()``
waits a bounded time (``CLOSE_WAIT``) for them and abandons, with a warning naming the node,
those still inside ``fn`` (an ``fn`` blocked on a lock or a dead server); an abandoned daemon
thread does not hold up the interpreter's exit, where an executor's threads are joined at exit
without a bound. Whoever waits on an item in flight at ``close()`` gets a ``RuntimeError``.

Its position is what ``ParallelMapper`` gives: the input's state at some item and how many
items after it were already emitted. The input's state is taken before every
``snapshot_every``-th item read, in the caller's thread (where the input is read), so a
restore re-reads (without mapping) fewer than ``snapshot_every`` items.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
import weakref
from typing import Any, Callable

from torchdata.nodes import BaseNode

_GATHER_WAIT = 0.01  # seconds the caller waits for the gather-th result before the head's

log = logging.getLogger(__name__)

CLOSE_WAIT = 2.0  # seconds close() waits for threads still inside fn before abandoning them

_QUEUED, _RUNNING, _DONE, _DROPPED = range(4)


class _Slot:
    """One item in flight: its input, then its output, and where it stands."""

    __slots__ = ("item", "out", "state")

    def __init__(self, item: Any):
        self.item = item
        self.out: Any = None
        self.state = _QUEUED


class _Crashed:
    """``call`` raised (a bug there: sample errors come back as values): re-raised by the caller."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException):
        self.exc = exc


class _Shared:
    """What the workers and the caller share: the condition and the slot the caller awaits."""

    __slots__ = ("cond", "want")

    def __init__(self) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.want: _Slot | None = None


def _run(jobs: queue.SimpleQueue, call: Callable[[Any], Any], shared: _Shared) -> None:
    """A worker thread: run ``call`` on each queued slot until a ``None``."""
    cond = shared.cond
    while True:
        slot = jobs.get()
        if slot is None:
            return
        with cond:
            if slot.state != _QUEUED:  # dropped by a reset or close before it started
                continue
            slot.state = _RUNNING
        item, slot.item = slot.item, None
        try:
            out = call(item)
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the item
            out = _Crashed(exc)
        with cond:
            if slot.state == _RUNNING:
                slot.out = out
                slot.state = _DONE
                if shared.want is slot:
                    cond.notify()
        del slot, item, out


def _end(jobs: queue.SimpleQueue, n: int) -> None:
    for _ in range(n):
        jobs.put(None)


class _Threads:
    """``workers`` daemon threads running ``call(slot.item)`` for each slot queued.

    The threads hold the queue, not this object: a pool nobody closed ends its threads when
    it is garbage-collected (a node dropped without ``close()``), as an executor's do.
    """

    def __init__(self, call: Callable[[Any], Any], workers: int, name: str, shared: _Shared):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.threads = [threading.Thread(target=_run, args=(self._jobs, call, shared), name=f"{name}_{i}",
                                         daemon=True) for i in range(workers)]
        for t in self.threads:
            t.start()
        self._ender = weakref.finalize(self, _end, self._jobs, workers)

    def submit(self, item: Any) -> _Slot:
        slot = _Slot(item)
        self._jobs.put(slot)
        return slot

    def stop(self, wait: float) -> list[threading.Thread]:
        """Ask every thread to end; returns those still alive after ``wait`` seconds."""
        self._ender()  # (once: a later collection adds nothing)
        deadline = time.monotonic() + wait
        for t in self.threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        return [t for t in self.threads if t.is_alive()]


class OrderedThreads:
    """``call`` over ``source`` on ``workers`` persistent threads, results in input order.

    Args:
        source: the input; reset and positioned by the owner before ``start()``.
        call: the function run in the threads (it must not raise: errors are values).
        workers: threads.
        window: items in flight at most (read ahead of the one being emitted).
        snapshot_every: take the input's state every N items read.
        gather: when the next result is not ready, wait until this many pending results
            are (default: half the window), so the caller wakes once per that many items.
        name: thread name prefix.
        where: the node, for the warning about threads abandoned at ``close()``.
        prepare: applied to each input item in the caller's thread, in input order, before
            it is queued (``call`` then receives what it returns).
    """

    def __init__(self, source: BaseNode, call: Callable[[Any], Any], *, workers: int, window: int,
                 snapshot_every: int, gather: int | None = None, name: str = "conveyor-map",
                 where: str = "map", prepare: Callable[[Any], Any] | None = None):
        self.source = source
        self.prepare = prepare
        self.call = call
        self.workers = workers
        self.window = max(window, 1)
        self.gather = max(1, min(gather or self.window // 2, self.window))
        self.snapshot_every = snapshot_every
        self.name = name
        self.where = where
        self._shared = _Shared()
        self._pool: _Threads | None = None
        self._pending: collections.deque[_Slot] = collections.deque()
        self._snaps: collections.deque[tuple[int, Any]] = collections.deque()
        self._read = 0
        self._emitted = 0
        self._ended = False
        self._closed = False

    def start(self) -> None:
        """Begin at the input's current position (an epoch's start or a restored place)."""
        self._drop_pending()
        self._read = self._emitted = 0
        self._ended = self._closed = False
        self._snaps = collections.deque([(0, self.source.state_dict())])

    def _drop_pending(self) -> None:
        """Forget what is in flight: a queued item is not run, a running one finishes in the
        background with its result unread."""
        with self._shared.cond:
            for slot in self._pending:
                slot.state = _DROPPED
                slot.item = slot.out = None
            self._shared.want = None
        self._pending.clear()

    def _wait(self, slot: _Slot, timeout: float | None = None) -> None:
        """Sleep until ``slot`` is done (or the pool is closed), or at most ``timeout`` s."""
        shared = self._shared
        deadline = None if timeout is None else time.monotonic() + timeout
        with shared.cond:
            while slot.state != _DONE:
                if self._closed or slot.state == _DROPPED:
                    raise RuntimeError(f"{self.where} was closed")
                shared.want = slot
                if deadline is None:
                    shared.cond.wait()
                else:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    shared.cond.wait(left)
            shared.want = None

    def __next__(self) -> Any:
        pending = self._pending
        if len(pending) < self.window and not self._ended:
            if self._closed:  # a thread above (a prefetch) still asking after close()
                raise RuntimeError(f"{self.where} was closed")
            pool = self._pool
            if pool is None:
                pool = self._pool = _Threads(self.call, self.workers, self.name, self._shared)
            while len(pending) < self.window:
                if self._read % self.snapshot_every == 0 and self._read:
                    self._snaps.append((self._read, self.source.state_dict()))
                try:
                    item = next(self.source)
                except StopIteration:
                    self._ended = True
                    break
                pending.append(pool.submit(item if self.prepare is None else self.prepare(item)))
                self._read += 1
        if not pending:
            raise StopIteration
        head = pending[0]
        if head.state != _DONE:
            # one wake-up for `gather` results, but never waiting on a slow or stuck later item
            # for longer than _GATHER_WAIT while the head may be done (nothing done is kept back)
            self._wait(pending[min(self.gather, len(pending)) - 1], timeout=_GATHER_WAIT)
            self._wait(head)
        try:
            pending.popleft()
        except IndexError:  # close() in another thread emptied it
            raise RuntimeError(f"{self.where} was closed") from None
        out, head.out = head.out, None
        if isinstance(out, _Crashed):
            raise out.exc
        self._emitted += 1
        snaps = self._snaps
        while len(snaps) > 1 and snaps[1][0] <= self._emitted:
            snaps.popleft()
        return out

    def position(self) -> tuple[Any, int]:
        """(the input's state at a snapshot, items emitted after it)."""
        at, state = self._snaps[0]
        return state, self._emitted - at

    def running(self) -> int:
        """Items inside ``call`` now."""
        return sum(1 for slot in list(self._pending) if slot.state == _RUNNING)

    def ready(self) -> int:
        """Results finished and not yet taken."""
        return sum(1 for slot in list(self._pending) if slot.state == _DONE)

    def close(self) -> None:
        """Stop the threads; those still inside ``fn`` after ``CLOSE_WAIT`` s are abandoned.
        A thread waiting on an item (a prefetch above) is woken with a ``RuntimeError``."""
        self._closed = True
        with self._shared.cond:
            self._shared.cond.notify_all()
        self._drop_pending()
        pool, self._pool = self._pool, None
        if pool is None:
            return
        stuck = pool.stop(CLOSE_WAIT)
        if stuck:
            log.warning("%s: %d of its %d worker threads are still inside fn %.0f s after close(); "
                        "they are abandoned (daemon threads: they do not hold up the exit): %s",
                        self.where, len(stuck), len(pool.threads), CLOSE_WAIT,
                        ", ".join(t.name for t in stuck))

"""An ordered map over persistent threads, for ``map`` with thread workers.

torchdata's ``ParallelMapper`` starts a reader thread, N workers and a sorting thread for
every epoch and joins them at the next reset (~0.1 s: they poll a stop flag), and each item
crosses three queues. ``OrderedThreads`` keeps one set of threads for the node's life: the
caller's thread reads the input and submits up to ``window`` items ahead, then takes results
in input order, so an item crosses one queue and one future.

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
from concurrent.futures import Future, InvalidStateError
from typing import Any, Callable

from torchdata.nodes import BaseNode

log = logging.getLogger(__name__)

CLOSE_WAIT = 2.0  # seconds close() waits for threads still inside fn before abandoning them


def _run(jobs: queue.SimpleQueue, call: Callable[[Any], Any]) -> None:
    """A worker thread: run ``call`` on each queued ``(future, item)`` until a ``None``."""
    while True:
        job = jobs.get()
        if job is None:
            return
        fut, item = job
        if not fut.set_running_or_notify_cancel():
            continue
        try:
            out = call(item)
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the item
            out, failed = exc, True
        else:
            failed = False
        try:
            if failed:
                fut.set_exception(out)
            else:
                fut.set_result(out)
        except InvalidStateError:  # closed while fn ran: nobody waits for this item now
            pass
        del job, fut, item, out


def _end(jobs: queue.SimpleQueue, n: int) -> None:
    for _ in range(n):
        jobs.put(None)


class _Threads:
    """``workers`` daemon threads running ``call(item)`` for each ``(future, item)`` queued.

    The threads hold the queue, not this object: a pool nobody closed ends its threads when
    it is garbage-collected (a node dropped without ``close()``), as an executor's do.
    """

    def __init__(self, call: Callable[[Any], Any], workers: int, name: str):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.threads = [threading.Thread(target=_run, args=(self._jobs, call), name=f"{name}_{i}", daemon=True)
                        for i in range(workers)]
        for t in self.threads:
            t.start()
        self._ender = weakref.finalize(self, _end, self._jobs, workers)

    def submit(self, item: Any) -> Future:
        fut: Future = Future()
        self._jobs.put((fut, item))
        return fut

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
        name: thread name prefix.
        where: the node, for the warning about threads abandoned at ``close()``.
    """

    def __init__(self, source: BaseNode, call: Callable[[Any], Any], *, workers: int, window: int,
                 snapshot_every: int, name: str = "conveyor-map", where: str = "map"):
        self.source = source
        self.call = call
        self.workers = workers
        self.window = max(window, 1)
        self.snapshot_every = snapshot_every
        self.name = name
        self.where = where
        self._pool: _Threads | None = None
        self._pending: collections.deque[Future] = collections.deque()
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

    def _drop_pending(self, closing: bool = False) -> None:
        for fut in list(self._pending):
            # one already running finishes in the background, its result unread; at close, a
            # thread waiting on it (a prefetch above) is woken with an error instead
            if not fut.cancel() and closing:
                try:
                    fut.set_exception(RuntimeError(f"{self.where} was closed"))
                except InvalidStateError:
                    pass
        self._pending.clear()

    def __next__(self) -> Any:
        pending = self._pending
        if len(pending) < self.window and not self._ended:
            if self._closed:  # a thread above (a prefetch) still asking after close()
                raise RuntimeError(f"{self.where} was closed")
            pool = self._pool
            if pool is None:
                pool = self._pool = _Threads(self.call, self.workers, self.name)
            while len(pending) < self.window:
                if self._read % self.snapshot_every == 0 and self._read:
                    self._snaps.append((self._read, self.source.state_dict()))
                try:
                    item = next(self.source)
                except StopIteration:
                    self._ended = True
                    break
                pending.append(pool.submit(item))
                self._read += 1
        if not pending:
            raise StopIteration
        out = pending.popleft().result()
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
        return sum(1 for fut in list(self._pending) if fut.running())

    def ready(self) -> int:
        """Results finished and not yet taken."""
        return sum(1 for fut in self._pending if fut.done())

    def close(self) -> None:
        """Stop the threads; those still inside ``fn`` after ``CLOSE_WAIT`` s are abandoned."""
        self._closed = True
        self._drop_pending(closing=True)
        pool, self._pool = self._pool, None
        if pool is None:
            return
        stuck = pool.stop(CLOSE_WAIT)
        if stuck:
            log.warning("%s: %d of its %d worker threads are still inside fn %.0f s after close(); "
                        "they are abandoned (daemon threads: they do not hold up the exit): %s",
                        self.where, len(stuck), len(pool.threads), CLOSE_WAIT,
                        ", ".join(t.name for t in stuck))

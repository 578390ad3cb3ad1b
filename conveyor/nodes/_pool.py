"""An ordered map over persistent threads, for ``map`` with thread workers.

torchdata's ``ParallelMapper`` starts a reader thread, N workers and a sorting thread for
every epoch and joins them at the next reset (~0.1 s: they poll a stop flag), and each item
crosses three queues. ``OrderedThreads`` keeps one ``ThreadPoolExecutor`` for the node's
life: the caller's thread reads the input and submits up to ``window`` items ahead, then
takes results in input order, so an item crosses one queue and one future.

Its position is what ``ParallelMapper`` gives: the input's state at some item and how many
items after it were already emitted. The input's state is taken before every
``snapshot_every``-th item read, in the caller's thread (where the input is read), so a
restore re-reads (without mapping) fewer than ``snapshot_every`` items.
"""

from __future__ import annotations

import collections
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

from torchdata.nodes import BaseNode


class OrderedThreads:
    """``call`` over ``source`` on ``workers`` persistent threads, results in input order.

    Args:
        source: the input; reset and positioned by the owner before ``start()``.
        call: the function run in the threads (it must not raise: errors are values).
        workers: threads.
        window: items in flight at most (read ahead of the one being emitted).
        snapshot_every: take the input's state every N items read.
        name: thread name prefix.
    """

    def __init__(self, source: BaseNode, call: Callable[[Any], Any], *, workers: int, window: int,
                 snapshot_every: int, name: str = "conveyor-map"):
        self.source = source
        self.call = call
        self.workers = workers
        self.window = max(window, 1)
        self.snapshot_every = snapshot_every
        self.name = name
        self._pool: ThreadPoolExecutor | None = None
        self._pending: collections.deque[Future] = collections.deque()
        self._snaps: collections.deque[tuple[int, Any]] = collections.deque()
        self._read = 0
        self._emitted = 0
        self._ended = False

    def start(self) -> None:
        """Begin at the input's current position (an epoch's start or a restored place)."""
        self._drop_pending()
        self._read = self._emitted = 0
        self._ended = False
        self._snaps = collections.deque([(0, self.source.state_dict())])

    def _drop_pending(self) -> None:
        for fut in self._pending:
            fut.cancel()  # one already running finishes in the background, its result unread
        self._pending.clear()

    def __next__(self) -> Any:
        pending = self._pending
        if len(pending) < self.window and not self._ended:
            pool = self._pool
            if pool is None:
                pool = self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix=self.name)
            while len(pending) < self.window:
                if self._read % self.snapshot_every == 0 and self._read:
                    self._snaps.append((self._read, self.source.state_dict()))
                try:
                    item = next(self.source)
                except StopIteration:
                    self._ended = True
                    break
                pending.append(pool.submit(self.call, item))
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

    def ready(self) -> int:
        """Results finished and not yet taken."""
        return sum(1 for fut in self._pending if fut.done())

    def close(self) -> None:
        self._drop_pending()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

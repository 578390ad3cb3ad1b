"""prefetch: run the graph above in a background thread, ``depth`` items ahead.

Wraps torchdata's ``Prefetcher`` (a bounded queue filled by one thread) and adds ``close()``,
which stops the thread now rather than when the garbage collector gets to it (a thread busy
in its input's ``next()`` ends after that item: ``lingering()`` gives it to the loader to join). The state is
the input's state snapshot at the last emitted item plus a count, so nothing queued is lost
or repeated on resume.
"""

from __future__ import annotations

import threading

from torchdata.nodes import BaseNode, Prefetcher

from conveyor.nodes._elastic import Cursor
from conveyor.nodes._threads import CarryErrors, Raised, shutdown_torchdata


class Prefetch(BaseNode):
    """Fill a queue of ``depth`` items from ``source`` in a background thread.

    Args:
        source: the input stream.
        depth: items kept ready, > 0.
        snapshot_every: take the input's state every N items (1: every item; a larger N
            trades a longer replay on restore for less work per item).

    Example:
        >>> from torchdata.nodes import IterableWrapper
        >>> with_prefetch = Prefetch(IterableWrapper(range(3)), depth=2)
        >>> list(with_prefetch)
        [0, 1, 2]
    """

    IT_KEY = "it"

    def __init__(self, source: BaseNode, *, depth: int = 2, snapshot_every: int = 1):
        super().__init__()
        if not isinstance(depth, int) or depth <= 0:
            raise ValueError(f"{depth=} must be a positive int")
        if not isinstance(snapshot_every, int) or snapshot_every <= 0:
            raise ValueError(f"{snapshot_every=} must be a positive int")
        self.source = source
        self.depth = depth
        self.snapshot_every = snapshot_every
        self._pf: Prefetcher | None = None
        self._lingering: list[threading.Thread] = []

    def close(self) -> None:
        if self._pf is not None:
            self._lingering += shutdown_torchdata(self._pf)
            self._pf = None

    def lingering(self) -> list[threading.Thread]:
        """Threads of this node asked to stop that were still busy inside their input's
        ``next()`` when ``close()`` returned (the loader joins them after closing the nodes
        above them: a thread left running torch code at interpreter exit can abort it)."""
        self._lingering = [t for t in self._lingering if t.is_alive()]
        return list(self._lingering)

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self.close()
        self._pf = Prefetcher(CarryErrors(self.source), prefetch_factor=self.depth,
                              snapshot_frequency=self.snapshot_every)
        self._pf.reset(None if initial_state is None else initial_state[self.IT_KEY])

    def next(self):
        item = next(self._pf)  # type: ignore[arg-type]
        if isinstance(item, Raised):
            raise item.exc
        return item

    def get_state(self) -> dict:
        return {self.IT_KEY: self._pf.state_dict()}  # type: ignore[union-attr]

    @staticmethod
    def elastic_input(cursor: Cursor) -> Cursor:
        """Consumed input items (elastic resume): the snapshot plus the items taken after it."""
        if cursor.state is None:
            return cursor
        it = cursor.state[Prefetch.IT_KEY]
        return Cursor(it["snapshot"], it["steps_since_snapshot"] + cursor.more, cursor.extra)

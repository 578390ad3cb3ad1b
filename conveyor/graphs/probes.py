"""probes: what ``Counted`` (conveyor/graphs/instrument.py) reads from inside the nodes it wraps.

Two readings need to know a node's kind and reach a little into it: the time a ``map`` with
thread workers spends inside its ``fn`` (its ``fn`` is wrapped in a ``TimedFn`` that adds to a
``Work``), and how many items a buffered node (prefetch, map with workers, worker copies) holds
ready when its caller asks (``queue_probe``). Anything unexpected reads as "cannot tell", never
as an error.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from torchdata.nodes import BaseNode

from conveyor.nodes import Map, Prefetch, WorkerCopies

_clock = time.perf_counter


class Work:
    """Seconds spent in a threaded map's ``fn``, summed over its worker threads."""

    __slots__ = ("seconds", "trace")

    def __init__(self) -> None:
        self.seconds = 0.0
        self.trace: Callable[[float, float], None] | None = None


class TimedFn:
    """Wraps a threaded map's ``fn``: adds the time spent in it to a ``Work``."""

    def __init__(self, fn: Callable, work: Work):
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


def time_map_fn(inner: BaseNode, work: Work) -> bool:
    """Time ``fn`` of a map with thread workers; False where that is not possible."""
    if not isinstance(inner, Map) or inner.workers == 0 or inner.method != "thread":
        return False
    call = getattr(inner, "call", None)
    fn = getattr(call, "fn", None)
    if fn is None:
        return False
    if not isinstance(fn, TimedFn):
        call.fn = TimedFn(fn, work)
    return True


def queue_probe(inner: BaseNode) -> tuple[Callable[[], int], int] | None:
    """(a callable giving the items ready, the queue's capacity) for buffered nodes.

    torchdata keeps its queues a few attributes deep; anything unexpected gives None.
    """
    try:
        if isinstance(inner, Prefetch):
            return inner.ready, int(inner.depth)
        if isinstance(inner, Map):
            return inner.probe()
        if isinstance(inner, WorkerCopies):
            return inner.ready, int(inner.chunk) * inner.copies
    except (AttributeError, NotImplementedError, OSError, TypeError):
        return None
    return None

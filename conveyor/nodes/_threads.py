"""Private helpers for nodes that run torchdata's threaded iterators.

torchdata 0.11 keeps the running iterator of ``ParallelMapper``, ``Prefetcher`` and
``PinMemory`` a few attributes deep and stops its threads only from ``__del__``. A dropped
loader whose iterator is still referenced keeps its threads alive, and at interpreter exit
that can abort the process. ``shutdown_torchdata`` reaches the iterator and stops it now.
"""

from __future__ import annotations

from typing import Any


def shutdown_torchdata(node: Any) -> None:
    """Stop the threads (and worker processes) of a torchdata threaded node, if it runs any."""
    seen = 0
    it = node
    # ParallelMapper._it -> _ParallelMapperImpl._it -> _ParallelMapperIter; Prefetcher._it -> iter
    while it is not None and seen < 4:
        stop = getattr(it, "_shutdown", None)
        if callable(stop):
            stop()
            return
        it = getattr(it, "_it", None)
        seen += 1

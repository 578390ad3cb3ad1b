"""One compiled graph running in this process, and what closes it.

A ``GraphRun`` is what the loader holds of a compiled graph: the nodes it tells each epoch and
resets, its output pulled under the watchdog's eye (``conveyor/graphs/watchdog.py``), its
states (``conveyor/graphs/state.py``), what its ranks do together
(``conveyor/graphs/distributed.py``), its length per epoch, and a finalizer that stops every
thread and process of its nodes: at ``close()``, when the loader that owns it is
garbage-collected, or at interpreter exit. The loader builds a new one where torch.distributed
gives it another rank or world than it was built for.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

from conveyor.graphs.compile import Compiled
from conveyor.graphs.distributed import Ranks
from conveyor.graphs.length import epoch_length
from conveyor.graphs.state import States
from conveyor.graphs.watchdog import DEFAULT_AFTER, Watchdog, graph_progress, graph_report
from conveyor.nodes import check_state, join_threads

log = logging.getLogger(__name__)

LINGER_WAIT = 5.0  # seconds close() waits for threads busy in an item when they were asked to stop


def close_nodes(nodes: list[Any], dog: Watchdog | None = None) -> None:
    """Stop the watchdog and close ``nodes`` (outputs first), then wait a little for their
    threads still busy in an item."""
    if dog is not None:
        dog.stop()
    for node in nodes:
        close = getattr(node, "close", None)
        if callable(close):
            try:
                close()
            except Exception:  # closing must go on for the other nodes
                log.exception("closing %r failed", node)
    # a prefetch thread busy in its input when asked to stop (or woken by the close of a map
    # below it) ends after that item: wait for it here, not at interpreter exit, where a
    # thread still inside torch code can abort the process
    lingering = [(node, t) for node in nodes for t in getattr(node, "lingering", list)()]
    left = join_threads([t for _, t in lingering], LINGER_WAIT)
    if left:
        log.warning("closing: %d thread(s) still busy %.0f s after they were asked to stop, left "
                    "behind (daemon threads): %s", len(left), LINGER_WAIT,
                    ", ".join(f"{t.name} of {type(n).__name__}" for n, t in lingering if t in left))


class GraphRun:
    """A compiled graph running for ``owner``, which it is closed with when collected.

    Args:
        owner: the object whose garbage collection closes the graph (the loader); not referenced.
        compiled: the graph.
        serial: which loader of this spec this is in the process (the ranks' listing check).
    """

    def __init__(self, owner: Any, compiled: Compiled, serial: int):
        self.compiled = compiled
        self.root = compiled.root
        self.states = States(compiled.plan, compiled.rank, compiled.world)
        self.ranks = Ranks(compiled, self.states.digest, serial)
        self.length: int | None = None  # len(), once known
        inner = [compiled.nodes[n].inner for n in reversed(compiled.order) if n in compiled.nodes]
        after = getattr(compiled.plan, "watchdog", DEFAULT_AFTER)
        self.dog = Watchdog(after, progress=graph_progress(compiled), report=graph_report(compiled)) \
            if after else None
        self._finalizer = weakref.finalize(owner, close_nodes, inner, self.dog)

    def close(self) -> None:
        """Stop every thread and worker process of the graph. Safe to call twice."""
        self._finalizer()

    def start(self, epoch: int, graph_state: dict | None) -> None:
        """Tell every node the epoch, zero the counters, and reset the output to ``graph_state``
        (None: the epoch's start)."""
        for counted in self.compiled.nodes.values():
            set_epoch = getattr(counted.inner, "set_epoch", None)
            if callable(set_epoch):
                set_epoch(epoch)
        for counted in self.compiled.nodes.values():
            counted.items = 0
        dog = self.dog
        if dog is not None:
            dog.start()
            dog.entered += 1  # a reset may wait too (a worker's start, a shuffle's first window)
        try:
            self.root.reset(graph_state)
        finally:
            if dog is not None:
                dog.left += 1

    def check_state(self, graph_state: Any, path: tuple[str, ...]) -> None:
        """Refuse a graph state that does not have the shape its nodes declare (a key missing or
        unknown, a value of another type or out of bounds), before any node is reset with it.

        Raises:
            StateError: naming the key path (``path`` > the spec's node > its keys) and the value.
        """
        names = {id(counted): name for name, counted in self.compiled.nodes.items()}
        check_state(self.root, graph_state, path, names)

    def pull(self) -> Any:
        """The output's next item (StopIteration at the epoch's end)."""
        dog = self.dog
        if dog is None:
            return next(self.root)
        dog.entered += 1  # the watchdog looks whether the caller waits here and for how long
        try:
            return next(self.root)
        finally:
            dog.left += 1

    def set_deal(self, deal: dict[str, Any]) -> None:
        """Hand an elastic resume's deal to the nodes that take one (the shard)."""
        for counted in self.compiled.nodes.values():
            set_deal = getattr(counted.inner, "set_deal", None)
            if callable(set_deal):
                set_deal(deal)

    def copies(self) -> Any:
        """The graph's ``WorkerCopies`` node, or None."""
        from conveyor.nodes import WorkerCopies

        for counted in self.compiled.nodes.values():
            if isinstance(counted.inner, WorkerCopies):
                return counted.inner
        return None

    def epoch_length(self) -> int:
        """Batches this rank yields in an epoch; with ranks that agree on each epoch's end, the
        fewest of any rank.

        Raises:
            UnknownLength: the data decide it (graphs/length.py).
        """
        c = self.compiled
        copies = getattr(c.plan, "copies", None)
        copied = (copies.count, copies.until) if c.copied else None
        nodes = {n: counted for n, counted in c.nodes.items() if n not in c.copied}
        merge = self.copies() if c.copied else None
        hand = getattr(getattr(merge, "factory", None), "hand_listings", None)
        listings: dict[str, dict] = {}
        if callable(hand):  # the copies' listings, made once here: counted from them, handed to the copies
            hand()
            listings = merge.factory.listings  # type: ignore[union-attr]
        return min(epoch_length(c.plan, nodes, r, c.world, copied, listings)
                   for r in self.ranks.counted(c.rank, c.world))

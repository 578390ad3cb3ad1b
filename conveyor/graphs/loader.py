"""Loader: runs a compiled graph epoch after epoch, saves and restores its place, closes.

Iterating the loader runs one epoch; iterating it again starts the next, reshuffled (the
loader tells every node the epoch: there is no ``set_epoch`` to forget). ``state_dict()``
may be called at any step; ``load_state_dict()`` makes the next iteration continue exactly
after the step the state was taken at, in this process or a new one. A state taken after
the last batch of an epoch resumes at the first batch of the next epoch.

The state is plain data: a format version, the spec's digest and its node params (to name
what differs when a state does not fit), the epoch, the batches yielded in it, the rank and
world, and the graph's own state. In a job of several ranks whose graph can give them uneven
batch counts, every rank ends each epoch at the same batch (``conveyor/graphs/even.py``).
``close()`` (or ``with``) stops every thread and process;
a loader nobody closed is closed when it is garbage-collected or the interpreter exits.
"""

from __future__ import annotations

import logging
import time
import weakref
from typing import Any, Iterator

from conveyor.errors import StateError
from conveyor.graphs.compile import Compiled, digest, summary
from conveyor.graphs.even import agreement_for
from conveyor.graphs.instrument import node_perf

log = logging.getLogger(__name__)

STATE_FORMAT = 1
# params whose change leaves the data exactly the same (only speed or memory differ)
SAFE_PARAMS = frozenset({"workers", "method", "mp_context", "depth", "snapshot_every", "enabled",
                         "concurrency", "attempts", "timeout", "backoff", "backoff_max", "cache",
                         "cache_size", "block_size", "read_ahead",
                         "device", "non_blocking"})


def _close_nodes(nodes: list[Any]) -> None:
    for node in nodes:
        close = getattr(node, "close", None)
        if callable(close):
            try:
                close()
            except Exception:  # closing must go on for the other nodes
                log.exception("closing %r failed", node)


class _EpochIterator:
    """One epoch's iterator; ``iter()`` of it is itself, so ``it = iter(loader); next(it);
    for batch in it`` stays in the same epoch. A newer epoch ends an older iterator."""

    __slots__ = ("_loader", "_generation")

    def __init__(self, loader: "Loader", generation: int):
        self._loader = loader
        self._generation = generation

    def __iter__(self) -> "_EpochIterator":
        return self

    def __next__(self) -> Any:
        return self._loader._next(self._generation)


class Loader:
    """An iterable over the batches of a compiled graph, with epochs and exact resume.

    Usually made by ``conveyor.load_graph``. Example:
        >>> with load_graph("specs/numbers.yaml") as loader:       # doctest: +SKIP
        ...     for epoch in range(2):
        ...         for batch in loader: ...
        ...     state = loader.state_dict()
    """

    def __init__(self, compiled: Compiled):
        self._c = compiled
        self._summary = summary(compiled.plan)
        self._digest = digest(self._summary)
        self._root = compiled.root
        self._epoch = -1           # the epoch being (or last) iterated
        self._yielded = 0          # batches yielded in that epoch
        self._started = False      # root has been reset for self._epoch
        self._exhausted = False
        self._pending: dict | None = None  # a loaded state, applied at the next iter()
        self._peeked: list[Any] = []       # one batch read ahead after a restore
        self._peek_state: dict | None = None
        self._closed = False
        self._generation = 0  # which iterator is current: an older one is finished
        self._t_start = 0.0
        self._agree = agreement_for(compiled.plan, compiled.world)  # even batches across ranks
        self._cut = False          # this epoch was ended by the ranks' agreement, not by the data
        self._epochs_cut = 0
        inner = [compiled.nodes[n].inner for n in reversed(compiled.order) if n in compiled.nodes]
        self._finalizer = weakref.finalize(self, _close_nodes, inner)

    # ----- epochs -------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        """The epoch being iterated (or, between epochs, the last one); -1 before the first."""
        return self._epoch

    @property
    def spec_path(self) -> str:
        return self._c.plan.path

    @property
    def nodes(self) -> dict[str, Any]:
        """The built nodes by name (the torchdata ``BaseNode`` of each)."""
        return {n: c.inner for n, c in self._c.nodes.items()}

    def _set_epoch(self, epoch: int) -> None:
        self._epoch = epoch
        for counted in self._c.nodes.values():
            set_epoch = getattr(counted.inner, "set_epoch", None)
            if callable(set_epoch):
                set_epoch(epoch)

    def _start(self, epoch: int, graph_state: dict | None) -> None:
        self._set_epoch(epoch)
        for counted in self._c.nodes.values():
            counted.items = 0
        self._root.reset(graph_state)
        self._started = True
        self._exhausted = False
        self._cut = False
        self._t_start = time.perf_counter()

    def _restore(self, state: dict) -> None:
        if state.get("cut"):  # the ranks ended that epoch together: the next one begins
            self._start(state["epoch"] + 1, None)
            self._yielded = 0
            return
        self._start(state["epoch"], state["graph"])
        self._yielded = state["yielded"]
        try:
            self._peeked = [next(self._root)]
            self._peek_state = state
        except StopIteration:  # saved after the last batch: the next epoch begins
            self._start(state["epoch"] + 1, None)
            self._yielded = 0

    def __iter__(self) -> Iterator[Any]:
        self._check_open()
        if self._pending is not None:
            state, self._pending = self._pending, None
            self._restore(state)
        elif self._started and self._yielded == 0 and not self._exhausted:
            pass  # started (e.g. for a state_dict) but nothing taken yet: this is that epoch
        else:
            self._start(self._epoch + 1, None)
            self._yielded = 0
        self._generation += 1
        return _EpochIterator(self, self._generation)

    def _next(self, generation: int) -> Any:
        if self._exhausted or not self._started or generation != self._generation:
            raise StopIteration
        have = True
        if self._peeked:
            item = self._peeked.pop()
            self._peek_state = None
        else:
            try:
                item = next(self._root)
            except StopIteration:
                have = False
        all_have = have if self._agree is None else self._agree.all_have(have)  # every rank calls it
        if not all_have:
            self._exhausted = True
            if have:  # another rank ran out first: this rank's rest of the epoch stays unread
                self._cut = True
                self._epochs_cut += 1
                (log.warning if self._epochs_cut == 1 else log.info)(
                    "rank %d: epoch %d ends after %d batches, where another rank ran out; this rank's "
                    "remaining batches are left unread (even_batches keeps DDP from hanging)",
                    self._c.rank, self._epoch, self._yielded)
            raise StopIteration
        self._yielded += 1
        return item

    # ----- state --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where the loader is, as plain data (JSON-serialisable); cheap enough for every step."""
        self._check_open()
        if self._pending is not None:
            return self._pending
        if self._peek_state is not None:
            return self._peek_state
        if not self._started:
            self._start(0, None)
            self._yielded = 0
        return {
            "format": STATE_FORMAT,
            "digest": self._digest,
            "spec": self._summary["nodes"],
            "workers": self._summary["workers"],
            "rank": self._c.rank,
            "world": self._c.world,
            "epoch": self._epoch,
            "yielded": self._yielded,
            "cut": self._cut,
            "graph": self._root.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any], *, strict: bool = True) -> None:
        """Resume from ``state`` at the next ``iter()``.

        Args:
            state: from ``state_dict()``, possibly after a JSON or torch.save round trip.
            strict: refuse any difference between the saved spec and this one. With
                ``strict=False`` differences are logged, each marked as safe (workers, prefetch
                depth, pinning: the data stay the same) or as breaking exactness (seed, sizes, fn).

        Raises:
            StateError: the state is from another format, spec, rank or world size.
        """
        self._check_open()
        if not isinstance(state, dict) or "format" not in state or "graph" not in state:
            raise StateError("not a conveyor loader state (expected a dict from Loader.state_dict())")
        if state["format"] != STATE_FORMAT:
            raise StateError(f"state format {state['format']} is not supported (this conveyor "
                             f"writes format {STATE_FORMAT})")
        if (state.get("rank"), state.get("world")) != (self._c.rank, self._c.world):
            raise StateError(f"state was saved by rank {state.get('rank')} of world {state.get('world')}, "
                             f"this is rank {self._c.rank} of world {self._c.world}: load each rank's "
                             "own state, with the same world size")
        saved_w, now_w = state.get("workers") or {}, self._summary["workers"] or {}
        if (saved_w.get("copies", 1), saved_w.get("until")) != (now_w.get("copies", 1), now_w.get("until")):
            raise StateError(f"state was taken with {saved_w.get('copies', 1)} worker copies up to "
                             f"'{saved_w.get('until')}', this graph runs {now_w.get('copies', 1)} up to "
                             f"'{now_w.get('until')}': a state resumes only with the same copies "
                             "(each copy's position is part of it)")
        if state.get("digest") != self._digest:
            self._compare(state.get("spec") or {}, strict)
        if not self._c.plan.resumable:
            log.warning("%s declares resumable: false: this state restores the position of every "
                        "node, but the batches after it will not be exactly the uninterrupted run's",
                        self._c.plan.path)
        self._pending = state
        self._peeked, self._peek_state = [], None

    def _compare(self, saved: dict[str, Any], strict: bool) -> None:
        now = self._summary["nodes"]
        structural = []
        for n in saved:
            if n not in now:
                structural.append(f"node '{n}' is in the saved spec but not in this one")
        for n in now:
            if n not in saved:
                structural.append(f"node '{n}' is in this spec but not in the saved one")
            elif saved[n]["op"] != now[n]["op"] or saved[n].get("inputs") != now[n]["inputs"]:
                structural.append(f"node '{n}' is {saved[n]['op']} <- {saved[n].get('inputs')} in the "
                                  f"saved spec, {now[n]['op']} <- {now[n]['inputs']} here")
        if structural:
            raise StateError("the state is from a different graph: " + "; ".join(structural))
        diffs = []
        for n, node in now.items():
            old = saved[n]["params"]
            for p in sorted(set(old) | set(node["params"])):
                if old.get(p) != node["params"].get(p):
                    safe = p in SAFE_PARAMS
                    diffs.append((safe, f"node '{n}' param '{p}': saved {old.get(p)!r}, now "
                                        f"{node['params'].get(p)!r}"
                                        + (" (safe: the data stay the same)" if safe else
                                           " (breaks exactness: the batches will differ)")))
        if not diffs:
            return
        if strict:
            raise StateError("the state is from a spec with other params: "
                             + "; ".join(d for _, d in diffs)
                             + ". Pass strict=False to load it anyway")
        for safe, d in diffs:
            (log.info if safe else log.warning)("loading a state across a spec change: %s", d)

    # ----- stats and closing --------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """What each node did in the current epoch, as plain data.

        Per node: its op, ``items`` out, what the node counts itself (``skipped`` for map with
        on_error: skip, ``filtered`` for filter, ...), and ``perf`` (None for nodes that ran
        in worker copies): ``busy_s`` producing (its own work; for a map with thread workers
        the time in ``fn`` summed over them), ``wait_s`` getting items from its inputs,
        ``busy`` and ``wait`` as fractions of the epoch's seconds (busy per worker thread),
        ``items_per_s``, and ``queue`` for buffered nodes (items ready when asked: mean, max,
        capacity). ``data_wait_s`` is the time the caller spent waiting in ``next()``.
        See conveyor/graphs/instrument.py for how these are measured.
        """
        nodes = {}
        copies = self._copies()
        from_copies = copies.copy_stats() if copies is not None else {}
        elapsed = time.perf_counter() - self._t_start if self._started else 0.0
        perf = self._perf(elapsed + self._root.reset_seconds if self._started else 0.0)
        for name in self._c.order:
            entry: dict[str, Any] = {"op": self._c.plan.nodes[name].op.name}
            if name in from_copies:  # counted inside the worker copies, summed over them
                entry.update(from_copies[name])
            counted = self._c.nodes.get(name)
            if counted is not None:
                entry["items"] = counted.items
                own = getattr(counted.inner, "stats", None)
                if callable(own):
                    entry.update(own())
            entry["perf"] = perf.get(name)
            nodes[name] = entry
        return {"epoch": self._epoch, "batches": self._yielded, "seconds": elapsed,
                "data_wait_s": round(self._root.seconds, 6), "nodes": nodes,
                "even_batches": {"agreeing": self._agree is not None and self._agree.active is not False,
                                 "epochs_cut": self._epochs_cut,
                                 "this_epoch_cut": self._cut}}

    def _perf(self, elapsed: float) -> dict[str, dict[str, Any]]:
        counted = self._c.nodes
        raws = {n: c.raw() for n, c in counted.items()}
        inputs = {n: self._c.plan.nodes[n].inputs for n in counted}
        return node_perf(counted, inputs, raws, elapsed)

    def _copies(self) -> Any:
        from conveyor.nodes.copies import WorkerCopies

        for counted in self._c.nodes.values():
            if isinstance(counted.inner, WorkerCopies):
                return counted.inner
        return None

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this loader is closed")

    def close(self) -> None:
        """Stop every thread and worker process of the graph. Safe to call twice."""
        self._closed = True
        self._finalizer()

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Loader({self._c.plan.path!r}, output={self._c.plan.output!r}, epoch={self._epoch})"

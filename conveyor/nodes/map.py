"""map: apply a function to every item, in order, in threads or processes.

``fn(item, **args)`` runs inline (``workers=0``) or on ``workers`` threads or processes,
through one of three engines with one interface (``_workers/map_engines.py``): ordered threads
run in ``OrderedThreads``, whose threads live as long as the node (no pool is torn down and
rebuilt each epoch); processes, and threads with ``ordered=False``, in torchdata's
``ParallelMapper``. If ``fn`` takes an ``rng`` argument it receives a ``random.Random``
seeded from (seed, epoch, sample index), where the sample index is the item's ``"index"``
field when it has one (list_files records do) and the item's position in this node's input
otherwise (then the rank is mixed in too). A
``generator`` argument receives a ``torch.Generator`` seeded the same way, for torch-random
transforms (``torch.rand(..., generator=generator)``). Outputs therefore never depend on the
number of workers, the method, or timing. torch's *global* RNG (what ``torch.rand()`` without
a generator, and torchvision's random transforms, draw from) is not seeded per sample nor
saved in the state: a transform using it runs, but neither repeats nor resumes exactly.
``fn`` may be a transform object made once per worker (``_configured.PerWorker``).

Errors in ``fn`` are raised in the caller's thread as the original exception with a note
naming the node (``on_error="raise"``), or counted and skipped (``on_error="skip"``); the
count is in ``stats()["skipped"]`` and the first few are logged with their messages. A
``SourceError`` (``fn`` reading a remote path: a missing bucket, denied access, a server out
of reach) is raised even with ``skip``: it is no bad item (recognised by its type where it
was raised, so also from a worker process: ``_workers/map_calls.py``). A ``StopIteration``
from ``fn`` is a ``SampleError`` naming ``fn`` and the item (raised as it is, it would end the
stream there). A worker process that dies (the out-of-memory killer) is a ``WorkerError``
naming the node, its pid and the signal, raised within a fraction of a second; the state
from before it resumes exactly (``worker_pids()`` gives the pids).

With ``slab=N`` (the compiler sets it to the batch size when the map's thread workers feed
``batch`` then ``collate``) and an ``fn`` that takes an ``into`` argument (``conveyor.image``'s
transforms do), each item is given a row of an array of N consecutive outputs to write its
image into (``_workers/batch_slabs.py``), and collate hands such rows out as the batch
without a copy.

The state is the same whatever the workers: the input's state plus how many items after it
were already emitted. A restore re-reads those few input records but does not map them.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from torchdata.nodes import BaseNode

from conveyor.nodes._elastic import Cursor
from conveyor.nodes._skips import LEDGER_KEY, OnError
from conveyor.nodes._workers.batch_slabs import Slabs
from conveyor.nodes._workers.child_processes import check_timeout, threads_instead
from conveyor.nodes._workers.map_calls import Call, Enumerate, Failed, Slotted
from conveyor.nodes._workers.map_engines import SKIP_KEY, SOURCE_KEY, InlineEngine, ProcessEngine, ThreadEngine
from conveyor.nodes._workers.torchdata_threads import CarryErrors, Raised, Untravelled
from conveyor.nodes.state_shape import Child, Fields, Int, LEDGER_SHAPE

log = logging.getLogger(__name__)

METHODS = ("thread", "process")
ON_ERROR = ("raise", "skip")
THREAD_WINDOW = 8  # items in flight per ordered thread worker by default (see _workers/ordered_threads.py)


class Map(BaseNode):
    """Apply ``fn`` to every item, keeping the input order.

    Args:
        source: the input stream.
        fn: a callable ``fn(item, **args)``; give it an ``rng`` parameter for per-sample randomness.
        args: keyword arguments for ``fn``.
        workers: 0 runs inline; N > 0 runs N threads or processes.
        method: ``"thread"`` (Pillow and torch release the GIL) or ``"process"`` (pure-Python fns).
        on_error: ``"raise"`` or ``"skip"`` (counted per epoch in ``stats()`` and the state).
        seed: base seed for the ``rng``.
        rank: mixed into the seed of items without an ``"index"``.
        where: text for error notes, e.g. ``"node 'decode' (map) from specs/x.yaml:18"``.
        mp_context: multiprocessing start method for ``method="process"``.
        ordered: keep the input order (``False`` yields results as they finish: faster with
            uneven item costs, but neither deterministic nor exactly resumable).
        max_concurrent: items in flight (default: 8 per ordered thread, so the threads never
            run dry while the caller batches; 2 per worker otherwise).
        snapshot_every: with workers, take the input's state every N items; a restore then
            re-reads (without mapping) at most N input items. Every item cost 4 % on cheap
            items here; 16 costs 0.3 % (benchmarks/state_cost.py).
        slab: with ordered thread workers and an ``fn`` taking ``into``: give each item a row
            of an array of this many consecutive outputs to write into (the batch size of a
            ``batch`` + ``collate`` after this node: collate then copies nothing); 0: off.
        timeout: with ``method="process"``: seconds ``next()`` may wait for a result (an epoch's
            first too, while the workers start) before a ``WorkerError`` naming the node and its
            workers, as ``DataLoader``'s ``timeout``; ``None``: no limit (the watchdog names them).

    Example:
        >>> from torchdata.nodes import IterableWrapper
        >>> list(Map(IterableWrapper([1, 2]), fn=lambda x: x * 10))
        [10, 20]
    """

    SOURCE_KEY = SOURCE_KEY
    SKIP_KEY = SKIP_KEY
    SKIPPED_KEY = "skipped"
    STATE_SHAPE = Fields({SOURCE_KEY: Child(), SKIP_KEY: Int(), SKIPPED_KEY: Int(), LEDGER_KEY: LEDGER_SHAPE},
                         optional=(SKIPPED_KEY, LEDGER_KEY))

    def __init__(self, source: BaseNode, *, fn: Callable, args: dict[str, Any] | None = None,
                 workers: int = 0, method: str = "thread", on_error: str = "raise", seed: int = 0,
                 rank: int = 0, where: str | None = None, mp_context: str | None = None,
                 max_concurrent: int | None = None, snapshot_every: int = 16, ordered: bool = True,
                 slab: int = 0, timeout: float | None = None):
        super().__init__()
        check_timeout(timeout)
        self.timeout = timeout
        if not isinstance(workers, int) or workers < 0:
            raise ValueError(f"{workers=} must be an int >= 0")
        if method not in METHODS:
            raise ValueError(f"{method=} must be one of {METHODS}")
        if on_error not in ON_ERROR:
            raise ValueError(f"{on_error=} must be one of {ON_ERROR}")
        self.source = Enumerate(CarryErrors(source))
        self.call = Call(fn, args or {}, seed, rank)
        self.workers = workers
        self.where = where or f"map {getattr(fn, '__name__', fn)!r}"
        if workers and method == "process" and threads_instead(mp_context, self.where):
            method = "thread"  # the main module cannot be imported again by a worker: said once
        self.method = method
        self.on_error = on_error
        self.mp_context = mp_context
        self.max_concurrent = max_concurrent
        self.window = max_concurrent or (THREAD_WINDOW if method == "thread" and ordered else 2) * workers
        if not isinstance(snapshot_every, int) or snapshot_every < 1:
            raise ValueError(f"{snapshot_every=} must be an int >= 1")
        self.snapshot_every = snapshot_every
        if not isinstance(slab, int) or slab < 0:
            raise ValueError(f"{slab=} must be an int >= 0")
        self.ordered = ordered
        self.errors = OnError(on_error, self.where, log)
        self.ledger = self.errors.ledger
        self.engine = self._engine(slab)
        self._next = self.engine.next  # (bound once: the per-item path)

    def _engine(self, slab: int) -> InlineEngine | ThreadEngine | ProcessEngine:
        if not self.workers:
            return InlineEngine(self.source, self.call)
        if self.method == "thread" and self.ordered:
            if slab and self.call.wants_into:  # each item writes into its row of a batch slab
                slotted = Slotted(self.call, Slabs(slab), self.errors)
                return ThreadEngine(self.source, slotted, workers=self.workers, window=self.window,
                                    snapshot_every=self.snapshot_every, where=self.where,
                                    prepare=slotted.prepare, slabs=slotted.slabs)
            return ThreadEngine(self.source, self.call, workers=self.workers, window=self.window,
                                snapshot_every=self.snapshot_every, where=self.where)
        return ProcessEngine(self.source, self.call, workers=self.workers, method=self.method, timeout=self.timeout,
                             ordered=self.ordered, mp_context=self.mp_context,
                             max_concurrent=self.max_concurrent, snapshot_every=self.snapshot_every,
                             where=self.where)

    @property
    def skipped(self) -> int:
        """Items skipped this epoch (``on_error="skip"``)."""
        return self.errors.skipped

    def set_epoch(self, epoch: int) -> None:
        self.call.epoch = epoch

    def stats(self) -> dict[str, int]:
        return {"skipped": self.errors.skipped}

    def close(self) -> None:
        self.engine.close()

    def lingering(self) -> list:
        """ParallelMapper threads asked to stop and still busy (the loader joins them)."""
        return self.engine.lingering()

    def waiting_on(self) -> str | None:
        """What this node's workers are doing, in words (for the loader's watchdog)."""
        return self.engine.waiting_on()

    def worker_pids(self) -> list[int]:
        """The pids of this node's worker processes this epoch (``method="process"``; none
        inline or with threads)."""
        return self.engine.worker_pids()

    def probe(self) -> tuple[Callable[[], int], int] | None:
        """(a callable giving the results ready, how many may be in flight) for the
        instrumentation's queue samples; None inline or before the first epoch."""
        return self.engine.probe()

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        errors = self.errors
        errors.skipped = 0 if initial_state is None else initial_state.get(self.SKIPPED_KEY, 0)
        if initial_state is not None:
            errors.ledger.load(initial_state.get(LEDGER_KEY))
        self.engine.start(initial_state)

    def next(self):
        while True:
            out = self._next()
            if isinstance(out, Raised):  # an error of the input (text only, if it could not travel)
                raise out.exc.at(f"{self.where}, from its input") if isinstance(out.exc, Untravelled) else out.exc
            if not isinstance(out, Failed):
                return out
            self.errors.fail(out)

    def get_state(self) -> dict:
        src, skip = self.engine.position()
        return {self.SOURCE_KEY: src, self.SKIP_KEY: skip, self.SKIPPED_KEY: self.errors.skipped,
                LEDGER_KEY: self.ledger.state()}

    @staticmethod
    def elastic_input(cursor: Cursor) -> Cursor:
        """Consumed input items (elastic resume): the snapshot plus the items emitted after it
        (counted in input items, so an item skipped on error counts as consumed)."""
        if cursor.state is None:
            return cursor
        enum = cursor.state[Map.SOURCE_KEY]
        src = None if enum is None else enum[Enumerate.SOURCE_KEY]
        return Cursor(src, cursor.state[Map.SKIP_KEY] + cursor.more, cursor.extra)

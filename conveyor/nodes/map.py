"""map: apply a function to every item, in order, in threads or processes.

``fn(item, **args)`` runs inline (``workers=0``) or on ``workers`` threads or processes.
Ordered threads run in ``OrderedThreads`` (``_pool.py``), whose threads live as long as the
node: no pool is torn down and rebuilt each epoch. Processes, and threads with
``ordered=False``, run in torchdata's ``ParallelMapper``. If ``fn`` takes an ``rng``
argument it receives a ``random.Random`` seeded from (seed, epoch, sample index), where the
sample index is the item's ``"index"`` field when it has one (list_files records do) and the
item's position in this node's input otherwise (then the rank is mixed in too). A
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
of reach) is raised even with ``skip``: it is no bad item.

With ``slab=N`` (the compiler sets it to the batch size when the map's thread workers feed
``batch`` then ``collate``) and an ``fn`` that takes an ``into`` argument (``conveyor.image``'s
transforms do), each item is given a row of an array of N consecutive outputs to write its
image into (``_slabs.py``), and collate hands such rows out as the batch without a copy.

The state is the same whatever the workers: the input's state plus how many items after it
were already emitted. A restore re-reads those few input records but does not map them.
"""

from __future__ import annotations

import inspect
import logging
import os
import random
import threading
from multiprocessing.util import register_after_fork
from typing import Any, Callable

import torch
from torchdata.nodes import BaseNode, ParallelMapper

from conveyor.nodes._children import describe, end_processes, threads_instead
from conveyor.nodes._parent import watch_parent
from conveyor.nodes._elastic import Cursor
from conveyor.nodes._pool import OrderedThreads
from conveyor.nodes._rng import derive_seed
from conveyor.nodes._slabs import Slabs
from conveyor.nodes._threads import CarryErrors, Raised, portable, shutdown_torchdata
from conveyor.nodes._skips import LEDGER_KEY, SkipLedger, log_skip, sample_id

log = logging.getLogger(__name__)

_SEED_MASK = (1 << 63) - 1  # torch.Generator seeds are signed 64-bit
METHODS = ("thread", "process")
CLOSE_WAIT = 10.0  # seconds close() gives worker processes to leave (a stopped one: none)
ON_ERROR = ("raise", "skip")
THREAD_WINDOW = 8  # items in flight per ordered thread worker by default (see _pool.py)


class _Enumerate(BaseNode):
    """(position, item) pairs; the position is part of the state."""

    SOURCE_KEY = "source"
    POS_KEY = "pos"

    def __init__(self, source: BaseNode):
        super().__init__()
        self.source = source
        self.pos = 0

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self.source.reset(None if initial_state is None else initial_state[self.SOURCE_KEY])
        self.pos = 0 if initial_state is None else initial_state[self.POS_KEY]

    def next(self):
        item = next(self.source)
        self.pos += 1
        return self.pos - 1, item

    def get_state(self) -> dict:
        return {self.SOURCE_KEY: self.source.state_dict(), self.POS_KEY: self.pos}


class _Failed:
    """An exception raised by ``fn``, carried back to the caller's thread.

    In threads it is the exception itself. Sent from a worker process, it carries the
    exception only when that survives pickling both ways (an exception whose ``__init__``
    takes other arguments than ``args`` pickles but fails to unpickle, which would kill
    torchdata's receiving thread and hang ``next()``), else its text and traceback.
    """

    __slots__ = ("exc", "text", "sample", "kind")

    def __init__(self, exc: BaseException | None, text: str | None = None, sample: str = "?",
                 kind: str | None = None):
        self.exc = exc
        self.text = text if text is not None else f"{type(exc).__name__}: {exc}"
        self.sample = sample  # the failed item, named for the skip ledger (_skips.sample_id)
        self.kind = kind or (type(exc).__name__ if exc is not None else "Exception")

    @property
    def message(self) -> str:
        """What failed, without the exception's type (the ledger keeps that apart)."""
        return str(self.exc) if self.exc is not None else self.text.removeprefix(f"{self.kind}: ")

    def __reduce__(self) -> tuple:
        exc = None if self.exc is None else portable(self.exc)
        if exc is not self.exc:  # it cannot travel: its text and traceback do
            return (_Failed, (None, str(exc) if exc is not None else self.text, self.sample, self.kind))
        return (_Failed, (exc, self.text, self.sample, self.kind))


class _Call:
    """The picklable callable that workers run: seeds the rng, calls fn, catches errors.

    Given ``parent`` (the main process's pid, and whether its main thread starts the
    workers), a copy of it in a worker process makes that process end with the main one
    (``_parent``): as it is unpickled there (spawn, forkserver) or after a fork.
    """

    def __init__(self, fn: Callable, args: dict[str, Any], seed: int, rank: int):
        self.parent: tuple[int, bool] | None = None
        self.fn = fn
        self.args = dict(args)
        self.seed = seed
        self.rank = rank
        self.epoch = 0
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            params = {}
        self.wants_rng = "rng" in params
        self.wants_generator = "generator" in params
        self.wants_into = "into" in params  # given only with slabs (_Slotted), else left out

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.watch_parent()

    def watch_parent(self) -> None:
        """In a worker process (not the one that made ``parent``): end with that one."""
        if self.parent is not None and os.getpid() != self.parent[0]:
            watch_parent(self.parent[0], what="conveyor map worker", from_main_thread=self.parent[1])

    def sample_seed(self, pos: int, item: Any) -> int:
        index = item.get("index") if isinstance(item, dict) else None
        if isinstance(index, int):
            return derive_seed(self.seed, self.epoch, index)
        return derive_seed(self.seed, self.epoch, self.rank, pos, 1)

    def _randomness(self, pos: int, item: Any) -> dict[str, Any]:
        """``rng`` (a ``random.Random``) and/or ``generator`` (a ``torch.Generator``), seeded
        from this sample alone."""
        seed = self.sample_seed(pos, item)
        out: dict[str, Any] = {}
        if self.wants_rng:
            out["rng"] = random.Random(seed)
        if self.wants_generator:
            out["generator"] = torch.Generator().manual_seed(derive_seed(seed, 2) & _SEED_MASK)
        return out

    def __call__(self, pair: tuple[int, Any], into: Any = None) -> Any:
        pos, item = pair
        if isinstance(item, Raised):
            return item  # an error upstream, not in fn: re-raised by Map.next as it is
        try:
            if into is not None:
                return self.fn(item, **self._randomness(pos, item), into=into, **self.args)
            if self.wants_rng or self.wants_generator:
                return self.fn(item, **self._randomness(pos, item), **self.args)
            return self.fn(item, **self.args)
        except Exception as exc:  # carried to the caller, re-raised or counted there
            return _Failed(exc, sample=sample_id(item))


class _Slotted:
    """With slabs: gives each (position, item) its slot in the caller's thread (``prepare``);
    in a worker thread, runs ``call`` with an ``into`` for that slot."""

    __slots__ = ("call", "slabs", "skipped")

    def __init__(self, call: _Call, slabs: Slabs):
        self.call = call
        self.slabs = slabs
        self.skipped = 0  # the map's count of items skipped this epoch, kept up to date by it

    def prepare(self, pair: tuple[int, Any]) -> tuple[tuple[int, Any], Any, int]:
        # where the item lands in the output if none of the items in flight before it is skipped
        slab, row = self.slabs.assign(pair[0] - self.skipped)
        return pair, slab, row

    def __call__(self, job: tuple[tuple[int, Any], Any, int]) -> Any:
        pair, slab, row = job
        return self.call(pair, self.slabs.into(slab, row))


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

    Example:
        >>> from torchdata.nodes import IterableWrapper
        >>> list(Map(IterableWrapper([1, 2]), fn=lambda x: x * 10))
        [10, 20]
    """

    SOURCE_KEY = "source"
    SKIP_KEY = "skip"
    SKIPPED_KEY = "skipped"

    def __init__(self, source: BaseNode, *, fn: Callable, args: dict[str, Any] | None = None,
                 workers: int = 0, method: str = "thread", on_error: str = "raise", seed: int = 0,
                 rank: int = 0, where: str | None = None, mp_context: str | None = None,
                 max_concurrent: int | None = None, snapshot_every: int = 16, ordered: bool = True,
                 slab: int = 0):
        super().__init__()
        if not isinstance(workers, int) or workers < 0:
            raise ValueError(f"{workers=} must be an int >= 0")
        if method not in METHODS:
            raise ValueError(f"{method=} must be one of {METHODS}")
        if on_error not in ON_ERROR:
            raise ValueError(f"{on_error=} must be one of {ON_ERROR}")
        self.source = _Enumerate(CarryErrors(source))
        self.call = _Call(fn, args or {}, seed, rank)
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
        self.skipped = 0
        self.ledger = SkipLedger()
        self._pm: ParallelMapper | None = None  # processes, or threads unordered
        self._retired: list[Any] = []  # worker processes of earlier epochs, maybe still exiting
        self._lingering: list[threading.Thread] = []  # ParallelMapper threads still busy at its stop
        self._pool: OrderedThreads | None = None  # threads, in order: persists across epochs
        if workers and method == "process":
            register_after_fork(self.call, _Call.watch_parent)  # under fork nothing is unpickled
        self._slotted: _Slotted | None = None
        if workers and method == "thread" and ordered:
            run: Callable[[Any], Any] = self.call
            if slab and self.call.wants_into:
                run = self._slotted = _Slotted(self.call, Slabs(slab))
            self._pool = OrderedThreads(self.source, run, workers=workers, window=self.window,
                                        snapshot_every=snapshot_every, where=self.where,
                                        prepare=None if self._slotted is None else self._slotted.prepare)

    def set_epoch(self, epoch: int) -> None:
        self.call.epoch = epoch

    def stats(self) -> dict[str, int]:
        return {"skipped": self.skipped}

    def _processes(self) -> list[Any]:
        """The worker processes of the running ParallelMapper (none for threads)."""
        it = getattr(getattr(self._pm, "_it", None), "_it", None)
        return list(getattr(it, "_workers", [])) if self.method == "process" else []

    def _stop_pm(self) -> None:
        if self._pm is not None:
            procs = self._processes()
            self._lingering = [t for t in self._lingering if t.is_alive()]
            self._lingering += shutdown_torchdata(self._pm)  # asks workers to stop; joins each 0.5 s
            self._pm = None
            # those still finishing their items are ended at close() if they have not left by then
            self._retired = [p for p in self._retired + procs if p.is_alive()]

    def close(self) -> None:
        self._stop_pm()
        if self._retired:  # a stopped worker is killed at once, any other after CLOSE_WAIT s
            end_processes([(f"{self.where}: worker process", p) for p in self._retired], wait=CLOSE_WAIT)
            self._retired = []
        if self._pool is not None:
            self._pool.close()

    def lingering(self) -> list[threading.Thread]:
        """ParallelMapper threads asked to stop and still busy (the loader joins them)."""
        self._lingering = [t for t in self._lingering if t.is_alive()]
        return list(self._lingering)

    def waiting_on(self) -> str | None:
        """What this node's workers are doing, in words (for the loader's watchdog)."""
        if self._pool is not None:
            busy = self._pool.running()
            return f"{busy} item(s) inside fn on its {self.workers} threads" if busy else None
        procs = self._processes()
        if procs:
            return "its worker processes: " + "; ".join(describe(p) for p in procs)
        return None

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self._stop_pm()  # (the ordered-threads pool stays: its threads outlive epochs)
        pm_state = None
        self.skipped = 0 if initial_state is None else initial_state.get(self.SKIPPED_KEY, 0)
        if initial_state is not None:
            self.ledger.load(initial_state.get(LEDGER_KEY))
        inline = self.workers == 0 or self._pool is not None  # the input is read in this thread
        if initial_state is None:
            if inline:
                self.source.reset()
        else:
            src, skip = initial_state[self.SOURCE_KEY], initial_state[self.SKIP_KEY]
            if inline or skip:
                self.source.reset(src)
                for _ in range(skip):
                    next(self.source)  # emitted before the save: re-read, not re-mapped
                src = self.source.state_dict()
            pm_state = {ParallelMapper.IT_STATE_KEY: {"snapshot": src, "steps_since_snapshot": 0}}
        if self._pool is not None:
            if self._slotted is not None:
                self._slotted.slabs.restart()
                self._slotted.skipped = self.skipped
            self._pool.start()
            return
        if self.workers == 0:
            return
        if self.method == "process":
            self.call.parent = (os.getpid(), threading.current_thread() is threading.main_thread())
        self._pm = ParallelMapper(
            self.source, self.call, num_workers=self.workers, in_order=self.ordered, method=self.method,
            multiprocessing_context=self.mp_context, max_concurrent=self.max_concurrent,
            snapshot_frequency=self.snapshot_every)
        self._pm.reset(pm_state)

    def next(self):
        while True:
            if self._pool is not None:
                out = next(self._pool)
            elif self._pm is not None:
                out = next(self._pm)
            else:
                out = self.call(next(self.source))
            if isinstance(out, Raised):
                raise out.exc
            if not isinstance(out, _Failed):
                return out
            self._fail(out)

    def _fail(self, failed: _Failed) -> None:
        # a source that cannot be read at all (a missing bucket, denied access, a server out of
        # reach: SourceError, as conveyor.storage raises it) is no bad item: never skipped
        if self.on_error == "raise" or failed.kind == "SourceError":
            exc = failed.exc if failed.exc is not None else RuntimeError(failed.text)
            exc.add_note(f"in {self.where}")
            raise exc
        self.skipped += 1
        if self._slotted is not None:
            self._slotted.skipped = self.skipped
        self.ledger.add(failed.sample, failed.kind, failed.message)
        log_skip(log, self.skipped, f"{self.where}: skipped an item ({failed.text})")

    def get_state(self) -> dict:
        if self._pool is not None:
            src, skip = self._pool.position()
            return {self.SOURCE_KEY: src, self.SKIP_KEY: skip, self.SKIPPED_KEY: self.skipped,
                    LEDGER_KEY: self.ledger.state()}
        if self._pm is None:
            return {self.SOURCE_KEY: self.source.state_dict(), self.SKIP_KEY: 0,
                    self.SKIPPED_KEY: self.skipped, LEDGER_KEY: self.ledger.state()}
        it_state = self._pm.state_dict()[ParallelMapper.IT_STATE_KEY]
        return {self.SOURCE_KEY: it_state["snapshot"], self.SKIP_KEY: it_state["steps_since_snapshot"],
                self.SKIPPED_KEY: self.skipped, LEDGER_KEY: self.ledger.state()}

    @staticmethod
    def elastic_input(cursor: Cursor) -> Cursor:
        """Consumed input items (elastic resume): the snapshot plus the items emitted after it
        (counted in input items, so an item skipped on error counts as consumed)."""
        if cursor.state is None:
            return cursor
        enum = cursor.state[Map.SOURCE_KEY]
        src = None if enum is None else enum[_Enumerate.SOURCE_KEY]
        return Cursor(src, cursor.state[Map.SKIP_KEY] + cursor.more, cursor.extra)

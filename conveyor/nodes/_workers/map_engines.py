"""The engines a map runs its ``Call`` on: inline, ordered threads, or worker processes.

Every engine reads the map's input (an ``Enumerate`` over ``CarryErrors``) and gives the
call's outputs in input order (``Failed`` and ``Raised`` values among them: the map decides).
They share one interface, so ``Map`` never asks which one it has:

- ``start(state)``: begin an epoch at its start (``None``) or at a saved position
  ``{"source": <the input's state>, "skip": <items after it already emitted>}``; the skipped
  items are re-read, not mapped.
- ``next()``: the next output (``StopIteration`` at the end).
- ``position()``: ``(the input's state at a snapshot, items emitted after it)``, the map's
  state whatever the engine, so any engine resumes any other's.
- ``close()``, ``waiting_on()`` (the watchdog), ``worker_pids()``, ``lingering()`` (threads still busy after a
  stop), ``probe()`` (the queue the instrumentation samples, or None).

``InlineEngine`` calls in the caller's thread. ``ThreadEngine`` runs ``OrderedThreads``
(``ordered_threads``), whose threads live as long as the map. ``ProcessEngine`` runs
torchdata's ``ParallelMapper``, made anew each epoch: worker processes, and also threads with
``ordered=False`` (results as they finish), the one case for its out-of-order yield.
"""

from __future__ import annotations

import os
import threading
import time
from multiprocessing.util import register_after_fork
from typing import Any, Callable

from torchdata.nodes import BaseNode, ParallelMapper

from conveyor.errors import WorkerError
from conveyor.nodes._workers.child_processes import DeathWatch, describe, end_processes
from conveyor.nodes._workers.map_calls import Call
from conveyor.nodes._workers.ordered_threads import OrderedThreads
from conveyor.nodes._workers.torchdata_threads import shutdown_torchdata

CLOSE_WAIT = 10.0  # seconds close() gives worker processes to leave (a stopped one: none)
DEATH_WAIT = 1.0   # the same, after one of them died
SOURCE_KEY, SKIP_KEY = "source", "skip"  # a saved position, as Map's state holds it


def _position_input(source: BaseNode, state: dict | None) -> None:
    """Reset ``source`` to ``state``'s position in this thread, re-reading the items after the
    snapshot that were emitted before the save (not mapped again)."""
    if state is None:
        source.reset()
        return
    source.reset(state[SOURCE_KEY])
    for _ in range(state[SKIP_KEY]):
        next(source)


class InlineEngine:
    """``call`` on each item in the caller's thread (``workers=0``)."""

    def __init__(self, source: BaseNode, call: Callable[[Any], Any]):
        self.source = source
        self.call = call

    def start(self, state: dict | None) -> None:
        _position_input(self.source, state)

    def next(self) -> Any:
        return self.call(next(self.source))

    def position(self) -> tuple[Any, int]:
        return self.source.state_dict(), 0

    def close(self) -> None:
        pass

    def waiting_on(self) -> str | None:
        return None

    def worker_pids(self) -> list[int]:
        return []  # threads cannot be killed alone: a thread that dies takes the process with it

    def lingering(self) -> list[threading.Thread]:
        return []

    def probe(self) -> tuple[Callable[[], int], int] | None:
        return None


class ThreadEngine:
    """``run`` on ``workers`` persistent threads, in input order (``OrderedThreads``).

    Args:
        source: the map's input, read in the caller's thread.
        run: what a thread runs per item (the ``Call``, or a ``Slotted`` around it).
        prepare: applied to each item in the caller's thread first (``Slotted.prepare``).
        slabs: the slabs ``prepare`` places items in, restarted with each epoch.
        workers, window, snapshot_every, where: see ``OrderedThreads``.
    """

    def __init__(self, source: BaseNode, run: Callable[[Any], Any], *, workers: int, window: int,
                 snapshot_every: int, where: str, prepare: Callable[[Any], Any] | None = None,
                 slabs: Any = None):
        self.source = source
        self.workers = workers
        self.slabs = slabs
        self.pool = OrderedThreads(source, run, workers=workers, window=window, snapshot_every=snapshot_every,
                                   where=where, prepare=prepare)
        self.next = self.pool.__next__  # (bound once: the map's per-item path)

    def start(self, state: dict | None) -> None:
        _position_input(self.source, state)  # (the threads stay: they outlive epochs)
        if self.slabs is not None:
            self.slabs.restart()
        self.pool.start()

    def position(self) -> tuple[Any, int]:
        return self.pool.position()

    def close(self) -> None:
        self.pool.close()

    def waiting_on(self) -> str | None:
        busy = self.pool.running()
        return f"{busy} item(s) inside fn on its {self.workers} threads" if busy else None

    def worker_pids(self) -> list[int]:
        return []  # threads cannot be killed alone: a thread that dies takes the process with it

    def lingering(self) -> list[threading.Thread]:
        return []

    def probe(self) -> tuple[Callable[[], int], int] | None:
        return self.pool.ready, int(self.pool.window)


class ProcessEngine:
    """``call`` in torchdata's ``ParallelMapper``: ``workers`` processes (``method="process"``),
    or threads yielding results as they finish (``method="thread"``, ``ordered=False``).

    A ``ParallelMapper`` is made for each epoch and stopped at the next ``start``; its worker
    processes still finishing an item are ended at ``close()`` if they have not left by then.
    A worker process that dies (the out-of-memory killer's SIGKILL) takes its item with it and
    torchdata would wait for that item for ever: a ``DeathWatch`` notices it, stops the
    ParallelMapper, and ``next()`` raises the ``WorkerError`` (the position stays that of the
    last item given, so a state taken before the error resumes exactly).
    """

    def __init__(self, source: BaseNode, call: Call, *, workers: int, method: str, ordered: bool,
                 mp_context: str | None, max_concurrent: int | None, snapshot_every: int, where: str,
                 timeout: float | None = None):
        self.timeout = timeout  # seconds next() may wait for a result (processes): then a WorkerError
        self._asked: float | None = None  # when the waiting next() asked (None: not waiting)
        self.source = source
        self.call = call
        self.workers = workers
        self.method = method
        self.ordered = ordered
        self.mp_context = mp_context
        self.max_concurrent = max_concurrent
        self.snapshot_every = snapshot_every
        self.where = where
        self.pm: ParallelMapper | None = None
        self._retired: list[Any] = []  # worker processes of earlier epochs, maybe still exiting
        self._lingering: list[threading.Thread] = []  # ParallelMapper threads still busy at its stop
        self._watch: DeathWatch | None = None
        if method == "process":
            register_after_fork(call, Call.watch_parent)  # under fork nothing is unpickled

    def processes(self) -> list[Any]:
        """The worker processes of the running ParallelMapper (none for threads)."""
        it = getattr(getattr(self.pm, "_it", None), "_it", None)  # torchdata keeps them this deep
        return list(getattr(it, "_workers", [])) if self.method == "process" else []

    def _stop(self) -> None:
        if self.pm is not None:
            procs = self.processes()
            self._lingering = [t for t in self._lingering if t.is_alive()]
            self._lingering += shutdown_torchdata(self.pm)  # asks workers to stop; joins each 0.5 s
            self.pm = None
            died, self._watch = self._watch is not None and self._watch.error is not None, None
            if died:  # a survivor may wait for ever on a queue lock the dead one held: end them now
                end_processes([(f"{self.where}: worker process", p) for p in procs], wait=DEATH_WAIT)
            self._retired = [p for p in self._retired + procs if p.is_alive()]

    def start(self, state: dict | None) -> None:
        self._stop()  # before the input is touched: its threads read it
        for thread in self._lingering:  # a reader still inside the input's next() leaves after that
            thread.join()               # item: resetting the input under it had two threads in it
        self._lingering = []
        pm_state = None
        if state is not None:
            src = state[SOURCE_KEY]
            if state[SKIP_KEY]:
                _position_input(self.source, state)
                src = self.source.state_dict()
            pm_state = {ParallelMapper.IT_STATE_KEY: {"snapshot": src, "steps_since_snapshot": 0}}
        if self.method == "process":
            self.call.parent = (os.getpid(), threading.current_thread() is threading.main_thread())
        self.pm = ParallelMapper(
            self.source, self.call, num_workers=self.workers, in_order=self.ordered, method=self.method,
            multiprocessing_context=self.mp_context, max_concurrent=self.max_concurrent,
            snapshot_frequency=self.snapshot_every)
        self.pm.reset(pm_state)
        if self.method == "process":
            it = self.pm._it._it  # type: ignore[union-attr]  # torchdata keeps its iterator this deep
            mp_stop, stop = it._mp_stop, it._stop  # (not the iterator: a forked worker would inherit it)

            def wake() -> None:  # the workers leave; next() ends its wait within 0.1 s
                mp_stop.set()
                stop.set()

            self._watch = DeathWatch(it._workers, where=self.where, stopping=mp_stop.is_set, wake=wake,
                                     stalled=self._stalled if self.timeout is not None else None)

    def _stalled(self) -> WorkerError | None:
        """The error for a result awaited past ``timeout`` seconds (the DeathWatch asks)."""
        asked = self._asked
        if asked is None or time.monotonic() - asked < self.timeout:  # type: ignore[operator]
            return None
        procs = "; ".join(describe(p) for p in self.processes()) or "none running"
        return WorkerError(f"{self.where}: no result from its worker processes for {self.timeout:g} s (timeout): "
                           f"a fn stuck, or one item slower than that (raise timeout for such items); its "
                           f"workers: {procs}. The loader's state from before is intact: a new loader "
                           "resumes from it", node=self.where)

    def next(self) -> Any:
        if self.timeout is not None:
            self._asked = time.monotonic()
        try:
            return next(self.pm)
        except StopIteration:
            if self._watch is not None and self._watch.error is not None:
                raise self._watch.error from None
            raise
        finally:
            self._asked = None

    def worker_pids(self) -> list[int]:
        """The pids of the running worker processes (none for threads)."""
        return [p.pid for p in self.processes() if p.pid is not None]

    def position(self) -> tuple[Any, int]:
        if self.pm is None:
            return self.source.state_dict(), 0
        it_state = self.pm.state_dict()[ParallelMapper.IT_STATE_KEY]
        return it_state["snapshot"], it_state["steps_since_snapshot"]

    def close(self) -> None:
        self._stop()
        if self._retired:  # a stopped worker is killed at once, any other after CLOSE_WAIT s
            end_processes([(f"{self.where}: worker process", p) for p in self._retired], wait=CLOSE_WAIT)
            self._retired = []

    def waiting_on(self) -> str | None:
        procs = self.processes()
        return "its worker processes: " + "; ".join(describe(p) for p in procs) if procs else None

    def lingering(self) -> list[threading.Thread]:
        self._lingering = [t for t in self._lingering if t.is_alive()]
        return list(self._lingering)

    def probe(self) -> tuple[Callable[[], int], int] | None:
        try:
            it = self.pm._it._it  # type: ignore[union-attr]  # torchdata keeps its queue this deep
            return it._out_q.qsize, int(it._max_tasks)
        except (AttributeError, TypeError):  # not started, or another torchdata
            return None

"""copies: run the same sub-graph in N worker processes (or threads) and merge round-robin.

Per-item Python work (parsing, tokenising) does not speed up with threads under the GIL.
``WorkerCopies`` builds one copy of a sub-graph in each of N workers — copy ``w`` built by
``factory(w)``, which gives its ``shard`` the slot ``rank * N + w`` of ``world * N`` — and
merges their outputs in a fixed round-robin order: copy 0, 1, ..., N-1, 0, 1, ...; a copy
that is exhausted drops out of the turn. For a given N the order is deterministic; when the
copied part maps items one to one, it is the order of N = 1.

The workers persist across epochs: each epoch the node sends every worker the epoch and the
state to start from, except when the next epoch simply follows a whole one: then the workers
have already gone on into it (``run_ahead``), so no copy idles while the main process drains
the end of an epoch. What a worker does (``_workers/copy_worker.py``): it sends its items in
chunks (a per-item hand-off between processes costs more than cheap items), each chunk with
its copy's state before its first item; a worker process writes its own pipe, packs small
tensors into one buffer per chunk and lends big ones through shared-memory slots it reuses once
nothing here refers to them. The node's state is, per copy, that chunk state and
how many of its items were taken, plus the turn and which copies are done. A restore sends
each copy its own state (the copy re-runs the few items taken from the chunk and drops them),
so nothing in flight is lost or repeated.
Workers start under ``spawn`` by default (safe with the threads a loader runs); ``factory``
must then be picklable. Where the main module cannot be imported again (``python -`` reads it
from stdin) they run in threads instead, with a warning (``child_processes.threads_instead``).
Errors in a worker come back as the original exception when it can be pickled, else as a
``RuntimeError`` that starts with the node, the type and the message, then the traceback; a
worker process that dies (the out-of-memory killer's SIGKILL) is a ``WorkerError`` naming
its pid and signal within ``POLL`` seconds, not a hang, and the state before it resumes.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import queue
import threading
import time
from typing import Any, Callable

from torchdata.nodes import BaseNode

from conveyor.errors import WorkerError
from conveyor.nodes._elastic import Cursor, compact
from conveyor.nodes._skips import LEDGER_KEY, ledgers
from conveyor.nodes._workers.child_processes import check_timeout, describe, died, end_processes, threads_instead
from conveyor.nodes._workers.chunk_packing import unpack
from conveyor.nodes._workers.copy_worker import BASE_KEY, END, ERR, ITEMS, POLL, SKIP_KEY, run_worker
from conveyor.nodes._workers.shared_slots import MAX_SLOTS, Borrower, available
from conveyor.nodes._workers.torchdata_threads import Untravelled
from conveyor.nodes._workers.worker_pipe import make_pipe
from conveyor.nodes.state_shape import Bool, Fields, Int, ListOf, Null, Plain

log = logging.getLogger(__name__)

METHODS = ("process", "thread", "ray")
CLOSE_WAIT = 10.0  # seconds close() gives workers to leave on their own (a stopped one: none)


class WorkerCopies(BaseNode):
    """Merge N copies of a sub-graph, each running in its own worker, round-robin.

    Args:
        factory: ``factory(w) -> (root, nodes)`` builds copy ``w``; ``nodes`` maps names to the
            copy's nodes (for epochs and stats). Picklable for ``method="process"``.
        copies: N >= 1.
        method: ``"process"``, ``"thread"`` or ``"ray"`` (Ray actors, ``_workers/ray_actors``).
        mp_context: start method for processes (default ``spawn``).
        depth: chunks each worker may have ready ahead of the merge (a chunk ends at
            ``chunk`` items, 4 MiB of tensors or ``max_wait`` seconds, whichever comes first).
        pipe_bytes: kernel buffer of each worker process's pipe: what it may have ready ahead
            of the merge besides the chunk it is writing (Linux only; capped by
            /proc/sys/fs/pipe-max-size). 256 KiB holds a few chunks of token ids; more only
            lets one copy run further ahead of the others while the merge waits on them.
        run_ahead: a worker that ended an epoch goes on into the next from its start, unasked
            (taken when the next ``reset`` asks for exactly that; dropped otherwise).
        chunk: most items per hand-off from a worker (fewer if ``max_wait`` seconds pass
            first): each hand-off costs the main process a wake-up and the worker its cache,
            so cheap items travel in big chunks. An epoch starts with chunks of 8, doubling.
        max_wait: seconds a worker gathers a chunk before sending what it has.
        start_timeout: seconds to wait for a worker to build its copy and start an epoch.
        timeout: seconds the merge waits for a worker's next chunk before a ``WorkerError``
            naming it (a worker alive but silent: stuck in a fn, a read that never returns, a
            stopped process), as ``DataLoader``'s ``timeout``; ``None`` (default): no limit
            (the loader's watchdog names the copy it waits for, and warns again).
        where: the copied part in words, for errors (``the worker copies up to node 'parse'``).
        address: with ``method="ray"``, the Ray cluster to run the copies on (default
            ``RAY_ADDRESS``, else a local one started here).

    Example:
        >>> # see conveyor/graphs/compile.py, which builds the factory from a spec
    """

    COPIES_KEY = "copies"
    NEXT_KEY = "next"
    DONE_KEY = "done"
    # a copy's graph is built in its worker: its base state is checked there, not here
    STATE_SHAPE = Fields({COPIES_KEY: ListOf(Fields({BASE_KEY: Null(Plain(dict)), SKIP_KEY: Int()}), length="copies"),
                          NEXT_KEY: Int(under="copies"), DONE_KEY: ListOf(Bool(), length="copies")})

    def __init__(self, factory: Callable[[int], tuple[BaseNode, dict[str, Any]]], *, copies: int,
                 method: str = "process", mp_context: str | None = "spawn", depth: int = 8,
                 pipe_bytes: int = 1 << 18, run_ahead: bool = True,
                 chunk: int = 256, max_wait: float = 0.05, start_timeout: float = 300.0,
                 where: str = "worker copies", address: str | None = None, timeout: float | None = None):
        super().__init__()
        self.where = where
        check_timeout(timeout)
        self.timeout = timeout
        if not isinstance(copies, int) or copies < 1:
            raise ValueError(f"{copies=} must be an int >= 1")
        if method not in METHODS:
            raise ValueError(f"{method=} must be one of {METHODS}")
        self.factory = factory
        self.copies = copies
        self.mp_context = mp_context or "spawn"
        if method == "process" and threads_instead(self.mp_context, f"{copies} worker copies"):
            method = "thread"
        self.method = method
        self.depth = depth
        self.pipe_bytes = pipe_bytes
        self.run_ahead = run_ahead
        self.chunk = chunk
        self.max_wait = max_wait
        self.start_timeout = start_timeout
        self.address = address
        self.epoch = 0
        self._workers: list[Any] = []
        self._credits: list[Any] = []
        self._borrowers: list[Borrower | None] = []  # per worker process: the slots it lends
        self._cmd: list[Any] = []
        self._out: list[Any] = []
        self._stop: Any = None
        self._gen = 0
        self._key: tuple[int, int] | None = None  # (generation, epoch) of the messages wanted
        self._base: list[Any] = []  # per copy: its state before the current chunk
        self._chunk: list[list] = []  # per copy: the current chunk's items
        self._taken: list[int] = []  # per copy: how many of them were taken
        self._done: list[bool] = []
        self._next = 0
        self._stats: list[dict] = [{} for _ in range(copies)]
        self._ledgers: list[dict[str, dict]] = [{} for _ in range(copies)]  # per copy: node -> ledger
        self.startup_seconds: float | None = None
        self.epochs_run_ahead = 0  # epochs the workers began before they were asked
        self.waiting_for: int | None = None  # the copy whose message next() waits for now
        self.received = 0  # messages taken from the workers (the watchdog sees them move)
        self._deal: dict | None = None  # set_deal: sent with the next start

    # ----- workers ------------------------------------------------------------------------
    def _launch(self) -> None:
        t0 = time.perf_counter()
        if self.method == "ray":  # actors stand for the workers, their queues and their credits
            from conveyor.nodes._workers.ray_actors import launch

            actors = launch(self.factory, self.copies, address=self.address, depth=self.depth,
                            chunk=self.chunk, max_wait=self.max_wait, run_ahead=self.run_ahead)
            self._stop = threading.Event()
            self._workers, self._cmd, self._out = list(actors), list(actors), list(actors)
            self._credits, self._borrowers = [None] * self.copies, [None] * self.copies
            self._t_launch = t0
            return
        if self.method == "process":
            ctx = mp.get_context(self.mp_context)
            self._stop = ctx.Event()
            make_q, make_worker = ctx.Queue, ctx.Process
        else:
            self._stop = threading.Event()
            make_q, make_worker = queue.Queue, threading.Thread
        by_value = self.method == "process"
        parent = (os.getpid(), threading.current_thread() is threading.main_thread()) if by_value else None
        for w in range(self.copies):
            cmd_q = make_q()
            credits = flags = None
            if by_value:
                out_q, child_end = make_pipe(ctx, self.pipe_bytes)
                credits = ctx.Semaphore(self.depth)  # chunks in flight, released as taken
                if available():
                    flags = ctx.Array("b", MAX_SLOTS)  # 1: a slot lent to this process (shared_slots)
            else:
                out_q = child_end = make_q(maxsize=self.depth)
            self._credits.append(credits)
            self._borrowers.append(None if flags is None else Borrower(flags))
            worker = make_worker(target=run_worker, args=(self.factory, w, cmd_q, child_end, self._stop,
                                                            self.chunk, self.max_wait, by_value,
                                                            self.run_ahead, credits, parent, flags,
                                                            self.depth),
                                 daemon=True, name=f"conveyor-copy-{w}")
            worker.start()
            if by_value:
                child_end.close()  # the worker holds its own copy now
            self._workers.append(worker)
            self._cmd.append(cmd_q)
            self._out.append(out_q)
        self._t_launch = t0

    def _get(self, w: int, timeout: float | None = None, stall: bool = False) -> tuple:
        """The next message of worker ``w`` for the current (generation, epoch), within
        ``timeout`` seconds where given (``stall``: a chunk in an epoch, ``WorkerError`` past it)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self.waiting_for = w
        try:
            while True:
                try:
                    msg = self._out[w].get(timeout=POLL)
                except (queue.Empty, EOFError, OSError) as gone:
                    broken = not isinstance(gone, queue.Empty)
                    if broken:  # its pipe closed, maybe half-way through a message: it is exiting
                        self._workers[w].join(timeout=5)
                    if not self._workers[w].is_alive():  # killed (the OOM killer), or crashed
                        raise self._died(w) from None
                    if broken:
                        raise RuntimeError(f"worker copy {w}: its pipe broke ({gone})") from gone
                    if deadline is not None and time.monotonic() > deadline:
                        if stall:
                            raise self._stalled(w, timeout) from None
                        raise TimeoutError(f"worker copy {w} did not start within {timeout:.0f} s")
                    continue
                if msg[1] == ITEMS and self._credits[w] is not None:
                    self._credits[w].release()  # taken (or dropped, if stale): the worker may send another
                if msg[0] == -1 and msg[1] == ERR:
                    self._raise(w, msg[2])
                if msg[0] == self._key:
                    self.received += 1
                    return msg
                if msg[1] == ITEMS and self._borrowers[w] is not None:
                    try:
                        self._unpack(w, msg[2])  # stale: unpacked only so that its slots come back
                    except (OSError, EOFError):
                        pass  # its sender is gone: the next message (or its absence) says so
        finally:
            self.waiting_for = None

    def _stalled(self, w: int, seconds: float) -> Exception:
        """The error for worker ``w`` alive and silent for ``seconds`` (``timeout``)."""
        worker = self._workers[w]
        how = describe(worker) if self.method == "process" else self.method
        pid = getattr(worker, "pid", None) if self.method == "process" else None
        return WorkerError(f"{self.where}: worker copy {w} ({how}) sent nothing for {seconds:g} s (workers: "
                           "timeout): stuck in a fn or a read, or one item takes longer than that; raise "
                           "timeout for such items. The loader's state from before is intact: a new loader "
                           "resumes from it", node=self.where, pid=pid)

    def _died(self, w: int, more: str = "") -> Exception:
        """The error for worker ``w`` gone: a ``WorkerError`` naming its pid and signal (a
        thread that ended: a ``RuntimeError``, threads die only with an error they send)."""
        worker = self._workers[w]
        if self.method != "process":
            return RuntimeError(f"{self.where}: worker copy {w} (a thread) ended without a word{more}")
        err = died(worker, self.where, f"worker copy {w}")
        if more:
            err.args = (str(err) + more,)
        return err

    def _raise(self, w: int, exc: BaseException) -> None:
        """Raise an error a worker sent; one that could not travel names the copy if it names no node."""
        raise exc.at(f"{self.where}: worker copy {w}") if isinstance(exc, Untravelled) else exc

    def worker_pids(self) -> list[int]:
        """The pids of the worker processes (none with threads)."""
        return [p.pid for p in self._workers if self.method == "process" and p.pid is not None]

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def set_deal(self, deal: dict | None) -> None:
        """Pass an elastic deal (see ``shard``) to the copies with the next epoch's start."""
        self._deal = deal

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        if not self._workers:
            self._launch()
        deal, self._deal = self._deal, None
        if initial_state is not None or (deal is not None and deal["epoch"] != self.epoch):
            deal = None
        ran_ahead = (self.run_ahead and initial_state is None and self._key is not None
                     and all(self._done) and self.epoch == self._key[1] + 1 and deal is None)
        if ran_ahead:  # the workers went on into this epoch when they ended the last one
            self._key = (self._key[0], self.epoch)
            self.epochs_run_ahead += 1
        else:
            self._gen += 1
            self._key = (self._gen, self.epoch)
        if initial_state is not None:
            states = list(initial_state[self.COPIES_KEY])
            self._next = initial_state[self.NEXT_KEY]
            self._done = list(initial_state[self.DONE_KEY])
        else:
            states = [None] * self.copies
            self._next = 0
            self._done = [False] * self.copies
        if not ran_ahead:
            for w in range(self.copies):
                self._cmd[w].put(("start", self._gen, self.epoch, states[w], deal))
        self._base, self._chunk, self._taken = [], [[] for _ in range(self.copies)], [0] * self.copies
        for w in range(self.copies):
            msg = self._get(w, timeout=self.start_timeout)
            if msg[1] == ERR:
                self._raise(w, msg[2])
            self._base.append(msg[2])
            self._ledgers[w] = {ledger["node"]: ledger for ledger in ledgers(msg[2])}
        if self.startup_seconds is None:
            self.startup_seconds = time.perf_counter() - self._t_launch

    def _advance(self, w: int) -> None:
        for step in range(1, self.copies + 1):
            nxt = (w + step) % self.copies
            if not self._done[nxt]:
                self._next = nxt
                return
        self._next = 0

    def _refill(self, w: int) -> bool:
        """Take copy ``w``'s next chunk; False when the copy has ended."""
        msg = self._get(w, self.timeout, stall=True)
        kind = msg[1]
        if kind == ERR:
            self._raise(w, msg[2])
        if kind == END:
            self._done[w] = True
            self._base[w], self._chunk[w], self._taken[w] = msg[2], [], 0
            self._take_stats(w, msg[3])
            return False
        _, _, payload, base, stats = msg
        self._base[w], self._taken[w] = base, 0
        try:
            self._chunk[w] = self._unpack(w, payload) if isinstance(payload, tuple) else payload
        except (OSError, EOFError) as exc:  # a shared-memory tensor whose sender is gone
            self._workers[w].join(timeout=5)
            if not self._workers[w].is_alive():
                raise self._died(w, f" (while handing over a chunk: {exc})") from None
            raise RuntimeError(f"{self.where}: worker copy {w} is unreachable (while handing over a chunk: "
                               f"{exc})") from None
        self._take_stats(w, stats)
        return True

    def _take_stats(self, w: int, stats: dict | None) -> None:
        """Copy ``w``'s counters as of its last message, and the ledgers it sent with them."""
        if not stats:
            return
        for name, entry in stats.items():
            ledger = entry.pop(LEDGER_KEY, None)
            if ledger is not None:
                self._ledgers[w][name] = ledger
        self._stats[w] = stats

    def copy_ledgers(self) -> list[dict]:
        """The skip ledgers of the copied nodes, each copy's as of its last message (the state's
        are as of the start of the chunk being taken, a whole epoch behind at an epoch's end)."""
        return [ledger for per_copy in self._ledgers for ledger in per_copy.values()]

    def _unpack(self, w: int, payload: tuple) -> list:
        borrower = self._borrowers[w]
        if borrower is not None:
            borrower.release()  # the slots of batches the trainer has let go: the worker may reuse them
        return unpack(payload, borrower)

    def next(self):
        w = self._next
        taken = self._taken[w]
        chunk = self._chunk[w]
        if taken < len(chunk) and not any(self._done):  # the common case, kept short
            self._taken[w] = taken + 1
            self._next = w + 1 if w + 1 < self.copies else 0
            return chunk[taken]
        while not all(self._done):
            w = self._next
            if self._done[w] or (self._taken[w] == len(self._chunk[w]) and not self._refill(w)):
                self._advance(w)
                continue
            item = self._chunk[w][self._taken[w]]
            self._taken[w] += 1
            self._advance(w)
            return item
        raise StopIteration

    def waiting_on(self) -> str | None:
        """What ``next()`` waits for now, in words (for the loader's watchdog), or None."""
        w = self.waiting_for
        if w is None or w >= len(self._workers):
            return None
        worker = self._workers[w]
        how = describe(worker) if self.method == "process" else ("alive" if worker.is_alive() else "ended")
        return f"waits for worker copy {w} ({self.method}, {how})"

    def ready(self) -> int:
        """Items received from the workers and not yet taken (in pipes: not counted)."""
        return sum(len(c) - t for c, t in zip(self._chunk, self._taken))

    def get_state(self) -> dict:
        states = [{BASE_KEY: base, SKIP_KEY: taken} for base, taken in zip(self._base, self._taken)]
        return {self.COPIES_KEY: states, self.NEXT_KEY: self._next, self.DONE_KEY: list(self._done)}

    @staticmethod
    def elastic_split(cursor: Cursor, copies: int) -> list[Cursor]:
        """Per copy, what was consumed of it (elastic resume), from what was consumed of the
        merge: each copy's chunk state and the items taken from it, then the outputs after the
        merge's state dealt round-robin from the copy whose turn it was (a copy that ends
        within those few outputs is not foreseen)."""
        state = cursor.state
        if state is None:
            bases, skips, turn, done = [None] * copies, [0] * copies, 0, [False] * copies
        else:
            bases = [c[BASE_KEY] for c in state[WorkerCopies.COPIES_KEY]]
            skips = [c[SKIP_KEY] for c in state[WorkerCopies.COPIES_KEY]]
            turn, done = state[WorkerCopies.NEXT_KEY], state[WorkerCopies.DONE_KEY]
        order = [(turn + i) % copies for i in range(copies) if not done[(turn + i) % copies]]
        after: list[list[int]] = [[] for _ in range(copies)]
        outs = list(range(cursor.more)) + [cursor.more + e for e in cursor.extra]
        if outs and not order:
            raise ValueError("outputs consumed after every worker copy had ended")
        for o in outs:
            after[order[o % len(order)]].append(o // len(order))
        cursors = []
        for w in range(copies):
            more, extra = compact(after[w], skips[w])
            cursors.append(Cursor(bases[w], more, extra))
        return cursors

    def copy_stats(self) -> dict[str, dict]:
        """Per copied node: counters summed over the copies (as of their last report)."""
        total: dict[str, dict] = {}
        for per_copy in self._stats:
            for name, entry in per_copy.items():
                agg = total.setdefault(name, {})
                for k, v in entry.items():
                    if isinstance(v, (int, float)) and not isinstance(v, bool):
                        agg[k] = agg.get(k, 0) + v
                    else:
                        agg.setdefault(k, v)
        return total

    def stats(self) -> dict:
        out = {"copies": self.copies, "method": self.method,
               "startup_seconds": round(self.startup_seconds or 0.0, 3),
               "epochs_run_ahead": self.epochs_run_ahead}
        if self.method == "ray" and self._workers:
            out["object_store_bytes"] = sum(a.bytes_received for a in self._workers)
            out["object_store_chunks"] = sum(a.chunks_received for a in self._workers)
            out["shared_memory_bytes"] = sum(a.shared_bytes for a in self._workers)
            out["actor_restarts"] = sum(a.restarts for a in self._workers)
        return out

    def close(self) -> None:
        if not self._workers:
            return
        self._stop.set()
        for q in self._cmd:
            try:
                q.put(("stop",))
            except (OSError, ValueError):
                pass
        if self.method == "process":
            for out in self._out:
                out.close()  # a worker blocked writing to a full pipe now gets BrokenPipeError
        if self.method == "process":  # a stopped worker is killed at once, any other after a while
            end_processes([(f"worker copy {w}", p) for w, p in enumerate(self._workers)], wait=CLOSE_WAIT)
        else:
            deadline = time.monotonic() + CLOSE_WAIT
            for worker in self._workers:
                worker.join(timeout=max(0.0, deadline - time.monotonic()))
            stuck = [w for w, t in enumerate(self._workers) if t.is_alive()]
            if stuck:
                log.warning("closing: worker copies %s (threads) are still busy %.0f s after they were "
                            "asked to stop; abandoned (daemon threads: they do not hold up the exit)",
                            stuck, CLOSE_WAIT)
        if self.method == "process":
            for q in self._cmd:
                q.close()
                q.cancel_join_thread()
        self._workers, self._cmd, self._out, self._credits, self._borrowers = [], [], [], [], []

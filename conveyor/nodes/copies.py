"""copies: run the same sub-graph in N worker processes (or threads) and merge round-robin.

Per-item Python work (parsing, tokenising) does not speed up with threads under the GIL.
``WorkerCopies`` builds one copy of a sub-graph in each of N workers — copy ``w`` built by
``factory(w)``, which gives its ``shard`` the slot ``rank * N + w`` of ``world * N`` — and
merges their outputs in a fixed round-robin order: copy 0, 1, ..., N-1, 0, 1, ...; a copy
that is exhausted drops out of the turn. For a given N the order is deterministic; when the
copied part maps items one to one, it is the order of N = 1.

The workers persist across epochs: each epoch the node sends every worker the epoch and the
state to start from. Items come back in chunks (a per-item hand-off between processes costs
more than cheap items), each chunk with its copy's state before its first item; the node's
state is, per copy, that chunk state and how many of its items were taken, plus the turn and
which copies are done. A restore sends each copy its own state (the copy re-runs the few
items taken from the chunk and drops them), so nothing in flight is lost or repeated.
Workers start under ``spawn`` by default (safe with the threads a loader runs); ``factory``
must then be picklable. Errors in a worker come back as the original exception when it can be
pickled, else as a ``RuntimeError`` with its text; a worker that dies is an error, not a hang.
"""

from __future__ import annotations

import collections
import io
import logging
import multiprocessing as mp
import pickle
import queue
import threading
import time
import traceback
from typing import Any, Callable

from torchdata.nodes import BaseNode

log = logging.getLogger(__name__)

METHODS = ("process", "thread")
_START, _ITEMS, _END, _ERR = "start", "items", "end", "err"
_POLL = 0.1
BASE_KEY, SKIP_KEY = "base", "skip"


def _stats_of(nodes: dict[str, Any]) -> dict[str, dict]:
    out = {}
    for name, node in nodes.items():
        entry = {"items": getattr(node, "items", 0)}
        own = getattr(getattr(node, "inner", node), "stats", None)
        if callable(own):
            entry.update(own())
        out[name] = entry
    return out


def _tensor_from_numpy(array: Any) -> Any:
    import torch

    return torch.from_numpy(array)


class _ChunkPickler(pickle.Pickler):
    """Pickles CPU tensors through numpy: torch's own by-value pickling goes through
    ``torch.load`` for every tensor, ~10x slower for small ones."""

    def reducer_override(self, obj: Any) -> Any:
        import torch

        if isinstance(obj, torch.Tensor) and obj.device.type == "cpu" and not obj.requires_grad \
                and obj.dtype not in (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2) \
                and type(obj) is torch.Tensor:
            return _tensor_from_numpy, (obj.numpy(),)
        return NotImplemented


def _dumps(items: list) -> bytes:
    buf = io.BytesIO()
    _ChunkPickler(buf, protocol=5).dump(items)
    return buf.getvalue()


def _portable(exc: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError("".join(traceback.format_exception(exc)))


def _worker_loop(factory: Callable[[int], tuple[BaseNode, dict[str, Any]]], w: int,
                 cmd_q: Any, out_q: Any, stop: Any, chunk: int, max_wait: float, by_value: bool) -> None:
    """One worker: build the copy once, then run epochs as the commands ask.

    Items travel in chunks (at most ``chunk`` items, or what ``max_wait`` seconds gave), each
    with the copy's state before its first item; ``by_value`` pickles a chunk to bytes here,
    so tensors are copied once instead of each passing a file descriptor.
    """
    try:
        root, nodes = factory(w)
    except BaseException as exc:  # noqa: BLE001 - reported to the main process
        out_q.put((-1, _ERR, _portable(exc), None, None))
        return
    cmd = None
    while not stop.is_set():
        if cmd is None:
            try:
                cmd = cmd_q.get(timeout=_POLL)
            except queue.Empty:
                continue
        if cmd[0] == "stop":
            return
        _, gen, epoch, state = cmd
        cmd = None
        try:
            for node in nodes.values():
                if hasattr(node, "items"):
                    node.items = 0
                set_epoch = getattr(getattr(node, "inner", node), "set_epoch", None)
                if callable(set_epoch):
                    set_epoch(epoch)
            if state is None:
                root.reset(None)
            else:
                root.reset(state[BASE_KEY])
                for _ in range(state[SKIP_KEY]):
                    next(root)  # taken from the chunk before the save: recomputed, not sent
            msg: tuple = (gen, _START, root.state_dict(), None, None)
        except BaseException as exc:  # noqa: BLE001
            msg = (gen, _ERR, _portable(exc), None, None)
        while cmd is None and not stop.is_set():
            # hand the message over, but give way to a new command (a new epoch or a stop)
            try:
                out_q.put(msg, timeout=_POLL)
            except queue.Full:
                try:
                    cmd = cmd_q.get_nowait()
                except queue.Empty:
                    pass
                continue
            if msg[1] in (_END, _ERR):
                break
            base = root.state_dict()
            items: list = []
            deadline = time.monotonic() + max_wait
            try:
                while len(items) < chunk and (not items or time.monotonic() < deadline):
                    items.append(next(root))
                end = False
            except StopIteration:
                end = True
            except BaseException as exc:  # noqa: BLE001
                msg = (gen, _ERR, _portable(exc), None, None)
                if items:  # deliver what came before the error first
                    out_q.put((gen, _ITEMS, _dumps(items) if by_value else items, base, None))
                continue
            if items:
                payload = _dumps(items) if by_value else items
                msg = (gen, _ITEMS, payload, base, _stats_of(nodes))
                if end:  # send the items now, the end with the next round
                    out_q.put(msg)
            if end:
                msg = (gen, _END, root.state_dict(), _stats_of(nodes), None)
            try:
                cmd = cmd_q.get_nowait()
            except queue.Empty:
                pass


class WorkerCopies(BaseNode):
    """Merge N copies of a sub-graph, each running in its own worker, round-robin.

    Args:
        factory: ``factory(w) -> (root, nodes)`` builds copy ``w``; ``nodes`` maps names to the
            copy's nodes (for epochs and stats). Picklable for ``method="process"``.
        copies: N >= 1.
        method: ``"process"`` or ``"thread"``.
        mp_context: start method for processes (default ``spawn``).
        depth: chunks each worker may have ready ahead of the merge.
        chunk: items per hand-off from a worker (fewer if ``max_wait`` seconds pass first):
            a per-item hand-off between processes costs more than cheap items do.
        max_wait: seconds a worker gathers a chunk before sending what it has.
        start_timeout: seconds to wait for a worker to build its copy and start an epoch.

    Example:
        >>> # see conveyor/graphs/compile.py, which builds the factory from a spec
    """

    COPIES_KEY = "copies"
    NEXT_KEY = "next"
    DONE_KEY = "done"

    def __init__(self, factory: Callable[[int], tuple[BaseNode, dict[str, Any]]], *, copies: int,
                 method: str = "process", mp_context: str | None = "spawn", depth: int = 4,
                 chunk: int = 64, max_wait: float = 0.05, start_timeout: float = 300.0):
        super().__init__()
        if not isinstance(copies, int) or copies < 1:
            raise ValueError(f"{copies=} must be an int >= 1")
        if method not in METHODS:
            raise ValueError(f"{method=} must be one of {METHODS}")
        self.factory = factory
        self.copies = copies
        self.method = method
        self.mp_context = mp_context or "spawn"
        self.depth = depth
        self.chunk = chunk
        self.max_wait = max_wait
        self.start_timeout = start_timeout
        self.epoch = 0
        self._workers: list[Any] = []
        self._cmd: list[Any] = []
        self._out: list[Any] = []
        self._stop: Any = None
        self._gen = 0
        self._states: list[Any] = []
        self._pending: list[collections.deque] = []
        self._done: list[bool] = []
        self._next = 0
        self._stats: list[dict] = [{} for _ in range(copies)]
        self.startup_seconds: float | None = None

    # ----- workers ------------------------------------------------------------------------
    def _launch(self) -> None:
        t0 = time.perf_counter()
        if self.method == "process":
            ctx = mp.get_context(self.mp_context)
            self._stop = ctx.Event()
            make_q, make_worker = ctx.Queue, ctx.Process
        else:
            self._stop = threading.Event()
            make_q, make_worker = queue.Queue, threading.Thread
        for w in range(self.copies):
            cmd_q, out_q = make_q(), make_q(maxsize=self.depth)
            by_value = self.method == "process"
            worker = make_worker(target=_worker_loop, args=(self.factory, w, cmd_q, out_q, self._stop,
                                                            self.chunk, self.max_wait, by_value),
                                 daemon=True, name=f"conveyor-copy-{w}")
            worker.start()
            self._workers.append(worker)
            self._cmd.append(cmd_q)
            self._out.append(out_q)
        self._t_launch = t0

    def _get(self, w: int, timeout: float | None = None) -> tuple:
        """The next message of worker ``w`` for the current generation."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                msg = self._out[w].get(timeout=_POLL)
            except queue.Empty:
                alive = self._workers[w].is_alive()
                if not alive:
                    code = getattr(self._workers[w], "exitcode", None)
                    raise RuntimeError(f"worker copy {w} died (exit code {code}) without an error "
                                       "message; look for an out-of-memory kill or a crash in native code")
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"worker copy {w} did not start within {timeout:.0f} s")
                continue
            if msg[0] == -1 and msg[1] == _ERR:
                raise msg[2]
            if msg[0] == self._gen:
                return msg

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        if not self._workers:
            self._launch()
        self._gen += 1
        if initial_state is not None:
            states = list(initial_state[self.COPIES_KEY])
            self._next = initial_state[self.NEXT_KEY]
            self._done = list(initial_state[self.DONE_KEY])
        else:
            states = [None] * self.copies
            self._next = 0
            self._done = [False] * self.copies
        for w in range(self.copies):
            self._cmd[w].put(("start", self._gen, self.epoch, states[w]))
        self._states = []
        self._pending = [collections.deque() for _ in range(self.copies)]
        for w in range(self.copies):
            msg = self._get(w, timeout=self.start_timeout)
            if msg[1] == _ERR:
                raise msg[2]
            self._states.append({BASE_KEY: msg[2], SKIP_KEY: 0})
        if self.startup_seconds is None:
            self.startup_seconds = time.perf_counter() - self._t_launch

    def _advance(self, w: int) -> None:
        for step in range(1, self.copies + 1):
            nxt = (w + step) % self.copies
            if not self._done[nxt]:
                self._next = nxt
                return
        self._next = 0

    def next(self):
        while not all(self._done):
            w = self._next
            if self._done[w]:
                self._advance(w)
                continue
            pending = self._pending[w]
            if not pending:
                msg = self._get(w)
                kind = msg[1]
                if kind == _ERR:
                    raise msg[2]
                if kind == _END:
                    self._done[w] = True
                    self._states[w] = {BASE_KEY: msg[2], SKIP_KEY: 0}
                    self._stats[w] = msg[3] or self._stats[w]
                    self._advance(w)
                    continue
                _, _, payload, base, stats = msg
                items = pickle.loads(payload) if isinstance(payload, bytes) else payload
                pending.extend((base, j + 1, item) for j, item in enumerate(items))
                if stats:
                    self._stats[w] = stats
            base, taken, item = pending.popleft()
            self._states[w] = {BASE_KEY: base, SKIP_KEY: taken}
            self._advance(w)
            return item
        raise StopIteration

    def get_state(self) -> dict:
        return {self.COPIES_KEY: list(self._states), self.NEXT_KEY: self._next,
                self.DONE_KEY: list(self._done)}

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
        return {"copies": self.copies, "method": self.method,
                "startup_seconds": round(self.startup_seconds or 0.0, 3)}

    def close(self) -> None:
        if not self._workers:
            return
        self._stop.set()
        for q in self._cmd:
            try:
                q.put(("stop",))
            except (OSError, ValueError):
                pass
        for worker in self._workers:
            worker.join(timeout=5)
            if self.method == "process" and worker.is_alive():
                worker.terminate()
                worker.join(timeout=5)
        if self.method == "process":
            for q in self._cmd + self._out:
                q.close()
                q.cancel_join_thread()
        self._workers, self._cmd, self._out = [], [], []

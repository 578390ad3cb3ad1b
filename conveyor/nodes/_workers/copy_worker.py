"""The worker side of ``copies``: build one copy of a sub-graph, then run its epochs as told.

A worker (a process, or a thread with ``method: thread``) builds copy ``w`` once with
``factory(w)`` and then serves commands from the main process (``WorkerCopies``): ``start``
(an epoch, a state to start from, an elastic deal) and ``stop``. It sends the epoch's items in
chunks, each with the copy's state before its first item: 8 items first, doubling up to
``chunk``, fewer once ``max_wait`` seconds pass or the chunk's tensors hold ``CHUNK_BYTES``.
A worker process writes its pipe from its own thread (``worker_pipe``), packs each chunk's
small tensors into one buffer and lends its big ones through shared-memory slots
(``chunk_packing``, ``shared_slots``), runs torch with one intra-op thread, and ends with the
main process (``parent_watch``). With ``run_ahead``, a copy that sent the end of epoch e goes on
into epoch e + 1 unasked. Messages are tuples ``(key, kind, payload, state, stats)``: ``key``
is the (generation, epoch) they belong to (-1: a failure outside any epoch), ``kind`` one of
``START``, ``ITEMS``, ``END``, ``ERR``.
"""

from __future__ import annotations

import queue
import time
from typing import Any, Callable

from torchdata.nodes import BaseNode

from conveyor.nodes import capabilities as cap
from conveyor.nodes._skips import LEDGER_KEY
from conveyor.nodes._workers.chunk_packing import Packer
from conveyor.nodes._workers.parent_watch import Parent, watch_parent
from conveyor.nodes._workers.shared_slots import Lender
from conveyor.nodes._workers.torchdata_threads import portable
from conveyor.nodes._workers.worker_pipe import PipeOut
from conveyor.nodes.state_shape import check_state

START, ITEMS, END, ERR = "start", "items", "end", "err"
POLL = 0.1  # seconds between looks at the stop flag and the parent while waiting
FIRST_CHUNK = 8
BASE_KEY, SKIP_KEY = "base", "skip"  # a copy's state: its state before a chunk, items taken of it
CHUNK_BYTES = 4 << 20  # a chunk ends once its tensors hold this much (big items: few per chunk)


def _tensor_bytes(item: Any) -> int:
    """Bytes of the tensors in an item, looking one level into dicts, lists and tuples."""
    values = item.values() if isinstance(item, dict) else item if isinstance(item, (list, tuple)) else (item,)
    total = 0
    for v in values:
        nbytes = getattr(v, "nbytes", None)  # torch tensors and numpy arrays
        if isinstance(nbytes, int):
            total += nbytes
    return total


def _stats_of(nodes: dict[str, Any], sent: dict[str, int] | None = None) -> dict[str, dict]:
    """Each node's counters; with ``sent`` (skips last reported, by node), also the skip ledger
    of each node whose count moved since (the ledger in a state is as of the chunk's start)."""
    out = {}
    for name, node in nodes.items():
        entry = {"items": node.items if cap.has(node, cap.Wraps) else 0}
        inner = cap.unwrap(node)
        entry.update(cap.stats(inner))
        ledger = cap.ledger(inner)
        if sent is not None and ledger is not None and sent.get(name) != ledger.count:
            sent[name] = ledger.count
            entry[LEDGER_KEY] = ledger.state()
        out[name] = entry
    return out


def run_worker(factory: Callable[[int], tuple[BaseNode, dict[str, Any]]], w: int,
               cmd_q: Any, out_q: Any, stop: Any, chunk: int, max_wait: float, by_value: bool,
               run_ahead: bool = True, credits: Any = None, parent: tuple[int, bool] | None = None,
               flags: Any = None, flags_first: int = 1) -> None:
    """One worker: build the copy once, then run epochs as the commands ask.

    Items travel in chunks (8 items first, doubling up to ``chunk``, or what ``max_wait``
    seconds gave), each with the copy's state before its first item; ``by_value`` packs a
    chunk's small tensors into one buffer and moves big ones to shared memory here (see
    ``chunk_packing``; with ``flags``, into slots of shared memory it lends the main process,
    ``flags_first`` of them made at once, ``shared_slots``). With ``run_ahead``, a copy that
    sent the end of epoch e goes on into epoch e + 1 from its start, unasked: the main process
    takes those items if that is what it asks for next, and drops them otherwise. A worker
    process given ``parent`` (the main process's pid, and whether its main thread started the
    worker) ends when the main process does (``parent_watch``).
    """
    watch = None
    if parent is not None:
        watch = watch_parent(parent[0], what=f"conveyor worker copy {w}", from_main_thread=parent[1])
    pack = None
    if by_value:
        out_q = PipeOut(out_q, credits, stop, watch)
        # a worker that finds shared memory failing stops trying (Packer)
        pack = Packer(lender=Lender(flags, first=flags_first) if flags is not None else None)
        import torch

        # N copies already use the cores: torch's own intra-op threads would only contend
        # (and spin) with the other copies, as DataLoader's workers also set.
        torch.set_num_threads(1)
    try:
        _serve(factory, w, cmd_q, out_q, stop, chunk, max_wait, pack, run_ahead, watch)
    except (BrokenPipeError, EOFError):
        pass  # the main process closed its end: it is gone or closing
    except BaseException as exc:  # noqa: BLE001 - a failure outside the graph's items: say it
        try:
            out_q.put((-1, ERR, portable(exc), None, None))
        except Exception:  # noqa: BLE001 - the pipe is gone too: the exit code tells
            pass
        raise


def _serve(factory: Callable[[int], tuple[BaseNode, dict[str, Any]]], w: int,
           cmd_q: Any, out_q: Any, stop: Any, chunk: int, max_wait: float, pack: Packer | None,
           run_ahead: bool, watch: Parent | None) -> None:
    try:
        root, nodes = factory(w)
    except BaseException as exc:  # noqa: BLE001 - reported to the main process
        out_q.put((-1, ERR, portable(exc), None, None))
        return
    cmd = None
    ahead = None  # (gen, epoch): the epoch to run next without waiting for a command
    while not stop.is_set():
        if cmd is None and ahead is None:
            try:
                cmd = cmd_q.get(timeout=POLL)
            except queue.Empty:
                if watch is not None and watch.gone():
                    return
                continue
        if cmd is not None:
            if cmd[0] == "stop":
                return
            _, gen, epoch, state, deal = cmd
            cmd = ahead = None
        else:
            (gen, epoch), state, ahead, deal = ahead, None, None, None
        cmd, ended = _run_epoch(root, nodes, cmd_q, out_q, stop, (gen, epoch), state, chunk, max_wait, pack,
                                deal)
        if ended and cmd is None and run_ahead:
            ahead = (gen, epoch + 1)


def _put_unless_stopped(out_q: Any, msg: tuple, stop: Any) -> None:
    """Hand ``msg`` over, waiting while the queue is full, until ``stop`` is set (a closing
    loader reads nothing more: a plain ``put`` would block its join)."""
    while not stop.is_set():
        try:
            out_q.put(msg, timeout=POLL)
            return
        except queue.Full:
            continue


def _run_epoch(root: BaseNode, nodes: dict[str, Any], cmd_q: Any, out_q: Any, stop: Any, key: tuple,
               state: dict | None, chunk: int, max_wait: float, pack: Packer | None,
               deal: dict | None = None) -> tuple[Any, bool]:
    """Send one epoch of the copy, tagged with ``key``; returns (a command that came in
    meanwhile, whether the epoch was sent to its end). ``pack``: how a worker process packs
    a chunk (None: threads hand the items over as they are). ``deal``: what is left of an
    epoch interrupted on another world size (elastic resume), for the copy's shard."""
    epoch = key[1]
    sent: dict[str, int] = {}  # the ledgers' counts as reported: the first chunk reports them
    try:
        for node in nodes.values():
            if cap.has(node, cap.Wraps):
                node.items = 0
            inner = cap.unwrap(node)
            cap.set_epoch(inner, epoch)
            cap.set_deal(inner, deal)
        if state is None:
            root.reset(None)
        else:
            # the copy's own graph is built here: its state is checked here, before any reset
            check_state(root, state[BASE_KEY], ("worker copy", "base"),
                        {id(node): name for name, node in nodes.items()})
            root.reset(state[BASE_KEY])
            for _ in range(state[SKIP_KEY]):
                next(root)  # taken from the chunk before the save: recomputed, not sent
        msg: tuple = (key, START, root.state_dict(), None, None)
    except BaseException as exc:  # noqa: BLE001
        msg = (key, ERR, portable(exc), None, None)
    cmd = None
    size = min(FIRST_CHUNK, chunk)  # small first chunks: the epoch's first items come soon
    while cmd is None and not stop.is_set():
        # hand the message over, but give way to a new command (a new epoch or a stop)
        try:
            out_q.put(msg, timeout=POLL)
        except queue.Full:
            try:
                cmd = cmd_q.get_nowait()
            except queue.Empty:
                pass
            continue
        if msg[1] in (END, ERR):
            return None, msg[1] == END
        base = root.state_dict()
        items: list = []
        deadline = time.monotonic() + max_wait
        try:
            nbytes = 0
            while len(items) < size and nbytes < CHUNK_BYTES and (not items or time.monotonic() < deadline):
                item = next(root)
                items.append(item)
                nbytes += _tensor_bytes(item)
            size = min(2 * size, chunk)
            end = False
        except StopIteration:
            end = True
        except BaseException as exc:  # noqa: BLE001
            msg = (key, ERR, portable(exc), None, None)
            if items:  # deliver what came before the error first
                _put_unless_stopped(out_q, (key, ITEMS, pack(items) if pack else items, base, None), stop)
            continue
        if items:
            payload = pack(items) if pack else items
            msg = (key, ITEMS, payload, base, _stats_of(nodes, sent))
            if end:  # send the items now, the end with the next round
                _put_unless_stopped(out_q, msg, stop)
        if end:
            msg = (key, END, root.state_dict(), _stats_of(nodes, sent), None)
        try:
            cmd = cmd_q.get_nowait()
        except queue.Empty:
            pass
    if pack is not None and msg[1] == ITEMS:
        pack.take_back()  # a new command came before the chunk could be sent: it never will be
    return cmd, False

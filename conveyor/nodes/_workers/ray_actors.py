"""Worker copies as Ray actors: the engine behind ``workers: {copies: N, method: ray}``.

Each copy is one actor that builds its copy with ``factory(w)`` and runs the same serving loop
as a worker process (``copy_worker._serve``) in a thread of its own, into a one-message queue.
The main process pulls that stream: ``RayCopy`` keeps ``depth`` calls of the actor's
``next_message`` in flight (the credits of process copies: a call is a chunk the actor may have
ready ahead of the merge), and hands each message to ``WorkerCopies`` as a worker's pipe would,
so the merge, the run-ahead and the state are those of process copies. An actor on the
driver's node lends the driver its big tensors (1 MiB and more: the image batches) in
shared-memory slots named by file (``named_slots``, a new set each life of the actor), as a
worker process does; only the slots' numbers and the small tensors cross Ray. Elsewhere (or
once ``/dev/shm`` fails) a chunk's tensors are packed into one buffer (``chunk_packing``) that
Ray returns through its object store out of band: the tensors handed on are views of the
object store's memory, not copies. On imagenet-procs.yaml (2 copies, 2 cores) the object
store's way cost 1.05 ms of CPU an image in all (actors, driver, raylet) against 0.79 for
worker processes (0.70 × their rate); through the slots, 0.83.

Faults: an actor whose process dies (SIGKILL, its node removed) is restarted by Ray
(``max_restarts``; no task retries: a call it had not answered fails). ``RayCopy`` then starts
the new actor from what the main process last took of it: the state before the last chunk
received and that chunk's length (the actor re-runs those items and drops them), or the start
of the epoch it had run ahead into, so no item is lost or repeated. Calls made before the
restart carry the actor's old ``life`` and are answered with nothing. Ray is imported only
here, when ``method: ray`` is asked for.
"""

from __future__ import annotations

import collections
import logging
import os
import queue
import socket
import threading
import time
import uuid
from typing import Any, Callable

from conveyor.errors import WorkerError
from conveyor.nodes._workers.chunk_packing import pack, unpack
from conveyor.nodes._workers.copy_worker import BASE_KEY, END, ERR, ITEMS, POLL, SKIP_KEY, START
from conveyor.nodes._workers.named_slots import FileBorrower, FileFlags, lender_for, remove_orphans, remove_slots
from conveyor.nodes._workers.shared_slots import SHM, available

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'conveyor[ray]'"
CONNECT_TIMEOUT = 3.0  # seconds to reach a cluster's address before calling it unreachable
CONTROL = "control"  # the actor's concurrency group for start and pid
MAX_RESTARTS = 3  # per actor: how often Ray restarts a copy whose process died
BACK_WITHIN = 60.0  # seconds a dead actor has to answer again (Ray restarting it) before it is an error


def _first_line(exc: BaseException) -> str:
    """The line of Ray's message that says what happened (its task errors lead with a frame)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    said = [ln for ln in lines if ln.startswith("ray.exceptions.")]
    return (said[-1].split(": ", 1)[-1] if said else lines[-1] if lines else type(exc).__name__)


def import_ray() -> Any:
    """``ray``, or an ImportError that says how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError(f"workers: method: ray needs Ray, which is not installed: {INSTALL_HINT} "
                          f"(keeps torch as it is)") from exc
    return ray


def _reachable(address: str) -> None:
    """Raise ConnectionError naming ``address`` when nothing answers there (Ray itself retries
    for a long while before it gives up)."""
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not port.isdigit():
        return  # "auto" and the like: Ray resolves them and names them when it fails
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=CONNECT_TIMEOUT).close()
    except OSError as exc:
        raise ConnectionError(f"workers: method: ray: the Ray cluster at {address!r} cannot be reached "
                              f"({exc}); start it (ray start --head) or set RAY_ADDRESS / workers: "
                              "address to a running one") from None


def connect(address: str | None) -> Any:
    """Ray, connected to the cluster at ``address`` (else ``RAY_ADDRESS``; else one started here)."""
    ray = import_ray()
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address is not None:
        _reachable(address)  # also when this process is connected already: the address asked for
    if ray.is_initialized():
        return ray
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False,
                 configure_logging=False, ignore_reinit_error=True)
    except ConnectionError as exc:
        raise ConnectionError(f"workers: method: ray: cannot connect to the Ray cluster at {address!r}: "
                              f"{exc}") from None
    return ray


class _ActorPacker:
    """How an actor packs a chunk: big tensors into slots the driver maps (``named_slots``)
    while it runs on the driver's node, else everything by value, through the object store."""

    def __init__(self, w: int):
        self.w = w
        self.lender: Any = None

    def __call__(self, items: Any) -> tuple:
        lender = self.lender
        if lender is None:
            return pack(items)
        lender.begin()
        try:
            return pack(items, lender=lender)
        except (OSError, RuntimeError) as exc:  # /dev/shm full or gone: the object store from now on
            lender.take_back()
            self.lender = None
            log.warning("worker copy %d (ray actor): shared memory with the driver failed (%s); its "
                        "chunks go through Ray's object store from now on", self.w, exc)
            return pack(items)

    def take_back(self) -> None:
        if self.lender is not None:
            self.lender.take_back()


class _CopyActor:
    """One copy in a Ray actor: the serving loop of a worker process, run in a thread."""

    def __init__(self, factory: Callable, w: int, chunk: int, max_wait: float, run_ahead: bool,
                 depth: int = 1):
        import torch

        from conveyor.nodes._workers.copy_worker import _serve

        torch.set_num_threads(1)  # N copies share the node's cores, as worker processes do
        self.life, self.pulled, self.held = -1, 0, {}
        self.depth = depth
        self.packer = _ActorPacker(w)
        self.cmd: queue.Queue = queue.Queue()
        self.out: queue.Queue = queue.Queue(maxsize=1)
        self.stop = threading.Event()
        self.thread = threading.Thread(
            target=_serve, args=(factory, w, self.cmd, self.out, self.stop, chunk, max_wait,
                                 self.packer, run_ahead, None),
            daemon=True, name=f"conveyor-copy-{w}")
        self.thread.start()

    def pid(self) -> int:
        return os.getpid()

    def start(self, life: int, cmd: tuple, share: tuple | None = None) -> None:
        """Run ``cmd`` (in the control group: a ``next_message`` waiting does not hold it up).
        ``share``: the driver's node and this life's flags and slot names (``named_slots``)."""
        if life != self.life:  # the first start of this actor (a restarted one: a new life)
            self.pulled, self.held = 0, {}
            self.life = life
            self.packer.lender = self._lender(share)
        self.cmd.put(cmd)

    def _lender(self, share: tuple | None) -> Any:
        import ray

        try:
            return lender_for(share, ray.get_runtime_context().get_node_id(), self.depth)
        except OSError as exc:  # the flags file is not here after all: the object store
            log.warning("worker copy (ray actor): no shared memory with the driver (%s); chunks go "
                        "through Ray's object store", exc)
            return None

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def shares(self) -> bool:
        """Whether this life's big tensors go through shared memory with the driver."""
        return self.packer.lender is not None

    def next_message(self, life: int, seq: int) -> tuple | None:
        """Message ``seq`` of this life's stream (calls may arrive out of order: one pulled for a
        later call waits in ``held``); None for a call of an earlier life (made before a restart)."""
        while life > self.life:  # made after a restart, before its start came in
            self.stop.wait(POLL)
        while life == self.life:
            if seq in self.held:
                return self.held.pop(seq)
            try:
                msg = self.out.get(timeout=POLL)
            except queue.Empty:
                if not self.thread.is_alive():
                    return (-1, ERR, RuntimeError("its serving thread ended"), None, None)
                continue
            self.pulled += 1
            if self.pulled - 1 == seq:
                return msg
            self.held[self.pulled - 1] = msg
        return None


_swept = False


def _sweep_once() -> None:
    """Once a process, before its first slots: the names of drivers killed before they closed
    (``named_slots.remove_orphans``), said in the log."""
    global _swept
    if _swept:
        return
    _swept = True
    try:
        pids = remove_orphans()
    except OSError as exc:  # a sweep that cannot read SHM changes nothing for this job
        log.debug("no sweep of %s: %s", SHM, exc)
        return
    if pids:
        log.info("removed the shared-memory names that conveyor drivers %s left in %s when they were "
                 "killed before they closed", ", ".join(map(str, pids)), SHM)


class RayCopy:
    """The main process's end of one actor: a command queue (``put``), a message stream
    (``get``), and ``is_alive``/``join``, as ``WorkerCopies`` uses a worker process's."""

    def __init__(self, ray: Any, actor_cls: Any, factory: Callable, w: int, *, depth: int, chunk: int,
                 max_wait: float, run_ahead: bool, max_restarts: int = MAX_RESTARTS,
                 node: str | None = None):
        self.ray, self.w, self.depth, self.run_ahead = ray, w, depth, run_ahead
        self.max_restarts = max_restarts
        self.node = node  # the driver's node (None: never shared memory, the object store only)
        self.prefix = f"conveyor-ray-{os.getpid()}-{uuid.uuid4().hex[:8]}-w{w}"
        self.flags: FileFlags | None = None
        self.borrower: FileBorrower | None = None
        self.share: tuple | None = None
        self.bytes_shared = 0  # payload bytes that came through shared memory
        self.actor = actor_cls.options(max_restarts=max_restarts, max_task_retries=0).remote(
            factory, w, chunk, max_wait, run_ahead, depth)
        self.refs: collections.deque = collections.deque()
        self.life, self.seq = 0, 0
        self.restarts = 0
        self.failing_since: float | None = None  # the first failed call of a death not yet over
        self.streaming = False  # whether the actor is sending (calls kept in flight)
        self.resume: tuple | None = None  # the start that takes a new actor to where this one was
        self.started: tuple | None = None  # key of the last START handed on
        self.swallow: tuple | None = None  # key whose START a restarted actor sends again
        self.bytes_received = 0  # payload bytes that came through the object store
        self.chunks_received = 0
        self.alive = True
        self._new_share()

    def _new_share(self) -> None:
        """Flags and a slot prefix for the actor's next life (``named_slots``), if it can share
        memory with this process: an actor on another node ignores them."""
        self._end_share()
        if self.node is None:
            return
        _sweep_once()
        prefix = f"{self.prefix}-l{self.life}"
        try:
            self.flags = FileFlags(os.path.join(SHM, f"{prefix}-flags"), create=True)
        except OSError as exc:
            log.warning("worker copy %d (ray actor): no shared memory here (%s); its chunks go "
                        "through Ray's object store", self.w, exc)
            self.node = None
            return
        self.borrower = FileBorrower(self.flags)
        self.share = (self.node, self.flags.path, prefix)

    def _end_share(self) -> None:
        """The names the last life left: its flags, its slots never mapped here. Batches the
        trainer holds keep their memory (the mappings stay)."""
        if self.share is not None:
            self.flags.remove()
            remove_slots(self.share[2])
            self.bytes_shared += self.borrower.nbytes
        self.flags = self.borrower = self.share = None

    # ----- the command queue ---------------------------------------------------------------
    def put(self, cmd: tuple) -> None:
        if cmd[0] == "stop":
            self.close()
            return
        self.resume = cmd
        self.swallow = None
        self._start(cmd)

    def _start(self, cmd: tuple) -> None:
        self.actor.start.options(concurrency_group=CONTROL).remote(self.life, cmd, self.share)
        self.streaming = True
        self._top_up()

    def _top_up(self) -> None:
        while self.streaming and len(self.refs) < self.depth:
            self.refs.append(self.actor.next_message.remote(self.life, self.seq))
            self.seq += 1

    # ----- the message stream --------------------------------------------------------------
    def get(self, timeout: float | None = None) -> tuple:
        ray = self.ray
        if not self.refs:
            threading.Event().wait(timeout or POLL)
            raise queue.Empty
        ready, _ = ray.wait([self.refs[0]], timeout=timeout)
        if not ready:
            raise queue.Empty
        ref = self.refs.popleft()
        try:
            msg = ray.get(ref)
        except ray.exceptions.RayActorError as exc:  # died, or unavailable while Ray restarts it
            self._restart(exc)
            raise queue.Empty from None
        except (ray.exceptions.ObjectStoreFullError, ray.exceptions.OutOfDiskError) as exc:
            # a chunk larger than the store is allocated outside it, on disk: this is both full
            what = "OutOfDiskError" if isinstance(exc, ray.exceptions.OutOfDiskError) else "ObjectStoreFullError"
            raise WorkerError(f"worker copy {self.w} (ray actor): Ray's object store is full, and so is the "
                              f"disk it spills to: a chunk could not be stored ({what}: "
                              f"{_first_line(exc)}); give the nodes more object store memory (ray start "
                              "--object-store-memory) or disk, or run the actors on the driver's node "
                              "(their batches then go through shared memory)") from None
        except ray.exceptions.RayError as exc:
            raise WorkerError(f"worker copy {self.w} (ray actor) failed: {exc}") from None
        self.failing_since = None  # it answers: a death, if there was one, is over
        if msg is None:
            raise queue.Empty  # a call from before a restart
        key, kind = msg[0], msg[1]
        if kind == START and key == self.swallow:
            self.swallow = None  # the restarted actor's own start: the merge has had this one
            self._top_up()
            raise queue.Empty
        if kind == ITEMS:
            _, _, payload, base, stats = msg
            if self.borrower is not None:
                self.borrower.release()  # the slots of batches the trainer has let go: the actor may reuse them
            items = unpack(payload, self.borrower)
            self.bytes_received += len(payload[0]) + memoryview(payload[2]).nbytes
            self.chunks_received += 1
            self.resume = ("start", key[0], key[1], {BASE_KEY: base, SKIP_KEY: len(items)}, self._deal())
            msg = (key, ITEMS, items, base, stats)
        elif kind == START:
            self.started = key
            self.resume = ("start", key[0], key[1], {BASE_KEY: msg[2], SKIP_KEY: 0}, self._deal())
        elif kind == END:
            if self.run_ahead:
                self.resume = ("start", key[0], key[1] + 1, None, None)
            else:
                self.resume, self.streaming = None, False
        elif kind == ERR:
            self.resume, self.streaming = None, False
        self._top_up()
        return msg

    def _deal(self) -> Any:
        return self.resume[4] if self.resume is not None else None

    def _restart(self, exc: BaseException) -> None:
        """The actor died: go on with the one Ray starts instead, from where this one was.

        One death fails every call in flight, and the calls made while Ray restarts the actor
        ("temporarily unavailable"): the death is counted once, at its first failed call, and is
        over at the first call answered again; an actor not back within ``BACK_WITHIN`` seconds
        (its restarts used up, its node gone) is an error naming it."""
        now = time.monotonic()
        if self.failing_since is None:
            self.failing_since = now
            self.restarts += 1
            log.warning("worker copy %d (ray actor) died (%s); Ray restarts it, and it resumes from the "
                        "last chunk taken", self.w, type(exc).__name__)
        elif now - self.failing_since > BACK_WITHIN:
            self.alive = False
            raise WorkerError(f"worker copy {self.w} (ray actor) died and has not come back within "
                              f"{BACK_WITHIN:g} s (restarts so far: {self.restarts}): {exc}") from None
        else:
            time.sleep(0.1)  # still restarting: ask again in a moment, not in a busy loop
        if self.restarts > self.max_restarts:
            self.alive = False
            raise WorkerError(f"worker copy {self.w} (ray actor) died and Ray has restarted it "
                              f"{self.max_restarts} times already: {exc}") from None
        self.life, self.seq = self.life + 1, 0
        self.refs.clear()
        self._new_share()
        self.streaming = False
        if self.resume is not None:
            cmd = self.resume
            self.swallow = (cmd[1], cmd[2]) if (cmd[1], cmd[2]) == self.started else None
            self._start(cmd)

    # ----- as a worker ---------------------------------------------------------------------
    def is_alive(self) -> bool:
        return self.alive

    def join(self, timeout: float | None = None) -> None:
        pass  # close() kills the actor at once

    def close(self) -> None:
        if self.alive:
            self.alive = False
            self.refs.clear()
            try:
                self.ray.kill(self.actor, no_restart=True)
            except Exception as exc:  # noqa: BLE001 - the cluster is gone already: nothing to end
                log.debug("worker copy %d: ray.kill: %s", self.w, exc)
            self._end_share()

    @property
    def shared_bytes(self) -> int:
        """Payload bytes that came through shared memory (not the object store)."""
        return self.bytes_shared + (self.borrower.nbytes if self.borrower is not None else 0)


def _driver_node(ray: Any) -> str:
    """The Ray node this process runs on: actors there share memory with it."""
    return ray.get_runtime_context().get_node_id()


def launch(factory: Callable, copies: int, *, address: str | None, depth: int, chunk: int,
           max_wait: float, run_ahead: bool, max_restarts: int = MAX_RESTARTS,
           share_memory: bool = True) -> list[RayCopy]:
    """N actors, one a copy, on the cluster at ``address`` (see ``connect``); with
    ``share_memory``, those on the driver's node hand big tensors over through shared memory."""
    ray = connect(address)
    actor_cls = ray.remote(num_cpus=1, concurrency_groups={CONTROL: 1})(_CopyActor)
    node = _driver_node(ray) if share_memory and available() else None
    return [RayCopy(ray, actor_cls, factory, w, depth=depth, chunk=chunk, max_wait=max_wait,
                    run_ahead=run_ahead, max_restarts=max_restarts, node=node) for w in range(copies)]

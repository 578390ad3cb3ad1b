"""Loader: runs a compiled graph epoch after epoch, saves and restores its place, closes.

Iterating the loader runs one epoch; iterating it again starts the next, reshuffled (the
loader tells every node the epoch: there is no ``set_epoch`` to forget, though
``set_epoch(n)`` jumps to epoch ``n``). ``len()`` is an epoch's batch count where the graph
fixes it (graphs/length.py); ``peek()`` shows the next batch without taking it. ``state_dict()``
may be called at any step; ``load_state_dict()`` makes the next iteration continue exactly
after the step the state was taken at, in this process or a new one. A state taken after
the last batch of an epoch resumes at the first batch of the next epoch.

The state is plain data that ``torch.load`` (weights_only), JSON and
``torch.distributed.checkpoint`` read as they are: ``{"format": 2, "rank<R>": "<JSON>"}``, one
entry per rank, so the states of several ranks saved under one key (DCP's global plan, a merged
dict) stay distinct and each rank loads its own. The JSON holds the rank's own state: its
layout version, the spec's digest and node params (to name what differs when a state does not
fit), the epoch, the batches yielded in it, the rank and world, and the graph's own state
(``rank_states`` decodes it). A state differing from this graph's spec only in params that
leave the data the same (``SAFE_PARAMS``: workers, prefetch depth, retries...) loads as it is.

In a job of several ranks whose graph can give them uneven batch counts, every rank ends each
epoch at the same batch (``conveyor/graphs/even.py``). A loader whose graph stalls says where
it waits (``conveyor/graphs/watchdog.py``). ``close()`` (or ``with``) stops every thread and
process; a loader nobody closed is closed when it is garbage-collected or the interpreter exits.
"""

from __future__ import annotations

import json
import logging
import time
import weakref
from collections import deque
from typing import Any, Iterator

from conveyor.errors import ConveyorError, StateError
from conveyor.graphs import elastic
from conveyor.graphs.compile import Compiled, compile_plan, digest, summary, with_spec_dir
from conveyor.graphs.even import agreement_for
from conveyor.graphs.instrument import node_perf
from conveyor.graphs.listings import ListingCheck, listings_to_check
from conveyor.graphs.length import UnknownLength, epoch_length
from conveyor.graphs.watchdog import DEFAULT_AFTER, Watchdog, graph_progress, graph_report
from conveyor.nodes import LEDGER_KEY, gather, join_threads, ledgers

log = logging.getLogger(__name__)

KEEP_BEHIND = 2  # pre-batch states kept for state_dict(behind=...), where len() is unknown
LINGER_WAIT = 5.0  # seconds close() waits for threads busy in an item when they were asked to stop
STATE_FORMAT = 2  # {"format": 2, "rank<R>": JSON of the rank's state}
RANK_FORMAT = 1    # the layout of one rank's state (a format-1 state is one of these, bare)
# params whose change leaves the data exactly the same (only speed or memory differ)
SAFE_PARAMS = frozenset({"workers", "method", "mp_context", "depth", "snapshot_every", "enabled",
                         "concurrency", "attempts", "timeout", "backoff", "backoff_max", "cache",
                         "cache_size", "block_size", "read_ahead",
                         "device", "non_blocking"})


# dcp.load({"data": loader}) gives each rank the entry of its own rank number only
_DCP_HINT = (" (from a torch.distributed.checkpoint folder, conveyor.dcp_states(folder) reads every "
             "rank's: loader.load_state_dict(conveyor.dcp_states(folder)))")


def rank_key(rank: int) -> str:
    """The key of rank ``rank``'s entry in a loader state."""
    return f"rank{rank}"


def rank_states(state: Any) -> dict[int, dict[str, Any]]:
    """Each rank's own state (decoded) in a loader state, by rank.

    Takes a state from ``Loader.state_dict()`` (format 2), several ranks' states merged into
    one dict, or a bare rank state (format 1, as conveyor wrote before).

    Raises:
        StateError: ``state`` is not a conveyor loader state, or an entry cannot be read.
    """
    if not isinstance(state, dict) or "format" not in state:
        raise StateError("not a conveyor loader state (expected a dict from Loader.state_dict())")
    if state["format"] == RANK_FORMAT and "graph" in state:
        return {state.get("rank", 0): state}
    if state["format"] != STATE_FORMAT:
        raise StateError(f"state format {state['format']} is not supported (this conveyor "
                         f"writes format {STATE_FORMAT})")
    out = {}
    for key, value in state.items():
        if not (key.startswith("rank") and key[4:].isdigit()):
            continue
        try:
            one = json.loads(value)
        except (TypeError, ValueError) as exc:
            raise StateError(f"state entry '{key}' is not a conveyor rank state: {exc}") from None
        if not isinstance(one, dict) or "graph" not in one:
            raise StateError(f"state entry '{key}' is not a conveyor rank state")
        out[int(key[4:])] = one
    return out


def _close_nodes(nodes: list[Any], dog: Watchdog | None = None) -> None:
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


def _dist_ready() -> bool:
    try:
        import torch.distributed as dist

        return dist.is_available() and dist.is_initialized()
    except ImportError:
        return False


_END = object()  # read ahead where the epoch had ended


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
        self._epoch = -1           # the epoch being (or last) iterated
        self._yielded = 0          # batches yielded in that epoch
        self._started = False      # root has been reset for self._epoch
        self._taken = False        # a batch was taken since the epoch was started or restored
        self._exhausted = False
        self._peeked: list[Any] = []       # one batch (or _END) read ahead: restore, peek()
        self._peek_state: dict | None = None  # the rank state from before that read
        self._behind: deque[dict] | None = None  # rank states from before the epoch's last batches
        self._abandoned = 0        # epochs left with batches by a new iter() (logged once)
        self._length: int | None = None   # len(), once known
        self._closed = False
        self._generation = 0  # which iterator is current: an older one is finished
        self._t_start = 0.0
        self._cut = False          # this epoch was ended by the ranks' agreement, not by the data
        self._epochs_cut = 0
        self._world_ok = False     # the graph's rank and world are torch.distributed's
        self._used = False         # a batch was taken or a state loaded: the graph cannot be rebuilt
        self._serial = ListingCheck.serial(digest(summary(compiled.plan)))  # for the ranks' listings
        self._bind(compiled)

    def _bind(self, compiled: Compiled) -> None:
        """Run ``compiled``: its nodes, the ranks' agreement and the watchdog."""
        self._c = compiled
        self._summary = summary(compiled.plan)
        self._digest = digest(self._summary)
        self._root = compiled.root
        self._length = None
        self._agree = agreement_for(compiled.plan, compiled.world)  # even batches across ranks
        listed = listings_to_check(compiled.plan) if compiled.world > 1 else []
        self._listings = ListingCheck(compiled.plan, listed, self._digest, self._serial, compiled.rank,
                                      compiled.world) if listed else None
        inner = [compiled.nodes[n].inner for n in reversed(compiled.order) if n in compiled.nodes]
        after = getattr(compiled.plan, "watchdog", DEFAULT_AFTER)
        self._dog = Watchdog(after, progress=graph_progress(compiled), report=graph_report(compiled)) \
            if after else None
        self._finalizer = weakref.finalize(self, _close_nodes, inner, self._dog)

    def _follow_world(self) -> None:
        """Build the graph again for the rank and world torch.distributed gives, where it was built
        before ``init_process_group`` for others (from RANK/WORLD_SIZE, or none).

        Lightning's DDP starts its processes with LOCAL_RANK and WORLD_SIZE but no RANK, and sets
        WORLD_SIZE in the first process only inside ``fit``; ``mp.spawn`` sets neither. A loader
        built before then was rank 0 of the wrong world on every process: the ranks read the same
        share (or all of it) and DDP's all-reduces went out of step. While no batch has been taken
        and no state loaded (built, or only peeked at, its epoch set, its len or state asked), the
        graph is built again, at the epoch it stood at; after that, it is an error.
        """
        if self._world_ok or self._closed or not _dist_ready():
            return
        import torch.distributed as dist

        rank, world = dist.get_rank(), dist.get_world_size()
        if (rank, world) == (self._c.rank, self._c.world):
            self._world_ok = True  # a process keeps its rank: looked at once
            return
        if self._used:
            raise ConveyorError(
                f"{self._c.plan.path}: this loader was built and used as rank {self._c.rank} of world "
                f"{self._c.world} (torch.distributed was not initialised: from RANK/WORLD_SIZE), but "
                f"torch.distributed runs this process as rank {rank} of world {world}: build the loader "
                "after init_process_group, or take batches and load states only after")
        log.info("%s: built as rank %d of world %d before torch.distributed was initialised; built "
                 "again for rank %d of world %d", self._c.plan.path, self._c.rank, self._c.world, rank, world)
        self._finalizer()
        self._bind(compile_plan(self._c.plan))
        if self._started:  # at the same epoch, from its first batch, as this rank's
            self._generation += 1
            self._start(self._epoch, None)
            self._yielded = 0

    # ----- epochs -------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        """The epoch being iterated (or, between epochs, the last one); -1 before the first.

        Right after ``load_state_dict`` it is the epoch the state resumes in (the next one for
        a state taken after an epoch's last batch), and after ``set_epoch(n)`` it is ``n``.
        """
        return self._epoch

    @property
    def spec_path(self) -> str:
        return self._c.plan.path

    @property
    def nodes(self) -> dict[str, Any]:
        """The built nodes by name (the torchdata ``BaseNode`` of each)."""
        return {n: c.inner for n, c in self._c.nodes.items()}

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter()`` start epoch ``epoch`` at its first batch, shuffled as that epoch.

        For jobs that checkpoint once per epoch: ``loader.set_epoch(saved_epoch + 1)``. Setting
        the epoch the loader is about to iterate anyway (just restored, started or set, nothing
        taken) changes nothing, so calling ``set_epoch(epoch)`` at the top of every epoch, as
        with ``DistributedSampler``, keeps a position restored by ``load_state_dict``.

        Args:
            epoch: the epoch to start, >= 0.

        Example:
            >>> loader.set_epoch(3)          # doctest: +SKIP
            >>> for batch in loader: ...     # epoch 3, from its first batch
        """
        self._check_open()
        self._follow_world()
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"set_epoch: epoch={epoch!r} must be an int >= 0")
        if self._started and not self._taken and not self._exhausted and self._epoch == epoch:
            return
        self._note_abandoned(f"set_epoch({epoch})", epoch)
        self._generation += 1  # an iterator of the old epoch ends
        self._start(epoch, None)
        self._yielded = 0

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
        self._peeked, self._peek_state = [], None  # read ahead from the position being left
        if self._behind is not None:
            self._behind.clear()
        dog = self._dog
        if dog is not None:
            dog.start()
            dog.entered += 1  # a reset may wait too (a worker's start, a shuffle's first window)
        try:
            self._root.reset(graph_state)
        finally:
            if dog is not None:
                dog.left += 1
        self._started = True
        self._taken = False
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
        self._read_ahead(state)

    def _read_ahead(self, state: dict[str, Any]) -> None:
        """After a restore, read the batch the loader gives next; where there is none, the next
        epoch begins. Ranks that agree on each epoch's end (``even_batches``) agree here too: a
        state taken after the last batch the ranks agreed on may leave one rank with batches
        and another without, and the uninterrupted run ended that epoch on every rank there."""
        epoch = self._epoch
        try:
            item, have = next(self._root), True
        except StopIteration:
            item, have = _END, False
        # every rank loads its state, so every rank asks here (once torch.distributed is up;
        # before it, the first batch's agreement is the first collective, as without a restore)
        all_have = self._agree.all_have(have) if self._agree is not None and _dist_ready() else have
        if all_have:
            self._peeked = [item]
            self._peek_state = state
            return
        if have:
            log.info("rank %d: epoch %d resumes at its end, where another rank has no batch left; "
                     "this rank's remaining batches are left unread, as in the uninterrupted run",
                     self._c.rank, epoch)
        self._start(epoch + 1, None)
        self._yielded = 0

    def __iter__(self) -> Iterator[Any]:
        self._check_open()
        self._follow_world()
        if not self._started or self._taken or self._exhausted:
            # else: started (by state_dict, peek, set_epoch or a restore) with nothing taken
            # since: this iterator takes that epoch from where it stands
            self._note_abandoned("a new iter()", self._epoch + 1)
            self._start(self._epoch + 1, None)
            self._yielded = 0
        self._generation += 1
        return _EpochIterator(self, self._generation)

    def _note_abandoned(self, by: str, next_epoch: int) -> None:
        """Say (a warning the first time, then at debug level) that an epoch is being left
        with batches still to come."""
        if not self._started or self._exhausted or not self._taken:
            return
        if self._peeked:
            if self._peeked[-1] is _END:
                return
        else:
            known = self._known_length()
            if known is not None and self._yielded >= known:
                return
        self._abandoned += 1
        (log.warning if self._abandoned == 1 else log.debug)(
            "%s: epoch %d is left after %d batch(es) with more to come, and %s starts epoch %d "
            "(keep one iterator per epoch to see all of it; said once)", self._c.plan.path,
            self._epoch, self._yielded, by, next_epoch)

    def _next(self, generation: int) -> Any:
        if self._exhausted or not self._started or generation != self._generation:
            raise StopIteration
        if self._behind is None:  # decided once: kept where a consumer may read ahead (below)
            self._behind = deque(maxlen=KEEP_BEHIND if self._known_length() is None else 0)
        before = self._rank_state() if self._behind.maxlen else None
        have = True
        if self._peeked:
            item = self._peeked.pop()
            self._peek_state = None
            have = item is not _END
        else:
            dog = self._dog
            if dog is not None:
                dog.entered += 1  # the watchdog looks whether the caller waits here and for how long
            try:
                item = next(self._root)
            except StopIteration:
                have = False
            finally:
                if dog is not None:
                    dog.left += 1
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
        self._taken = self._used = True
        if before is not None:
            self._behind.append(before)
        if self._listings is not None:  # the ranks list the same files (graphs/listings.py)
            self._listings.after_batch(self._root.state_dict)
        return item

    def peek(self) -> Any:
        """The batch the loader gives next, without taking it.

        Mid-epoch it is the epoch's next batch; between epochs (before the first, or after
        one ended) it is the first batch of the next epoch, which the next ``iter()`` then
        begins with. Nothing moves: ``state_dict()`` is the same before and after, and the
        next batch taken is this one. ``conveyor show SPEC --batch`` prints its structure.

        Raises:
            RuntimeError: the loader is closed.
            ConveyorError: the current epoch has no batch left (iterating the loader again
                starts the next one), or the epoch has no batches at all.

        Example:
            >>> batch = loader.peek()                            # doctest: +SKIP
            >>> model = make_model(batch["image"].shape[1:])     # doctest: +SKIP
            >>> for batch in loader: ...                         # starts with that batch
        """
        self._check_open()
        self._follow_world()
        if not self._started or self._exhausted:
            self._generation += 1  # an iterator that ended stays ended
            self._start(self._epoch + 1, None)
            self._yielded = 0
        if not self._peeked:
            state = self._rank_state()
            try:
                self._peeked = [next(self._root)]
            except StopIteration:
                self._peeked = [_END]
            self._peek_state = state
        item = self._peeked[-1]
        if item is _END:
            if self._yielded:
                raise ConveyorError(f"{self._c.plan.path}: epoch {self._epoch} has no batch left after "
                                    f"{self._yielded}; iterating the loader again starts epoch "
                                    f"{self._epoch + 1}")
            raise ConveyorError(f"{self._c.plan.path}: epoch {self._epoch} has no batches at all "
                                "(no input, or fewer items than one batch with drop_last)")
        return item

    # ----- state --------------------------------------------------------------------------
    def _rank_state(self) -> dict[str, Any]:
        """This rank's own state, as plain data."""
        if self._peek_state is not None:
            return self._peek_state
        if not self._started:
            self._start(0, None)
            self._yielded = 0
        return {
            "format": RANK_FORMAT,
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

    def state_dict(self, *, behind: int = 0) -> dict[str, Any]:
        """Where the loader is, as plain data; cheap enough for every step.

        ``{"format": 2, "rank<R>": "<JSON>"}``: plain types only, so ``torch.load`` with its
        defaults, JSON and ``torch.distributed.checkpoint`` all read it. The entry is keyed by
        this rank, so under DCP every rank's entry is its own and ``load_state_dict`` picks it
        (``rank_states`` decodes the entries).

        Args:
            behind: the state from before the last ``behind`` batches of the current epoch, for
                a consumer that has taken batches it has not used yet (Lightning reads one ahead
                of the training step when ``len()`` is unknown: :class:`conveyor.lightning.ExactResume`).
                Kept for the last two batches of an epoch where ``len()`` is unknown.

        Raises:
            ValueError: ``behind`` is more batches than the loader kept.
        """
        self._check_open()
        self._follow_world()
        if behind:
            kept = self._behind if self._behind is not None else ()
            if not 0 < behind <= len(kept):
                raise ValueError(f"{self._c.plan.path}: no state from {behind} batch(es) back: the loader "
                                 f"keeps the states from before the last {len(kept)} batch(es) of this epoch "
                                 f"(up to {KEEP_BEHIND}, where len() is unknown)")
            state = kept[-behind]
        else:
            state = self._rank_state()
        return {"format": STATE_FORMAT, rank_key(self._c.rank): json.dumps(state, separators=(",", ":"))}

    def load_state_dict(self, state: dict[str, Any], *, strict: bool = True) -> None:
        """Resume from ``state``: the next batch is the one after the step it was taken at.

        ``loader.epoch`` is then the epoch the state resumes in, and the next ``iter()``
        continues it. A state whose spec differs from this one only in params that leave the
        data the same (``SAFE_PARAMS``: workers, method, prefetch depth, retries, cache...)
        loads with an info log.

        Args:
            state: from ``state_dict()``, possibly after a JSON, ``torch.save``/``torch.load``
                or ``torch.distributed.checkpoint`` round trip; states of several ranks merged
                into one dict (or a list of them) are fine (each rank takes its own entry).
                The states of *every* rank of a run with another world size or number of
                worker copies resume elastically: the interrupted epoch goes on with what no
                old rank consumed, dealt evenly to the new ranks, and the next epochs are this
                world's (see conveyor/graphs/elastic.py).
            strict: refuse params that change the data (seed, sizes, fn...). With
                ``strict=False`` such differences are logged as warnings and the state loads.

        Raises:
            StateError: the state is from another format or graph, is another rank's, is not
                every rank's of a run of another world size, or (with ``strict``) is from a spec
                whose params change the data; or a graph that cannot resume elastically (the
                error names the node that stops it).
        """
        self._check_open()
        self._follow_world()  # the rank whose entry this process takes
        self._used = True
        by_rank = elastic.merged_rank_states(state, rank_states)
        own = by_rank.get(self._c.rank)
        if own is None or (own.get("world"), self._copies_of(own)) != (self._c.world, self._copies_of(None)):
            if elastic.complete(by_rank):  # every rank of another world size or copies: elastic
                for one in by_rank.values():
                    self._check_fits(one, strict, elastic=True)
                self._generation += 1
                self._resume_elastic(elastic.plan_resume(self._c.plan, list(by_rank.values())))
                return
        own = self._own_state(by_rank)
        self._check_fits(own, strict)
        if not self._c.plan.resumable:
            log.warning("%s declares resumable: false: this state restores the position of every "
                        "node, but the batches after it will not be exactly the uninterrupted run's",
                        self._c.plan.path)
        self._generation += 1  # an iterator from before the load ends
        self._restore(own)

    def _own_state(self, by_rank: dict[int, dict[str, Any]]) -> dict[str, Any]:
        """This rank's entry of the decoded states."""
        own = by_rank.get(self._c.rank)
        if own is None and len(by_rank) == 1:
            own = next(iter(by_rank.values()))  # one rank's state: _check_fits names the mismatch
        if own is None:
            raise StateError(f"the state holds rank(s) {sorted(by_rank)}, this is rank {self._c.rank} of "
                             f"world {self._c.world}: load each rank's own state with the same world "
                             "size, or the states of every rank of the old run to resume elastically"
                             f"{_DCP_HINT}")
        return own

    def _copies_of(self, state: dict[str, Any] | None) -> int:
        workers = (self._summary["workers"] if state is None else state.get("workers")) or {}
        return workers.get("copies", 1)

    def _check_fits(self, state: dict[str, Any], strict: bool, elastic: bool = False) -> None:
        if state.get("format") != RANK_FORMAT:
            raise StateError(f"rank state format {state.get('format')} is not supported (this conveyor "
                             f"writes format {RANK_FORMAT})")
        if not elastic and (state.get("rank"), state.get("world")) != (self._c.rank, self._c.world):
            one_rank = state.get("world") == self._c.world > 1  # a checkpoint one rank wrote
            raise StateError(f"state was saved by rank {state.get('rank')} of world {state.get('world')}, "
                             f"this is rank {self._c.rank} of world {self._c.world}: load each rank's "
                             "own state with the same world size, or the states of every rank of the "
                             f"old run to resume elastically{_DCP_HINT}"
                             + ("; Lightning writes rank 0's checkpoint only: add "
                                "conveyor.lightning.ExactResume() to the trainer's callbacks to keep "
                                "every rank's state in it" if one_rank else ""))
        saved_w, now_w = state.get("workers") or {}, self._summary["workers"] or {}
        saved_until = saved_w.get("until") if saved_w.get("copies", 1) > 1 else None
        now_until = now_w.get("until") if now_w.get("copies", 1) > 1 else None
        if elastic and saved_until and now_until and saved_until != now_until:
            raise StateError(f"state was taken with worker copies up to '{saved_until}', this graph "
                             f"runs them up to '{now_until}'")
        if not elastic and (saved_w.get("copies", 1), saved_w.get("until")) != (now_w.get("copies", 1),
                                                                                 now_w.get("until")):
            raise StateError(f"state was taken with {saved_w.get('copies', 1)} worker copies up to "
                             f"'{saved_w.get('until')}', this graph runs {now_w.get('copies', 1)} up to "
                             f"'{now_w.get('until')}': load the states of every rank of the old run to "
                             "resume with other copies (elastic)")
        if state.get("digest") != self._digest:
            self._compare(state.get("spec") or {}, strict)

    def _resume_elastic(self, plan: dict[str, Any]) -> None:
        """Start the epoch an old run was interrupted in, dealing what it left (graphs/elastic.py)."""
        epoch, deal = plan["epoch"], plan["deal"]
        if deal is None:  # that epoch was over: the next one begins
            self._start(epoch + 1, None)
            self._yielded = 0
            return
        for counted in self._c.nodes.values():
            set_deal = getattr(counted.inner, "set_deal", None)
            if callable(set_deal):
                set_deal(deal)
        self._start(epoch, None)
        self._yielded = 0
        self._read_ahead(self._rank_state())  # nothing left for this rank: the next epoch begins

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
        spec_dir = self._c.plan.spec_dir  # a state from before paths were kept as ${spec_dir}/...
        for n, node in now.items():
            old = saved[n]["params"]
            for p in sorted(set(old) | set(node["params"])):
                if with_spec_dir(old.get(p), spec_dir) != node["params"].get(p):
                    safe = p in SAFE_PARAMS
                    diffs.append((safe, f"node '{n}' param '{p}': saved {old.get(p)!r}, now "
                                        f"{node['params'].get(p)!r}"
                                        + (" (safe: the data stay the same)" if safe else
                                           " (breaks exactness: the batches will differ)")))
        breaking = [d for safe, d in diffs if not safe]
        if strict and breaking:
            raise StateError("the state is from a spec with other params: " + "; ".join(breaking)
                             + ". Pass strict=False to load it anyway")
        for safe, d in diffs:
            (log.info if safe else log.warning)("loading a state across a spec change: %s", d)

    # ----- length -------------------------------------------------------------------------
    def __len__(self) -> int:
        """Batches this rank yields in an epoch (the coming one, or the current one whole).

        Known where the graph fixes it before iterating: a listing, shard (with equalize),
        batch (drop_last), worker copies. Where the data decide (filter, skipped errors,
        records read from files, length buckets, mix until the first input ends), ``len()``
        raises ``TypeError`` naming the node, as ``DataLoader`` does for an iterable dataset.
        With ranks that agree on each epoch's end (``even_batches``), the fewest of any rank.
        """
        self._follow_world()
        if self._length is None:
            self._check_open()
            try:
                self._length = self._count_batches()
            except UnknownLength as exc:
                raise TypeError(f"len() of the loader of {self._c.plan.path} is unknown: {exc}") from None
        return self._length

    def __bool__(self) -> bool:
        return True  # a loader is never false, whatever its length (or when it has none)

    def _count_batches(self) -> int:
        copies = getattr(self._c.plan, "copies", None)
        copied = (copies.count, copies.until) if self._c.copied else None
        nodes = {n: c for n, c in self._c.nodes.items() if n not in self._c.copied}
        ranks = [self._c.rank]
        if self._agree is not None and _dist_ready():  # every rank stops at the shortest
            ranks = list(range(self._c.world))
        return min(epoch_length(self._c.plan, nodes, r, self._c.world, copied) for r in ranks)

    def _known_length(self) -> int | None:
        try:
            return len(self)
        except (TypeError, ConveyorError):
            return None

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

    def skipped(self) -> dict[str, Any]:
        """The ledger of the samples ``on_error: skip`` left out, since the run began.

        Returns:
            ``{"count": skips in all, "entries": [...]}``; an entry is ``{"node", "sample",
            "error", "message", "times"}`` (``sample`` names it: a path, ``shard#key``,
            ``file:line``, an index; ``times``: how often it was skipped, once per epoch). The
            first 1,000 distinct samples of each node are kept in full, the rest only counted.
            The ledger is part of the state: a restored loader reports the skips before its
            restore too, and worker copies' skips are in it.

        Example:
            >>> for e in loader.skipped()["entries"]:                 # doctest: +SKIP
            ...     print(e["sample"], e["error"], e["message"])
        """
        if not self._started:
            return {"count": 0, "entries": []}  # nothing ran yet (and nothing is started to ask)
        # the nodes of this process are read live (their ledgers in a state are as of the point a
        # restore would replay from), and those of worker copies as the copies last reported them
        live = [c.inner.ledger.state() for c in self._c.nodes.values()
                if getattr(c.inner, "ledger", None) is not None]
        if self._c.copied:
            copies = self._copies()
            live += (copies.copy_ledgers() if copies is not None
                     else list(ledgers(self._rank_state()["graph"], set(self._c.copied))))
        entries, count = gather([{LEDGER_KEY: ledger} for ledger in live])
        return {"count": count, "entries": entries}

    def _perf(self, elapsed: float) -> dict[str, dict[str, Any]]:
        counted = self._c.nodes
        raws = {n: c.raw() for n, c in counted.items()}
        inputs = {n: self._c.plan.nodes[n].inputs for n in counted}
        return node_perf(counted, inputs, raws, elapsed)

    def _copies(self) -> Any:
        from conveyor.nodes import WorkerCopies

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

    def __getstate__(self) -> Any:
        # pickle (and copy) reached a thread lock deep inside the graph and said only that:
        # a LightningModule holding the loader under ddp_spawn, mp.spawn(train, args=(loader,))
        raise TypeError(f"a conveyor Loader ({self._c.plan.path}) cannot be pickled or copied: it runs "
                        "threads and processes of this one. Build it in each process that reads it "
                        "(load_graph(...) in the worker, or in Lightning's train_dataloader()), and "
                        "hand over its state_dict() to move a position")

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Loader({self._c.plan.path!r}, output={self._c.plan.output!r}, epoch={self._epoch})"

"""Loader: runs a compiled graph epoch after epoch, saves and restores its place, closes.

Iterating the loader runs one epoch; iterating it again starts the next, reshuffled (the
loader tells every node the epoch: there is no ``set_epoch`` to forget, though
``set_epoch(n)`` jumps to epoch ``n``). ``len()`` is an epoch's batch count where the graph
fixes it (graphs/length.py); ``peek()`` shows the next batch without taking it. ``state_dict()``
may be called at any step; ``load_state_dict()`` makes the next iteration continue exactly
after the step the state was taken at, in this process or a new one. A state taken after
the last batch of an epoch resumes at the first batch of the next epoch.

The Loader is a face over small parts, each in a module of its own:

- ``graphs/epochs.py``: where it stands (the epoch, the batches yielded, the batch read ahead);
- ``graphs/run.py``: the compiled graph running, its watchdog (``graphs/watchdog.py``) and the
  finalizer that closes it;
- ``graphs/state.py``: the state format, ``{"format": 2, "rank<R>": "<JSON>"}``, and whether a
  saved state fits this graph (strict, or params that leave the data the same);
- ``graphs/elastic.py``: the states of every rank of a run of another world size, resumed;
- ``graphs/distributed.py``: torch.distributed's rank and world, and what the ranks do
  together (even batches, ``graphs/even.py``; the same listing, ``graphs/listings.py``);
- ``graphs/stats.py``: ``stats()`` and ``skipped()``.

A loader whose graph stalls says where it waits; ``close()`` (or ``with``) stops every thread and
process; a loader nobody closed is closed when it is garbage-collected or the interpreter exits.
"""

from __future__ import annotations

import logging
from typing import Any, Iterator

from conveyor.errors import ConveyorError
from conveyor.graphs import elastic
from conveyor.graphs.compile import Compiled, compile_plan
from conveyor.graphs.distributed import dist_ready, world_moved
from conveyor.graphs.epochs import EpochIterator, Epochs
from conveyor.graphs.length import UnknownLength
from conveyor.graphs.listings import ListingCheck
from conveyor.graphs.run import GraphRun
from conveyor.graphs.state import digest, merged_rank_states, rank_key, summary
from conveyor.graphs.stats import epoch_stats, skip_ledger

log = logging.getLogger(__name__)


class Loader:
    """An iterable over the batches of a compiled graph, with epochs and exact resume.

    Usually made by ``conveyor.load_graph``. Example:
        >>> with load_graph("specs/numbers.yaml") as loader:       # doctest: +SKIP
        ...     for epoch in range(2):
        ...         for batch in loader: ...
        ...     state = loader.state_dict()
    """

    def __init__(self, compiled: Compiled):
        self._closed = False
        self._world_ok = False     # the graph's rank and world are torch.distributed's
        self._serial = ListingCheck.serial(digest(summary(compiled.plan)))  # for the ranks' listings
        self._epochs = Epochs(GraphRun(self, compiled, self._serial))

    @property
    def _c(self) -> Compiled:
        """The compiled graph (the tools read its plan and nodes)."""
        return self._epochs.run.compiled

    def _follow_world(self) -> None:
        """Build the graph again for the rank and world torch.distributed gives, where it was built
        before ``init_process_group`` for others (from RANK/WORLD_SIZE, or none).

        While no batch has been taken and no state loaded (built, or only peeked at, its epoch
        set, its len or state asked), the graph is built again, at the epoch it stood at; after
        that, it is an error (graphs/distributed.py).
        """
        if self._world_ok or self._closed or not dist_ready():
            return
        if not world_moved(self._c, self._epochs.used):
            self._world_ok = True  # a process keeps its rank: looked at once
            return
        self._epochs.run.close()
        self._epochs.rebind(GraphRun(self, compile_plan(self._c.plan), self._serial))

    # ----- epochs -------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        """The epoch being iterated (or, between epochs, the last one); -1 before the first.

        Right after ``load_state_dict`` it is the epoch the state resumes in (the next one for
        a state taken after an epoch's last batch), and after ``set_epoch(n)`` it is ``n``.
        """
        return self._epochs.epoch

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
        self._epochs.set_epoch(epoch, self._known_length)

    def __iter__(self) -> Iterator[Any]:
        self._check_open()
        self._follow_world()
        return EpochIterator(self, self._epochs.begin_iter(self._known_length))

    def _next(self, generation: int) -> Any:
        return self._epochs.next(generation)

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
        return self._epochs.peek()

    # ----- state --------------------------------------------------------------------------
    def keep_behind(self, batches: int) -> None:
        """Keep the states from before the last ``batches`` batches of each epoch, for
        ``state_dict(behind=...)``: for a consumer that reads batches ahead of its training step
        (:class:`conveyor.lightning.ExactResume` asks for 2). Each kept state is taken before
        its batch (microseconds: a few per cent of a text graph's time), so none is kept unless
        asked, but the state from before an epoch's first batch.

        Args:
            batches: how many, >= 0 (0: none but the first batch's).

        Example:
            >>> loader.keep_behind(1)                    # doctest: +SKIP
            >>> it = iter(loader); ahead = next(it)      # doctest: +SKIP
            >>> loader.state_dict(behind=1)              # doctest: +SKIP  # from before `ahead`
        """
        self._check_open()
        if isinstance(batches, bool) or not isinstance(batches, int) or batches < 0:
            raise ValueError(f"keep_behind: batches={batches!r} must be an int >= 0")
        self._epochs.keep_behind(batches)

    def state_dict(self, *, behind: int = 0) -> dict[str, Any]:
        """Where the loader is, as plain data; cheap enough for every step.

        ``{"format": 2, "rank<R>": "<JSON>"}``: plain types only, so ``torch.load`` with its
        defaults, JSON and ``torch.distributed.checkpoint`` all read it. The entry is keyed by
        this rank, so under DCP every rank's entry is its own and ``load_state_dict`` picks it
        (``conveyor.graphs.state.rank_states`` decodes the entries).

        Args:
            behind: the state from before the last ``behind`` batches of the current epoch, for
                a consumer that has taken batches it has not used yet (Lightning reads one ahead
                of the training step when ``len()`` is unknown: :class:`conveyor.lightning.ExactResume`).
                Kept for as many batches as ``keep_behind`` asked, and for an epoch's first.

        Raises:
            ValueError: ``behind`` is more batches than the loader kept.
        """
        self._check_open()
        self._follow_world()
        state = self._epochs.kept(behind) if behind else self._epochs.rank_state()
        return self._epochs.run.states.encode(state)

    def load_state_dict(self, state: dict[str, Any], *, strict: bool = True) -> None:
        """Resume from ``state``: the next batch is the one after the step it was taken at.

        ``loader.epoch`` is then the epoch the state resumes in, and the next ``iter()``
        continues it. A state whose spec differs from this one only in params that leave the
        data the same (workers, method, prefetch depth, retries, cache...: see
        ``conveyor.graphs.state.is_safe_param``) loads with an info log.

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
        self._epochs.used = True
        states = self._epochs.run.states
        by_rank = merged_rank_states(state)
        plan = elastic.resume_plan(states, by_rank, strict)
        if plan is not None:  # every rank of another world size or copies: elastic
            self._epochs.resume_elastic(plan)
            return
        own = states.own(by_rank)
        states.check_fits(own, strict)
        self._epochs.run.check_state(own["graph"], (rank_key(own["rank"]), "graph"))
        if not self._c.plan.resumable:
            log.warning("%s declares resumable: false: this state restores the position of every "
                        "node, but the batches after it will not be exactly the uninterrupted run's",
                        self._c.plan.path)
        self._epochs.restore(own)

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
        run = self._epochs.run
        if run.length is None:
            self._check_open()
            try:
                run.length = run.epoch_length()
            except UnknownLength as exc:
                raise TypeError(f"len() of the loader of {self._c.plan.path} is unknown: {exc}") from None
        return run.length

    def __bool__(self) -> bool:
        return True  # a loader is never false, whatever its length (or when it has none)

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
        return epoch_stats(self._epochs)

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
        return skip_ledger(self._epochs)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this loader is closed")

    def close(self) -> None:
        """Stop every thread and worker process of the graph. Safe to call twice."""
        self._closed = True
        self._epochs.run.close()

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
        return f"Loader({self._c.plan.path!r}, output={self._c.plan.output!r}, epoch={self._epochs.epoch})"

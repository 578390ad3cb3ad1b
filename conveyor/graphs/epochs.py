"""Where a loader stands: the epoch, the batches yielded in it, and the batch read ahead.

Iterating the loader runs one epoch; iterating it again starts the next (every node is told
the epoch, so each is reshuffled). An iterator dropped before its first ``next()`` consumed
nothing: the next ``iter()`` takes the same epoch from where it stands. ``Epochs`` keeps that
position over a ``GraphRun`` (conveyor/graphs/run.py): it starts and restores epochs, reads one
batch ahead for ``peek()`` and after a restore (so that a state taken after an epoch's last
batch resumes at the next epoch's first), keeps the rank states from before the last batches
where a consumer that reads ahead asks (``keep_behind``, ``state_dict(behind=...)``), and ends
an epoch where the ranks agree it ends (conveyor/graphs/even.py).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any, Callable

from conveyor.errors import ConveyorError
from conveyor.graphs.run import GraphRun

log = logging.getLogger(__name__)

END = object()  # read ahead where the epoch had ended

KnownLength = Callable[[], "int | None"]


class EpochIterator:
    """One epoch's iterator; ``iter()`` of it is itself, so ``it = iter(loader); next(it);
    for batch in it`` stays in the same epoch. A newer epoch ends an older iterator."""

    __slots__ = ("_loader", "_generation")

    def __init__(self, loader: Any, generation: int):
        self._loader = loader
        self._generation = generation

    def __iter__(self) -> "EpochIterator":
        return self

    def __next__(self) -> Any:
        return self._loader._next(self._generation)


class Epochs:
    """A loader's position in its epochs, over the graph ``run``.

    ``known_length`` (given to the methods that need it) returns ``len(loader)`` or None where
    it is unknown.
    """

    def __init__(self, run: GraphRun):
        self.run = run
        self.epoch = -1           # the epoch being (or last) iterated
        self.yielded = 0          # batches yielded in that epoch
        self.started = False      # the graph has been reset for self.epoch
        self.taken = False        # a batch was taken since the epoch was started or restored
        self.exhausted = False
        self.peeked: list[Any] = []       # one batch (or END) read ahead: restore, peek()
        self.peek_state: dict | None = None  # the rank state from before that read
        self.keep = 0             # rank states kept from before the last batches (keep_behind)
        self.behind: deque[dict] = deque(maxlen=1)  # those states, the epoch's latest last
        self.abandoned = 0        # epochs left with batches by a new iter() (logged once)
        self.generation = 0       # which iterator is current: an older one is finished
        self.t_start = 0.0
        self.cut = False          # this epoch was ended by the ranks' agreement, not by the data
        self.epochs_cut = 0
        self.used = False         # a batch was taken or a state loaded: the graph cannot be rebuilt

    # ----- starting -----------------------------------------------------------------------
    def start(self, epoch: int, graph_state: dict | None = None) -> None:
        """Start epoch ``epoch`` at its first batch, or at ``graph_state``."""
        self.epoch = epoch
        self.peeked, self.peek_state = [], None  # read ahead from the position being left
        self.behind.clear()
        self.run.start(epoch, graph_state)
        self.started = True
        self.taken = False
        self.exhausted = False
        self.cut = False
        self.t_start = time.perf_counter()
        self.yielded = 0

    def rebind(self, run: GraphRun) -> None:
        """Go on over ``run`` (the graph built again): at the same epoch, from its first batch."""
        self.run = run
        if self.started:
            self.generation += 1
            self.start(self.epoch)

    def begin_iter(self, known_length: KnownLength) -> int:
        """For a new ``iter()``: the next epoch, unless the one started has nothing taken
        (started by state_dict, peek, set_epoch or a restore); the iterator's generation."""
        if not self.started or self.taken or self.exhausted:
            self.note_abandoned("a new iter()", self.epoch + 1, known_length)
            self.start(self.epoch + 1)
        self.generation += 1
        return self.generation

    def set_epoch(self, epoch: int, known_length: KnownLength) -> None:
        """Make the next ``iter()`` start ``epoch`` (nothing changes where it would anyway)."""
        if self.started and not self.taken and not self.exhausted and self.epoch == epoch:
            return
        self.note_abandoned(f"set_epoch({epoch})", epoch, known_length)
        self.generation += 1  # an iterator of the old epoch ends
        self.start(epoch)

    def note_abandoned(self, by: str, next_epoch: int, known_length: KnownLength) -> None:
        """Say (a warning the first time, then at debug level) that an epoch is being left
        with batches still to come."""
        if not self.started or self.exhausted or not self.taken:
            return
        if self.peeked:
            if self.peeked[-1] is END:
                return
        else:
            known = known_length()
            if known is not None and self.yielded >= known:
                return
        self.abandoned += 1
        (log.warning if self.abandoned == 1 else log.debug)(
            "%s: epoch %d is left after %d batch(es) with more to come, and %s starts epoch %d "
            "(keep one iterator per epoch to see all of it; said once)", self.run.compiled.plan.path,
            self.epoch, self.yielded, by, next_epoch)

    # ----- restoring ----------------------------------------------------------------------
    def restore(self, state: dict) -> None:
        """Continue after the step rank state ``state`` was taken at."""
        self.generation += 1  # an iterator from before the load ends
        if state.get("cut"):  # the ranks ended that epoch together: the next one begins
            self.start(state["epoch"] + 1)
            return
        self.start(state["epoch"], state["graph"])
        self.yielded = state["yielded"]
        self.read_ahead(state)

    def resume_elastic(self, plan: dict[str, Any]) -> None:
        """Start the epoch an old run was interrupted in, dealing what it left (graphs/elastic.py)."""
        self.generation += 1
        epoch, deal = plan["epoch"], plan["deal"]
        if deal is None:  # that epoch was over: the next one begins
            self.start(epoch + 1)
            return
        self.run.set_deal(deal)
        self.start(epoch)
        self.read_ahead(self.rank_state())  # nothing left for this rank: the next epoch begins

    def read_ahead(self, state: dict[str, Any]) -> None:
        """After a restore, read the batch the loader gives next; where there is none, the next
        epoch begins. Ranks that agree on each epoch's end (``even_batches``) agree here too: a
        state taken after the last batch the ranks agreed on may leave one rank with batches
        and another without, and the uninterrupted run ended that epoch on every rank there."""
        epoch = self.epoch
        try:
            item, have = next(self.run.root), True
        except StopIteration:
            item, have = END, False
        # every rank loads its state, so every rank asks here (once torch.distributed is up;
        # before it, the first batch's agreement is the first collective, as without a restore)
        if self.run.ranks.all_have_if_up(have):
            self.peeked = [item]
            self.peek_state = state
            return
        if have:
            log.info("rank %d: epoch %d resumes at its end, where another rank has no batch left; "
                     "this rank's remaining batches are left unread, as in the uninterrupted run",
                     self.run.compiled.rank, epoch)
        self.start(epoch + 1)

    # ----- batches ------------------------------------------------------------------------
    def keep_behind(self, batches: int) -> None:
        """Keep the rank states from before the last ``batches`` batches of each epoch."""
        self.keep = batches
        self.behind = deque(self.behind, maxlen=max(1, batches))

    def next(self, generation: int) -> Any:
        """The next batch of the iterator of ``generation`` (StopIteration: its epoch ended).

        The rank state from before it is kept where ``keep_behind`` asked, and before an epoch's
        first batch always (once an epoch: as good as free; a consumer that reads ahead may
        have taken that batch before it could ask). Taking that state walks the graph: where
        every batch paid it, it was much of what text.yaml's loader added over its nodes
        (``benchmarks/text_throughput.py --breakdown``, docs/performance.md)."""
        if self.exhausted or not self.started or generation != self.generation:
            raise StopIteration
        before = self.rank_state() if self.keep or not self.yielded else None
        run = self.run
        have = True
        if self.peeked:
            item = self.peeked.pop()
            self.peek_state = None
            have = item is not END
        else:
            try:
                item = run.pull()
            except StopIteration:
                have = False
        agree = run.ranks.agree  # the ranks agree on each epoch's end: every rank asks
        if not (have if agree is None else agree.all_have(have)):
            self.exhausted = True
            if have:  # another rank ran out first: this rank's rest of the epoch stays unread
                self.cut = True
                self.epochs_cut += 1
                (log.warning if self.epochs_cut == 1 else log.info)(
                    "rank %d: epoch %d ends after %d batches, where another rank ran out; this rank's "
                    "remaining batches are left unread (even_batches keeps DDP from hanging)",
                    run.compiled.rank, self.epoch, self.yielded)
            raise StopIteration
        self.yielded += 1
        self.taken = self.used = True
        if before is not None:
            self.behind.append(before)
        elif self.behind:  # a batch whose state was not kept: the ones before it are no longer "behind"
            self.behind.clear()
        listings = run.ranks.listings
        if listings is not None:  # the ranks list the same files (graphs/listings.py)
            listings.after_batch(run.root.state_dict)
        return item

    def peek(self) -> Any:
        """The batch given next, without taking it (see ``Loader.peek``)."""
        if not self.started or self.exhausted:
            self.generation += 1  # an iterator that ended stays ended
            self.start(self.epoch + 1)
        if not self.peeked:
            state = self.rank_state()
            try:
                self.peeked = [next(self.run.root)]
            except StopIteration:
                self.peeked = [END]
            self.peek_state = state
        item = self.peeked[-1]
        if item is END:
            path = self.run.compiled.plan.path
            if self.yielded:
                raise ConveyorError(f"{path}: epoch {self.epoch} has no batch left after "
                                    f"{self.yielded}; iterating the loader again starts epoch "
                                    f"{self.epoch + 1}")
            raise ConveyorError(f"{path}: epoch {self.epoch} has no batches at all "
                                "(no input, or fewer items than one batch with drop_last)")
        return item

    # ----- state --------------------------------------------------------------------------
    def rank_state(self) -> dict[str, Any]:
        """This rank's own state, as plain data (``conveyor/graphs/state.py``)."""
        if self.peek_state is not None:
            return self.peek_state
        if not self.started:
            self.start(0)
        return self.run.states.rank_state(self.epoch, self.yielded, self.cut, self.run.root.state_dict())

    def kept(self, behind: int) -> dict[str, Any]:
        """The rank state from before the last ``behind`` batches of the epoch.

        Raises:
            ValueError: ``behind`` is more batches than were kept.
        """
        kept = self.behind
        if not 0 < behind <= len(kept):
            raise ValueError(f"{self.run.compiled.plan.path}: no state from {behind} batch(es) back: the "
                             f"loader has the states from before the last {len(kept)} batch(es) of this "
                             f"epoch; loader.keep_behind({behind}) before iterating keeps them "
                             f"(conveyor.lightning.ExactResume asks for them; without it, only the state from "
                             f"before an epoch's first batch is kept)")
        return kept[-behind]

"""shard: keep this rank's (and this worker's) share of a stream, the same amount on each.

Item ``i`` goes to rank ``i % world``; inside a rank, the rank's ``j``-th item goes to
worker copy ``j % workers``. So a rank gets the same items whatever its number of worker
copies, and merging the copies round-robin gives back the rank's order exactly. Rank and world come from ``torch.distributed`` when it is
initialised, else from the ``RANK`` and ``WORLD_SIZE`` environment variables (what torchrun
sets), else 0 and 1; explicit values override. ``worker``/``workers`` are set by the
compiler when the graph runs in several worker copies (a spec's top-level ``workers``).

Equal epochs: if the items do not divide evenly, some ranks would get one more than others
and a DDP job would hang at the end of the epoch. ``equalize`` fixes that:
``repeat`` (default, like DistributedSampler) wraps around to the first items of the epoch
so that every rank gets ``ceil(n / world)`` items; ``drop`` stops every rank at
``floor(n / world)``; ``none`` keeps the uneven split. (Worker copies inside a rank may
differ by one item: the merge handles that.) The item count ``n`` comes from the
input's ``count()`` when it has one (list_files does, from its listing), else from one
counting pass over the input at the start of the epoch. ``stats()`` says what was done.

Elastic resume: ``set_deal(deal)`` (or a state that carries one) makes the shard deal, for the
one epoch the deal names, only the positions an interrupted run on another world size or
number of copies left (``_elastic.remaining``), in order, with the same rules (slot, equalize)
as a whole epoch; the next epochs are whole again. ``elastic_taken`` names, from an old slot's
state, what that slot had consumed. The state then also holds the deal (a few ints per old
slot, plus a bitmap of a shuffle window) and how far the input was read.
"""

from __future__ import annotations

import logging
import os

from torchdata.nodes import BaseNode

from conveyor.errors import StateError
from conveyor.nodes import capabilities as cap
from conveyor.nodes._elastic import Cursor, deal_end, remaining, slot_items
from conveyor.nodes.state_shape import Bool, Child, Fields, Int, ListOf, Null, Str

log = logging.getLogger(__name__)
EQUALIZE = ("repeat", "drop", "none")


def dist_rank_world() -> tuple[int, int]:
    """(rank, world) from torch.distributed when initialised, else RANK/WORLD_SIZE, else (0, 1)."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:  # a torch build without distributed
        pass
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def count_items(node: BaseNode) -> int:
    """Items per epoch of ``node``: its ``count()`` when it has one, else a counting pass
    (which leaves the node reset to the start of the epoch)."""
    n = cap.count(node)
    if n is not None:
        return int(n)
    log.info("shard: counting the input's items for equalize (a pass over the input)")
    node.reset()
    n = sum(1 for _ in node)
    node.reset()
    return n


# an elastic deal (nodes/_elastic.py): per interruption, the old slots' [rank, copy, prefix, bits]
DEAL_SHAPE = Fields({"epoch": Int(), "levels": ListOf(Fields({
    "world": Int(min=1), "workers": Int(min=1), "equalize": Str(),
    "slots": ListOf(ListOf(Int() | Str()))}))})


class Shard(BaseNode):
    """Keep this rank's items (every ``world``-th), and of those this worker's (every ``workers``-th).

    Args:
        source: the stream to split.
        rank: this process's rank; ``None`` detects it.
        world: the number of ranks; ``None`` detects it.
        worker: this copy's index inside the rank.
        workers: copies per rank.
        equalize: ``"repeat"``, ``"drop"`` or ``"none"`` (see the module docstring).

    Example:
        >>> from torchdata.nodes import IterableWrapper
        >>> list(Shard(IterableWrapper(range(10)), rank=1, world=3, equalize="none"))
        [1, 4, 7]
    """

    SOURCE_KEY = "source"
    POS_KEY = "pos"
    WRAPPED_KEY = "wrapped"
    TOTAL_KEY = "total"
    DEAL_KEY = "deal"
    READ_KEY = "read"
    STATE_SHAPE = Fields({SOURCE_KEY: Child(), POS_KEY: Int(), WRAPPED_KEY: Bool(), TOTAL_KEY: Null(Int()),
                          DEAL_KEY: Null(DEAL_SHAPE), READ_KEY: Int()}, optional=(TOTAL_KEY, DEAL_KEY, READ_KEY))

    def __init__(self, source: BaseNode, *, rank: int | None = None, world: int | None = None,
                 worker: int = 0, workers: int = 1, equalize: str = "repeat"):
        super().__init__()
        det_rank, det_world = dist_rank_world()
        self.rank = det_rank if rank is None else rank
        self.world = det_world if world is None else world
        if self.world < 1:
            raise ValueError(f"world={self.world} must be >= 1")
        if not 0 <= self.rank < self.world:
            raise ValueError(f"rank={self.rank} must be in [0, world={self.world})")
        if workers < 1 or not 0 <= worker < workers:
            raise ValueError(f"{worker=} must be in [0, {workers=}) and workers >= 1")
        if equalize not in EQUALIZE:
            raise ValueError(f"{equalize=} must be one of {EQUALIZE}")
        self.source = source
        self.worker = worker
        self.workers = workers
        self.equalize = equalize
        self._pos = 0
        self._wrapped = False
        self._total: int | None = None
        self._end: int | None = None  # positions [0, end) are dealt out; None = until exhausted
        self.epoch = 0
        self._next_deal: dict | None = None  # set_deal: applies when the epoch it names starts
        self._deal: dict | None = None       # this epoch's deal, if elastic
        self._left = None                    # its remaining global positions
        self._read = 0                       # with a deal: input items read in this pass

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def set_deal(self, deal: dict | None) -> None:
        """Deal only what ``deal`` left of its epoch (``{"epoch", "levels"}``) at the next reset
        that starts that epoch from its beginning; None cancels."""
        self._next_deal = deal

    def _plan_epoch(self) -> None:
        self._total = self._end = None
        if self._deal is not None:
            self._total = count_items(self.source)
            self._left = remaining(self._total, self._deal["levels"])
            self._end = deal_end(len(self._left), self.world, self.equalize)
            return
        self._left = None
        if self.equalize == "none" or self.world == 1:
            self._total = cap.count(self.source)  # noted for elastic resume when it is cheap
            return
        total = count_items(self.source)
        self._total = total
        if self.equalize == "drop":
            self._end = total // self.world * self.world
        else:
            self._end = -(-total // self.world) * self.world

    def count(self) -> int | None:
        """Items this shard yields per epoch, when known."""
        if self._end is None:
            return None
        return sum(1 for p in range(self.rank, self._end, self.world) if self._mine(p))

    def stats(self) -> dict:
        """What equalize did for this slot this epoch: items dealt again, or items left out."""
        if self._total is None or self._end is None:
            return {}
        if self._left is not None:
            return {"equalize": self.equalize, "elastic_left": len(self._left)}
        lo, hi = sorted((self._total, self._end))
        mine = sum(1 for p in range(lo, hi) if self._mine(p))
        return {"equalize": self.equalize, ("repeated" if self._end > self._total else "dropped"): mine}

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        if initial_state is not None:
            self._deal = initial_state.get(self.DEAL_KEY)
        else:
            pending = self._next_deal
            self._deal = pending if pending is not None and pending["epoch"] == self.epoch else None
        self._next_deal = None
        self._plan_epoch()
        self._read = 0
        if initial_state is not None:
            self.source.reset(initial_state[self.SOURCE_KEY])
            self._pos = initial_state[self.POS_KEY]
            self._wrapped = initial_state[self.WRAPPED_KEY]
            self._read = initial_state.get(self.READ_KEY, 0)
            last = self._end if self._end is not None else self._total
            if last is not None and self._pos > last:
                raise StateError(f"shard: the state is at position {self._pos} of an input whose epoch deals "
                                 f"{last} positions: not a state of this input")
        else:
            self.source.reset()
            self._pos = 0
            self._wrapped = False

    def _next_dealt(self):
        """With a deal: this slot's next position among those left, read from the input."""
        left, m = self._left, len(self._left)
        while self._pos < self._end:
            v = self._pos
            self._pos += 1
            if not self._mine(v):
                continue
            want = int(left[v % m])
            if want < self._read:  # equalize: repeat wraps to the first positions left
                self.source.reset()
                self._read, self._wrapped = 0, True
            while self._read < want:
                next(self.source)
                self._read += 1
            self._read += 1
            return next(self.source)
        raise StopIteration

    def next(self):
        if self._left is not None:
            return self._next_dealt()
        while True:
            if self._end is not None and self._pos >= self._end:
                raise StopIteration
            try:
                item = next(self.source)
            except StopIteration:
                if self._end is None or self._pos >= self._end or self._pos == 0:
                    raise
                # repeat: deal the first items of this epoch again until every slot is even
                self.source.reset()
                self._wrapped = True
                item = next(self.source)
            pos = self._pos
            self._pos += 1
            if self._mine(pos):
                return item

    def _mine(self, pos: int) -> bool:
        return pos % self.world == self.rank and (pos // self.world) % self.workers == self.worker

    def get_state(self) -> dict:
        state = {self.SOURCE_KEY: self.source.state_dict(), self.POS_KEY: self._pos,
                 self.WRAPPED_KEY: self._wrapped, self.TOTAL_KEY: self._total}
        if self._deal is not None:
            state[self.DEAL_KEY] = self._deal
            state[self.READ_KEY] = self._read
        return state

    @staticmethod
    def elastic_taken(cursor: Cursor, *, rank: int, world: int, worker: int, workers: int,
                      equalize: str) -> dict:
        """What the slot (rank, worker) of an old run had consumed, from a cursor on its output.

        Returns:
            ``{"slot": [rank, worker, count, extra offsets], "levels": the deal's levels so
            far, "epoch_total": items of the slot this epoch, "total": the input's count}``.
        """
        state = cursor.state or {}
        deal = state.get(Shard.DEAL_KEY)
        total = state.get(Shard.TOTAL_KEY)
        pos = state.get(Shard.POS_KEY, 0)
        emitted = slot_items(pos, rank, world, worker, workers)
        slot_total = None
        if total is not None:
            m = len(remaining(total, deal["levels"])) if deal else total
            slot_total = slot_items(deal_end(m, world, equalize), rank, world, worker, workers)
        return {"slot": [rank, worker, emitted + cursor.more, list(cursor.extra)],
                "levels": deal["levels"] if deal else [], "epoch": deal["epoch"] if deal else None,
                "slot_total": slot_total, "emitted_at_state": emitted, "total": total}

"""Following torch.distributed's world: the loader's rank and world, and what the ranks share.

A graph is compiled for the rank and world ``RANK``/``WORLD_SIZE`` (or torch.distributed) give
when it is built. Lightning's DDP starts its processes with LOCAL_RANK and WORLD_SIZE but no
RANK, and sets WORLD_SIZE in the first process only inside ``fit``; ``mp.spawn`` sets neither.
A loader built before ``init_process_group`` was then rank 0 of the wrong world on every
process: the ranks read the same share (or all of it) and DDP's all-reduces went out of step.
``world_moved`` tells the loader when to build its graph again (while nothing was taken or
loaded) or refuses to go on. ``every_rank_state`` gathers every rank's loader state into one,
for trainers that write the checkpoint of one process only (Lightning, HF Trainer, accelerate).

Where the graph runs on several ranks, ``Ranks`` holds what they do together: they agree on
each epoch's last batch (``conveyor/graphs/even.py``) and compare their listings through the
process group's store (``conveyor/graphs/listings.py``).
"""

from __future__ import annotations

import logging
from typing import Any

from conveyor.errors import ConveyorError
from conveyor.graphs.compile import Compiled
from conveyor.graphs.even import agreement_for
from conveyor.graphs.listings import ListingCheck, listings_to_check

log = logging.getLogger(__name__)


def dist_ready() -> bool:
    """Whether torch.distributed is initialised in this process."""
    try:
        import torch.distributed as dist

        return dist.is_available() and dist.is_initialized()
    except ImportError:
        return False


def world_size() -> int:
    """torch.distributed's world size, or 1 where it is not initialised."""
    if not dist_ready():
        return 1
    import torch.distributed as dist

    return dist.get_world_size()


def every_rank_state(state: dict[str, Any]) -> dict[str, Any]:
    """Every rank's entries of a loader state (``Loader.state_dict()``) merged into one dict, on
    every rank: a collective that every rank calls (``all_gather_object``). Each rank of the
    resumed run takes its own entry from it; a run on another world size resumes elastically.
    Without torch.distributed (one process) it is ``state`` itself."""
    if world_size() <= 1:
        return state
    import torch.distributed as dist

    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, state)
    merged = dict(state)
    for one in gathered:
        merged.update({k: v for k, v in one.items() if k.startswith("rank") and k[4:].isdigit()})
    return merged


def world_moved(compiled: Compiled, used: bool) -> bool:
    """Whether torch.distributed (initialised) runs this process as another rank or world than
    ``compiled`` was built for, so that the graph must be built again.

    Raises:
        ConveyorError: it does, and the loader was ``used`` (a batch taken or a state loaded).
    """
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    if (rank, world) == (compiled.rank, compiled.world):
        return False
    if used:
        raise ConveyorError(
            f"{compiled.plan.path}: this loader was built and used as rank {compiled.rank} of world "
            f"{compiled.world} (torch.distributed was not initialised: from RANK/WORLD_SIZE), but "
            f"torch.distributed runs this process as rank {rank} of world {world}: build the loader "
            "after init_process_group, or take batches and load states only after")
    log.info("%s: built as rank %d of world %d before torch.distributed was initialised; built "
             "again for rank %d of world %d", compiled.plan.path, compiled.rank, compiled.world, rank, world)
    return True


class Ranks:
    """What the ranks of one compiled graph do together: agree on each epoch's end (``agree``,
    asked before each batch), and check that they list the same files (``listings``, told after
    each batch; None where there is nothing to check).

    Args:
        compiled: the graph.
        digest: the spec's digest (the key of the ranks' listings in the store).
        serial: which loader of that spec this is in the process (``ListingCheck.serial``).
    """

    def __init__(self, compiled: Compiled, digest: str, serial: int):
        self.agree = agreement_for(compiled.plan, compiled.world)  # even batches across ranks
        listed = listings_to_check(compiled.plan) if compiled.world > 1 else []
        self.listings = ListingCheck(compiled.plan, listed, digest, serial, compiled.rank,
                                     compiled.world) if listed else None

    def all_have_if_up(self, have: bool) -> bool:
        """Whether every rank has a next batch (``have``: this one's), once torch.distributed is
        up (before it, ``have``); every rank calls it."""
        return self.agree.all_have(have) if self.agree is not None and dist_ready() else have

    def counted(self, rank: int, world: int) -> list[int]:
        """The ranks whose epoch length ``len()`` takes the fewest of: every rank where they
        agree on each epoch's end (and torch.distributed is up), else this one."""
        return list(range(world)) if self.agree is not None and dist_ready() else [rank]

    @property
    def agreeing(self) -> bool:
        return self.agree is not None and self.agree.active is not False

"""shard: keep this rank's (and this worker's) share of a stream.

Item ``i`` is kept when ``i % (world * workers) == rank * workers + worker``. Rank and world
come from ``torch.distributed`` when it is initialised, else from the ``RANK`` and
``WORLD_SIZE`` environment variables (what torchrun sets), else 0 and 1; explicit values
override. Inside one process there is one worker (``worker=0, workers=1``) until graph-level
worker copies exist; ``by: [rank, worker]`` in a spec already names both.
"""

from __future__ import annotations

import os

from torchdata.nodes import BaseNode


def dist_rank_world() -> tuple[int, int]:
    """(rank, world) from torch.distributed when initialised, else RANK/WORLD_SIZE, else (0, 1)."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:  # a torch build without distributed
        pass
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


class Shard(BaseNode):
    """Pass through every ``(world * workers)``-th item, starting at this rank/worker's slot.

    Args:
        source: the stream to split.
        rank: this process's rank; ``None`` detects it.
        world: the number of ranks; ``None`` detects it.
        worker: this copy's index inside the rank.
        workers: copies per rank.

    Example:
        >>> from torchdata.nodes import IterableWrapper
        >>> list(Shard(IterableWrapper(range(10)), rank=1, world=3))
        [1, 4, 7]
    """

    SOURCE_KEY = "source"
    POS_KEY = "pos"

    def __init__(self, source: BaseNode, *, rank: int | None = None, world: int | None = None,
                 worker: int = 0, workers: int = 1):
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
        self.source = source
        self.worker = worker
        self.workers = workers
        self._stride = self.world * workers
        self._slot = self.rank * workers + worker
        self._pos = 0

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        if initial_state is not None:
            self.source.reset(initial_state[self.SOURCE_KEY])
            self._pos = initial_state[self.POS_KEY]
        else:
            self.source.reset()
            self._pos = 0

    def next(self):
        while True:
            item = next(self.source)
            pos = self._pos
            self._pos += 1
            if pos % self._stride == self._slot:
                return item

    def get_state(self) -> dict:
        return {self.SOURCE_KEY: self.source.state_dict(), self.POS_KEY: self._pos}

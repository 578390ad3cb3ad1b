"""dataset: the indexes of a map-style dataset, in the order a sampler draws them, as records.

Each epoch's order comes from (seed, epoch) alone, the same on every rank (a ``shard`` after
this node deals it out, so ranks get disjoint positions of it):

- ``sequential``: ``0, 1, ..., n-1``;
- ``shuffle``: a permutation (``num_samples`` above ``n`` chains further permutations, below
  ``n`` takes the first ones);
- ``weighted``: ``num_samples`` draws with probability proportional to ``weights[i]``, with or
  without replacement: ``torch.multinomial`` over the weights, the rule of torch's
  ``WeightedRandomSampler``.

Records are ``{"index": i, "dataset": handle}`` (``conveyor.dataset``); a map with
``fn: conveyor.dataset:getitem`` reads the items. The state is the position in the epoch's
order and the dataset's length (a restore into a dataset of another length is a ``StateError``,
not a silent shift); the order itself is drawn again from (seed, epoch).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch
from torchdata.nodes import BaseNode

from conveyor.dataset import DatasetHandle
from conveyor.errors import StateError
from conveyor.nodes._rng import derive_seed
from conveyor.nodes.state_shape import Fields, Int

SAMPLERS = ("sequential", "shuffle", "weighted")


def bad_weight(weights: Sequence[float], n: int) -> tuple[int | None, str] | None:
    """Why ``weights`` cannot weigh a dataset of ``n`` items, as (the first bad weight's index
    or None, message), or ``None`` when they can."""
    if len(weights) != n:
        return None, f"expected one weight per item ({n}), got {len(weights)}"
    bad = [(i, w) for i, w in enumerate(weights) if not isinstance(w, (int, float)) or isinstance(w, bool)
           or math.isnan(w) or math.isinf(w) or w < 0]
    if bad:
        i, w = bad[0]
        return i, f"weights must be finite numbers >= 0; weight {i} is {w!r}" + (
            f" ({len(bad)} such weights)" if len(bad) > 1 else "")
    if not any(w > 0 for w in weights):
        return None, "weights are all 0: nothing could be drawn"
    return None


def weights_problem(weights: Sequence[float], n: int) -> str | None:
    """Why ``weights`` cannot weigh a dataset of ``n`` items, or ``None``."""
    found = bad_weight(weights, n)
    return None if found is None else found[1]


def epoch_order(n: int, *, sampler: str, seed: int, epoch: int, weights: Sequence[float] | None = None,
                num_samples: int | None = None, replacement: bool = True) -> torch.Tensor:
    """The indexes drawn in ``epoch``, from (seed, epoch) alone.

    Example:
        >>> epoch_order(4, sampler="sequential", seed=0, epoch=0).tolist()
        [0, 1, 2, 3]
    """
    if sampler == "sequential":
        return torch.arange(n if num_samples is None else min(n, num_samples))
    g = torch.Generator().manual_seed(derive_seed(seed, epoch) & ((1 << 63) - 1))
    count = n if num_samples is None else num_samples
    if sampler == "shuffle":
        parts = [torch.randperm(n, generator=g) for _ in range(-(-count // n))]
        return torch.cat(parts)[:count]
    w = torch.as_tensor(list(weights), dtype=torch.double)  # type: ignore[arg-type]
    return torch.multinomial(w, count, replacement, generator=g)


class DatasetSampler(BaseNode[dict]):
    """Yield ``{"index": i, "dataset": handle}`` for each index a sampler draws this epoch.

    Args:
        dataset: a ``DatasetHandle`` (or a dataset object, wrapped in one).
        sampler: ``"sequential"``, ``"shuffle"`` or ``"weighted"``.
        seed: the sampler's seed (the epoch is mixed in).
        weights: one number >= 0 per item, for ``"weighted"``.
        num_samples: draws per epoch (default: the dataset's length).
        replacement: ``"weighted"`` draws with replacement (an item may come several times).

    Example:
        >>> node = DatasetSampler(["a", "b", "c"], sampler="shuffle", seed=1)
        >>> sorted(r["index"] for r in node)
        [0, 1, 2]
    """

    POS_KEY = "pos"
    LEN_KEY = "len"
    STATE_SHAPE = Fields({POS_KEY: Int(), LEN_KEY: Int()})  # (pos may pass len: num_samples)

    def __init__(self, dataset: Any, *, sampler: str = "sequential", seed: int = 0,
                 weights: Sequence[float] | None = None, num_samples: int | None = None,
                 replacement: bool = True):
        super().__init__()
        self.handle = dataset if isinstance(dataset, DatasetHandle) else DatasetHandle(obj=dataset)
        self.n = len(self.handle.get())
        if sampler not in SAMPLERS:
            raise ValueError(f"{sampler=} must be one of {SAMPLERS}")
        if (weights is not None) != (sampler == "weighted"):
            raise ValueError("weights go with sampler='weighted', and it needs them")
        if weights is not None:
            problem = weights_problem(list(weights), self.n)
            if problem:
                raise ValueError(problem)
            positive = sum(1 for w in weights if w > 0)
            if not replacement and (num_samples or self.n) > positive:
                raise ValueError(f"{num_samples=} draws without replacement need as many items of "
                                 f"weight > 0; there are {positive}")
        if num_samples is not None and num_samples < 1:
            raise ValueError(f"{num_samples=} must be >= 1")
        self.sampler = sampler
        self.seed = seed
        self.weights = None if weights is None else list(weights)
        self.num_samples = num_samples
        self.replacement = replacement
        self.epoch = 0
        self._order: list[int] = []
        self._pos = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def count(self) -> int:
        """Records per epoch (for ``shard``'s equal split)."""
        if self.sampler == "sequential":
            return self.n if self.num_samples is None else min(self.n, self.num_samples)
        return self.n if self.num_samples is None else self.num_samples

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self._order = epoch_order(self.n, sampler=self.sampler, seed=self.seed, epoch=self.epoch,
                                  weights=self.weights, num_samples=self.num_samples,
                                  replacement=self.replacement).tolist()
        self._pos = 0
        if initial_state is not None:
            saved = initial_state[self.LEN_KEY]
            if saved != self.n:
                raise StateError(f"the state was saved over a dataset of {saved} items, this one has "
                                 f"{self.n}: the positions would not be the same items")
            self._pos = initial_state[self.POS_KEY]

    def next(self) -> dict:
        if self._pos >= len(self._order):
            raise StopIteration
        index = self._order[self._pos]
        self._pos += 1
        return {"index": index, "dataset": self.handle}

    def get_state(self) -> dict:
        return {self.POS_KEY: self._pos, self.LEN_KEY: self.n}

"""synthetic: made-up image records, for measuring a model (or a graph) without data.

Like torchvision's ``FakeData`` or a classic script's ``--dummy``: ``count`` records
``{"image": tensor [C, H, W], "label": int, "index": i}``, the shape of the image decoder's
output, in index order. Record ``i`` is the same whatever the epoch, rank or resume: its
pixels are a window of one random pool drawn once from ``seed`` (at an offset derived from
(seed, i)), copied, so a record costs a memcpy, not a random draw; its label derives from
(seed, i). The order is global (the same on every rank): a ``shard`` after it deals it out
by rank and worker, and elastic resume deals what no old rank consumed. The state is the
position and the count.
"""

from __future__ import annotations

import numpy as np
import torch
from torchdata.nodes import BaseNode

from conveyor.errors import StateError
from conveyor.nodes._rng import derive_seed
from conveyor.nodes.state_shape import Fields, Int

DTYPES = {"uint8": torch.uint8, "float32": torch.float32}
_SLACK = 4096  # the pool is this many values longer than one image: the offsets' range


class Synthetic(BaseNode[dict]):
    """Yield ``count`` deterministic fake image records.

    Args:
        count: records per epoch (> 0).
        shape: the image's ``[C, H, W]``.
        classes: labels are in ``range(classes)``.
        dtype: ``"uint8"`` (0..255, as decoded) or ``"float32"`` (standard normal, as normalised).
        seed: pixels and labels derive from it and the index.

    Example:
        >>> node = Synthetic(count=3, shape=[3, 4, 4], classes=10)
        >>> [r["index"] for r in node], next(iter(Synthetic(count=1, shape=[3, 4, 4])))["image"].shape
        ([0, 1, 2], torch.Size([3, 4, 4]))
    """

    POS_KEY = "pos"
    COUNT_KEY = "count"
    STATE_SHAPE = Fields({POS_KEY: Int(at_most=COUNT_KEY), COUNT_KEY: Int(min=1)})

    def __init__(self, *, count: int, shape: list[int] | tuple[int, ...] = (3, 224, 224), classes: int = 1000,
                 dtype: str = "uint8", seed: int = 0):
        super().__init__()
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"{count=} must be an int > 0")
        if len(shape) != 3 or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
            raise ValueError(f"{shape=} must be [C, H, W], three ints > 0")
        if isinstance(classes, bool) or not isinstance(classes, int) or classes < 1:
            raise ValueError(f"{classes=} must be an int > 0")
        if dtype not in DTYPES:
            raise ValueError(f"{dtype=} must be one of {list(DTYPES)}")
        self.n, self.shape, self.classes, self.dtype, self.seed = count, tuple(shape), classes, dtype, seed
        self._pool: np.ndarray | None = None
        self._pos = 0

    def _pool_values(self) -> np.ndarray:
        if self._pool is None:
            size = self.shape[0] * self.shape[1] * self.shape[2] + _SLACK
            g = torch.Generator().manual_seed(derive_seed(self.seed, 1) & ((1 << 63) - 1))
            self._pool = (torch.randint(0, 256, (size,), dtype=torch.uint8, generator=g)
                          if self.dtype == "uint8" else torch.randn(size, generator=g)).numpy()
        return self._pool

    def count(self) -> int:
        """Records per epoch (for ``shard``'s equal split and ``len(loader)``)."""
        return self.n

    def record(self, i: int) -> dict:
        """Record ``i``, the same every time."""
        h = derive_seed(self.seed, 2, i)
        size = self.shape[0] * self.shape[1] * self.shape[2]
        offset = h % _SLACK
        # numpy's copy, not torch's clone: a torch op here fans out to OpenMP threads (collate.py)
        image = torch.from_numpy(self._pool_values()[offset:offset + size].copy()).view(self.shape)
        return {"image": image, "label": (h >> 16) % self.classes, "index": i}

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self._pos = 0
        if initial_state is not None:
            if initial_state[self.COUNT_KEY] != self.n:
                raise StateError(f"the state was saved over {initial_state[self.COUNT_KEY]} synthetic records, "
                                 f"this node makes {self.n}")
            self._pos = initial_state[self.POS_KEY]

    def next(self) -> dict:
        if self._pos >= self.n:
            raise StopIteration
        self._pos += 1
        return self.record(self._pos - 1)

    def get_state(self) -> dict:
        return {self.POS_KEY: self._pos, self.COUNT_KEY: self.n}

"""shuffle_buffer: shuffle through a window of ``size`` items, with a state of three numbers.

The stream is cut into consecutive windows of ``size`` items; each window is read whole,
permuted with a generator seeded from (seed, epoch, rank, window number), and emitted. The
state is the upstream state at the start of the current window, the window number and the
position inside it: never the items. Restoring replays at most ``size`` upstream items
(small records, before decode) and skips what was already emitted — Grain's window shuffle.

Against a reservoir buffer of the same size, a window never lets an item wander into a later
window; combine it with ``list_files(shuffle=True)`` (a full permutation of the listing each
epoch) for a global shuffle, as the bundled specs do.
"""

from __future__ import annotations

import random

from torchdata.nodes import BaseNode

from conveyor.nodes._rng import derive_seed


class ShuffleBuffer(BaseNode):
    """Emit the stream shuffled within consecutive windows of ``size`` items.

    Args:
        source: the stream (best small records: a restore re-reads up to ``size`` of them).
        size: items per window, > 0.
        seed: base seed; the permutation also depends on the epoch and ``rank``.
        rank: mixed into the seed so that ranks shuffle differently.

    Example:
        >>> from torchdata.nodes import IterableWrapper
        >>> sorted(ShuffleBuffer(IterableWrapper(range(5)), size=3, seed=1)) == list(range(5))
        True
    """

    SOURCE_KEY = "source"
    WINDOW_KEY = "window"
    POS_KEY = "pos"

    def __init__(self, source: BaseNode, *, size: int, seed: int = 0, rank: int = 0):
        super().__init__()
        if not isinstance(size, int) or size <= 0:
            raise ValueError(f"{size=} must be a positive int")
        self.source = source
        self.size = size
        self.seed = seed
        self.rank = rank
        self.epoch = 0
        self._window = 0
        self._pos = 0
        self._buf: list = []
        self._start_state: dict | None = None
        self._exhausted = False

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _fill(self) -> None:
        self._start_state = self.source.state_dict()
        buf = []
        for _ in range(self.size):
            try:
                buf.append(next(self.source))
            except StopIteration:
                self._exhausted = True
                break
        random.Random(derive_seed(self.seed, self.epoch, self.rank, self._window)).shuffle(buf)
        self._buf = buf

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self._exhausted = False
        if initial_state is not None:
            self.source.reset(initial_state[self.SOURCE_KEY])
            self._window = initial_state[self.WINDOW_KEY]
            self._fill()
            self._pos = min(initial_state[self.POS_KEY], len(self._buf))
        else:
            self.source.reset()
            self._window = 0
            self._fill()
            self._pos = 0

    def next(self):
        if self._pos >= len(self._buf):
            if self._exhausted:
                raise StopIteration
            self._window += 1
            self._fill()
            self._pos = 0
            if not self._buf:
                raise StopIteration
        item = self._buf[self._pos]
        self._buf[self._pos] = None  # let emitted items go
        self._pos += 1
        return item

    def get_state(self) -> dict:
        return {self.SOURCE_KEY: self._start_state, self.WINDOW_KEY: self._window,
                self.POS_KEY: self._pos}

"""shuffle_buffer: shuffle through windows of ``size`` items, never stalling between windows.

The stream is cut into consecutive windows of ``size`` items; each window is permuted with a
generator seeded from (seed, epoch, rank, window number) and emitted. The next window is read
while the current one drains: every item emitted is preceded by one upstream read into the
next window, so once the first window of an epoch is full, nothing downstream ever waits for a
fill (a window that fills before it emits cut a 2-thread map to 0.53 x its rate; this keeps
it level with no shuffle, see ``benchmarks/RESULTS.md``). Only the first window of an epoch is
read before its first item comes out. Memory: up to two windows of items.

The state is the upstream state at the start of the current window, the window number, the
position inside it and the window size: never the items (a few hundred bytes plus the
upstream's state). Restoring re-reads the current window and the part of the next one that
had been read, at most two windows (small records, before decode), and skips what was
already emitted — Grain's window shuffle, with the refill overlapped. A state from another
``size`` is refused with a ``StateError`` (its windows are other windows: resuming it would
repeat some items and lose others).

Against a reservoir buffer of the same size, a window never lets an item wander into a later
window; combine it with ``list_files(shuffle=True)`` (a full permutation of the listing each
epoch) for a global shuffle, as the bundled specs do.

Elastic resume (``elastic_input``): the items a partly drained window already emitted are
named by their places in the window (the permutation is known from the seed), so what an
interrupted run consumed stays a prefix of the input plus at most one window's positions.
"""

from __future__ import annotations

import random
from operator import itemgetter
from typing import Callable

import numpy as np

from torchdata.nodes import BaseNode

from conveyor.errors import StateError
from conveyor.nodes.capabilities import take_exactly
from conveyor.nodes._elastic import Cursor, compact
from conveyor.nodes._rng import derive_seed
from conveyor.nodes.state_shape import Child, Fields, Int, Str


_NONES = [None] * 1024


def window_order(n: int, seed: int, epoch: int, rank: int, window: int) -> list[int]:
    """The order of a window's ``n`` items: position ``i`` of the output is item ``order[i]``.

    A stable argsort of ``n`` random 64-bit keys from ``random.Random`` seeded by (seed, epoch,
    rank, window): the same on every platform and numpy version, and ~4 x cheaper per item
    than ``random.shuffle`` (0.12 against 0.46 us), which was a few percent of a text record.

    Example:
        >>> sorted(window_order(5, 0, 0, 0, 0))
        [0, 1, 2, 3, 4]
    """
    keys = np.frombuffer(random.Random(derive_seed(seed, epoch, rank, window)).randbytes(8 * n), "<u8")
    return keys.argsort(kind="stable").tolist()


def _check_order(state: dict, emitted: int) -> None:
    """Refuse a state with ``emitted`` items of its window out whose window was ordered another
    way (by ``random.shuffle``, before ``window_order``): resuming it would repeat some of the
    window's items and lose others. A state at a window's start resumes anywhere."""
    if emitted and state.get(ShuffleBuffer.ORDER_KEY) != ShuffleBuffer.ORDER:
        raise StateError(
            "shuffle_buffer: the state was taken mid-window by an earlier conveyor, which ordered "
            "its windows another way; resuming it here would repeat some items of that window and "
            "lose others. Finish the epoch with that version, or start the next one afresh "
            "(loader.set_epoch(epoch + 1)).")


class ShuffleBuffer(BaseNode):
    """Emit the stream shuffled within consecutive windows of ``size`` items.

    Args:
        source: the stream (best small records: a restore re-reads up to two windows of them).
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
    SIZE_KEY = "size"
    ORDER_KEY = "order"
    STATE_SHAPE = Fields({SOURCE_KEY: Child(), WINDOW_KEY: Int(), POS_KEY: Int(at_most=SIZE_KEY),
                          SIZE_KEY: Int(min=1), ORDER_KEY: Str()}, optional=(SIZE_KEY, ORDER_KEY))
    ORDER = "argsort"  # how windows are ordered (window_order); states before it had none

    def __init__(self, source: BaseNode, *, size: int, seed: int = 0, rank: int = 0):
        super().__init__()
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise ValueError(f"{size=} must be a positive int")
        self.source = source
        self.size = size
        self.seed = seed
        self.rank = rank
        self.epoch = 0
        self._window = 0
        self._pos = 0
        self._buf: list | None = None  # the window being emitted (None: not read yet)
        self._ahead: list = []  # the next window, being read
        self._start_state: dict | None = None  # upstream state where the window starts
        self._ahead_state: dict | None = None  # ... and where the next one starts
        self._exhausted = False

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _read(self, into: list, n: int) -> None:
        """Read up to ``n`` upstream items into ``into`` (fewer once the upstream is done)."""
        if n <= 0 or self._exhausted:
            return
        items = take_exactly(self.source, n)
        if len(items) < n:
            self._exhausted = True
        into += items

    def _permute(self, buf: list) -> list:
        if len(buf) < 2:
            return buf
        return list(itemgetter(*window_order(len(buf), self.seed, self.epoch, self.rank, self._window))(buf))

    def _load(self, ahead: int) -> None:
        """Read the current window (upstream at its start), then ``ahead`` items of the next."""
        buf: list = []
        self._read(buf, self.size)
        self._buf = self._permute(buf)
        self._ahead = []
        self._ahead_state = self.source.state_dict() if not self._exhausted else None
        self._read(self._ahead, ahead)

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self._exhausted = False
        self._buf = None
        self._ahead = []
        self._ahead_state = None
        if initial_state is None:
            self.source.reset()
            self._window, self._pos = 0, 0
            self._start_state = self.source.state_dict()
            return
        size = initial_state.get(self.SIZE_KEY, self.size)
        if size != self.size:
            raise StateError(f"shuffle_buffer: the state was taken with size={size}, this node has "
                             f"size={self.size}; its windows are other windows, so resuming would "
                             "repeat some items and lose others (start the epoch afresh, or keep the size)")
        self.source.reset(initial_state[self.SOURCE_KEY])
        self._start_state = initial_state[self.SOURCE_KEY]
        self._window = initial_state[self.WINDOW_KEY]
        pos = initial_state[self.POS_KEY]
        _check_order(initial_state, pos)
        if pos:  # resume mid-window: as the uninterrupted run, with `pos` items read ahead
            self._load(ahead=pos)
            if pos > len(self._buf):
                raise StateError(f"shuffle_buffer: the state is at item {pos} of window "
                                 f"{self._window}, which now holds {len(self._buf)} items: "
                                 "the input changed since the state was taken")
        self._pos = pos

    def next(self):
        return self.next_many(1)[0]

    def next_many(self, n: int) -> list:
        """Up to ``n`` items, from one window at most (nodes/capabilities.py)."""
        if self._buf is None:  # the first window of the epoch: the one fill anyone waits for
            self._load(ahead=0)
        if self._pos >= len(self._buf):
            self._read(self._ahead, self.size - len(self._ahead))  # only when the window was
            if not self._ahead:                                     # short or restored mid-way
                self._exhausted = True
                raise StopIteration
            self._window += 1
            self._start_state = self._ahead_state
            self._buf = self._permute(self._ahead)
            self._ahead = []
            self._ahead_state = self.source.state_dict() if not self._exhausted else None
            self._pos = 0
        buf, pos = self._buf, self._pos
        k = min(n, len(buf) - pos)
        self._read(self._ahead, min(k, self.size - len(self._ahead)))  # the next window fills
        out = buf[pos:pos + k]                                          # as this one drains
        buf[pos:pos + k] = _NONES[:k] if k <= len(_NONES) else [None] * k  # let emitted items go
        self._pos = pos + k
        return out

    def get_state(self) -> dict:
        return {self.SOURCE_KEY: self._start_state, self.WINDOW_KEY: self._window,
                self.POS_KEY: self._pos, self.SIZE_KEY: self.size, self.ORDER_KEY: self.ORDER}

    @staticmethod
    def elastic_input(cursor: Cursor, *, size: int, seed: int, epoch: int, rank: int,
                      left_after: Callable[[Cursor], int]) -> Cursor:
        """The input items consumed, given what was consumed of the output (``cursor``).

        Args:
            cursor: on this node's output, from a state of this node.
            size, seed, epoch, rank: this node's settings in the run that saved the state.
            left_after: ``left_after(c)`` is how many input items follow the input cursor
                ``c`` this epoch (the last window can be short, and its length sets its
                permutation).
        """
        state = cursor.state
        start = None if state is None else state[ShuffleBuffer.SOURCE_KEY]
        window = 0 if state is None else state[ShuffleBuffer.WINDOW_KEY]
        pos = 0 if state is None else state[ShuffleBuffer.POS_KEY]
        if state is not None:
            _check_order(state, pos + cursor.more + len(cursor.extra))
        size = size if state is None else state.get(ShuffleBuffer.SIZE_KEY, size)
        head = pos + cursor.more
        outs = list(range(head)) + [head + e for e in cursor.extra]
        left = left_after(Cursor(start))
        taken: set[int] = set()
        offset = 0
        while outs and left > 0:
            n = min(size, left)
            perm = window_order(n, seed, epoch, rank, window) if n > 1 else [0] * n
            taken.update(offset + perm[o] for o in outs if o < n)
            outs = [o - n for o in outs if o >= n]
            offset, left, window = offset + n, left - n, window + 1
        more, extra = compact(taken)
        return Cursor(start, more, extra)

"""Private helpers for elastic resume: naming what an interrupted epoch consumed, in global terms.

A job that restarts on another number of ranks (or worker copies) continues the interrupted
epoch from the states of all its old ranks. ``shard`` deals its input's items by position:
position ``v`` goes to rank ``v % world`` and copy ``(v // world) % copies``, so a slot (one
rank's copy) takes the positions ``slot_start + world * copies * t`` for t = 0, 1, ... Each old
slot's state says how many of its items were consumed downstream (``count``: a prefix of its
positions) plus, where a shuffle window was partly drained, which of the following ones
(``extra``: offsets after that prefix, bounded by the window). A ``Cursor`` carries that
description from the output of the graph down to the shard, each node translating "my state,
plus ``more`` outputs after it, plus the outputs at offsets ``extra`` after those" into the
same in terms of its input.

A *level* records one such interruption: the old world, copies and equalize rule, and per old
slot its count and extra (a bitmap, base64: a 10,000-item window costs at most 1.7 KB).
``remaining(n, levels)`` gives the positions not consumed, in order; the new shard deals those
to the new slots as it deals a whole epoch. A second interruption in the same epoch adds a
level over the positions the first one left.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Cursor:
    """What was consumed at a node's output: its ``state`` (where a restore starts; None: the
    epoch's start), ``more`` outputs after it, and the outputs at offsets ``extra`` after those."""

    state: Any
    more: int = 0
    extra: tuple[int, ...] = field(default_factory=tuple)

    def through(self, key: str = "source") -> "Cursor":
        """The same cursor on the input of a one-to-one node whose state nests its input's under ``key``."""
        return Cursor(None if self.state is None else self.state[key], self.more, self.extra)

    def scaled(self, state: Any, per_output: int) -> "Cursor":
        """On the input of a node that reads ``per_output`` input items per output (a batch)."""
        extra = tuple(e * per_output + i for e in self.extra for i in range(per_output))
        return Cursor(state, self.more * per_output, extra)


def compact(taken: set[int] | list[int], base: int = 0) -> tuple[int, tuple[int, ...]]:
    """(prefix, rest): ``base`` plus the offsets ``taken`` as a longer prefix and the offsets after it."""
    offsets = sorted(set(taken))
    run = 0
    while run < len(offsets) and offsets[run] == run:
        run += 1
    return base + run, tuple(o - run for o in offsets[run:])


def encode_bits(offsets: tuple[int, ...] | list[int]) -> str:
    """A set of small non-negative ints as a base64 bitmap (plain data, 1 bit per position)."""
    if not offsets:
        return ""
    bits = np.zeros(max(offsets) + 1, dtype=bool)
    bits[list(offsets)] = True
    return base64.b64encode(np.packbits(bits, bitorder="little").tobytes()).decode("ascii")


def decode_bits(text: str) -> list[int]:
    if not text:
        return []
    raw = np.frombuffer(base64.b64decode(text), dtype=np.uint8)
    return np.flatnonzero(np.unpackbits(raw, bitorder="little")).tolist()


def deal_end(m: int, world: int, equalize: str) -> int:
    """Positions ``[0, end)`` are dealt out of ``m``: padded (repeat), cut (drop) or all (none)."""
    if world == 1 or equalize == "none":
        return m
    if equalize == "drop":
        return m // world * world
    return -(-m // world) * world


def slot_start(rank: int, world: int, worker: int) -> int:
    return rank + world * worker


def slot_items(end: int, rank: int, world: int, worker: int, workers: int) -> int:
    """How many of the positions ``[0, end)`` belong to the slot (rank, worker)."""
    start = slot_start(rank, world, worker)
    return max(0, -(-(end - start) // (world * workers)))


def remaining(n: int, levels: list[dict]) -> np.ndarray:
    """The global positions (of ``n``) that the interruptions in ``levels`` left, in order."""
    left = np.arange(n, dtype=np.int64)
    for level in levels:
        m = len(left)
        taken = np.zeros(m, dtype=bool)
        world, workers = level["world"], level["workers"]
        for rank, worker, count, extra in level["slots"]:
            start, step = slot_start(rank, world, worker), world * workers
            ts = np.arange(count, dtype=np.int64)
            if extra:
                ts = np.concatenate([ts, count + np.asarray(decode_bits(extra), dtype=np.int64)])
            pos = start + step * ts
            if m:
                taken[pos % m] = True  # positions past m were the equalize padding: items again
        left = left[~taken]
    return left

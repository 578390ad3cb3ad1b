"""conveyor_repeat: a one-op conveyor plug-in, ``op: repeat`` (each item ``times`` times).

What a plug-in provides: a torchdata node (``Repeat``, which knows nothing of YAML), a frozen
params dataclass whose fields are the op's params (types, defaults and ``doc`` are what the
validator checks and ``conveyor ops repeat`` shows), a build function, and an ``OpSpec``
that the package's ``conveyor.ops`` entry point names (see pyproject.toml).

The ``OpSpec`` also declares what conveyor asks of any op (conveyor/graphs/opspec.py), so a
plug-in op is first-class: its length rule (``len(loader)``: ``times`` items per input
item), that ranks with equal counts keep them through it (``shard``'s ``equalize``), and its
elastic rule (which of its input items were consumed, for a resume on another world size).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from torchdata.nodes import BaseNode

from conveyor.graphs.registry import OpSpec, param


class Repeat(BaseNode):
    """Yield each item of ``source`` ``times`` times in a row.

    The state is the input's state before the current item and how many copies of it were
    yielded, so a restore reads that one item again and goes on.

    Args:
        source: the input stream.
        times: copies per item (>= 1).

    Example:
        >>> from torchdata.nodes import IterableWrapper
        >>> list(Repeat(IterableWrapper([1, 2]), times=2))
        [1, 1, 2, 2]
    """

    SOURCE_KEY = "source"
    DONE_KEY = "done"

    def __init__(self, source: BaseNode, *, times: int):
        super().__init__()
        if times < 1:
            raise ValueError(f"{times=} must be >= 1")
        self.source = source
        self.times = times
        self._before: Any = None  # the input's state before the current item
        self._item: Any = None
        self._done = 0

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self.source.reset(None if initial_state is None else initial_state[self.SOURCE_KEY])
        self._before = self.source.state_dict()
        self._done = 0 if initial_state is None else initial_state[self.DONE_KEY]
        if self._done:
            self._item = next(self.source)

    def next(self) -> Any:
        if self._done == 0 or self._done == self.times:
            self._before = self.source.state_dict()
            self._item = next(self.source)
            self._done = 0
        self._done += 1
        return self._item

    def get_state(self) -> dict:
        return {self.SOURCE_KEY: self._before, self.DONE_KEY: self._done}


@dataclass(frozen=True)
class RepeatParams:
    times: int = param(2, min=1, doc="copies of each item, in a row")


def _build(p: RepeatParams, inputs: list[BaseNode], ctx: Any) -> BaseNode:
    return Repeat(inputs[0], times=p.times)


def _length(p: RepeatParams, counts: list[int], where: Any, source: Callable[[], Any]) -> int:
    """Items per epoch: ``times`` for each item of the input."""
    return counts[0] * p.times


def _elastic(p: RepeatParams, ctx: Any, cursor: Any) -> Any:
    """What was consumed of the input, from what was consumed of the output (a cursor: a state,
    ``more`` outputs after it, and outputs at offsets ``extra`` after those). An input item
    counts as consumed once one of its copies was: the copies it had left are not yielded
    after a resume on another world size."""
    if cursor.state is None:
        before, done = None, 0
    else:
        before, done = cursor.state[Repeat.SOURCE_KEY], cursor.state[Repeat.DONE_KEY]
    start = done + cursor.more  # outputs taken in a row after `before` (the current item's copies first)
    items = {(start + e) // p.times for e in cursor.extra}
    prefix = -(-start // p.times)
    while prefix in items:
        prefix += 1
    extra = tuple(sorted(i - prefix for i in items if i >= prefix))
    return dataclasses.replace(cursor, state=before, more=prefix, extra=extra)


REPEAT = OpSpec("repeat", RepeatParams, _build, "one", "yield each item `times` times in a row",
                items_in="any items", items_out="the same items, each `times` times",
                example="twice: {op: repeat, times: 2}",
                length=_length, keeps_count="always", per_record=True, elastic=_elastic)

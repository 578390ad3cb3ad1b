"""conveyor_repeat: a one-op conveyor plug-in, ``op: repeat`` (each item ``times`` times).

What a plug-in provides: a torchdata node (``Repeat``, which knows nothing of YAML), a frozen
params dataclass whose fields are the op's params (types, defaults and ``doc`` are what the
validator checks and ``conveyor ops repeat`` shows), a build function, and an ``OpSpec``
that the package's ``conveyor.ops`` entry point names (see pyproject.toml).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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


REPEAT = OpSpec("repeat", RepeatParams, _build, "one", "yield each item `times` times in a row",
                items_in="any items", items_out="the same items, each `times` times",
                example="twice: {op: repeat, times: 2}")

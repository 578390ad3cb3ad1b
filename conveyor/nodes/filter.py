"""filter: drop the items for which ``fn(item, **args)`` is false, and count them.

Nothing is dropped silently: ``stats()["filtered"]`` says how many items the predicate
rejected in this epoch, and a ``StopIteration`` raised by ``fn`` is a ``SampleError`` naming
it and the item, not the end of the stream.
"""

from __future__ import annotations

from typing import Any, Callable

from torchdata.nodes import BaseNode
from conveyor.nodes.state_shape import Child, Fields, Int

from conveyor.nodes._workers.map_calls import stopped


class Filter(BaseNode):
    """Keep the items for which ``fn(item, **args)`` is true.

    Args:
        source: the input stream.
        fn: the predicate.
        args: keyword arguments for ``fn``.
        where: text for error notes (the node and spec line).

    Example:
        >>> from torchdata.nodes import IterableWrapper
        >>> list(Filter(IterableWrapper(range(6)), fn=lambda x: x % 2 == 0))
        [0, 2, 4]
    """

    SOURCE_KEY = "source"
    FILTERED_KEY = "filtered"
    STATE_SHAPE = Fields({SOURCE_KEY: Child(), FILTERED_KEY: Int()})

    def __init__(self, source: BaseNode, *, fn: Callable[..., Any], args: dict[str, Any] | None = None,
                 where: str | None = None):
        super().__init__()
        self.source = source
        self.fn = fn
        self.args = dict(args or {})
        self.where = where or f"filter {getattr(fn, '__name__', fn)!r}"
        self.filtered = 0

    def stats(self) -> dict[str, int]:
        return {"filtered": self.filtered}

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        if initial_state is not None:
            self.source.reset(initial_state[self.SOURCE_KEY])
            self.filtered = initial_state[self.FILTERED_KEY]
        else:
            self.source.reset()
            self.filtered = 0

    def next(self):
        while True:
            item = next(self.source)
            try:
                keep = self.fn(item, **self.args)
            except Exception as exc:
                err = stopped(exc, self.fn, item)  # a StopIteration would end the stream silently
                err.add_note(f"in {self.where}")
                raise err from err.__cause__
            if keep:
                return item
            self.filtered += 1

    def get_state(self) -> dict:
        return {self.SOURCE_KEY: self.source.state_dict(), self.FILTERED_KEY: self.filtered}

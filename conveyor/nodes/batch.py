"""batch: group consecutive items into lists of ``size``.

The state is the input's state: a batch is emitted whole, so no partial batch is ever
pending between two calls.
"""

from __future__ import annotations

from torchdata.nodes import BaseNode

from conveyor.nodes._elastic import Cursor
from conveyor.nodes.state_shape import Child, Fields


class Batch(BaseNode[list]):
    """Lists of ``size`` consecutive items; the last one shorter unless ``drop_last``.

    Args:
        source: the input stream.
        size: items per batch, > 0.
        drop_last: drop a final batch shorter than ``size``.

    Example:
        >>> from torchdata.nodes import IterableWrapper
        >>> list(Batch(IterableWrapper(range(5)), size=2))
        [[0, 1], [2, 3], [4]]
    """

    SOURCE_KEY = "source"
    STATE_SHAPE = Fields({SOURCE_KEY: Child()})

    def __init__(self, source: BaseNode, *, size: int, drop_last: bool = False):
        super().__init__()
        if not isinstance(size, int) or size <= 0:
            raise ValueError(f"{size=} must be a positive int")
        self.source = source
        self.size = size
        self.drop_last = drop_last

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self.source.reset(None if initial_state is None else initial_state[self.SOURCE_KEY])

    def next(self) -> list:
        batch = []
        for _ in range(self.size):
            try:
                batch.append(next(self.source))
            except StopIteration:
                break
        if not batch or (self.drop_last and len(batch) < self.size):
            raise StopIteration
        return batch

    def get_state(self) -> dict:
        return {self.SOURCE_KEY: self.source.state_dict()}

    @staticmethod
    def elastic_input(cursor: Cursor, *, size: int) -> Cursor:
        """Consumed input items, from consumed batches (elastic resume): ``size`` per batch."""
        state = None if cursor.state is None else cursor.state[Batch.SOURCE_KEY]
        return cursor.scaled(state, size)

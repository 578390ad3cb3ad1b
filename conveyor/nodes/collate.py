"""collate: turn a list of samples into a batch with torch's ``default_collate`` rules.

Tensors and numpy arrays are stacked, numbers become tensors, dicts and tuples are collated
field by field, strings stay lists. Stateless.
"""

from __future__ import annotations

from torch.utils.data import default_collate
from torchdata.nodes import BaseNode


class Collate(BaseNode):
    """Apply ``default_collate`` to each list the input yields.

    Example:
        >>> from torchdata.nodes import IterableWrapper
        >>> next(Collate(IterableWrapper([[{"x": 1}, {"x": 2}]])))["x"].tolist()
        [1, 2]
    """

    SOURCE_KEY = "source"

    def __init__(self, source: BaseNode, *, where: str | None = None):
        super().__init__()
        self.source = source
        self.where = where or "collate"

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self.source.reset(None if initial_state is None else initial_state[self.SOURCE_KEY])

    def next(self):
        batch = next(self.source)
        try:
            return default_collate(batch)
        except Exception as exc:
            exc.add_note(f"in {self.where}: samples of one batch must have the same shapes and "
                         "fields (use pad_collate for variable lengths)")
            raise

    def get_state(self) -> dict:
        return {self.SOURCE_KEY: self.source.state_dict()}

"""The token ids of a list of records as one block, for a consumer that takes ids in bulk.

A batch tokenizer (``conveyor.text:byte_tokenize`` with ``map``'s ``batch``) lays out every
record's ids in one buffer and then cuts it into a numpy view and a dict a record, which the
next node may only gather back into one array (``pack_tokens`` concatenates its pool's ids).
An ``IdsBlock`` is that buffer with the records' lengths, and makes the records themselves
only when asked (``records()``: what the tokenizer gives for the list, exactly), so that a
consumer that needs them only to name a bad one never pays for them otherwise.

``map`` hands a block out through ``next_ids`` (``nodes/capabilities.py``: ``IdsAtOnce``)
where its fn offers one (a ``columns`` attribute: ``fn.columns(items, **args) -> IdsBlock``)
and it runs inline; anything else takes the records as before.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

Records = Callable[[list, np.ndarray, np.ndarray], list]  # (items, ids, lengths) -> the records


class IdsBlock:
    """``ids`` (1-D, every record's ids one after another) and ``lengths`` (int64, a record's
    ids each) of the records made from ``items`` by ``make(items, ids, lengths)``, which hold
    their ids in ``field``.

    Example:
        >>> b = IdsBlock(np.array([1, 2, 3]), np.array([2, 1]), ["a", "b"], lambda i, x, n: list(zip(i, n.tolist())))
        >>> len(b), b.records(), b.field
        (2, [('a', 2), ('b', 1)], 'input_ids')
        >>> head, rest = b.split(1)
        >>> head.ids.tolist(), rest.ids.tolist(), rest.records()
        ([1, 2], [3], [('b', 1)])
    """

    __slots__ = ("ids", "lengths", "field", "_items", "_make")

    def __init__(self, ids: np.ndarray, lengths: np.ndarray, items: list, make: Records, field: str = "input_ids"):
        self.ids, self.lengths, self.field, self._items, self._make = ids, lengths, field, items, make

    def __len__(self) -> int:
        return len(self._items)

    def records(self) -> list:
        """The records of the block, as the fn gives them for its list."""
        return self._make(self._items, self.ids, self.lengths)

    def split(self, k: int) -> tuple["IdsBlock", "IdsBlock"]:
        """The first ``k`` records' block and the rest's."""
        end = int(self.lengths[:k].sum())
        return (IdsBlock(self.ids[:end], self.lengths[:k], self._items[:k], self._make, self.field),
                IdsBlock(self.ids[end:], self.lengths[k:], self._items[k:], self._make, self.field))

    @classmethod
    def of_records(cls, records: list, field: str) -> "IdsBlock | None":
        """The block of records that hold their ids in ``field`` (arrays, tensors, lists): the
        ids joined; None where they cannot be (no such field, ids of other dims, not numbers)."""
        try:
            values = [r[field] for r in records]
            lengths = np.fromiter(map(len, values), dtype=np.int64, count=len(values))
            ids = np.concatenate(values)
        except (KeyError, TypeError, IndexError, ValueError, RuntimeError):
            return None
        return cls(ids, lengths, records, _themselves, field)


def _themselves(items: list, ids: Any, lengths: Any) -> list:
    return items

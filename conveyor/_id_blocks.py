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

``bucket_batch`` goes one step further: it pools a block's items with each one's ids (the bytes
of its part of the buffer, not a numpy view and a dict), and hands a batch of them to a
``pad_collate`` after it as ``IdsRows`` (``next_rows``: ``RowsAtOnce``), which pads the ids
from the buffers and takes the other fields from the items where the block says which
(``carried``); anyone else gets the batch's records, made then. On text.yaml the records
were ~0.4 us of a record's ~4 us (a dict and a view each, which bucket_batch and pad_collate
only took apart again).
"""

from __future__ import annotations

from itertools import accumulate
from typing import Any, Callable

import numpy as np

Records = Callable[[list, np.ndarray, np.ndarray], list]  # (items, ids, lengths) -> the records


class IdsBlock:
    """``ids`` (1-D, every record's ids one after another) and ``lengths`` (int64, a record's
    ids each) of the records made from ``items`` by ``make(items, ids, lengths)``, which hold
    their ids in ``field``. ``carried``, where the fn knows it: the keys each record copies
    from its item, after ``field`` (the record is ``{field: ids, k: item[k] ...}`` in that
    order) for every item that has them all; an item that lacks one gets another record, so
    whoever builds fields from the items must take the records where a key is missing.
    ``None``: not known (take the records). A fn may give ``carried`` as a function of the
    items instead, asked only if someone reads it (it passes over every item: pack_tokens,
    which does not, saves that). The block belongs to whoever took it: it may clear ``items``
    as it goes, once it has read ``carried``.

    Example:
        >>> b = IdsBlock(np.array([1, 2, 3]), np.array([2, 1]), ["a", "b"], lambda i, x, n: list(zip(i, n.tolist())))
        >>> len(b), b.records(), b.field
        (2, [('a', 2), ('b', 1)], 'input_ids')
        >>> head, rest = b.split(1)
        >>> head.ids.tolist(), rest.ids.tolist(), rest.records()
        ([1, 2], [3], [('b', 1)])
    """

    __slots__ = ("ids", "lengths", "field", "items", "make", "_carried")

    def __init__(self, ids: np.ndarray, lengths: np.ndarray, items: list, make: Records, field: str = "input_ids",
                 carried: tuple[str, ...] | Callable[[list], tuple[str, ...] | None] | None = None):
        self.ids, self.lengths, self.field, self.items, self.make = ids, lengths, field, items, make
        self._carried = carried

    @property
    def carried(self) -> tuple[str, ...] | None:
        """The keys each record copies from its item (see the class), found when first asked."""
        got = self._carried
        if callable(got):
            got = self._carried = got(self.items)
        return got

    def __len__(self) -> int:
        return len(self.items)

    def records(self) -> list:
        """The records of the block, as the fn gives them for its list."""
        return self.make(self.items, self.ids, self.lengths)

    def split(self, k: int) -> tuple["IdsBlock", "IdsBlock"]:
        """The first ``k`` records' block and the rest's."""
        end = int(self.lengths[:k].sum())
        keys = self._carried  # (a function of the items: each part asks it of its own)
        return (IdsBlock(self.ids[:end], self.lengths[:k], self.items[:k], self.make, self.field, keys),
                IdsBlock(self.ids[end:], self.lengths[k:], self.items[k:], self.make, self.field, keys))

    def kind(self) -> tuple:
        """What rows of this block share with rows of another that may be batched together
        (``IdsRows``): how their records are made, their ids' dtype, field and carried keys."""
        return (self.make, self.ids.dtype, self.field, self.carried)

    def row_ids(self) -> list[bytes]:
        """Each record's ids, as the bytes of its part of the buffer (``IdsRows`` joins them):
        ~90 ns a record against ~120 for a numpy view. Not a ``memoryview`` of the buffer, as
        cheap to make: the garbage collector tracks memoryviews, and a thousand a block set
        off its young collections (text.yaml 1.03 x slower than bytes, benchmarks/checkouts_ab.py)."""
        raw = self.ids.tobytes()
        width = self.ids.itemsize
        ends = list(accumulate(self.lengths.tolist()))
        if width != 1:
            ends = [e * width for e in ends]
        return [raw[s:e] for s, e in zip([0, *ends[:-1]], ends)]

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


class IdsRows:
    """A batch of records not yet made: their ``items``, each one's ids (``ids``: buffers of
    ``dtype``, such as ``IdsBlock.row_ids``) and ``lengths``, of blocks of one ``kind``
    (``make``, dtype, ``field``, ``carried``: ``IdsBlock``'s). ``records()`` makes them.

    Example:
        >>> b = IdsBlock(np.array([1, 2, 3], np.int32), np.array([2, 1]), [{"i": 0}, {"i": 1}],
        ...              lambda i, x, n: [{"ids": v} for v in np.split(x, np.cumsum(n)[:-1])], "ids")
        >>> rows = IdsRows(b.items[::-1], b.row_ids()[::-1], [1, 2], b.kind())
        >>> rows.joined().tolist(), [r["ids"].tolist() for r in rows.records()]
        ([3, 1, 2], [[3], [1, 2]])
    """

    __slots__ = ("items", "ids", "lengths", "make", "dtype", "field", "carried")

    def __init__(self, items: list, ids: list, lengths: list[int], kind: tuple):
        self.items, self.ids, self.lengths = items, ids, lengths
        self.make, self.dtype, self.field, self.carried = kind

    def __len__(self) -> int:
        return len(self.items)

    def joined(self) -> np.ndarray:
        """Every row's ids, one row after another, in one writable array."""
        return np.frombuffer(bytearray().join(self.ids), self.dtype)

    def records(self) -> list:
        """The records, as the fn gives them for these items."""
        return self.make(self.items, self.joined(), np.array(self.lengths, dtype=np.int64))

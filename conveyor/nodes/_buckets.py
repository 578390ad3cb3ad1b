"""``bucket_batch``'s parts apart from reading its input and keeping its state: the rules
(what the params may be, an item's length, the truncation of an item over the last
boundary, boundaries from quantiles, a pool's size, how a sorted pool is cut into batches)
and ``Pools``, the per-bucket pools of an epoch and the batches cut from them.
"""

from __future__ import annotations

import math
import operator
from bisect import bisect_left
import random
from typing import Any, Callable, Sequence

import numpy as np
import torch

from conveyor._id_blocks import IdsRows
from conveyor.errors import SampleError

OVERFLOW = ("raise", "skip", "truncate", "own_bucket")
EMPTY = ("raise", "skip")
DEFAULT_POOL = 8
NONE, ALL = -1, -2  # state "emitting": no pool, or the end-of-epoch flush of every pool
_INF = float("inf")


def increasing_lengths(bounds: Any) -> bool:
    """Whether ``bounds`` is a non-empty sequence of increasing positive ints (bucket boundaries)."""
    return (bool(bounds) and all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in bounds)
            and all(a < b for a, b in zip(bounds, bounds[1:])))


def check_args(*, length: str | Callable[[Any], int], boundaries: Sequence[int] | str,
               batch_sizes: Sequence[int] | None, max_tokens: int | None, pad_to_multiple_of: int | None,
               pool: int, overflow: str | None, empty: str, auto_buckets: int, auto_sample: int,
               max_pending: int | None) -> str:
    """Check ``BucketBatch``'s arguments (a ``ValueError`` showing the value); returns the
    ``overflow`` rule, ``None`` resolved (``own_bucket`` with ``boundaries="auto"``, else ``raise``)."""
    auto = boundaries == "auto"
    if not auto:
        if isinstance(boundaries, str) or not increasing_lengths(boundaries):
            raise ValueError(f"{boundaries=} must be 'auto' or a non-empty list of increasing positive ints")
    overflow = overflow or ("own_bucket" if auto else "raise")
    if overflow not in OVERFLOW:
        raise ValueError(f"{overflow=} must be one of {OVERFLOW}")
    if empty not in EMPTY:
        raise ValueError(f"{empty=} must be one of {EMPTY}")
    if (batch_sizes is None) == (max_tokens is None):
        raise ValueError(f"give exactly one of batch_sizes and max_tokens ({batch_sizes=}, {max_tokens=})")
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens <= 0):
        raise ValueError(f"{max_tokens=} must be a positive int")
    if batch_sizes is not None:
        if auto:
            raise ValueError("boundaries='auto' needs max_tokens (the number of buckets is not known "
                             f"in advance), got {batch_sizes=}")
        want = len(boundaries) + (overflow == "own_bucket")
        if len(batch_sizes) != want or not all(isinstance(s, int) and s > 0 for s in batch_sizes):
            raise ValueError(f"{batch_sizes=} must be {want} positive ints (one per bucket"
                             + (", the last for the overflow bucket)" if overflow == "own_bucket" else ")"))
    for name, value in (("pool", pool), ("auto_buckets", auto_buckets), ("auto_sample", auto_sample)):
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name}={value!r} must be a positive int")
    if pad_to_multiple_of is not None and (not isinstance(pad_to_multiple_of, int) or pad_to_multiple_of <= 0):
        raise ValueError(f"{pad_to_multiple_of=} must be a positive int or None")
    if max_pending is not None and (not isinstance(max_pending, int) or max_pending <= 0):
        raise ValueError(f"{max_pending=} must be a positive int or None")
    if overflow == "truncate" and not isinstance(length, str):
        raise ValueError("overflow='truncate' needs length to be a field name (a length fn gives "
                         "nothing to cut); truncate in the tokenizer (max_length) instead")
    if not isinstance(length, str) and not callable(length):
        raise ValueError(f"{length=} must be a field name or a callable")
    return overflow


def item_where(item: Any) -> str:
    """An item named for a message: ``file:line``, ``file row N``, ``item N``, or ``an item``."""
    if isinstance(item, dict):
        if "file" in item and "line" in item:
            return f"{item['file']}:{item['line']}"
        if "file" in item and "row" in item:  # read_parquet's provenance
            return f"{item['file']} row {item['row']}"
        if "index" in item:
            return f"item {item['index']}"
    return "an item"


def _seq_len(value: Any) -> int | None:
    """The first-dim length of a sequence field (tensor, numpy array, list), else None."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return value.shape[0] if value.ndim else None
    return len(value) if isinstance(value, (list, tuple)) else None


def truncated(item: dict, field: str, n: int, keep: int) -> dict:
    """A copy of ``item`` with ``field`` (``n`` long) cut to ``keep``, and with it every other
    sequence field as long (labels, attention_mask, token_type_ids: the same positions)."""
    out = dict(item)
    for key, value in item.items():
        if key == field or (type(value) is not str and _seq_len(value) == n):
            out[key] = value[:keep]
    return out


def auto_boundaries(lengths: Sequence[int], buckets: int, multiple: int | None = None) -> list[int]:
    """Upper bounds at the ``1/buckets, 2/buckets, ..., 1`` quantiles of ``lengths``.

    Rounded up to ``multiple``, without duplicates; the last is the largest length.

    Example:
        >>> auto_boundaries([1, 2, 3, 4, 5, 6, 7, 8], 4)
        [2, 4, 6, 8]
    """
    s = sorted(max(int(n), 1) for n in lengths) or [1]
    out: list[int] = []
    for i in range(1, buckets + 1):
        q = s[max(math.ceil(i * len(s) / buckets) - 1, 0)]
        if multiple:
            q = -(-q // multiple) * multiple
        if not out or q > out[-1]:
            out.append(q)
    return out


def item_length(item: Any, length: str | Callable[[Any], int], where: str) -> int:
    """``item``'s length: ``len(item[length])`` for a field name, else ``length(item)``; a
    ``SampleError`` naming the item where there is none, or it is not an int >= 0."""
    try:
        if callable(length):
            n = length(item)
        else:
            v = item[length]
            n = v.shape[0] if isinstance(v, torch.Tensor) else len(v)  # Tensor.__len__ is slow
    except (KeyError, TypeError, IndexError) as exc:
        raise SampleError(f"{where}: cannot take the length of {item_where(item)} "
                          f"({type(exc).__name__}: {exc})") from exc
    try:
        n = operator.index(n)  # ints, numpy ints, integer 0-d tensors
    except TypeError:
        n = -1
    if n < 0:
        raise SampleError(f"{where}: the length of {item_where(item)} must be an int >= 0")
    return n


def pool_items(b: int, pool: int, batch_sizes: list[int] | None, max_tokens: int | None,
               boundaries: list[int]) -> int:
    """About how many items bucket ``b``'s pool holds when full (``pool`` batches' worth)."""
    if batch_sizes is not None:
        return pool * batch_sizes[b]
    lo = boundaries[b - 1] if b else 0
    hi = boundaries[b] if b < len(boundaries) else 2 * max(lo, 1)
    return max(math.ceil(pool * max_tokens / max((lo + hi) / 2, 1)), pool)  # type: ignore[operator]


_WALK = 8  # batch ends a walk of at most this many items finds; farther ones are bisected


def _batch_end(padded: list[int], start: int, n: int, budget: int) -> int:
    """The end of the batch from ``start`` in a pool sorted by length (``padded``, each at least
    1): as many items as fit ``budget`` (their count x the longest's padded length), one at
    least. No batch from ``start`` holds more than ``budget // padded[start]`` items (``hi``);
    one of ``budget // padded[hi - 1]`` fits, its items being no longer. In a bucket of similar
    lengths the two bounds are a few items apart, walked in Python steps where a bisection's
    key calls had cost a few times more; bounds farther apart are bisected."""
    hi = min(n, start + budget // padded[start])
    if hi <= start + 1:
        return start + 1  # one item, alone over the budget or not
    lo = min(hi, max(start + 1, start + budget // padded[hi - 1]))
    if hi - lo > _WALK:
        return bisect_left(range(lo, hi), True, key=lambda i: (i + 1 - start) * padded[i] > budget) + lo
    while lo < hi and (lo + 1 - start) * padded[lo] <= budget:
        lo += 1
    return lo


def cut_sorted(lens: list[int], *, size: int | None, budget: int | None,
               multiple: int | None) -> tuple[list[tuple[int, int]], bool]:
    """Cut a pool sorted by length (``lens``) into batches of ``size`` items, or of as many as
    fit ``budget`` tokens (batch size x the longest, rounded up to ``multiple``; an item alone
    over the budget is a batch of one). Returns the (start, end) of each batch and whether the
    last is partial (fewer than ``size``, or room for one more of its longest under the budget).

    Example:
        >>> cut_sorted([1, 2, 3, 4, 5], size=2, budget=None, multiple=None)
        ([(0, 2), (2, 4), (4, 5)], True)
    """
    n = len(lens)
    cuts: list[tuple[int, int]] = []  # (start, end) in lens
    if size is not None:
        cuts = [(i, min(i + size, n)) for i in range(0, n, size)]
        return cuts, bool(cuts) and cuts[-1][1] - cuts[-1][0] < size
    if not n:
        return cuts, False
    m = multiple
    arr = np.array(lens, dtype=np.int64)
    if m:
        arr = -(-arr // m) * m
    padded = np.maximum(arr, 1).tolist()
    start = 0
    while True:  # sorted: entry i is the longest of [start, i], so (i + 1 - start) * padded[i] grows with i
        end = _batch_end(padded, start, n, budget)  # type: ignore[arg-type]
        if end >= n:
            break
        cuts.append((start, end))
        start = end
    cuts.append((start, n))
    return cuts, (n - start + 1) * padded[n - 1] <= budget  # type: ignore[operator]


def _by_length(lens: list[int]) -> list[int]:
    """The positions of ``lens`` by length, equal lengths in their input order (a stable
    sort): numpy's for a pool of more than a few dozen (a third less than ``sorted`` with a
    key on text.yaml's pools of ~240), ``sorted``'s below that."""
    if len(lens) < 64:
        return sorted(range(len(lens)), key=lens.__getitem__)
    return np.array(lens, dtype=np.int64).argsort(kind="stable").tolist()


class Batch:
    """A batch cut from a pool: its bucket, items, longest length and real tokens; for a pool
    of a block's rows (``Pools.ids``), each item's ids, their lengths and the rows' kind
    (``IdsRows``: the records are made when the batch is emitted)."""

    __slots__ = ("bucket", "items", "longest", "real", "ids", "lens", "kind")

    def __init__(self, bucket: int, items: list, longest: int, real: int, ids: list | None = None,
                 lens: list[int] | None = None, kind: tuple | None = None):
        self.bucket, self.items, self.longest, self.real = bucket, items, longest, real
        self.ids, self.lens, self.kind = ids, lens, kind

    def rows(self) -> IdsRows:
        """The batch of rows (``ids`` not None)."""
        return IdsRows(self.items, self.ids, self.lens, self.kind)  # type: ignore[arg-type]


class Pools:
    """The per-bucket pools of one epoch, and the batches being emitted from one cut.

    ``items[b]``, ``lens[b]``: bucket ``b``'s items not yet cut and their lengths, two lists side
    by side (a ``(length, position, item)`` tuple an item stayed in the garbage collector's
    care, as a tuple holding a dict is never untracked, was promoted with the pool and set off
    a full collection, ~80 ms with torch loaded, every ~60 text.yaml epochs); ``first[b]`` the
    input position of its first item (``_INF``: none); ``tokens[b]`` their weight (items, or
    tokens under a budget); ``read[b]``/``done[b]`` the bucket's items read this epoch and
    emitted of them; ``oldest`` the input position of the oldest pooled item. ``ids[b]``: None
    where the pool holds records; a list side by side with ``items[b]`` where it holds the
    items of ``IdsBlock`` rows of one kind (``kinds[b]``), each item's ids (``to_records``
    makes them records, for a record joining them). A cut (``cut``)
    is emitted from ``out[out_pos]``: ``emitting`` is its bucket (``ALL``: every pool,
    ``NONE``: no cut), ``emit_first`` its oldest position, ``cut_count`` the pools cut so far.
    ``bucket_batch``'s docstring says how these make its state.
    """

    def __init__(self, buckets: int):
        self.items: list[list[Any]] = [[] for _ in range(buckets)]
        self.lens: list[list[int]] = [[] for _ in range(buckets)]
        self.ids: list[list | None] = [None] * buckets
        self.kinds: list[tuple | None] = [None] * buckets
        self.first: list[float] = [_INF] * buckets
        self.tokens = [0] * buckets
        self.read = [0] * buckets
        self.done = [0] * buckets
        self.oldest: float = _INF
        self.out: list[Batch | None] = []
        self.out_pos = 0
        self.emitting = NONE
        self.emit_first: float = _INF
        self.emit_counts: dict[int, int] = {}
        self.cut_count = 0

    def to_records(self, b: int) -> None:
        """Bucket ``b``'s pool as records (its rows' records made now), for a record to join it."""
        ids = self.ids[b]
        if ids is None:
            return
        if ids:
            self.items[b] = IdsRows(self.items[b], ids, self.lens[b], self.kinds[b]).records()  # type: ignore[arg-type]
        self.ids[b] = self.kinds[b] = None

    def cut(self, which: int, counter: int, split: Callable[..., list[Batch]], seed: int | None) -> None:
        """Sort and cut bucket ``which``'s pool (or every pool) into batches with ``split(b,
        lengths, items, final, ids, kind)`` (sorted by length; ``ids``: the rows' ids, or None
        for records), shuffled by ``seed`` (None: shortest first); ``counter``: this cut's."""
        buckets = [i for i, p in enumerate(self.items) if p] if which == ALL else [which]
        batches: list[Batch] = []
        self.emit_counts = {}
        for b in buckets:
            items, lens, first, ids, kind = self.items[b], self.lens[b], self.first[b], self.ids[b], self.kinds[b]
            self.items[b], self.lens[b], self.first[b], self.ids[b], self.kinds[b] = [], [], _INF, None, None
            self.tokens[b] = 0
            self.emit_first = min(self.emit_first, first)
            self.emit_counts[b] = len(items)
            order = _by_length(lens)
            batches.extend(split(b, list(map(lens.__getitem__, order)), list(map(items.__getitem__, order)),
                                 which == ALL, list(map(ids.__getitem__, order)) if ids else None, kind))
        self.oldest = min(self.first)
        self.emitting = which
        self.cut_count = counter + 1
        if seed is not None:
            random.Random(seed).shuffle(batches)
        self.out = list(batches)
        self.out_pos = 0

    def consume(self) -> None:
        """The cut being emitted is all out: its items count as emitted."""
        for b, count in self.emit_counts.items():
            self.done[b] += count
        self.emit_counts = {}
        self.emitting = NONE
        self.emit_first = _INF
        self.out = []
        self.out_pos = 0

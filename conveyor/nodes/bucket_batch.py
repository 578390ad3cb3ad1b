"""bucket_batch: batches of items of similar length, to waste little on padding.

Items go to buckets by length: bucket ``i`` holds lengths in ``(boundaries[i-1], boundaries[i]]``
(the first from 0). Each bucket gathers a *pool* of about ``pool`` batches' worth of items;
a full pool is sorted by length, cut into batches — ``batch_sizes[i]`` items each, or as many
as fit a token budget ``max_tokens`` (batch size x padded length <= budget, the padded length
rounded up to ``pad_to_multiple_of``: in a spec, a multiple of that of the ``pad_collate`` after
it, or its batches would exceed the budget) — and those batches are emitted in an order
shuffled by (seed, epoch, rank, pool number). At the end of the epoch every partial pool is cut
the same way and all their batches are emitted together in one shuffled order (so the epoch
does not end in length order); ``drop_remainder`` drops each bucket's last batch there when it is not
full — fewer than its batch size, or room left for one more item of its longest length under
the budget — and counts the items in ``stats()["dropped"]``. An item alone over the budget
becomes a batch of one (counted in ``stats()["oversize"]``).

Pool size trades padding against memory and randomness: a bigger pool sorts more items
together, so neighbours in a batch have closer lengths (less padding), but it holds
``pool`` batches of items per bucket in memory and makes the batches of one pool less mixed
(randomness then comes from the upstream shuffle and the shuffled batch order). The default
``pool=8`` keeps padding waste under 5 % on the bundled docstring corpus (see
``benchmarks/padding.py``).

Items longer than the last boundary follow ``overflow``: ``raise`` (``SampleError`` naming the
item's file and line), ``skip`` (counted, the first few logged, each named in the skip ledger
that ``Loader.skipped()`` reads), ``truncate`` (the ``length`` field cut to the last
boundary, and with it every other sequence field of the same length, such as ``labels`` or
``attention_mask``, so they stay aligned), or ``own_bucket`` (one more bucket without an upper
bound). Items of length 0 (an empty document, or a text a tokenizer maps to no ids) follow
``empty``: ``raise`` (``SampleError`` naming the item) or ``skip`` (counted in
``stats()["empty"]``, logged and named as overflow's are): sorted together, they made batches
0 tokens wide (``(1056, 0)``), which no model can take. ``boundaries="auto"`` takes length quantiles of the first ``auto_sample`` items of the
first epoch (logged at INFO, shown in ``stats()``, kept in the state so a resumed run uses the
same).

State, without the items. Within a bucket, pools are emitted in the order they filled, and
the input is only read when no batch is waiting, so at any time the items of bucket ``b``
already emitted are exactly the first ``done[b]`` items of ``b`` read this epoch. The node
keeps the input's state at a few points of the stream (the epoch start, each pool cut, every
``max_pending // 8`` items) and saves the latest point ``P`` at or before the oldest item not
yet emitted, with:

* ``replay``: how many input items were read after ``P``;
* ``done[b]``: how many of the bucket-``b`` items read after ``P`` were already emitted;
* ``emitting``/``out_pos``/``pools``: the bucket whose pool is being emitted (-1: none, -2:
  the end-of-epoch flush of every pool), how many of its batches went out, and the pool
  counter (the shuffle seed of the next pool).

A restore resets the input to ``P``, re-reads ``replay`` items (skipping the first ``done[b]``
of each bucket: emitted before), which rebuilds the pending pools exactly — the pool being
emitted included, since the input is not read while a pool is emitted — recuts that pool
and skips ``out_pos`` batches. The state is counts, the input's state at ``P``, the
boundaries and the epoch's stats (restored as saved; replayed items are not counted twice);
never an item. The replay is bounded: a pool whose oldest item lies more than ``max_pending``
items behind the read position is flushed early, partially full (counted in
``stats()["forced_flushes"]``), so a rare bucket never pins the state to the epoch's start;
a restore re-reads at most about ``max_pending * 9 / 8`` input items (and re-runs the input's
per-item work, such as tokenizing, for them).
"""

from __future__ import annotations

import logging
import math
import operator
import random
from bisect import bisect_left
from operator import itemgetter
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torchdata.nodes import BaseNode

from conveyor.errors import SampleError, StateError
from conveyor.nodes.capabilities import take
from conveyor.nodes._rng import derive_seed
from conveyor.nodes._skips import LEDGER_KEY, SkipLedger, log_skip, sample_id

log = logging.getLogger(__name__)

OVERFLOW = ("raise", "skip", "truncate", "own_bucket")
EMPTY = ("raise", "skip")
DEFAULT_POOL = 8
NONE, ALL = -1, -2  # state "emitting": no pool, or the end-of-epoch flush of every pool
_INF = float("inf")
_CHUNK = 256  # input items read at once (the input's state is kept at chunk starts)


def _where(item: Any) -> str:
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


def _truncated(item: dict, field: str, n: int, keep: int) -> dict:
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


class _Batch:
    __slots__ = ("bucket", "items", "longest", "real")

    def __init__(self, bucket: int, items: list, longest: int, real: int):
        self.bucket, self.items, self.longest, self.real = bucket, items, longest, real


class _Snap:
    __slots__ = ("pos", "state", "read")

    def __init__(self, pos: int, state: Any, read: list[int]):
        self.pos, self.state, self.read = pos, state, read


class BucketBatch(BaseNode[list]):
    """Batches of similar-length items from per-bucket sorted pools, in a shuffled order.

    Args:
        source: the input stream.
        length: a field name (the length is ``len(item[field])``) or a callable ``fn(item) -> int``.
        boundaries: increasing upper bounds of the buckets, or ``"auto"``.
        batch_sizes: items per batch for each bucket (one more with ``overflow="own_bucket"``).
        max_tokens: token budget per batch (batch size x padded length); instead of batch_sizes.
        pad_to_multiple_of: the padded length the budget assumes (match pad_collate's).
        pool: batches' worth of items each bucket gathers before sorting and cutting.
        shuffle: shuffle the batches of each pool (``False``: shortest first).
        drop_remainder: at the epoch's end, drop each bucket's last batch when it is not full.
        overflow: ``raise``, ``skip``, ``truncate`` or ``own_bucket`` for items longer than the
            last boundary; ``None``: ``own_bucket`` with ``boundaries="auto"``, else ``raise``.
        empty: ``raise`` or ``skip`` for items of length 0.
        auto_buckets: buckets that ``"auto"`` makes (fewer when quantiles coincide).
        auto_sample: items ``"auto"`` reads to choose the boundaries.
        max_pending: the most input items a restore replays (pools older than that are flushed
            early); ``None``: 4 x what all pools hold when full.
        seed: base seed of the batch order (with epoch, rank and pool number).
        rank: mixed into the seed.
        where: text for error messages (the node and spec line).

    Example:
        >>> from torchdata.nodes import IterableWrapper
        >>> items = [[0] * n for n in (1, 9, 2, 8, 3, 7)]
        >>> node = BucketBatch(IterableWrapper(items), length=len, boundaries=[4, 9],
        ...                    batch_sizes=[2, 2], pool=1, shuffle=False)
        >>> [[len(x) for x in b] for b in node]
        [[1, 2], [8, 9], [3], [7]]
    """

    SOURCE_KEY = "source"
    REPLAY_KEY = "replay"
    DONE_KEY = "done"
    EMITTING_KEY = "emitting"
    OUT_POS_KEY = "out_pos"
    POOLS_KEY = "pools"
    BOUNDARIES_KEY = "boundaries"
    STATS_KEY = "stats"

    def __init__(self, source: BaseNode, *, length: str | Callable[[Any], int] = "input_ids",
                 boundaries: Sequence[int] | str, batch_sizes: Sequence[int] | None = None,
                 max_tokens: int | None = None, pad_to_multiple_of: int | None = None,
                 pool: int = DEFAULT_POOL, shuffle: bool = True, drop_remainder: bool = False,
                 overflow: str | None = None, empty: str = "raise", auto_buckets: int = 8,
                 auto_sample: int = 1000,
                 max_pending: int | None = None, seed: int = 0, rank: int = 0, where: str | None = None):
        super().__init__()
        auto = boundaries == "auto"
        if not auto:
            if (isinstance(boundaries, str) or not boundaries
                    or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in boundaries)
                    or any(a >= b for a, b in zip(boundaries, boundaries[1:]))):
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
        self.source = source
        self.length = length
        self.auto = auto
        self.batch_sizes = list(batch_sizes) if batch_sizes is not None else None
        self.max_tokens = max_tokens
        self.multiple = pad_to_multiple_of
        self.pool = pool
        self.shuffle = shuffle
        self.drop_remainder = drop_remainder
        self.overflow = overflow
        self.empty = empty
        self.auto_buckets = auto_buckets
        self.auto_sample = auto_sample
        self._max_pending_arg = max_pending
        self.seed = seed
        self.rank = rank
        self.where = where or "bucket_batch"
        self._field = length if isinstance(length, str) else None
        self.epoch = 0
        self.boundaries: list[int] | None = None if auto else list(boundaries)  # type: ignore[arg-type]
        if self.boundaries is not None:
            self._set_boundaries(self.boundaries)
        self._stats = self._zero_stats()
        self.ledger = SkipLedger()  # the items overflow: skip and empty: skip left out, since the run began

    # ----- configuration ------------------------------------------------------------------
    def _set_boundaries(self, bounds: list[int]) -> None:
        self.boundaries = list(bounds)
        self.n_buckets = len(bounds) + (self.overflow == "own_bucket")
        self.max_pending = self._max_pending_arg or max(4 * sum(self._pool_items(b) for b in range(self.n_buckets)), 64)
        self._snap_every = max(self.max_pending // 8, 1)
        self._n_bounds = len(bounds)
        self._by_tokens = self.batch_sizes is None
        # a pool is full when its weight (items, or tokens under a budget) reaches its capacity
        if self.batch_sizes is not None:
            self._capacity = [self.pool * s for s in self.batch_sizes]
        else:
            self._capacity = [self.pool * self.max_tokens] * self.n_buckets  # type: ignore[operator]

    def _pool_items(self, b: int) -> int:
        if self.batch_sizes is not None:
            return self.pool * self.batch_sizes[b]
        lo = self.boundaries[b - 1] if b else 0  # type: ignore[index]
        hi = self.boundaries[b] if b < len(self.boundaries) else 2 * max(lo, 1)  # type: ignore[index, arg-type]
        return max(math.ceil(self.pool * self.max_tokens / max((lo + hi) / 2, 1)), self.pool)  # type: ignore[operator]

    def _zero_stats(self) -> dict[str, Any]:
        n = getattr(self, "n_buckets", 0)
        return {"real": 0, "padded": 0, "batches": [0] * n, "overflow": 0, "dropped": 0, "oversize": 0,
                "forced": 0, "empty": 0}

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def stats(self) -> dict[str, Any]:
        s = self._stats
        return {"padding_efficiency": round(s["real"] / s["padded"], 4) if s["padded"] else 1.0,
                "real_tokens": s["real"], "padded_tokens": s["padded"],
                "batches_per_bucket": list(s["batches"]), "boundaries": list(self.boundaries or []),
                "overflow": s["overflow"], "empty": s["empty"], "dropped": s["dropped"],
                "oversize": s["oversize"],
                "forced_flushes": s["forced"]}

    def _padded(self, n: int) -> int:
        m = self.multiple
        return -(-n // m) * m if m else n

    def _len(self, item: Any) -> int:
        try:
            if callable(self.length):
                n = self.length(item)
            else:
                v = item[self.length]
                n = v.shape[0] if isinstance(v, torch.Tensor) else len(v)  # Tensor.__len__ is slow
        except (KeyError, TypeError, IndexError) as exc:
            raise SampleError(f"{self.where}: cannot take the length of {_where(item)} "
                              f"({type(exc).__name__}: {exc})") from exc
        try:
            n = operator.index(n)  # ints, numpy ints, integer 0-d tensors
        except TypeError:
            n = -1
        if n < 0:
            raise SampleError(f"{self.where}: the length of {_where(item)} must be an int >= 0")
        return n

    def _choose_boundaries(self) -> None:
        self.source.reset()
        lengths = []
        for _ in range(self.auto_sample):
            try:
                lengths.append(self._len(next(self.source)))
            except StopIteration:
                break
        bounds = auto_boundaries(lengths, self.auto_buckets, self.multiple)
        log.info("%s: boundaries auto from the first %d items: %s", self.where, len(lengths), bounds)
        self._set_boundaries(bounds)

    # ----- reset and state ----------------------------------------------------------------
    def _clear(self) -> None:
        nb = self.n_buckets
        self._pos = 0
        self._pools: list[list[tuple[int, int, Any]]] = [[] for _ in range(nb)]
        self._pool_tokens = [0] * nb
        self._read = [0] * nb
        self._done = [0] * nb
        self._oldest: float = _INF
        self._out: list[_Batch | None] = []
        self._out_pos = 0
        self._emitting = NONE
        self._emit_first: float = _INF
        self._emit_counts: dict[int, int] = {}
        self._pools_cut = 0
        self._exhausted = False
        self._replaying = False
        self._pending: list = []  # a chunk read from the input, added from index _pi on
        self._pi = 0
        self._chunk_snap: _Snap | None = None  # the input's state where that chunk began

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        if initial_state is None:
            if self.boundaries is None:
                self._choose_boundaries()
            self.source.reset()
            self._clear()
            self._stats = self._zero_stats()
            self._snaps = [_Snap(0, self.source.state_dict(), [0] * self.n_buckets)]
            return
        self._set_boundaries(list(initial_state[self.BOUNDARIES_KEY]))
        src = initial_state[self.SOURCE_KEY]
        self.source.reset(src)
        self._clear()
        stats = {"empty": 0, **initial_state[self.STATS_KEY]}  # (a state from before empty: counts)
        self._stats = {k: (list(v) if isinstance(v, list) else v) for k, v in stats.items()}
        self.ledger.load(initial_state.get(LEDGER_KEY))  # as saved: the replay does not add to it
        self._snaps = [_Snap(0, src, [0] * self.n_buckets)]
        self._done = list(initial_state[self.DONE_KEY])
        self._pools_cut = initial_state[self.POOLS_KEY]
        emitting = initial_state[self.EMITTING_KEY]
        self._replaying = True  # counted before the save: not counted again
        try:
            for _ in range(initial_state[self.REPLAY_KEY]):
                self._add(next(self.source))
            if emitting != NONE:
                self._exhausted = emitting == ALL
                self._cut(emitting, self._pools_cut - 1)
                self._out_pos = initial_state[self.OUT_POS_KEY]
                for i in range(self._out_pos):
                    self._out[i] = None
        except StopIteration:
            raise StateError(f"{self.where}: the input ended while replaying {initial_state[self.REPLAY_KEY]} "
                             "items to restore the state: it is not the input the state was saved "
                             "from") from None
        finally:
            self._replaying = False

    def _earliest(self) -> float:
        """Position of the oldest item not yet emitted (the read position if none)."""
        return min(self._oldest, float(self._pos), self._emit_first)

    def _prune(self) -> _Snap:
        e = self._earliest()
        snaps = self._snaps
        drop = 0
        while drop + 1 < len(snaps) and snaps[drop + 1].pos <= e:
            drop += 1
        if drop:
            del snaps[:drop]
        return snaps[0]

    def get_state(self) -> dict:
        snap = self._prune()
        return {
            self.SOURCE_KEY: snap.state,
            self.REPLAY_KEY: self._pos - snap.pos,
            self.DONE_KEY: [d - r for d, r in zip(self._done, snap.read)],
            self.EMITTING_KEY: self._emitting,
            self.OUT_POS_KEY: self._out_pos,
            self.POOLS_KEY: self._pools_cut,
            self.BOUNDARIES_KEY: list(self.boundaries),  # type: ignore[arg-type]
            self.STATS_KEY: {k: (list(v) if isinstance(v, list) else v) for k, v in self._stats.items()},
            LEDGER_KEY: self.ledger.state(),
        }

    # ----- reading ------------------------------------------------------------------------
    def _add(self, item: Any) -> int:
        """Put one input item in its bucket; the bucket, or -1 if it was skipped."""
        pos = self._pos
        self._pos = pos + 1
        field = self._field
        if field is not None:  # the fast path of _len
            try:
                v = item[field]
                n = v.shape[0] if type(v) is torch.Tensor else len(v)  # (isinstance of Tensor is slow)
            except Exception:  # _len says what is wrong
                n = self._len(item)
        else:
            n = self._len(item)
        if not n:
            if self.empty == "raise":
                raise SampleError(f"{self.where}: {_where(item)} has length 0 (an empty document): sorted "
                                  "together such items make batches 0 tokens wide; set empty: skip to "
                                  "count and skip them, or filter them out before")
            if not self._replaying:
                self._stats["empty"] += 1
                self._skip(item, "length 0, an empty document (empty: skip)")
            return -1
        bounds = self.boundaries
        b = bisect_left(bounds, n)  # type: ignore[arg-type]
        if b == self._n_bounds:
            if not self._replaying:
                self._stats["overflow"] += 1
            if self.overflow == "raise":
                raise SampleError(f"{self.where}: {_where(item)} has length {n}, over the last boundary "
                                  f"{bounds[-1]}; set overflow: own_bucket | truncate | skip, add a "  # type: ignore[index]
                                  "boundary, or truncate earlier (the tokenizer's max_length)")
            if self.overflow == "skip":
                if not self._replaying:
                    self._skip(item, f"length {n}, over the last boundary {bounds[-1]} (overflow: skip)")  # type: ignore[index]
                return -1
            if self.overflow == "truncate":
                item = _truncated(item, self.length, n, bounds[-1])  # type: ignore[arg-type,index]
                n = bounds[-1]  # type: ignore[index]
                b -= 1
        read = self._read
        ordinal = read[b]
        read[b] = ordinal + 1
        if ordinal < self._done[b]:
            return b  # emitted before the state was saved (only while replaying)
        pool = self._pools[b]
        if not pool and pos < self._oldest:
            self._oldest = pos
        pool.append((n, pos, item))
        self._pool_tokens[b] += n if self._by_tokens and n else 1
        return b

    def _skip(self, item: Any, why: str) -> None:
        """Name an item ``overflow: skip`` or ``empty: skip`` leaves out: in the skip ledger, and
        logged (the first few)."""
        sample = sample_id(item)
        self.ledger.add(sample, "SampleError", why)
        log_skip(log, self.ledger.count, f"{self.where}: skipped {sample}: {why}")

    def _snapshot(self) -> None:
        """Keep the input's state here, or, while items of a chunk read from it wait to be
        added (the input is past them), the state where that chunk began."""
        if self._pi < len(self._pending):
            snap = self._chunk_snap
            if snap is None:
                return
            self._chunk_snap = None
        else:
            snap = _Snap(self._pos, self.source.state_dict(), list(self._read))
        if snap.pos > self._snaps[-1].pos:
            self._snaps.append(snap)

    def _fill(self) -> None:
        """Read until a pool is cut (StopIteration at the end of the input)."""
        source, add, weight, capacity = self.source, self._add, self._pool_tokens, self._capacity
        max_pending, snap_every = self.max_pending, self._snap_every
        while True:
            pending, pi = self._pending, self._pi
            if pi >= len(pending):  # read the next chunk (nodes/capabilities.py)
                snap = self._chunk_snap = _Snap(self._pos, source.state_dict(), list(self._read))
                if snap.pos - self._snaps[-1].pos >= snap_every:
                    self._snaps.append(snap)
                self._pending, self._pi = pending, pi = take(source, _CHUNK), 0
            item = pending[pi]
            pending[pi] = None
            self._pi = pi + 1
            b = add(item)
            if b >= 0 and weight[b] >= capacity[b]:
                self._cut(b, self._pools_cut)
            elif self._pos - self._oldest > max_pending:
                oldest = min((p[0][1], i) for i, p in enumerate(self._pools) if p)[1]
                self._stats["forced"] += 1
                self._cut(oldest, self._pools_cut)
            else:
                continue
            self._snapshot()
            return

    # ----- cutting and emitting -----------------------------------------------------------
    def _split(self, b: int, entries: list[tuple[int, int, Any]], final: bool) -> list[_Batch]:
        """Cut one bucket's sorted entries into batches (the last dropped if partial and asked)."""
        n = len(entries)
        lens = [e[0] for e in entries]
        cuts: list[tuple[int, int]] = []  # (start, end) in entries
        if self.batch_sizes is not None:
            size = self.batch_sizes[b]
            cuts = [(i, min(i + size, n)) for i in range(0, n, size)]
            partial = bool(cuts) and cuts[-1][1] - cuts[-1][0] < size
        elif n:
            m, budget = self.multiple, self.max_tokens
            padded = [(-(-x // m) * m or 1) for x in lens] if m else [x or 1 for x in lens]
            start = 0
            for i in range(1, n):  # sorted: entry i is the longest of [start, i]
                if (i + 1 - start) * padded[i] > budget:  # type: ignore[operator]
                    cuts.append((start, i))  # an item alone over the budget is a batch of one
                    start = i
            cuts.append((start, n))
            partial = (n - start + 1) * padded[n - 1] <= budget  # type: ignore[operator]
        else:
            partial = False
        if final and self.drop_remainder and partial:
            s, e = cuts.pop()
            if not self._replaying:
                self._stats["dropped"] += e - s
        return [_Batch(b, [x[2] for x in entries[s:e]], lens[e - 1], sum(lens[s:e])) for s, e in cuts]

    def _cut(self, which: int, counter: int) -> None:
        """Sort and cut bucket ``which``'s pool (or, with ``ALL``, every pool at the epoch's end)
        into batches, in an order shuffled by the pool counter."""
        buckets = [i for i, p in enumerate(self._pools) if p] if which == ALL else [which]
        batches: list[_Batch] = []
        self._emit_counts = {}
        for b in buckets:
            entries = self._pools[b]
            self._pools[b] = []
            self._pool_tokens[b] = 0
            self._emit_first = min(self._emit_first, entries[0][1])
            self._emit_counts[b] = len(entries)
            entries.sort(key=itemgetter(0))  # stable: equal lengths keep their input order
            batches.extend(self._split(b, entries, which == ALL))
        self._oldest = min((p[0][1] for p in self._pools if p), default=_INF)
        self._emitting = which
        self._pools_cut = counter + 1
        if self.shuffle:
            random.Random(derive_seed(self.seed, self.epoch, self.rank, counter)).shuffle(batches)
        self._out = list(batches)
        self._out_pos = 0
        if not self._out:
            self._consume()

    def _consume(self) -> None:
        """The pool being emitted is all out: its items count as emitted."""
        for b, count in self._emit_counts.items():
            self._done[b] += count
        self._emit_counts = {}
        self._emitting = NONE
        self._emit_first = _INF
        self._out = []
        self._out_pos = 0
        self._prune()

    def next(self) -> list:
        while self._out_pos >= len(self._out):
            if not self._exhausted:
                try:
                    self._fill()
                except StopIteration:
                    self._exhausted = True
                continue
            if not any(self._pools):
                raise StopIteration
            self._cut(ALL, self._pools_cut)
        batch = self._out[self._out_pos]
        self._out[self._out_pos] = None
        self._out_pos += 1
        assert batch is not None
        s = self._stats
        padded = self._padded(batch.longest)
        s["real"] += batch.real
        s["padded"] += len(batch.items) * padded
        s["batches"][batch.bucket] += 1
        if self.max_tokens is not None and len(batch.items) == 1 and padded > self.max_tokens:
            s["oversize"] += 1
        if self._out_pos == len(self._out):
            self._consume()
        return batch.items

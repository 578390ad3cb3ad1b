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

Where the input is a batch tokenizer's inline ``map`` (``byte_tokenize``, ``hf_tokenize`` with
``batch``) and ``length`` is its ids' field, a chunk comes as one ``IdsBlock`` of ids, and the
pools hold its items with each one's ids (``Pools.ids``), not a record each; a batch of them
goes out as its records (``next``: made then), or, to a ``pad_collate`` that pads from the
buffers, as ``IdsRows`` (``next_rows``, nodes/capabilities.py). A record that joins such a pool
(a truncated or replayed one) turns the pool into records. The batches and states are the
same either way (tests/test_text_rows.py).
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from itertools import repeat
from operator import itemgetter, lt
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torchdata.nodes import BaseNode

from conveyor._id_blocks import IdsRows
from conveyor.errors import SampleError, StateError
from conveyor.nodes._buckets import (ALL, DEFAULT_POOL, EMPTY, NONE, OVERFLOW, Batch, Pools,  # noqa: F401
                                     auto_boundaries, check_args, cut_sorted, increasing_lengths, item_length,
                                     item_where, pool_items, truncated)
from conveyor.nodes._rng import derive_seed
from conveyor.nodes._skips import LEDGER_KEY, SkipLedger, log_skip, sample_id
from conveyor.nodes.capabilities import take, take_ids
from conveyor.nodes.state_shape import Child, Fields, Int, LEDGER_SHAPE, ListOf

log = logging.getLogger(__name__)
_CHUNK = 1024  # the most input items read at once. The input's state is kept at chunk starts, so a
               # chunk is at most half a snapshot interval (_set_boundaries: the replay stays about
               # max_pending * 9 / 8, at most * 19 / 16). 1,024 against 256: text.yaml ~2 % faster (a
               # quarter of the per-chunk numpy calls; the same batches)
_BULK_MIN = 16  # a shorter chunk goes item by item (numpy's calls cost more than they save)
_ADDED, _ONE = -3, -4  # _bulk: added without a cut; the first item is for _add
_INF = float("inf")


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
    STATE_SHAPE = Fields({SOURCE_KEY: Child(), REPLAY_KEY: Int(), DONE_KEY: ListOf(Int()), EMITTING_KEY: Int(min=ALL),
                          OUT_POS_KEY: Int(), POOLS_KEY: Int(), BOUNDARIES_KEY: ListOf(Int(min=1)),
                          STATS_KEY: Fields({"real": Int(), "padded": Int(), "batches": ListOf(Int()), "overflow": Int(),
                                             "dropped": Int(), "oversize": Int(), "forced": Int(), "empty": Int()},
                                            optional=("empty",)),  # (states from before empty: lack it)
                          LEDGER_KEY: LEDGER_SHAPE}, optional=(LEDGER_KEY,))

    def __init__(self, source: BaseNode, *, length: str | Callable[[Any], int] = "input_ids",
                 boundaries: Sequence[int] | str, batch_sizes: Sequence[int] | None = None,
                 max_tokens: int | None = None, pad_to_multiple_of: int | None = None,
                 pool: int = DEFAULT_POOL, shuffle: bool = True, drop_remainder: bool = False,
                 overflow: str | None = None, empty: str = "raise", auto_buckets: int = 8,
                 auto_sample: int = 1000,
                 max_pending: int | None = None, seed: int = 0, rank: int = 0, where: str | None = None):
        super().__init__()
        auto = boundaries == "auto"
        overflow = check_args(length=length, boundaries=boundaries, batch_sizes=batch_sizes, max_tokens=max_tokens,
                              pad_to_multiple_of=pad_to_multiple_of, pool=pool, overflow=overflow, empty=empty,
                              auto_buckets=auto_buckets, auto_sample=auto_sample, max_pending=max_pending)
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
        items = sum(pool_items(b, self.pool, self.batch_sizes, self.max_tokens, self.boundaries)
                    for b in range(self.n_buckets))
        self.max_pending = self._max_pending_arg or max(4 * items, 64)
        self._snap_every = max(self.max_pending // 8, 1)
        self._chunk = min(_CHUNK, max(self._snap_every // 2, _BULK_MIN))
        self._n_bounds = len(bounds)
        self._bounds_array = np.array(bounds, dtype=np.int64)
        self._by_tokens = self.batch_sizes is None
        # a pool is full when its weight (items, or tokens under a budget) reaches its capacity
        if self.batch_sizes is not None:
            self._capacity = [self.pool * s for s in self.batch_sizes]
        else:
            self._capacity = [self.pool * self.max_tokens] * self.n_buckets  # type: ignore[operator]

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

    def _choose_boundaries(self) -> None:
        self.source.reset()
        lengths = []
        for _ in range(self.auto_sample):
            try:
                lengths.append(item_length(next(self.source), self.length, self.where))
            except StopIteration:
                break
        bounds = auto_boundaries(lengths, self.auto_buckets, self.multiple)
        log.info("%s: boundaries auto from the first %d items: %s", self.where, len(lengths), bounds)
        self._set_boundaries(bounds)

    # ----- reset and state ----------------------------------------------------------------
    def _clear(self) -> None:
        self._pos = 0
        self._p = Pools(self.n_buckets)
        self._exhausted = False
        self._replaying = False
        self._pending: list = []  # a chunk read from the input, added from index _pi on
        self._pi = 0
        self._chunk_snap: _Snap | None = None  # the input's state where that chunk began
        self._lens: list[int] | None = None  # the chunk's lengths and buckets (_sized)
        self._bks: list[int] | None = None
        self._arrays: tuple[np.ndarray, np.ndarray] | None = None  # the same as arrays, for _bulk
        self._block: Any = None  # the IdsBlock the chunk is the items of (None: records), its
        self._row_ids: list | None = None  # rows' ids and kind (_take_chunk)
        self._kind: tuple | None = None

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
        self._check_lists(initial_state)
        self._set_boundaries(list(initial_state[self.BOUNDARIES_KEY]))
        src = initial_state[self.SOURCE_KEY]
        self.source.reset(src)
        self._clear()
        stats = {"empty": 0, **initial_state[self.STATS_KEY]}  # (a state from before empty: counts)
        self._stats = {k: (list(v) if isinstance(v, list) else v) for k, v in stats.items()}
        self.ledger.load(initial_state.get(LEDGER_KEY))  # as saved: the replay does not add to it
        self._snaps = [_Snap(0, src, [0] * self.n_buckets)]
        p = self._p
        p.done = list(initial_state[self.DONE_KEY])
        p.cut_count = initial_state[self.POOLS_KEY]
        emitting = initial_state[self.EMITTING_KEY]
        self._replaying = True  # counted before the save: not counted again
        try:
            for _ in range(initial_state[self.REPLAY_KEY]):
                self._add(next(self.source))
            short = [b for b, (r, d) in enumerate(zip(p.read, p.done)) if r < d]
            if short:
                raise StateError(f"{self.where}: the state says {p.done[short[0]]} items of bucket {short[0]} were "
                                 f"emitted, but its replay of {initial_state[self.REPLAY_KEY]} input items holds "
                                 f"{p.read[short[0]]} of that bucket: not a state of this input")
            if emitting != NONE:
                self._exhausted = emitting == ALL
                self._cut(emitting, p.cut_count - 1)
                p.out_pos = initial_state[self.OUT_POS_KEY]
                if p.out_pos > len(p.out):
                    raise StateError(f"{self.where}: the state is at batch {p.out_pos} of a pool that now cuts "
                                     f"into {len(p.out)}: not a state of this input")
                for i in range(p.out_pos):
                    p.out[i] = None
        except StopIteration:
            raise StateError(f"{self.where}: the input ended while replaying {initial_state[self.REPLAY_KEY]} "
                             "items to restore the state: it is not the input the state was saved "
                             "from") from None
        finally:
            self._replaying = False

    def _check_lists(self, state: dict) -> None:
        """Refuse a state whose boundaries, per-bucket lists and pool being emitted do not fit
        together (hand-edited or corrupt: resuming it would repeat or lose items, or fail deep
        inside with an IndexError), naming what does not fit."""
        bounds = state[self.BOUNDARIES_KEY]
        if not increasing_lengths(bounds):
            raise StateError(f"{self.where}: the state's boundaries {bounds} are not a non-empty list of "
                             "increasing lengths")
        n = len(bounds) + (self.overflow == "own_bucket")
        if self.batch_sizes is not None and len(self.batch_sizes) != n:
            raise StateError(f"{self.where}: the state's {len(bounds)} boundaries make {n} buckets, this node "
                             f"has batch_sizes for {len(self.batch_sizes)}")
        for name, value in (("done", state[self.DONE_KEY]), ("stats' batches", state[self.STATS_KEY]["batches"])):
            if len(value) != n:
                raise StateError(f"{self.where}: the state's {name} has {len(value)} entries, its boundaries "
                                 f"make {n} buckets")
        emitting = state[self.EMITTING_KEY]
        if emitting >= n:
            raise StateError(f"{self.where}: the state emits the pool of bucket {emitting}, of {n} buckets")

    def _earliest(self) -> float:
        """Position of the oldest item not yet emitted (the read position if none)."""
        return min(self._p.oldest, float(self._pos), self._p.emit_first)

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
        p = self._p
        return {
            self.SOURCE_KEY: snap.state,
            self.REPLAY_KEY: self._pos - snap.pos,
            self.DONE_KEY: [d - r for d, r in zip(p.done, snap.read)],
            self.EMITTING_KEY: p.emitting,
            self.OUT_POS_KEY: p.out_pos,
            self.POOLS_KEY: p.cut_count,
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
        if field is not None:  # the fast path of item_length
            try:
                v = item[field]
                n = v.shape[0] if type(v) is torch.Tensor else len(v)  # (isinstance of Tensor is slow)
            except Exception:  # item_length says what is wrong
                n = item_length(item, self.length, self.where)
        else:
            n = item_length(item, self.length, self.where)
        if not n:
            if self.empty == "raise":
                raise SampleError(f"{self.where}: {item_where(item)} has length 0 (an empty document): sorted "
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
                raise SampleError(f"{self.where}: {item_where(item)} has length {n}, over the last boundary "
                                  f"{bounds[-1]}; set overflow: own_bucket | truncate | skip, add a "  # type: ignore[index]
                                  "boundary, or truncate earlier (the tokenizer's max_length)")
            if self.overflow == "skip":
                if not self._replaying:
                    self._skip(item, f"length {n}, over the last boundary {bounds[-1]} (overflow: skip)")  # type: ignore[index]
                return -1
            if self.overflow == "truncate":
                item = truncated(item, self.length, n, bounds[-1])  # type: ignore[arg-type,index]
                n = bounds[-1]  # type: ignore[index]
                b -= 1
        p = self._p
        read = p.read
        ordinal = read[b]
        read[b] = ordinal + 1
        if ordinal < p.done[b]:
            return b  # emitted before the state was saved (only while replaying)
        if p.ids[b] is not None:  # a pool of rows: records from now on
            p.to_records(b)
        pool = p.items[b]
        if not pool:
            p.first[b] = pos
            if pos < p.oldest:
                p.oldest = pos
        pool.append(item)
        p.lens[b].append(n)
        p.tokens[b] += n if self._by_tokens and n else 1
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
            snap = _Snap(self._pos, self.source.state_dict(), list(self._p.read))
        if snap.pos > self._snaps[-1].pos:
            self._snaps.append(snap)

    def _fill(self) -> None:
        """Read until a pool is cut (StopIteration at the end of the input).

        Items are added a chunk (what ``take`` gave) at a time: the chunk's lengths and buckets
        are found at C speed (``_sized``), and the items added a bucket at a time up to the item
        that cuts a pool (``_bulk``: a text epoch cuts a pool about every chunk, so the chunk
        goes in a few such runs), else in a loop that keeps its counters in locals; an item
        that is empty, overflows, or comes while a restore replays takes ``_add``, item by item.
        The pools, counters, cuts and snapshots are exactly ``_add``'s (a chunk whose lengths
        cannot be taken that way goes by ``_add``)."""
        p = self._p
        source, add, weight, capacity = self.source, self._add, p.tokens, self._capacity
        max_pending, snap_every = self.max_pending, self._snap_every
        pools, pool_lens, first = p.items, p.lens, p.first
        read, done, n_bounds, by_tokens = p.read, p.done, self._n_bounds, self._by_tokens
        while True:
            pending, pi = self._pending, self._pi
            if pi >= len(pending):  # read the next chunk (nodes/capabilities.py)
                snap = self._chunk_snap = _Snap(self._pos, source.state_dict(), list(p.read))
                if snap.pos - self._snaps[-1].pos >= snap_every:
                    self._snaps.append(snap)
                self._pending, self._pi = pending, pi = self._take_chunk(), 0
            lens, bks = self._lens, self._bks
            end = len(pending)
            got = None
            if self._arrays is not None and not self._replaying:
                got = self._bulk(pending, pi)
                if got == _ADDED:
                    continue
                if got == _ONE:  # an empty or overflowing item first: _add's rules, below
                    end = pi + 1
                elif got is not None:
                    self._end_fill(got)
                    return
            if self._block is not None:  # the items below take records: that one, or the rest
                if got == _ONE:
                    pending[pi] = self._row_records(pi, pi + 1)[0]
                else:
                    pending[pi:] = self._row_records(pi, len(pending))
                    self._block = self._row_ids = None
            if lens is None or self._replaying:  # item by item
                item = pending[pi]
                pending[pi] = None
                self._pi = pi + 1
                b = add(item)
                if b >= 0 and weight[b] >= capacity[b]:
                    self._cut(b, p.cut_count)
                elif self._pos - p.oldest > max_pending:
                    self._forced_cut()
                else:
                    continue
                self._snapshot()
                return
            pos, cut = self._pos, False
            try:
                while pi < end:
                    n, b = lens[pi], bks[pi]
                    if not n or b == n_bounds:  # empty or over the last boundary: _add's rules
                        item = pending[pi]
                        pending[pi] = None
                        pi += 1
                        self._pos, self._pi, pos = pos, pi, -1  # (-1: _add keeps self._pos)
                        b = add(item)
                        pos = self._pos
                    else:
                        item = pending[pi]
                        pending[pi] = None
                        pi += 1
                        ordinal = read[b]
                        read[b] = ordinal + 1
                        if ordinal >= done[b]:
                            if p.ids[b] is not None:  # a pool of rows: records from now on
                                p.to_records(b)
                            pool = pools[b]
                            if not pool:
                                first[b] = pos
                                if pos < p.oldest:
                                    p.oldest = pos
                            pool.append(item)
                            pool_lens[b].append(n)
                            weight[b] += n if by_tokens else 1
                        pos += 1
                    if b >= 0 and weight[b] >= capacity[b]:
                        cut = True
                        break
                    if pos - p.oldest > max_pending:
                        b, cut = -1, True
                        break
            finally:
                if pos >= 0:
                    self._pos, self._pi = pos, pi
            if not cut:
                continue
            self._end_fill(b)
            return

    def _take_chunk(self) -> list:
        """The next chunk of input items, with their lengths and buckets (``_sized``). Where the
        input gives its records as one block of ids (``take_ids``: a batch tokenizer's map, for
        this node's ``length`` field), the chunk is the block's items, and the pools take them
        with their ids as rows (``Pools.ids``), the records made only as a batch goes out, or
        never (``next_rows``)."""
        block = take_ids(self.source, self._chunk) if self._field is not None else None
        self._block = self._row_ids = None
        if block is not None and len(block) and block.field == self._field:  # (any length: _bulk takes it)
            self._block, self._row_ids, self._kind = block, block.row_ids(), block.kind()
            self._lens, self._bks, self._arrays = self._bucketed(np.asarray(block.lengths, dtype=np.int64))
            return block.items
        if block is None or not len(block):  # (empty: its fn took a list as records, which take gives)
            chunk = take(self.source, self._chunk)
        else:
            chunk = block.records()
        self._lens, self._bks, self._arrays = self._sized(chunk)
        return chunk

    def _row_records(self, lo: int, hi: int) -> list:
        """The records of the chunk's rows ``lo`` to ``hi`` (a block's)."""
        return IdsRows(self._block.items[lo:hi], self._row_ids[lo:hi], self._lens[lo:hi],  # type: ignore[index]
                       self._kind).records()  # type: ignore[arg-type]

    def _end_fill(self, b: int) -> None:
        """A fill ends: bucket ``b``'s pool is cut (-1: the oldest pool, forced), and the position
        after it kept."""
        if b >= 0:
            self._cut(b, self._p.cut_count)
        else:
            self._forced_cut()
        self._snapshot()

    def _forced_cut(self) -> None:
        """Cut the oldest pool early: its first item is ``max_pending`` items back."""
        p = self._p
        oldest = min((f, i) for i, f in enumerate(p.first) if p.items[i])[1]
        self._stats["forced"] += 1
        self._cut(oldest, p.cut_count)

    def _sized(self, chunk: list) -> tuple[list[int] | None, list[int] | None, Any]:
        """The lengths and buckets of a chunk's items, as lists and as arrays (for ``_bulk``),
        where the length is a field every item has as a sequence with a ``len()`` (arrays,
        lists, 1-D tensors); (None, None, None) else, for ``_add`` to take each length (and say
        what is wrong)."""
        field = self._field
        if field is None:
            return None, None, None
        try:
            values = list(map(itemgetter(field), chunk))
            if values and type(values[0]) is torch.Tensor:  # (Tensor.__len__ is slow)
                lens = [v.shape[0] if type(v) is torch.Tensor else len(v) for v in values]
            else:
                lens = list(map(len, values))
        except Exception:  # not a dict, no such field, a 0-d array: _add's item_length says why
            return None, None, None
        if len(lens) < _BULK_MIN:
            return lens, list(map(bisect_left, repeat(self.boundaries), lens)), None
        return self._bucketed(np.array(lens, dtype=np.int64), lens)

    def _bucketed(self, arr: np.ndarray, lens: list[int] | None = None) -> tuple[list[int], list[int], Any]:
        """``_sized``'s answer for lengths given as an int64 array (and as a list, where made)."""
        bks = np.searchsorted(self._bounds_array, arr)  # side="left": bisect_left's bucket
        return arr.tolist() if lens is None else lens, bks.tolist(), (arr, bks)

    def _bulk(self, pending: list, pi: int) -> int | None:
        """Add the chunk's items from ``pending[pi]`` on in one pass per bucket, up to the
        first item that cuts a pool (reaches its capacity, or is ``max_pending`` past the
        oldest pending item), the first empty or overflowing item (``_add``'s rules), or the
        chunk's end: the cutting item is found from per-bucket running weights, so the pools,
        counters and cut are exactly what adding the items one by one gives. Returns the bucket
        to cut, -1 for a forced cut, ``_ADDED`` (no cut), ``_ONE`` (the first item is for
        ``_add``), or None where replayed items are still to be skipped (``done``), for the
        item loop."""
        p = self._p
        read, done = p.read, p.done
        if any(map(lt, read, done)):  # (just after a restore)
            return None
        arr, bks = self._arrays  # type: ignore[misc]
        if pi:
            arr, bks = arr[pi:], bks[pi:]
        special = arr == 0
        if self.overflow != "own_bucket":
            special |= bks == self._n_bounds
        m = len(arr)
        if special.any():
            m = int(special.argmax())
            if not m:
                return _ONE
            arr, bks = arr[:m], bks[:m]
        nb = self.n_buckets
        weights = arr if self._by_tokens else np.ones(m, dtype=np.int64)
        order = np.argsort(bks, kind="stable")  # each bucket's items, in input order
        counts = np.bincount(bks, minlength=nb)
        room = np.array(self._capacity, dtype=np.int64) - np.array(p.tokens, dtype=np.int64)
        total = np.bincount(bks, weights=weights, minlength=nb) if self._by_tokens else counts
        if (total < room).all():  # no pool fills (most chunks): no running weights to find where
            stop = m
        else:
            ends = np.cumsum(counts)
            run = np.cumsum(weights[order])  # the running weight of each bucket, in that order
            run -= np.repeat(np.concatenate(([0], run))[ends - counts], counts)
            hits = order[run >= np.repeat(room, counts)]
            stop = int(hits.min()) if len(hits) else m  # the first item to fill its pool
        pos0 = self._pos
        oldest = p.oldest if p.oldest != _INF else pos0  # (item 0 is added, so the oldest then)
        forced = self.max_pending + int(oldest) - pos0  # from this item on, past max_pending
        if forced < 0:
            forced = 0
        c = min(stop, forced, m - 1) + 1  # the items to add
        if c < m:
            keep = order < c
            order, counts = order[keep], np.bincount(bks[:c], minlength=nb)
        if not self._by_tokens:
            sums = None
        elif c == m:
            sums = total.tolist()
        else:
            sums = np.bincount(bks[:c], weights=weights[:c], minlength=nb).tolist()
        lens_c, items_c = self._lens[pi:pi + c], pending[pi:pi + c]  # type: ignore[index]
        pending[pi:pi + c] = repeat(None, c)
        idx = order.tolist()
        pools, tokens, pool_ids, j = p.items, p.tokens, p.ids, 0
        rows = self._block is not None
        if rows:
            ids_c, kind = self._row_ids[pi:pi + c], self._kind  # type: ignore[index]
        for b, k in enumerate(counts.tolist()):
            if not k:
                continue
            mine = idx[j:j + k]
            j += k
            pool = pools[b]
            if not pool:
                start = pos0 + mine[0]
                p.first[b] = start
                if start < p.oldest:
                    p.oldest = start
                pool_ids[b], p.kinds[b] = ([], kind) if rows else (None, None)
            if not rows:
                if pool_ids[b] is not None:  # records join a pool of rows
                    p.to_records(b)
                    pool = pools[b]
                pool.extend(map(items_c.__getitem__, mine))
            elif pool_ids[b] is not None and p.kinds[b] == kind:
                pool.extend(map(items_c.__getitem__, mine))
                pool_ids[b].extend(map(ids_c.__getitem__, mine))  # type: ignore[union-attr]
            else:  # rows join a pool of records, or of rows of another kind: as records
                p.to_records(b)
                pool = pools[b]
                pool.extend(IdsRows(list(map(items_c.__getitem__, mine)), list(map(ids_c.__getitem__, mine)),
                                    list(map(lens_c.__getitem__, mine)), kind).records())
            p.lens[b].extend(map(lens_c.__getitem__, mine))  # type: ignore[union-attr]
            read[b] += k
            tokens[b] += int(sums[b]) if sums is not None else k
        if nb > self._n_bounds and counts[self._n_bounds]:  # own_bucket: counted as _add does
            self._stats["overflow"] += int(counts[self._n_bounds])
        self._pos, self._pi = pos0 + c, pi + c
        if c - 1 == stop:
            return int(bks[stop])
        if c - 1 == forced:
            return -1
        return _ADDED

    # ----- cutting and emitting -----------------------------------------------------------
    def _split(self, b: int, lens: list[int], items: list, final: bool, ids: list | None = None,
               kind: tuple | None = None) -> list[Batch]:
        """Cut one bucket's items, sorted by their lengths ``lens``, into batches (the last
        dropped if partial and asked); ``ids``, for rows: their ids, in the same order."""
        size = self.batch_sizes[b] if self.batch_sizes is not None else None
        cuts, partial = cut_sorted(lens, size=size, budget=self.max_tokens, multiple=self.multiple)
        if final and self.drop_remainder and partial:
            s, e = cuts.pop()
            if not self._replaying:
                self._stats["dropped"] += e - s
        if ids is None:
            return [Batch(b, items[s:e], lens[e - 1], sum(lens[s:e])) for s, e in cuts]
        return [Batch(b, items[s:e], lens[e - 1], sum(lens[s:e]), ids[s:e], lens[s:e], kind) for s, e in cuts]

    def _cut(self, which: int, counter: int) -> None:
        """Cut bucket ``which``'s pool (or, with ``ALL``, every pool at the epoch's end) into
        batches, in an order shuffled by (seed, epoch, rank, the pool counter)."""
        seed = derive_seed(self.seed, self.epoch, self.rank, counter) if self.shuffle else None
        self._p.cut(which, counter, self._split, seed)
        if not self._p.out:
            self._consume()

    def _consume(self) -> None:
        """The pool being emitted is all out: its items count as emitted."""
        self._p.consume()
        self._prune()

    def next(self) -> list:
        batch = self._emit()
        return batch.items if batch.ids is None else batch.rows().records()

    def rows_ready(self) -> bool:
        """Whether ``next_rows`` may give rows (``RowsAtOnce``): this node takes a field's length."""
        return self._field is not None

    def next_rows(self) -> list | IdsRows:
        """The next batch as ``IdsRows`` where it is one of a block's rows (``_take_chunk``), else
        its records: the same batch as ``next``, for a consumer that pads ids from their buffers
        (``pad_collate``); the state moves as ``next``'s."""
        batch = self._emit()
        return batch.items if batch.ids is None else batch.rows()

    def _emit(self) -> Batch:
        p = self._p
        while p.out_pos >= len(p.out):
            if not self._exhausted:
                try:
                    self._fill()
                except StopIteration:
                    self._exhausted = True
                continue
            if not any(p.items):
                raise StopIteration
            self._cut(ALL, p.cut_count)
        batch = p.out[p.out_pos]
        p.out[p.out_pos] = None
        p.out_pos += 1
        assert batch is not None
        s = self._stats
        padded = self._padded(batch.longest)
        s["real"] += batch.real
        s["padded"] += len(batch.items) * padded
        s["batches"][batch.bucket] += 1
        if self.max_tokens is not None and len(batch.items) == 1 and padded > self.max_tokens:
            s["oversize"] += 1
        if p.out_pos == len(p.out):
            self._consume()
        return batch

"""pack_tokens: pack whole documents into rows of exactly ``seq_len`` tokens, for pretraining.

The node reads a *pool* of ``pool`` documents (records with a token field, ``input_ids`` as
conveyor.text's tokenizers make it), packs them into rows of ``seq_len`` tokens with
``first_fit`` (each document, in the pool's order, into the first row with room) or
``best_fit`` (longest first, each into the row it fills most tightly: the least padding), and
emits the pool's rows in an order drawn from (seed, epoch, pool number). A document never
straddles two rows unless it is longer than ``seq_len``; then ``overflow`` says what happens:
``split`` (default) cuts it into pieces of ``seq_len`` (the last piece is packed like any
document), ``truncate`` keeps its first ``seq_len`` tokens, ``skip`` leaves it out, counted
and named in the skip ledger (``Loader.skipped()``). Padding is only at a row's tail.

Each row is a dict of arrays of fixed shapes, so ``batch`` and ``collate`` stack them:

* ``input_ids`` [seq_len] (``dtype``), ``pad_id`` after the last document;
* ``labels`` [seq_len] int64: the ids, ``ignore_index`` on padding and, with ``mask_first``
  (default), on each document's first token (a model that shifts labels would otherwise learn
  to predict a document from the end of the one before it);
* ``position_ids`` [seq_len] int64, from 0 at each document (the padding counts from 0 too);
* ``segment_ids`` [seq_len] int32: 1, 2, ... for the documents, 0 for padding;
* ``cu_seqlens`` [width] int32: flash-attention's boundaries ``0, l1, l1+l2, ..., seq_len``
  (the padding is the last segment), then ``seq_len`` repeated up to the fixed width
  ``min(max_docs + 1, seq_len) + 1``; ``conveyor.text:varlen_cu_seqlens`` turns a batch of
  them into the concatenated form ``flash_attn_varlen_func`` takes;
* ``num_docs`` and ``num_tokens``: the row's documents (pieces) and real tokens.

``stats()`` has the padding figures pad_collate reports (``real_tokens``, ``padded_tokens``,
``padding_efficiency``, ``efficiency_min``) plus rows, documents, pieces and skips.

State, without a token: the input's state where the current pool began, the pool number and
how many of its rows were emitted, the settings and the epoch's counters; a restore re-reads
that one pool (its small records: tokenizing before packing re-runs for them), packs it again
and skips the emitted rows. Rows depend on the lengths of the pool's documents, which a
state does not hold, so the node is not elastic below a shard; its order is drawn from seed,
epoch and pool alone, so above one it is a global order.
"""

from __future__ import annotations

import logging
import random
from typing import Any

import numpy as np
import torch
from torchdata.nodes import BaseNode

from conveyor._id_blocks import IdsBlock
from conveyor.errors import SampleError, StateError
from conveyor.nodes._buckets import item_where
from conveyor.nodes._packing import best_fit, cu_width, first_fit, lay_out
from conveyor.nodes._rng import derive_seed
from conveyor.nodes._skips import LEDGER_KEY, SkipLedger, log_skip, sample_id
from conveyor.nodes._workers.batch_slabs import SLAB_MARK, Buffers
from conveyor.nodes.capabilities import take as take_records, take_ids
from conveyor.nodes.state_shape import Child, Fields, Int, LEDGER_SHAPE, ListOf, Plain

log = logging.getLogger(__name__)
_RANGES: dict[np.dtype, tuple[int, int]] = {}  # an integer dtype's (min, max), for _ids' range check

ALGORITHMS = ("first_fit", "best_fit")
OVERFLOWS = ("split", "truncate", "skip")
EMPTIES = ("raise", "skip")
ID_DTYPES = ("int64", "int32", "int16", "uint8")
_ROW_FIELDS = ("input_ids", "labels", "position_ids", "segment_ids", "cu_seqlens")
_PACKERS = {"first_fit": first_fit, "best_fit": best_fit}
_COUNTS = ("real", "rows", "docs", "pieces", "split", "truncated", "overflow", "empty")  # the epoch's counters
# (and min_real: the fewest real tokens of a row so far, -1 before the first), kept in the state


def check_args(*, seq_len: Any, algorithm: str, pool: Any, overflow: str, empty: str, max_docs: Any,
               pad_id: Any, dtype: str, mask_first: bool, batch_size: Any = None) -> list[tuple[str, str]]:
    """``(param, message)`` for each bad argument (the compiler reports them with spec lines)."""
    bad: list[tuple[str, str]] = []

    def positive(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v > 0

    if not positive(seq_len):
        bad.append(("seq_len", f"seq_len={seq_len!r} must be a positive int"))
    elif mask_first and seq_len < 2:
        bad.append(("seq_len", f"seq_len={seq_len} with mask_first: every label would be the ignore index "
                               "(a row of one token has no next token); use seq_len >= 2"))
    if algorithm not in ALGORITHMS:
        bad.append(("algorithm", f"algorithm={algorithm!r} must be one of {', '.join(ALGORITHMS)}"))
    if not positive(pool):
        bad.append(("pool", f"pool={pool!r} must be a positive int (documents packed together)"))
    if overflow not in OVERFLOWS:
        bad.append(("overflow", f"overflow={overflow!r} must be one of {', '.join(OVERFLOWS)}"))
    if empty not in EMPTIES:
        bad.append(("empty", f"empty={empty!r} must be one of {', '.join(EMPTIES)}"))
    if max_docs is not None and not positive(max_docs):
        bad.append(("max_docs", f"max_docs={max_docs!r} must be a positive int or null"))
    if batch_size is not None and not positive(batch_size):
        bad.append(("batch_size", f"batch_size={batch_size!r} must be a positive int or null (rows, one at a time)"))
    if dtype not in ID_DTYPES:
        bad.append(("dtype", f"dtype={dtype!r} must be one of {', '.join(ID_DTYPES)}"))
    elif not isinstance(pad_id, int) or isinstance(pad_id, bool) or not (
            np.iinfo(dtype).min <= pad_id <= np.iinfo(dtype).max):
        bad.append(("pad_id", f"pad_id={pad_id!r} does not fit dtype={dtype!r}"))
    return bad


class PackTokens(BaseNode[dict]):
    """Rows of exactly ``seq_len`` tokens, packed from pools of whole documents.

    Args:
        source: records with a token field (a 1-D tensor, numpy array or list of ints).
        seq_len: tokens per row.
        field: the token field.
        algorithm: ``first_fit`` or ``best_fit`` (less padding).
        pool: documents packed together (more: less padding, a longer restore).
        overflow: ``split``, ``truncate`` or ``skip`` a document longer than ``seq_len``.
        empty: ``raise`` (``SampleError``) or ``skip`` (counted) for a document of no tokens.
        max_docs: documents a row holds at most (``None``: no limit); sets ``cu_seqlens``' width.
        pad_id: the id after the last document.
        ignore_index: the label of padding (and of first tokens, with ``mask_first``).
        mask_first: put ``ignore_index`` on each document's first label.
        dtype: ``input_ids``' dtype; an id it cannot hold is a ``SampleError``.
        shuffle: emit each pool's rows in an order drawn from (seed, epoch, pool).
        seed: base seed of that order.
        batch_size: ``None`` (default): rows one by one; else batches of this many rows,
            collated (each field stacked to ``[batch_size, ...]``, ``num_docs`` and
            ``num_tokens`` int64 tensors): what ``batch`` and ``collate`` after the node make,
            without a dict per row (the rows of one pool are a slice of its arrays).
        drop_last: with ``batch_size``, drop the epoch's last batch when it is short.
        where: text for error messages (the node and spec line).

    Example:
        >>> from torchdata.nodes import IterableWrapper
        >>> docs = [{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5]}, {"input_ids": [6]}]
        >>> row = next(iter(PackTokens(IterableWrapper(docs), seq_len=4, shuffle=False)))
        >>> row["input_ids"].tolist(), row["position_ids"].tolist(), row["cu_seqlens"].tolist()[:3]
        ([1, 2, 3, 6], [0, 1, 2, 0], [0, 3, 4])
    """

    SOURCE_KEY = "source"
    POOL_KEY = "pool"
    POS_KEY = "pos"
    SETTINGS_KEY = "settings"
    STATS_KEY = "stats"
    STATE_SHAPE = Fields({SOURCE_KEY: Child(), POOL_KEY: Int(), POS_KEY: Int(), SETTINGS_KEY: ListOf(Plain()),
                          STATS_KEY: Fields({**{k: Int() for k in _COUNTS}, "min_real": Int(min=-1)}),
                          LEDGER_KEY: LEDGER_SHAPE}, optional=(LEDGER_KEY,))

    def __init__(self, source: BaseNode, *, seq_len: int, field: str = "input_ids", algorithm: str = "best_fit",
                 pool: int = 1000, overflow: str = "split", empty: str = "raise", max_docs: int | None = None,
                 pad_id: int = 0, ignore_index: int = -100, mask_first: bool = True, dtype: str = "int64",
                 shuffle: bool = True, seed: int = 0, batch_size: int | None = None, drop_last: bool = False,
                 where: str | None = None):
        super().__init__()
        bad = check_args(seq_len=seq_len, algorithm=algorithm, pool=pool, overflow=overflow, empty=empty,
                         max_docs=max_docs, pad_id=pad_id, dtype=dtype, mask_first=mask_first,
                         batch_size=batch_size)
        if bad:
            raise ValueError("; ".join(m for _, m in bad))
        self.source = source
        self.seq_len, self.field, self.algorithm, self.pool = seq_len, field, algorithm, pool
        self.overflow, self.empty, self.pad_id, self.ignore_index = overflow, empty, pad_id, ignore_index
        self.max_docs = max_docs if max_docs is not None else seq_len
        self.mask_first, self.shuffle, self.seed = mask_first, shuffle, seed
        self.batch_size, self.drop_last = batch_size, drop_last
        self.dtype = np.dtype(dtype)
        self._top = int(np.iinfo(self.dtype).max)
        self.width = cu_width(seq_len, self.max_docs)
        self.where = where or "pack_tokens"
        self.epoch = 0
        self.ledger = SkipLedger()
        self._stats = self._zero()
        self._buffers: dict[str, Buffers] = {}

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _settings(self) -> list:
        return [self.seq_len, self.algorithm, self.pool, self.overflow, self.max_docs]

    @staticmethod
    def _zero() -> dict[str, Any]:
        return {**dict.fromkeys(_COUNTS, 0), "min_real": -1}

    def stats(self) -> dict[str, Any]:
        s = self._stats
        padded = s["rows"] * self.seq_len
        return {"padding_efficiency": round(s["real"] / padded, 4) if padded else 1.0,
                "efficiency_min": round(s["min_real"] / self.seq_len, 4) if s["min_real"] >= 0 else 1.0,
                "real_tokens": s["real"], "padded_tokens": padded, "rows": s["rows"], "documents": s["docs"],
                "pieces": s["pieces"], "split": s["split"], "truncated": s["truncated"],
                "overflow": s["overflow"], "empty": s["empty"]}

    # ----- reset and state ----------------------------------------------------------------
    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self._rows: dict[str, torch.Tensor] | None = None  # the current pool's rows, in emit order
        self._arrays: dict[str, np.ndarray] = {}  # the pool's rows, all of a field in one array
        self._views: dict[str, Any] | None = None
        self._n = 0  # rows in the pool
        self._i = 0
        self._ended = False
        self._replaying = False
        if initial_state is None:
            self.source.reset()
            self._start = self.source.state_dict()
            self._pool_no = 0
            self._stats = self._zero()
            return
        saved = list(initial_state[self.SETTINGS_KEY])
        if saved != self._settings():
            raise StateError(f"{self.where}: the state was taken with [seq_len, algorithm, pool, overflow, "
                             f"max_docs] = {saved}, this node has {self._settings()}: its rows are other "
                             "rows, so resuming would repeat some documents and lose others (start the "
                             "epoch afresh, or keep the settings)")
        self._start = initial_state[self.SOURCE_KEY]
        self.source.reset(self._start)
        self._pool_no = initial_state[self.POOL_KEY]
        self._stats = dict(initial_state[self.STATS_KEY])
        self.ledger.load(initial_state.get(LEDGER_KEY))  # as saved: the replay does not add to it
        pos = initial_state[self.POS_KEY]
        if pos:
            self._replaying = True  # counted before the save: not counted again
            try:
                self._load()
            finally:
                self._replaying = False
            if self._rows is None or pos > self._n:
                raise StateError(f"{self.where}: the state is at row {pos} of pool {self._pool_no}, which now "
                                 f"packs into {0 if self._rows is None else self._n} rows: the input "
                                 "changed since the state was taken")
            self._i = pos

    def get_state(self) -> dict:
        if self._rows is not None and self._i >= self._n:  # the pool is all out
            source, pool_no, pos = self._after, self._pool_no + 1, 0
        else:
            source, pool_no, pos = self._start, self._pool_no, self._i
        return {self.SOURCE_KEY: source, self.POOL_KEY: pool_no, self.POS_KEY: pos,
                self.SETTINGS_KEY: self._settings(), self.STATS_KEY: dict(self._stats),
                LEDGER_KEY: self.ledger.state()}

    # ----- reading and packing ------------------------------------------------------------
    def _load(self) -> None:
        """Read the next pool and pack it (``_rows`` None where the input had nothing left)."""
        parts = [] if self._ended else self._take_pool()
        got = sum(map(len, parts))
        if got < self.pool:
            self._ended = True
        if not got:
            self._rows = None
            return
        self._after = self.source.state_dict()
        self._arrays, self._views = {}, None  # (the last pool's arrays may be reused once no batch holds them)
        flat, starts, lengths = self._pool_pieces(parts, got)
        if not len(lengths):  # every document skipped: a pool of no rows
            self._rows, self._n, self._i = {}, 0, 0
            return
        rows = _PACKERS[self.algorithm](lengths.tolist(), self.seq_len, self.max_docs)
        if self.shuffle:
            random.Random(derive_seed(self.seed, self.epoch, self._pool_no)).shuffle(rows)
        arrays = lay_out(rows, starts, lengths, flat, seq_len=self.seq_len, width=self.width, pad_id=self.pad_id,
                         ignore_index=self.ignore_index, mask_first=self.mask_first, dtype=self.dtype,
                         get=self._array)
        self._arrays = arrays
        self._rows = {k: torch.from_numpy(v) for k, v in arrays.items()}
        for k in _ROW_FIELDS:  # a batch of consecutive rows is a slice of these: collate copies nothing
            setattr(self._rows[k], SLAB_MARK, True)
        self._n, self._i = len(rows), 0
        self._real, self._docs = arrays["num_tokens"].tolist(), arrays["num_docs"].tolist()

    def _array(self, field: str, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An array for ``lay_out``: a view of one of this node's arrays that nothing else refers
        to any more (no row, batch or view of an earlier pool is still held), else a new one.
        Fresh memory costs a page fault per 4 KB (on a VM ~1.7 us, ~0.4 ms a 1.6 MB field:
        more than laying the pool out); arrays are kept by field, with room for a power of two
        of rows, so pools of a few rows more or less share them."""
        buffers = self._buffers.get(field)
        if buffers is None:
            buffers = self._buffers[field] = Buffers(keep_free=2)
        cap = 1 << max(shape[0] - 1, 0).bit_length()
        return buffers.get((cap, *shape[1:]), np.dtype(dtype))[:shape[0]]

    def _take_pool(self) -> list:
        """The next pool's documents (fewer at the input's end), in parts: each an ``IdsBlock``
        where the input gives one (a batch tokenizer: its records are made only if a document
        needs naming, ``conveyor/_id_blocks.py``), else a list of records."""
        parts: list = []
        need = self.pool
        source = self.source
        while need:
            try:
                block = take_ids(source, need)
                part = take_records(source, need) if block is None else block
            except StopIteration:
                break
            if len(part):
                parts.append(part)
                need -= len(part)
        return parts

    def _pool_pieces(self, parts: list, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The pool's pieces: ``(flat, starts, lengths)``, piece ``k`` being
        ``flat[starts[k]:starts[k] + lengths[k]]``, in the order of the documents (``count`` of
        them, in ``parts``: ``_take_pool``).

        The common pool (1-D integer ids in range, none empty, none to skip) is checked and cut
        with a few numpy calls over all its documents; any other goes document by document
        (``_pieces``), which names the record at fault and counts the skips.
        """
        fast = self._fast_ids(parts)
        if fast is None:
            items = [r for part in parts for r in (part.records() if type(part) is IdsBlock else part)]
            pieces: list[np.ndarray] = []
            for item in items:
                pieces += [p.astype(self.dtype, copy=False) for p in self._pieces(item)]
            lengths = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
            flat = np.concatenate(pieces) if pieces else np.empty(0, self.dtype)
            return flat, np.cumsum(lengths) - lengths, lengths
        flat, lengths = fast
        seq_len = self.seq_len
        starts = np.cumsum(lengths) - lengths
        long = lengths > seq_len
        n_long = int(np.count_nonzero(long))
        if not self._replaying:
            self._stats["docs"] += count
            if n_long:
                self._stats["split" if self.overflow == "split" else "truncated"] += n_long
        if not n_long:
            return flat, starts, lengths
        if self.overflow == "truncate":
            return flat, starts, np.minimum(lengths, seq_len)
        n_pieces = (lengths + seq_len - 1) // seq_len  # split: pieces of seq_len, the last shorter
        doc = np.repeat(np.arange(len(lengths), dtype=np.int64), n_pieces)
        offset = (np.arange(len(doc), dtype=np.int64) - np.repeat(np.cumsum(n_pieces) - n_pieces, n_pieces)) * seq_len
        return flat, starts[doc] + offset, np.minimum(seq_len, lengths[doc] - offset)

    def _fast_ids(self, parts: list) -> tuple[np.ndarray, np.ndarray] | None:
        """``(all ids concatenated, each document's length)`` when every document of the pool
        passes ``_ids``' checks, is not empty and needs no skip; else None."""
        field = self.field
        blocks = [part if type(part) is IdsBlock and part.field == field
                  else IdsBlock.of_records(part.records() if type(part) is IdsBlock else part, field) for part in parts]
        if None in blocks:  # (tensors join too: concatenate reads them as arrays)
            return None
        if len(blocks) == 1:
            flat, lengths = blocks[0].ids, blocks[0].lengths
        else:
            try:
                flat = np.concatenate([b.ids for b in blocks])
            except (TypeError, ValueError):
                return None
            lengths = np.concatenate([b.lengths for b in blocks])
        if flat.ndim != 1 or flat.dtype.kind not in "iub" or not lengths.all():
            return None
        if self.overflow == "skip" and int(lengths.max()) > self.seq_len:
            return None
        low, high = _range(flat.dtype)
        if (high > self._top and int(flat.max()) > self._top) or (low < 0 and int(flat.min()) < 0):
            return None
        return flat, lengths

    def _pieces(self, item: Any) -> list[np.ndarray]:
        """A document's token ids, checked, as the pieces it is packed as (none if skipped)."""
        ids = self._ids(item)
        n = len(ids)
        counting = not self._replaying
        if n == 0:
            if self.empty == "raise":
                raise SampleError(f"{self.where}: {item_where(item)} has no tokens (an empty document); set "
                                  "empty: skip to count and skip such documents, or filter them out before")
            if counting:
                self._stats["empty"] += 1
                self._skip(item, "no tokens, an empty document (empty: skip)")
            return []
        if counting:
            self._stats["docs"] += 1
        if n <= self.seq_len:
            return [ids]
        if counting:
            self._stats[{"split": "split", "truncate": "truncated", "skip": "overflow"}[self.overflow]] += 1
        if self.overflow == "truncate":
            return [ids[:self.seq_len]]
        if self.overflow == "skip":
            if counting:
                self._skip(item, f"{n} tokens, over seq_len {self.seq_len} (overflow: skip)")
            return []
        return [ids[s:s + self.seq_len] for s in range(0, n, self.seq_len)]

    def _ids(self, item: Any) -> np.ndarray:
        try:
            value = item[self.field]
        except (KeyError, TypeError, IndexError):
            what = f"fields {sorted(item)}" if isinstance(item, dict) else f"a {type(item).__name__}"
            raise SampleError(f"{self.where}: {item_where(item)} has no token field {self.field!r} (it has "
                              f"{what}); tokenize before packing, or set field") from None
        ids = value.numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iub"):
            raise SampleError(f"{self.where}: {item_where(item)}: field {self.field!r} must be a 1-D sequence "
                              f"of integer ids, got shape {list(ids.shape)} of {ids.dtype}")
        # the range check reads only what the ids' dtype can hold: none of a uint8 or uint16
        # can be negative, and none of an int16 over an int16 row's top (two numpy reductions
        # per document were a tenth of pretrain.yaml's time)
        low_high = _range(ids.dtype) if ids.size else None
        if low_high is not None and ((low_high[1] > self._top and int(ids.max()) > self._top)
                                     or (low_high[0] < 0 and int(ids.min()) < 0)):
            bad = int(ids.max()) if int(ids.max()) > self._top else int(ids.min())
            raise SampleError(f"{self.where}: {item_where(item)} has token id {bad}, which dtype={self.dtype.name} "
                              "cannot hold (ids are 0 up to its largest value); use a wider dtype")
        return ids

    def _skip(self, item: Any, why: str) -> None:
        sample = sample_id(item)
        self.ledger.add(sample, "SampleError", why)
        log_skip(log, self.ledger.count, f"{self.where}: skipped {sample}: {why}")

    # ----- emitting -----------------------------------------------------------------------
    def _pool_left(self) -> bool:
        """Make the current pool one with rows left (reading the next ones); False at the end."""
        while self._rows is None or self._i >= self._n:
            if self._rows is not None:  # that pool is all out: the next begins here
                self._start, self._pool_no, self._rows, self._i = self._after, self._pool_no + 1, None, 0
            self._load()
            if self._rows is None:
                return False
        return True

    def next(self) -> dict:
        if self.batch_size is not None:
            return self._next_batch()
        if not self._pool_left():
            raise StopIteration
        i = self._i
        self._i = i + 1
        views = self._views
        if views is None:  # every row's views at once (one C loop, not a Python index per field and row)
            views = self._views = {k: self._rows[k].unbind(0) for k in _ROW_FIELDS}
            views["num_docs"], views["num_tokens"] = self._docs, self._real
        self._count(i, i + 1)
        return {k: v[i] for k, v in views.items()}

    def _next_batch(self) -> dict:
        """``batch_size`` rows, collated: the rows of one pool are a slice of its arrays (no
        copy); a batch across two pools joins the two slices.

        The pool's last batch of its own, and the part of a batch a pool ends, are copies: the
        consumer holds that batch (or the part waits) while the next pool is laid out, and a
        slice would keep the pool's arrays from being written again, so a fresh loader's first
        epoch had made a second set of them (~8 MB of fresh memory, ~2,000 page faults: a few
        milliseconds; benchmarks/pack_profile.py). A copy is one batch a pool."""
        i, size = self._i, self.batch_size
        if i + size <= self._n and self._rows is not None:  # the common batch: inside the pool
            self._i = i + size
            self._count(i, i + size)
            last = i + 2 * size > self._n  # the pool's last batch of its own: a copy (above)
            return {k: torch.from_numpy(v[i:i + size].copy() if last else v[i:i + size])
                    for k, v in self._arrays.items()}
        parts: list[dict[str, np.ndarray]] = []
        need = size
        while need and self._pool_left():
            i = self._i
            take = min(need, self._n - i)
            ends = i + take == self._n  # (then the next pool may be laid out while this part waits)
            parts.append({k: v[i:i + take].copy() if ends else v[i:i + take] for k, v in self._arrays.items()})
            self._count(i, i + take)
            self._i = i + take
            need -= take
        if not parts or (need and self.drop_last):
            raise StopIteration
        if len(parts) == 1:  # (numpy arrays and from_numpy: a third of torch's slicing)
            return {k: torch.from_numpy(v) for k, v in parts[0].items()}
        return {k: torch.from_numpy(np.concatenate([p[k] for p in parts])) for k in parts[0]}

    def _count(self, i: int, j: int) -> None:
        """Rows ``i`` to ``j`` of the pool go out: into the padding figures."""
        s = self._stats
        real = self._real[i:j]
        low = min(real)
        s["real"] += sum(real)
        s["rows"] += j - i
        s["pieces"] += sum(self._docs[i:j])
        s["min_real"] = low if s["min_real"] < 0 else min(s["min_real"], low)


def _range(dtype: np.dtype) -> tuple[int, int]:
    """An integer (or bool) dtype's ``(min, max)``, kept (np.iinfo costs as much as a reduction)."""
    got = _RANGES.get(dtype)
    if got is None:
        info = np.iinfo(dtype) if dtype.kind != "b" else None
        got = _RANGES[dtype] = (int(info.min), int(info.max)) if info is not None else (0, 1)
    return got

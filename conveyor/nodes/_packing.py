"""Private helpers of ``pack_tokens``: the two packing algorithms and the assembly of one row.

``first_fit(lengths, ...)`` puts each piece, in the pool's order, into the first row that has
room; ``best_fit`` takes the pieces longest first and puts each into the row it leaves the
least room in (best-fit decreasing). Both return rows as lists of piece indices, a row never
holding more than ``seq_len`` tokens nor more than ``max_docs`` pieces. ``lay_out`` lays a
whole pool's rows out at once with numpy: ids, labels, position ids restarting per document,
segment ids, ``cu_seqlens``.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from itertools import chain
from typing import Any, Callable, Sequence

import numpy as np

ROW_INT = np.int64      # labels, position_ids: what Hugging Face models take
BOUNDS_INT = np.int32   # segment_ids, cu_seqlens: flash-attention's varlen form


def first_fit(lengths: Sequence[int], seq_len: int, max_docs: int) -> list[list[int]]:
    """Each piece in order into the first row with room for it (a new row when none has).

    Example:
        >>> first_fit([6, 5, 4, 3], 10, 10)
        [[0, 2], [1, 3]]
    """
    room = np.zeros(len(lengths), dtype=np.int64)  # a row's free tokens (0: full, or closed)
    rows: list[list[int]] = []
    for i, n in enumerate(lengths):
        r = len(rows)
        if r:
            fits = room[:r] >= n
            k = int(fits.argmax())
            if fits[k]:
                rows[k].append(i)
                room[k] = 0 if len(rows[k]) >= max_docs else room[k] - n
                continue
        rows.append([i])
        room[r] = 0 if max_docs <= 1 else seq_len - n
    return rows


def best_fit(lengths: Sequence[int], seq_len: int, max_docs: int) -> list[list[int]]:
    """Longest piece first, each into the open row it fills most tightly (best-fit decreasing).

    The open rows are kept as one sorted list of ints ``free * big + row`` (the order of the
    pairs ``(free, row)``: ties go to the older row), so finding the tightest row is one
    ``bisect`` over ints.

    Example:
        >>> best_fit([3, 6, 5, 4], 10, 10)
        [[1, 3], [2, 0]]
    """
    n = len(lengths)
    order = np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable").tolist()  # ties in pool order
    big = n + 1  # more than any row number
    rows: list[list[int]] = []
    open_rows: list[int] = []  # free * big + row, sorted
    for i in order:
        need = lengths[i]
        at = bisect_left(open_rows, need * big)
        if at < len(open_rows):
            key = open_rows.pop(at)
            free, r = key // big, key % big
            row = rows[r]
            row.append(i)
            free -= need
        else:
            r, free = len(rows), seq_len - need
            rows.append(row := [i])
        if free > 0 and len(row) < max_docs:
            insort(open_rows, free * big + r)
    return rows


def _new(field: str, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    return np.empty(shape, dtype)


_steps = np.arange(0, dtype=np.int64)


def _arange(n: int) -> np.ndarray:
    """``np.arange(n)`` (int64), read-only, from one array kept and grown to a power of two (a
    pool's worth of fresh memory a call cost page faults; a thread reading the old one still may)."""
    global _steps
    if len(_steps) < n:
        grown = np.arange(1 << max(n - 1, 0).bit_length(), dtype=np.int64)
        grown.flags.writeable = False
        _steps = grown
    return _steps[:n]


def lay_out(rows: list[list[int]], starts: np.ndarray, lengths: np.ndarray, flat: np.ndarray, *, seq_len: int,
            width: int, pad_id: int, ignore_index: int, mask_first: bool, dtype: np.dtype,
            get: Callable[[str, tuple[int, ...], Any], np.ndarray] = _new) -> dict[str, np.ndarray]:
    """A whole pool's rows at once, as arrays whose row ``r`` is ``rows[r]`` laid out.

    ``rows`` holds piece numbers; piece ``k`` is ``flat[starts[k]:starts[k] + lengths[k]]``
    (``sum`` of a row's lengths <= ``seq_len``). The padding after a row's last document is a
    segment of its own (segment id 0, positions from 0, ``cu_seqlens`` ending at ``seq_len``),
    so that every token of a flattened batch lies in one segment and no attention row is
    empty. ``cu_seqlens`` has ``width`` entries a row: ``0, l1, l1 + l2, ..., seq_len``, then
    ``seq_len`` repeated.

    No Python loop runs per piece or per token (one runs per padded row). The outputs are
    asked of ``get(field, shape, dtype)``, which may hand out a recycled one (a fresh 1.6 MB
    array costs ~400 page faults, more than the numpy work on it); the gather's scratch (its
    index; the tokens where their dtype is not ``dtype``) lives in outputs written after it,
    and the only other arrays of a pool's size are three ``np.repeat`` of 32-bit values. Every
    per-token field is a value per segment spread by ``np.repeat`` and one pass more (three
    ``cumsum`` passes over jumps had been half the time: ~2.3 ns a token each; 2.46 -> 1.18 ms
    a pool of pretrain.yaml's, 2026-12-06).

    Returns ``input_ids`` (``dtype``), ``labels`` and ``position_ids`` (int64), ``segment_ids``
    [R, seq_len] and ``cu_seqlens`` [R, width] (int32), ``num_docs`` and ``num_tokens`` [R] (int64).
    """
    n_rows, size = len(rows), len(rows) * seq_len
    counts = np.fromiter(map(len, rows), dtype=np.int64, count=n_rows)  # pieces per row (>= 1)
    order = np.fromiter(chain.from_iterable(rows), dtype=np.int64, count=int(counts.sum()))
    plen = lengths[order]
    first = np.cumsum(counts) - counts  # each row's first piece, in ``order``
    ends = np.cumsum(plen)  # each piece's end among all the real tokens
    end_in_row = ends - np.repeat(ends[first] - plen[first], counts)  # each piece's end within its row
    begin_in_row = end_in_row - plen
    real = end_in_row[first + counts - 1]  # real tokens per row
    row_of = np.repeat(np.arange(n_rows, dtype=np.int64), counts)
    piece_at = row_of * seq_len + begin_in_row  # each piece's first token in the flat rows
    padded = np.flatnonzero(real < seq_len)
    pad_at = padded * seq_len + real[padded]  # each padding's first token

    def out(field: str, dt: Any, cols: int = seq_len) -> np.ndarray:
        return get(field, (n_rows, cols), dt)

    # The segments in the flat rows' order: each row's pieces, then its padding where it has
    # any. Every per-token field is a per-segment value spread over the segment's tokens by
    # one np.repeat, and at most one pass more: token t of a piece comes from flat[t + delta]
    # (delta: its start in flat less its place in the rows; the padding gathers whatever,
    # clipped, and is overwritten), its position is t less the segment's first token, its
    # segment id the piece's number in its row from 1 (0 on the padding).
    n_pieces = len(order)
    seg_at = np.concatenate((piece_at, pad_at))
    perm = np.argsort(seg_at, kind="stable")
    seg_at = seg_at[perm]
    seg_len = np.diff(seg_at, append=size)
    steps = _arange(size)
    narrow = np.int32 if size + len(flat) < 1 << 31 else np.int64  # (a narrow repeat halves its new memory)
    delta = np.concatenate((starts[order] - piece_at, -pad_at))[perm].astype(narrow)
    # The gather's index lives in the labels' memory and the gathered tokens, where their
    # dtype is not the ids', in the positions': both are written only after (scratch arrays of
    # their own had been 2.5 MB more of fresh memory a pool: ~600 page faults a loader)
    ids, labels, positions = out("input_ids", dtype), out("labels", ROW_INT), out("position_ids", ROW_INT)
    index = labels.reshape(-1)
    np.add(steps, np.repeat(delta, seg_len), out=index)
    if flat.dtype == ids.dtype:
        np.take(flat, index, out=ids.reshape(-1), mode="clip")
    else:  # (take writes only its input's dtype)
        tokens = positions.reshape(-1).view(flat.dtype)[:size]  # (an id is at most 8 bytes wide)
        np.take(flat, index, out=tokens, mode="clip")
        np.copyto(ids.reshape(-1), tokens)
    np.copyto(labels, ids)
    for r, n in zip(padded.tolist(), real[padded].tolist()):
        ids[r, n:] = pad_id
        labels[r, n:] = ignore_index
    if mask_first:
        labels.reshape(-1)[piece_at] = ignore_index

    # positions from 0 at each segment (the padding's too)
    np.subtract(steps, np.repeat(seg_at.astype(narrow), seg_len), out=positions.reshape(-1))

    # segment ids 1, 2, ... per row, 0 on padding
    segments = out("segment_ids", BOUNDS_INT)
    number = (np.arange(n_pieces, dtype=np.int64) - np.repeat(first, counts) + 1).astype(BOUNDS_INT)
    values = np.concatenate((number, np.zeros(len(pad_at), BOUNDS_INT)))[perm]
    np.copyto(segments.reshape(-1), np.repeat(values, seg_len))

    cu = out("cu_seqlens", BOUNDS_INT, width)
    cu.fill(seq_len)
    cu[:, 0] = 0
    cu[row_of, number] = end_in_row
    return {"input_ids": ids, "labels": labels, "position_ids": positions, "segment_ids": segments,
            "cu_seqlens": cu, "num_docs": counts, "num_tokens": real}


def cu_width(seq_len: int, max_docs: int) -> int:
    """Entries of a row's ``cu_seqlens``: room for every document, the padding segment, and 0."""
    return min(max_docs + 1, seq_len) + 1

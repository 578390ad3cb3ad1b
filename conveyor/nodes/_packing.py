"""Private helpers of ``pack_tokens``: the two packing algorithms and the assembly of one row.

``first_fit(lengths, ...)`` puts each piece, in the pool's order, into the first row that has
room; ``best_fit`` takes the pieces longest first and puts each into the row it leaves the
least room in (best-fit decreasing). Both return rows as lists of piece indices, a row never
holding more than ``seq_len`` tokens nor more than ``max_docs`` pieces. ``assemble`` lays one
row out: ids, labels, position ids restarting per document, segment ids, ``cu_seqlens``.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from typing import Sequence

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

    Example:
        >>> best_fit([3, 6, 5, 4], 10, 10)
        [[1, 3], [2, 0]]
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])  # stable: ties in pool order
    rows: list[list[int]] = []
    open_rows: list[tuple[int, int]] = []  # (free tokens, row), sorted
    for i in order:
        n = lengths[i]
        at = bisect_left(open_rows, (n, -1))
        if at < len(open_rows):
            free, r = open_rows.pop(at)
            rows[r].append(i)
            free -= n
        else:
            r, free = len(rows), seq_len - n
            rows.append([i])
        if free > 0 and len(rows[r]) < max_docs:
            insort(open_rows, (free, r))
    return rows


def assemble(pieces: list[np.ndarray], *, seq_len: int, width: int, pad_id: int, ignore_index: int,
             mask_first: bool, dtype: np.dtype) -> dict[str, np.ndarray | int]:
    """One packed row of ``pieces`` (1-D integer arrays, ``sum(len) <= seq_len``).

    The padding after the last document is a segment of its own (segment id 0, positions
    from 0, ``cu_seqlens`` ending at ``seq_len``), so that every token of a flattened batch lies
    in one segment and no attention row is empty. ``cu_seqlens`` has ``width`` entries: the
    boundaries ``0, l1, l1 + l2, ..., seq_len``, then ``seq_len`` repeated.
    """
    ids = np.full(seq_len, pad_id, dtype=dtype)
    labels = np.full(seq_len, ignore_index, dtype=ROW_INT)
    positions = np.empty(seq_len, dtype=ROW_INT)
    segments = np.zeros(seq_len, dtype=BOUNDS_INT)
    cu = np.full(width, seq_len, dtype=BOUNDS_INT)
    cu[0] = 0
    ramp = np.arange(seq_len, dtype=ROW_INT)
    at = 0
    for k, piece in enumerate(pieces):
        n = len(piece)
        end = at + n
        ids[at:end] = piece
        labels[at:end] = piece
        if mask_first:
            labels[at] = ignore_index
        positions[at:end] = ramp[:n]
        segments[at:end] = k + 1
        cu[k + 1] = end
        at = end
    positions[at:] = ramp[:seq_len - at]
    return {"input_ids": ids, "labels": labels, "position_ids": positions, "segment_ids": segments,
            "cu_seqlens": cu, "num_docs": len(pieces), "num_tokens": at}


def cu_width(seq_len: int, max_docs: int) -> int:
    """Entries of a row's ``cu_seqlens``: room for every document, the padding segment, and 0."""
    return min(max_docs + 1, seq_len) + 1

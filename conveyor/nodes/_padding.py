"""Padding one field of a batch: its samples' sequences as rows of one ``[B, T, ...]`` tensor.

``pad_field`` pads one field's values (tensors, numpy arrays, lists of numbers) to the
longest, rounded up to a multiple, on the right or the left, and gives their lengths and
attention mask; ``check_dtype`` checks a ``dtype`` param and that the pad values fit it.
CPU values are copied with numpy, numpy arrays of one dtype in two calls for the whole field
(see ``_pad_arrays``); ``pad_collate`` (the op) applies this to the fields of each batch.
"""

from __future__ import annotations

import math

from functools import reduce
from typing import Any, Mapping, Sequence

import numpy as np
import torch

SIDES = ("right", "left")
DTYPES = ("int64", "int32", "int16", "int8", "uint8", "float64", "float32", "float16", "bfloat16")
_NUMPY = {dt: torch.empty(0, dtype=dt).numpy().dtype for dt in (
    torch.float16, torch.float32, torch.float64, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool)}


def check_dtype(dtype: str | None, pad_value: float | Mapping[Any, float]) -> torch.dtype | None:
    """The torch dtype named ``dtype`` (``None`` for none), checked to hold the pad values."""
    if dtype is None:
        return None
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} must be one of {', '.join(DTYPES)}")
    dt = getattr(torch, dtype)
    if not dt.is_floating_point:
        info = torch.iinfo(dt)
        values = pad_value.values() if isinstance(pad_value, Mapping) else [pad_value]
        for v in values:
            if isinstance(v, bool) or not math.isfinite(v) or v != int(v) or not info.min <= v <= info.max:
                raise ValueError(f"pad value {v!r} does not fit dtype={dtype!r}")
    return dt


def _as_tensor(value: Any, name: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        if value.dim() == 0:
            raise ValueError(f"field {name!r}: a 0-d tensor cannot be padded")
        return value
    if isinstance(value, np.ndarray):
        if value.ndim == 0 or value.dtype.kind not in "biuf":
            raise ValueError(f"field {name!r}: expected a numeric array of 1 dim or more to pad, got "
                             f"{value.ndim} dims of {value.dtype}")
        return torch.from_numpy(np.ascontiguousarray(value))
    if isinstance(value, (list, tuple)):
        return torch.tensor(value) if value else torch.empty(0, dtype=torch.long)
    raise ValueError(f"field {name!r}: expected a tensor or a list of numbers to pad, got {type(value).__name__}")


def _check_pad(name: Any, pad_value: float, dtype: Any) -> None:
    """Raise unless ``pad_value`` fits ``dtype`` (numpy's or torch's), the padded field's: ids that
    travel narrow (``uint8`` bytes) cannot hold a pad value such as -100, and numpy's refusal
    named neither the field nor the way out."""
    np_dtype = _NUMPY.get(dtype) if isinstance(dtype, torch.dtype) else np.dtype(dtype)
    if np_dtype is None or np_dtype.kind not in "biu":  # floats, and what numpy lacks (bfloat16): any
        return
    low, high = (0, 1) if np_dtype.kind == "b" else (int(np.iinfo(np_dtype).min), int(np.iinfo(np_dtype).max))
    if pad_value != int(pad_value) or not low <= pad_value <= high:
        raise ValueError(f"field {name!r}: pad value {pad_value!r} does not fit its dtype "
                         f"{str(dtype).removeprefix('torch.')} (the samples'); give pad_collate a dtype "
                         "that holds it (dtype: int64 widens ids as they are padded)")


def _rows(seqs: list[torch.Tensor], longest: int, pad_value: float, side: str) -> torch.Tensor:
    """``seqs`` (same dtype and trailing dims) as rows of one ``[B, longest, ...]`` tensor.

    CPU tensors are copied in with numpy: torch would run the fill and the mask on its
    intra-op (OpenMP) threads, whose spinning after each call takes CPU from the trainer and
    from worker copies (measured: the main process's cost per record x1.6 with 2 copies on 2
    cores). Other tensors (GPU, autograd, bfloat16, complex) go through torch.
    """
    first = seqs[0]
    shape = (len(seqs), longest, *first.shape[1:])
    np_dtype = _NUMPY.get(first.dtype)
    by_numpy = np_dtype is not None and all(s.is_cpu and not s.requires_grad for s in seqs)
    if by_numpy:
        out: Any = np.full(shape, pad_value, dtype=np_dtype)
    else:
        out = torch.full(shape, pad_value, dtype=first.dtype, device=first.device)
    for i, seq in enumerate(seqs):
        n = seq.shape[0]
        if n:
            rows = slice(0, n) if side == "right" else slice(longest - n, longest)
            out[i, rows] = seq.numpy() if by_numpy else seq
    return torch.from_numpy(out) if by_numpy else out


def pad_field(values: Sequence[Any], *, name: Any = "?", pad_value: float = 0, side: str = "right",
              multiple: int | None = None, dtype: torch.dtype | None = None,
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pad one field's values to ``[B, T, ...]``; also its lengths ``[B]`` and mask ``[B, T]``.
    The padded tensor has ``dtype`` when given, else the values' (promoted) dtype.

    Example:
        >>> padded, lengths, mask = pad_field([[1, 2, 3], [4]], pad_value=0)
        >>> padded.tolist(), lengths.tolist(), mask.tolist()
        ([[1, 2, 3], [4, 0, 0]], [3, 1], [[1, 1, 1], [1, 0, 0]])
    """
    if type(values[0]) is np.ndarray:
        fast = _pad_arrays(values, name, pad_value, side, multiple, dtype)
        if fast is not None:
            return fast[:3]
    seqs = [_as_tensor(v, name) for v in values]
    common = dtype or reduce(torch.promote_types, (s.dtype for s in seqs if s.numel()), seqs[0].dtype)
    if any(s.dtype != common for s in seqs):  # (empty lists default to int64: they follow the others)
        seqs = [s.to(common) for s in seqs]
    trailing = seqs[0].shape[1:]
    for s in seqs:
        if s.shape[1:] != trailing:
            raise ValueError(f"field {name!r}: sequences must agree in every dim but the first; "
                             f"got shapes {tuple(seqs[0].shape)} and {tuple(s.shape)}")
    counts = [s.shape[0] for s in seqs]
    longest = max(counts)
    if multiple and longest % multiple:
        longest += multiple - longest % multiple
    if pad_value != 0:
        _check_pad(name, pad_value, common)
    padded = _rows(seqs, longest, pad_value, side)
    return (padded,) + _lengths_mask(counts, longest, side)


def _lengths_mask(counts: list[int], longest: int, side: str) -> tuple[torch.Tensor, torch.Tensor]:
    sizes = np.array(counts, dtype=np.int64)
    return torch.from_numpy(sizes), torch.from_numpy(_masks(sizes, longest, side).astype(np.int64))


_MASK_ROWS_MOST = 2048  # longer padded lengths compare positions (a table that long is 4 MB)
_mask_rows = np.zeros((1, 0), bool)


def _masks(sizes: np.ndarray, longest: int, side: str) -> np.ndarray:
    """The ``[len(sizes), longest]`` mask of real tokens. Up to ``_MASK_ROWS_MOST``, rows of a
    table (row ``n``: ``n`` leading Trues) taken in one call, in place of comparing every
    position to every length (``_pad_arrays`` on text.yaml's batches: 40 -> 31 us a batch);
    the table grows to the longest padded length asked (a power of two), then is kept, read-only."""
    global _mask_rows
    if longest > _MASK_ROWS_MOST:
        positions = np.arange(longest)
        return positions < sizes[:, None] if side == "right" else positions >= (longest - sizes)[:, None]
    rows = _mask_rows
    if rows.shape[1] < longest:
        width = max(64, 1 << (longest - 1).bit_length())
        rows = np.arange(width) < np.arange(width + 1)[:, None]
        rows.flags.writeable = False
        _mask_rows = rows  # (a whole new table: a thread reading the old one still may)
    if side == "right":
        return rows[sizes, :longest]
    return ~rows[longest - sizes, :longest]


def _pad_arrays(values: Sequence[np.ndarray], name: Any, pad_value: float, side: str,
                multiple: int | None, dtype: torch.dtype | None,
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int] | None:
    """``pad_field`` of numpy arrays, and their real and padded tokens (rows x padded length):
    joined in one call, then copied into one buffer (of ``dtype``, cast on the way) through the
    mask in one more (the mask walks the real tokens in row order, the order of the arrays
    joined); no Python per sample but its length. None for anything unusual (mixed dtypes or
    dims, non-numeric arrays, other types among the arrays, a ``dtype`` numpy lacks), which the
    tensor path then handles or refuses."""
    given = values[0].dtype
    if given.kind not in "biuf" or (dtype is not None and _NUMPY.get(dtype) is None):
        return None
    try:
        counts = list(map(len, values))  # (a 0-d array has no len: the tensor path refuses it)
        flat = np.concatenate(values)  # refuses other dims; casts mixed dtypes (checked below)
    except (ValueError, TypeError, IndexError, AttributeError, RuntimeError):
        return None
    if flat.dtype != given:  # mixed dtypes: torch's promotion rules (the tensor path) decide
        return None
    return pad_flat(flat, counts, name, pad_value, side, multiple, dtype)


def pad_flat(flat: np.ndarray, counts: list[int], name: Any, pad_value: float, side: str,
             multiple: int | None, dtype: torch.dtype | None,
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int] | None:
    """``_pad_arrays`` of rows given joined (``flat``: numbers, every row's one after another)
    with their ``counts``; None where ``flat`` is not numbers or ``dtype`` is one numpy lacks."""
    out_dtype = flat.dtype if dtype is None else _NUMPY.get(dtype)
    if flat.dtype.kind not in "biuf" or out_dtype is None:
        return None
    longest = max(counts)
    if multiple and longest % multiple:
        longest += multiple - longest % multiple
    sizes = np.array(counts, dtype=np.int64)
    rows = len(counts)
    mask = _masks(sizes, longest, side)
    shape = (rows, longest, *flat.shape[1:])
    if pad_value != 0:
        _check_pad(name, pad_value, out_dtype)
    out = np.zeros(shape, out_dtype) if pad_value == 0 else np.full(shape, pad_value, dtype=out_dtype)
    out[mask] = flat
    return (torch.from_numpy(out), torch.from_numpy(sizes), torch.from_numpy(mask.astype(np.int64)), len(flat),
            rows * longest)

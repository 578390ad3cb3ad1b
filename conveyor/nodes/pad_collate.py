"""pad_collate: collate variable-length samples, padding sequences to the batch's longest.

Each input item is a list of samples (from ``batch`` or ``bucket_batch``). Sequence fields
(1-D tensors, 1-D numpy arrays, or lists of numbers; tensors and arrays of more dims when
named in ``fields``, padded along their first dim) are padded to the longest in the batch, rounded up to
``pad_to_multiple_of``, with ``pad_value`` on the ``right`` or ``left``; their dtype is kept
(lists become ``torch.tensor`` of them: int64 or float32; numpy arrays become tensors of
their dtype) unless ``dtype`` names another: token ids may travel narrow (``uint8`` bytes,
``int32`` ids of a vocabulary) through the shuffle and the length buckets, an eighth or half
the memory, and be widened to the model's ``int64`` here, in the same copy that pads them. A field of numpy arrays (what the batch tokenizers of ``conveyor.text`` give)
is copied into one preallocated buffer, row by row, with no tensor per sample: the cheap path
for short texts. Every other field is collated
with torch's ``default_collate``. For each padded field the batch gets its lengths (int64,
``[B]``) and an attention mask (int64 1 for real tokens, 0 for padding, ``[B, T]``, as
Hugging Face models expect):

* dict samples, one padded field: ``lengths`` and ``attention_mask``;
* dict samples, several padded fields: ``<field>_lengths`` and ``<field>_mask`` each;
* tuple samples: the collated tuple, then ``lengths`` and ``mask`` of each padded field in
  field order (``fields`` are positions: ``[0]``);
* bare sequences: ``(padded, lengths, attention_mask)``.

``fields=None`` pads every field whose value in the first sample is a 1-D tensor or a list of
numbers. A ``bucket_batch`` of a batch tokenizer's blocks hands its batches over as rows
(``IdsRows``: the items and each one's ids) where ``fields`` is that one field: ``pad_rows``
pads them from the ids' buffers and takes the other fields from the items, the batch the
records would give, without making them. The node counts real and padded tokens (``stats()``: ``real_tokens``,
``padded_tokens``, ``padding_efficiency`` for the epoch and ``efficiency_min``, the worst batch);
its state is its input's plus those counts.
"""

from __future__ import annotations

import numbers
from operator import itemgetter
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch.utils.data import default_collate
from torchdata.nodes import BaseNode

from conveyor.errors import SampleError
from conveyor._id_blocks import IdsRows
from conveyor.nodes._padding import DTYPES, SIDES, _pad_arrays, check_dtype, pad_field, pad_flat  # noqa: F401 - DTYPES: its names
from conveyor.nodes.capabilities import RowsAtOnce, has, take_rows
from conveyor.nodes.collate import _named, check_fields, same_fields
from conveyor.nodes.state_shape import Child, Fields, Int, Real


def _is_seq(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.dim() == 1
    if isinstance(value, np.ndarray):
        return value.ndim == 1 and value.dtype.kind in "biuf"
    if isinstance(value, (list, tuple)):
        return all(isinstance(v, numbers.Number) and not isinstance(v, bool) for v in value)
    return False


def _collate(values: list) -> Any:
    """``default_collate`` of a field that is not padded; ints and strs (sample ids, file
    names) the quick way, with the same result."""
    kind = type(values[0])
    if kind is int or kind is str:
        for v in values:
            if type(v) is not kind:
                return default_collate(values)
        return torch.from_numpy(np.array(values, dtype=np.int64)) if kind is int else values
    return default_collate(values)


def _shape(value: Any) -> tuple | None:
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return tuple(value.shape)
    if isinstance(value, (list, tuple)):
        return (len(value),)
    return None


def _unpadded(name: Any, values: list, samples: Sequence[Any], exc: Exception) -> Exception:
    """The error for a field that is not padded and failed to collate: one naming it and the
    first sample whose shape differs from the first's (a sequence left out of ``fields``), or
    ``exc`` as it was."""
    first = _shape(values[0])
    for i, v in enumerate(values):
        if _shape(v) != first:
            return ValueError(f"field {name!r} is not padded (it is not in fields) and its samples differ in "
                              f"shape: {first} in {_named(samples[0], 0)}, {_shape(v)} in {_named(samples[i], i)}; "
                              "name it in fields to pad it, or leave it out of the samples")
    return exc


def _pad_value(pad_value: float | Mapping[Any, float], name: Any) -> float:
    """The value field ``name`` is padded with (a mapping's absent fields: 0)."""
    if type(pad_value) is int or type(pad_value) is float:  # (isinstance of an ABC is slow)
        return pad_value
    if isinstance(pad_value, Mapping):
        return pad_value.get(name, 0)
    return pad_value


def _lean_dict(samples: Sequence[Any], first: dict, names: Sequence[Any], pad_value: float | Mapping[Any, float],
               side: str, multiple: int | None, dtype: torch.dtype | None) -> tuple[dict, int, int] | None:
    """The dict path for its common case (text.yaml's: dict samples whose named fields are
    numpy arrays, the others ints and strs), with no per-field dispatch: the general path's
    Python set-up is much of pad_collate's cost for short texts. None, having changed nothing, for anything else (a missing or unusual field, a
    sample that differs, a value ``_pad_arrays`` refuses, a name clash): the general path
    then gives the batch or the error it always gave."""
    if not _DICT.issuperset(map(type, samples)) or len(set(map(len, samples))) != 1:
        return None
    for name in names:
        if name not in first:
            return None
    one = len(names) == 1
    if (("lengths" in first or "attention_mask" in first) if one
            else any(f"{n}_lengths" in first or f"{n}_mask" in first for n in names)):
        return None
    out: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    real = padded_tokens = 0
    for key in first:
        try:
            values = list(map(itemgetter(key), samples))
        except (KeyError, TypeError, IndexError):
            return None
        if key in names:
            if type(values[0]) is not np.ndarray:
                return None
            got = _pad_arrays(values, key, _pad_value(pad_value, key), side, multiple, dtype)
            if got is None:
                return None
            p, lengths, mask, tokens, room = got
            out[key] = p
            real += tokens
            padded_tokens += room
            if one:
                extra["lengths"], extra["attention_mask"] = lengths, mask
            else:
                extra[f"{key}_lengths"], extra[f"{key}_mask"] = lengths, mask
        else:
            column = _plain_column(values)
            if column is None:
                return None
            out[key] = column
    out.update(extra)
    return out, real, padded_tokens


def _plain_column(values: list) -> Any:
    """A field of ints (or bools among them: int64, as ``default_collate`` makes them) or of
    strs, collated; None for anything else (a float among the ints makes float64, a huge int
    an object array: the general path decides)."""
    kind = type(values[0])
    if kind is int:
        try:
            ints = np.array(values)
        except (OverflowError, ValueError):
            return None
        if ints.dtype is not _INT64:  # (numpy's own int64: one object)
            return None
        return torch.from_numpy(ints)
    if kind is str and _STR.issuperset(map(type, values)):
        return values
    return None


def pad_rows(rows: IdsRows, *, field: Any, pad_value: float | Mapping[Any, float] = 0, side: str = "right",
             pad_to_multiple_of: int | None = None, dtype: torch.dtype | None = None) -> tuple[dict, int, int] | None:
    """``pad_collate`` of a batch of rows (``IdsRows``: a bucket_batch's, of a batch tokenizer's
    block) with ``fields=[field]``, from the rows' buffers and items, without their records:
    what ``_lean_dict`` gives for those records. None, having done nothing, where the records
    must say: the keys they carry are not known, one is missing from an item or is not an int
    or a str, or a key clashes with the fields pad_collate adds (the general path then gives
    the batch or the error it always gave).

    Example:
        >>> from conveyor.text import byte_tokenize
        >>> items = [{"text": "hi", "index": 0, "file": "f", "line": 1}, {"text": "a", "index": 1, "file": "f", "line": 2}]
        >>> block = byte_tokenize.columns(items, dtype="uint8")
        >>> batch, real, padded = pad_rows(IdsRows(block.items, block.row_ids(), [2, 1], block.kind()), field="input_ids")
        >>> batch["input_ids"].tolist(), batch["line"].tolist(), list(batch)[-2:], real, padded
        ([[104, 105], [97, 0]], [1, 2], ['lengths', 'attention_mask'], 3, 4)
    """
    keys = rows.carried
    if keys is None or rows.field != field or field in keys or "lengths" in keys or "attention_mask" in keys:
        return None
    items = rows.items
    columns = {}
    for key in keys:
        try:
            values = list(map(itemgetter(key), items))
        except (KeyError, TypeError, IndexError):  # an item without it: its record differs
            return None
        column = _plain_column(values)
        if column is None:
            return None
        columns[key] = column
    got = pad_flat(rows.joined(), rows.lengths, field, _pad_value(pad_value, field), side, pad_to_multiple_of, dtype)
    if got is None:
        return None
    padded, lengths, mask, real, room = got
    return {field: padded, **columns, "lengths": lengths, "attention_mask": mask}, real, room


_DICT, _STR = frozenset({dict}), frozenset({str})
_INT64 = np.dtype(np.int64)


def pad_collate(samples: Sequence[Any], *, fields: Sequence[Any] | None = None,
                pad_value: float | Mapping[Any, float] = 0, side: str = "right",
                pad_to_multiple_of: int | None = None, dtype: torch.dtype | None = None,
                ) -> tuple[Any, int, int]:
    """Collate ``samples`` with padding; returns ``(batch, real_tokens, padded_tokens)``.
    The padded fields get ``dtype`` when it is given.

    Example:
        >>> batch, real, padded = pad_collate([{"ids": [1, 2], "y": 0}, {"ids": [3], "y": 1}])
        >>> batch["ids"].tolist(), batch["lengths"].tolist(), batch["y"].tolist(), real, padded
        ([[1, 2], [3, 0]], [2, 1], [0, 1], 3, 4)
    """
    if not samples:
        raise ValueError("pad_collate got an empty batch")
    first = samples[0]
    if fields is not None and type(first) is dict and type(first.get(fields[0])) is np.ndarray:
        lean = _lean_dict(samples, first, fields, pad_value, side, pad_to_multiple_of, dtype)
        if lean is not None:
            return lean

    def pad(name: Any, values: list) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return pad_field(values, name=name, pad_value=_pad_value(pad_value, name), side=side,
                         multiple=pad_to_multiple_of, dtype=dtype)
    real = padded_tokens = 0
    if _is_seq(first) or (isinstance(first, torch.Tensor) and fields is None and first.dim() >= 1):
        p, lengths, mask = pad("sequence", list(samples))
        return (p, lengths, mask), sum(lengths.tolist()), int(mask.numel())
    if type(first) is dict or isinstance(first, Mapping):
        names = list(fields) if fields is not None else [k for k, v in first.items() if _is_seq(v)]
        missing = [n for n in names if n not in first]
        if missing:
            raise SampleError(f"fields {missing} are not in the samples (fields: {list(first)})")
        check_fields(samples)
        out: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for key in first:
            try:
                values = list(map(itemgetter(key), samples))
            except (KeyError, TypeError, IndexError):  # a sample without it, or not a dict
                same_fields(samples)
                raise
            if key in names:
                p, lengths, mask = pad(key, values)
                out[key] = p
                real += sum(lengths.tolist())
                padded_tokens += mask.numel()
                if len(names) == 1:
                    extra["lengths"], extra["attention_mask"] = lengths, mask
                else:
                    extra[f"{key}_lengths"], extra[f"{key}_mask"] = lengths, mask
            else:
                try:
                    out[key] = _collate(values)
                except RuntimeError as exc:  # torch.stack's "expects each tensor to be equal size"
                    raise _unpadded(key, values, samples, exc) from exc
        clash = [k for k in extra if k in out]
        if clash:
            raise ValueError(f"the samples already have fields {clash}, which pad_collate adds; rename them")
        out.update(extra)
        return out, real, padded_tokens
    if isinstance(first, (tuple, list)):
        names = list(fields) if fields is not None else [i for i, v in enumerate(first) if _is_seq(v)]
        bad = [n for n in names if not isinstance(n, int) or not 0 <= n < len(first)]
        if bad:
            raise ValueError(f"fields {bad} are not positions of the {len(first)}-tuples")
        cols: list[Any] = []
        tail: list[Any] = []
        for i in range(len(first)):
            values = [s[i] for s in samples]
            if i in names:
                p, lengths, mask = pad(i, values)
                cols.append(p)
                tail.extend((lengths, mask))
                real += sum(lengths.tolist())
                padded_tokens += mask.numel()
            else:
                try:
                    cols.append(default_collate(values))
                except RuntimeError as exc:
                    raise _unpadded(i, values, samples, exc) from exc
        return tuple(cols + tail), real, padded_tokens
    raise ValueError(f"pad_collate expects dicts, tuples or sequences, got {type(first).__name__}")


class PadCollate(BaseNode):
    """Collate each list of samples, padding the sequence fields (see the module docstring).

    Args:
        source: a stream of lists of samples.
        fields: names (dicts) or positions (tuples) to pad; ``None``: every 1-D sequence field.
        pad_value: one value, or a mapping field -> value (absent fields pad with 0).
        side: ``"right"`` or ``"left"``.
        pad_to_multiple_of: round the padded length up to a multiple of this.
        dtype: the padded fields' dtype, one of ``DTYPES`` (``None``: the samples'); an
            integer one needs integer ``pad_value``s it can hold.
        where: text for error notes (the node and spec line).

    Example:
        >>> from torchdata.nodes import IterableWrapper
        >>> batch = next(PadCollate(IterableWrapper([[{"ids": [1, 2, 3]}, {"ids": [4]}]]), side="left"))
        >>> batch["ids"].tolist(), batch["attention_mask"].tolist()
        ([[1, 2, 3], [0, 0, 4]], [[1, 1, 1], [0, 0, 1]])
    """

    SOURCE_KEY = "source"
    REAL_KEY = "real"
    PADDED_KEY = "padded"
    MIN_KEY = "min"
    STATE_SHAPE = Fields({SOURCE_KEY: Child(), REAL_KEY: Int(), PADDED_KEY: Int(), MIN_KEY: Real(min=0)})

    def __init__(self, source: BaseNode, *, fields: Sequence[Any] | None = None,
                 pad_value: float | Mapping[Any, float] = 0, side: str = "right",
                 pad_to_multiple_of: int | None = None, dtype: str | None = None, where: str | None = None):
        super().__init__()
        if side not in SIDES:
            raise ValueError(f"{side=} must be one of {SIDES}")
        if pad_to_multiple_of is not None and (not isinstance(pad_to_multiple_of, int) or pad_to_multiple_of <= 0):
            raise ValueError(f"{pad_to_multiple_of=} must be a positive int or None")
        if fields is not None and (isinstance(fields, (str, bytes)) or not len(fields)):
            raise ValueError(f"{fields=} must be a non-empty list of names or positions, or None")
        if not isinstance(pad_value, (numbers.Number, Mapping)):
            raise ValueError(f"{pad_value=} must be a number or a mapping field -> number")
        self.dtype = check_dtype(dtype, pad_value)
        self.source = source
        self.fields = list(fields) if fields is not None else None
        self.pad_value = pad_value
        self.side = side
        self.multiple = pad_to_multiple_of
        self.where = where or "pad_collate"
        self.real = self.padded = 0
        self.worst = 1.0
        # batches of rows (nodes/capabilities.py: a bucket_batch of a batch tokenizer's blocks)
        self._rows = self.fields is not None and len(self.fields) == 1 and has(source, RowsAtOnce)

    def stats(self) -> dict[str, Any]:
        return {"real_tokens": self.real, "padded_tokens": self.padded,
                "padding_efficiency": round(self.real / self.padded, 4) if self.padded else 1.0,
                "efficiency_min": round(self.worst, 4)}

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        if initial_state is None:
            self.source.reset()
            self.real = self.padded = 0
            self.worst = 1.0
        else:
            self.source.reset(initial_state[self.SOURCE_KEY])
            self.real, self.padded = initial_state[self.REAL_KEY], initial_state[self.PADDED_KEY]
            self.worst = initial_state[self.MIN_KEY]

    def next(self) -> Any:
        samples = take_rows(self.source) if self._rows else next(self.source)
        try:
            got = None
            if type(samples) is IdsRows:
                got = pad_rows(samples, field=self.fields[0], pad_value=self.pad_value, side=self.side,  # type: ignore[index]
                               pad_to_multiple_of=self.multiple, dtype=self.dtype)
                if got is None:
                    samples = samples.records()
            if got is None:
                got = pad_collate(samples, fields=self.fields, pad_value=self.pad_value, side=self.side,
                                  pad_to_multiple_of=self.multiple, dtype=self.dtype)
            batch, real, padded = got
        except Exception as exc:
            exc.add_note(f"in {self.where}")
            raise
        self.real += real
        self.padded += padded
        if padded:
            self.worst = min(self.worst, real / padded)
        return batch

    def get_state(self) -> dict:
        return {self.SOURCE_KEY: self.source.state_dict(), self.REAL_KEY: self.real,
                self.PADDED_KEY: self.padded, self.MIN_KEY: self.worst}

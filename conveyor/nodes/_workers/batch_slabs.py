"""Batch-shaped arrays that a threaded map's ``fn`` writes its images into, so collate copies nothing.

In ``map (thread workers) → batch → collate`` every image used to be written twice after its
kernel: by the kernel into a new tensor (in a decode thread), then by collate into the batch
(in the loader's one serial thread, on a cold cache, ~25-35 us of a ~1 ms image). With slabs
the kernel writes its output into the image's row of an array shaped like a batch (the resize
writes there directly; a flipped image is copied there by the flip), and collate finds that a
batch's samples are consecutive rows of one slab and hands those rows out as the batch.

* ``Slabs.assign`` (the map's caller thread, in input order) gives each item a slot: the
  item's expected place in the map's output (its input position less the items skipped so
  far) modulo the slab size, at or after the last slot given. So while nothing is skipped
  slab ``k`` is exactly batch ``k``; after a skip the items already in flight sit one slot
  off (collate copies their batches, as it always did) and the next ones realign. A slot is
  never given twice, and a skipped item's slot is never read.
* ``Into`` is what the map passes as ``fn``'s ``into`` argument: ``into(key, shape, dtype)``
  is the item's row of the slab's array for output field ``key`` (made, or reused, by the
  first item that asks; None for another shape or dtype: ``fn`` then makes its own tensor).
* ``slab_batch`` (collate) returns the rows of one slab that a batch consists of, or None.

A slab's array is written again only when nothing refers to it (``Buffers``, the rule collate
uses for its own arrays): each row handed out, the batch, and every tensor or array made from
them hold a reference to it, so a batch the trainer keeps is never overwritten, nor a slab
that a worker abandoned at a reset is still writing.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import numpy as np
import torch

SLAB_MARK = "_conveyor_slab"  # attribute set on a slab's tensor: views of it may be handed out as batches


class Buffers:
    """Arrays to write batches into, each written again once nothing refers to it.

    A batch handed out is ``torch.from_numpy(array)`` (or a view of it): its storage (shared by
    every view and every tensor made from it) holds a reference to the array, as does any
    numpy array made by ``.numpy()``; an array referred to only by this list is no batch's any
    more. At most ``keep_free`` unused arrays are kept; the list holds at most ``most`` arrays.
    """

    def __init__(self, keep_free: int = 2, most: int = 32):
        self.keep_free = keep_free
        self.most = most
        self.arrays: list[np.ndarray] = []

    def get(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        arrays = self.arrays
        free = [i for i in range(len(arrays)) if sys.getrefcount(arrays[i]) == 2]  # the list, the call
        for i in free:
            a = arrays[i]
            if a.shape == shape and a.dtype == dtype:
                del arrays[i]
                arrays.append(a)
                return a
        for i in reversed(free[: max(0, len(free) - self.keep_free + 1)]):
            del arrays[i]  # unused, of another shape: keep_free - 1 of them stay
        a = np.empty(shape, dtype)
        arrays.append(a)
        if len(arrays) > self.most:  # batches held by the trainer: no longer tracked
            del arrays[0]
        return a


def plain_tensor(t: Any) -> bool:
    """A CPU tensor that stacks as its numpy array (no grad, no subclass, strided)."""
    return (type(t) is torch.Tensor and t.device.type == "cpu" and t.layout == torch.strided
            and not t.requires_grad)


class _Slab:
    """``size`` slots; per field, the array and the tensor over it (made on first use)."""

    __slots__ = ("fields",)

    def __init__(self) -> None:
        self.fields: dict[Any, tuple[np.ndarray, torch.Tensor] | None] = {}


class Slabs:
    """Slots for a map's outputs in slabs of ``size`` consecutive outputs.

    Args:
        size: outputs per slab: the batch size of the ``batch`` after the map.
    """

    def __init__(self, size: int):
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"{size=} must be a positive int")
        self.size = size
        self._lock = threading.Lock()
        self._buffers: dict[Any, Buffers] = {}
        self.restart()

    def restart(self) -> None:
        """Forget the slab being filled (a reset: slots start again from 0)."""
        self._next = 0
        self._slab: _Slab | None = None
        self._slab_no = -1

    def assign(self, expected: int) -> tuple[_Slab, int]:
        """The slot for the next item, whose place in the output would be ``expected``."""
        s = self._next + (expected - self._next) % self.size
        self._next = s + 1
        no, row = divmod(s, self.size)
        if no != self._slab_no:
            self._slab, self._slab_no = _Slab(), no
        return self._slab, row  # type: ignore[return-value]

    def into(self, slab: _Slab, row: int) -> Into:
        """What the map passes to an ``fn`` that takes ``into``: its slot, to write into."""
        return Into(self, slab, row)

    def field(self, slab: _Slab, key: Any, shape: tuple[int, ...],
              dtype: torch.dtype) -> tuple[np.ndarray, torch.Tensor] | None:
        """``slab``'s (array, tensor) for ``key``, made by the first caller; None when it
        holds another shape or dtype (or a dtype numpy lacks)."""
        field = slab.fields.get(key)
        if field is None:
            with self._lock:
                if key not in slab.fields:
                    slab.fields[key] = self._new(key, shape, dtype)
                field = slab.fields[key]
        if field is None or field[1].shape[1:] != shape or field[1].dtype != dtype:
            return None
        return field

    def _new(self, key: Any, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[np.ndarray, torch.Tensor] | None:
        try:
            np_dtype = torch.empty(0, dtype=dtype).numpy().dtype
        except (TypeError, RuntimeError):  # bfloat16 and others numpy lacks
            return None
        buffers = self._buffers.setdefault(key, Buffers())
        array = buffers.get((self.size, *shape), np_dtype)
        tensor = torch.from_numpy(array)
        setattr(tensor, SLAB_MARK, True)
        return array, tensor


class Into:
    """``into(key, shape, dtype)``: the writable row for output field ``key`` of one item,
    a contiguous tensor of that shape and dtype, or None (then ``fn`` makes its own)."""

    __slots__ = ("slabs", "slab", "row")

    def __init__(self, slabs: Slabs, slab: _Slab, row: int):
        self.slabs, self.slab, self.row = slabs, slab, row

    def __call__(self, key: Any, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
        field = self.slabs.field(self.slab, key, tuple(shape), dtype)
        return None if field is None else field[1][self.row]


def slab_batch(batch: list[torch.Tensor]) -> torch.Tensor | None:
    """The rows of one slab that ``batch`` consists of, in order, as one tensor; else None."""
    base = batch[0]._base
    if base is None or not getattr(base, SLAB_MARK, False):
        return None
    row, rest = base.stride(0), base.shape[1:]
    first = batch[0].storage_offset()
    if first % row:
        return None
    for i, t in enumerate(batch):
        if t._base is not base or t.storage_offset() != first + i * row or t.shape != rest \
                or not t.is_contiguous():
            return None
    start = first // row
    return base[start:start + len(batch)]

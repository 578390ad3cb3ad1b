"""Chunk hand-off between processes: items pickled once, their tensors packed in one buffer.

Pickling a small CPU tensor by value costs torch a ``torch.load`` per tensor, and even through
numpy it is a reduce, a dtype and a reconstruct per tensor (~6 µs each way for a 100-token
sequence). ``pack`` pickles the items with every plain CPU tensor replaced by a reference,
copies the tensors' bytes into one ``bytearray`` (each at a multiple of 64 bytes) and returns
``(structure, metas, raw)``; ``unpack`` makes each tensor a view of that buffer with
``torch.frombuffer`` (no copy) and unpickles the structure. A tensor that does not fit
(gradients, sparse, quantized, a subclass) is pickled the ordinary way.

The tensors of one chunk share the chunk's buffer: keeping one keeps the chunk's bytes
(tens of KB) alive, as a view would.

``share=True`` (worker processes) sends tensors of ``SHARE_MIN_BYTES`` (1 MiB) and more through
shared memory, no bytes crossing the pipe: copied into a slot the worker's ``Lender`` reuses
(``shared_slots``; only the slot's number travels), or, with no lender or every slot lent, through
torch's own multiprocessing reduction (the tensor moves to a new segment and its file
descriptor is passed, as DataLoader does with its batches). A 4.8 MB image batch: 5 ms instead
of 10 per hand-off (``worker_pipe``' direct writes), 16-20 ms through ``Connection.send_bytes``; in
a reused slot, a copy into memory already mapped on both sides. ``Packer`` falls back to
by-value packing, saying so once, when shared memory fails (a small ``/dev/shm`` in a container).
"""

from __future__ import annotations

import io
import logging
import math
import pickle
import warnings
from typing import Any

import torch

from conveyor.nodes._workers.shared_slots import Borrower, Lender

log = logging.getLogger(__name__)

ALIGN = 64
SHARE_MIN_BYTES = 1 << 20  # with share=True, tensors this big go through shared memory
_PADS = [bytes(n) for n in range(ALIGN)]
_PACKABLE = frozenset({
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128,
    torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool,
})
_Tensor, _STRIDED = torch.Tensor, torch.strided


class _Pickler(pickle.Pickler):
    share_min: float = float("inf")
    torch_share = False  # whether a big tensor no slot takes goes torch's way (else by value)

    def __init__(self, file: io.BytesIO, tensors: list, lender: Lender | None = None):
        super().__init__(file, 5)  # positional: ForkingPickler passes only *args on
        self.tensors = tensors
        self.lender = lender
        self.seen: dict[int, int] = {}  # id(tensor) -> its number: one tensor twice stays one

    def persistent_id(self, obj: Any) -> int | tuple | None:
        # called for every object pickled: the common "not a tensor" answer comes first
        if type(obj) is not _Tensor or obj.requires_grad or obj.layout is not _STRIDED \
                or not obj.is_cpu or obj.dtype not in _PACKABLE:
            return None
        if obj.numel() * obj.element_size() >= self.share_min:
            lender = self.lender
            if lender is not None and id(obj) not in lender.mine:
                pid = lender.lend(obj)  # a slot of shared memory; None: every slot is lent
                if pid is not None or self.torch_share:
                    return pid
            elif self.torch_share:
                return None  # torch's own reduction: moved to shared memory, its fd sent
        pid = self.seen.get(id(obj))
        if pid is None:
            pid = self.seen[id(obj)] = len(self.tensors)
            self.tensors.append(obj)
        return pid


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, tensors: list, borrower: Borrower | None = None):
        super().__init__(file)
        self.tensors = tensors
        self.borrower = borrower

    def persistent_load(self, pid: int | tuple) -> torch.Tensor:
        if isinstance(pid, tuple):
            if self.borrower is None:
                raise pickle.UnpicklingError("a tensor lent in shared memory, and no Borrower to map it")
            return self.borrower.view(pid)
        return self.tensors[pid]


def _sharing_pickler() -> type:
    global _SharingPickler
    if _SharingPickler is None:
        import torch.multiprocessing  # noqa: F401 - registers torch's reductions
        from multiprocessing.reduction import ForkingPickler

        class _Sharing(_Pickler, ForkingPickler):
            share_min = SHARE_MIN_BYTES
            torch_share = True

        _SharingPickler = _Sharing
    return _SharingPickler


_SharingPickler: type | None = None


class _LendingPickler(_Pickler):
    """Big tensors into the lender's slots, by value when every slot is lent: for a process
    that cannot hand torch's shared memory over (a Ray actor, ``named_slots``)."""
    share_min = SHARE_MIN_BYTES


def pack(items: Any, *, share: bool = False, lender: Lender | None = None) -> tuple[bytes, list, pickle.PickleBuffer]:
    """``items`` as (pickled structure, tensor metas, one buffer of the tensors' bytes).

    The buffer is a ``PickleBuffer``: pickled with protocol 5 and a ``buffer_callback`` it
    travels out of band (``worker_pipe`` writes it straight from memory), else in band. With
    ``share`` and a ``lender``, big tensors are copied into the lender's slots (``shared_slots``),
    else moved to shared memory by torch; with a ``lender`` and no ``share``, into its slots, else
    packed by value (``named_slots``: a Ray actor, which cannot pass torch's file descriptors).
    """
    tensors: list[torch.Tensor] = []
    buf = io.BytesIO()
    pickler = _sharing_pickler() if share else _LendingPickler if lender is not None else _Pickler
    pickler(buf, tensors, lender).dump(items)
    metas, raw = [], bytearray()
    for t in tensors:
        metas.append((t.dtype, tuple(t.shape), len(raw)))
        if not t.is_contiguous():
            t = t.contiguous()
        if t.dtype is torch.bfloat16:  # numpy has no bfloat16; the bytes are what matter
            t = t.view(torch.int16)
        raw += t.numpy().data if t.dim() else t.reshape(1).numpy().data
        raw += _PADS[-len(raw) % ALIGN]
    return buf.getvalue(), metas, pickle.PickleBuffer(raw)


class Packer:
    """``pack`` for a worker process: through shared memory (the ``lender``'s slots when
    given, see ``shared_slots``) until that fails once (a small ``/dev/shm`` in a container, say),
    then by value through the pipe, said once."""

    def __init__(self, share: bool = True, lender: Lender | None = None):
        self.share = share
        self.lender = lender

    def __call__(self, items: Any) -> tuple[bytes, list, pickle.PickleBuffer]:
        if self.share:
            if self.lender is not None:
                self.lender.begin()
            try:
                return pack(items, share=True, lender=self.lender)
            except RuntimeError as exc:  # torch: "unable to write to file </torch_...>: No space left"
                self.share = False
                log.warning("shared memory for big tensors failed (%s); this worker sends them "
                            "through its pipe from now on. In a container, give it more /dev/shm "
                            "(docker run --shm-size=...)", exc)
        return pack(items)

    def take_back(self) -> None:
        """The last chunk packed was not sent: the shared-memory slots it took are free again."""
        if self.lender is not None:
            self.lender.take_back()


def unpack(packed: tuple[bytes, list, Any], borrower: Borrower | None = None) -> Any:
    """The items of ``pack``, their tensors views of one buffer (lent ones, views of the
    ``borrower``'s slots)."""
    structure, metas, raw = packed
    if isinstance(raw, pickle.PickleBuffer):  # not pickled on the way
        raw = raw.raw()
    if metas and memoryview(raw).readonly:
        # from Ray's object store: a read-only buffer over memory the store maps writable here,
        # and the loader's alone (the object is never read again), so torch's warning that the
        # tensors could write it says nothing (a filter set once would not outlive pytest's)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The given buffer is not writable", category=UserWarning)
            tensors = _views(raw, metas)
    else:
        tensors = _views(raw, metas)
    return _Unpickler(io.BytesIO(structure), tensors, borrower).load()


def _views(raw: Any, metas: list) -> list[torch.Tensor]:
    tensors = []
    for dtype, shape, offset in metas:
        count = math.prod(shape)
        if count:
            t = torch.frombuffer(raw, dtype=dtype, count=count, offset=offset)
            tensors.append(t if len(shape) == 1 else t.view(shape))
        else:
            tensors.append(torch.empty(shape, dtype=dtype))
    return tensors

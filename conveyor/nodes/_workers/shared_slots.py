"""Shared-memory slots a worker process lends the main process for its big tensors, written
again only once nothing in the main process uses them.

torch's own hand-off of a tensor between processes, which ``chunk_packing`` used for every tensor
of 1 MiB or more, copies it into a new shared-memory segment each time; the main process gets
that segment's file descriptor through ``multiprocessing``'s resource sharer (a socket
connection per tensor) and maps it afresh. For a 4.8 MB image batch that is 2.5-3 ms of the
worker's CPU and 0.5-0.6 ms of the main process's, and both then fault in new pages.

A ``Lender`` (in the worker) keeps segments ("slots") and copies each big tensor into a free
one; only the slot's number, dtype and shape travel, the segment itself (its descriptor,
through torch's reduction) only the first time. A ``Borrower`` (in the main process) keeps
each slot's mapping and gives the tensor as a view of it.

A slot stays lent until the main process finds nothing using it: every tensor made from the
view (the batch, its slices, a numpy array of it) holds the slot's storage, so the storage's
use count falls back to the borrower's own reference once the trainer lets go.
``Borrower.release`` (called before each chunk is unpacked) then clears the slot's flag in an
array both processes share, and only then may the lender write the slot again. A slot is never
written while the main process holds a view of it; a chunk the main process drops unread
(stale after a reset) is unpacked and let go like any other, so its slots come back. With
every slot lent (a trainer keeping many batches), a tensor goes torch's way, a new segment.
Slots are made as many at once as the worker may have chunks in flight, then in doublings (at
most ``MAX_SLOTS`` and ``SLOT_BYTES`` a worker, and only while half of ``/dev/shm`` stays free:
a container's 64 MB would otherwise be left full for the loader's life, with no room for
torch's own hand-offs or NCCL), and kept for the loader's life: the memory steps up at the
start to what the run needs at once, then stays flat.
A message packed and then never sent (a new command came first) gives its slots back
(``take_back``). What the main process cannot see is a view handed on to a third process
(torch shares the slot's segment with it): such a batch must be copied first (README).

Measured on imagenet-procs.yaml (2 worker processes, 800 ImageNet-sized JPEGs, 10 paired
rounds): 1,447 → 1,723 images/s, 1.38 → 1.15 ms of CPU per image (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch

MAX_SLOTS = 32  # slots per worker: chunks in flight (the credits) and what the main process holds
SLOT_BYTES = 256 << 20  # a worker's slots hold at most this much (its first slot: whatever it needs)
SHM = "/dev/shm"  # where torch makes shared memory (POSIX shm_open) on Linux
SHM_KEEP_FREE = 0.5  # slots are made only while this share of SHM's size stays free for others
LENT = "conveyor-lent"  # the tag of a persistent id naming a slot


def shm_room(nbytes: int) -> int | None:
    """How many slots of ``nbytes`` fit in ``SHM`` leaving ``SHM_KEEP_FREE`` of its size free
    (for torch's own hand-offs, NCCL, other jobs: a container's 64 MB is soon full); None where
    there is no such folder to ask (then only ``SLOT_BYTES`` bounds the slots)."""
    try:
        st = os.statvfs(SHM)
    except OSError:
        return None
    free, size = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
    return max(0, int(free - size * SHM_KEEP_FREE) // nbytes)


def _use_count(t: torch.Tensor) -> int:
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata)


# what a storage held by one tensor reports (that tensor and the temporary storage object)
_ALONE = _use_count(torch.empty(1)) if hasattr(torch._C, "_storage_Use_Count") else None


def available() -> bool:
    """Whether this torch can tell when a slot is free (else big tensors go torch's way)."""
    return _ALONE is not None


class Lender:
    """The worker's side: ``lend(t)`` copies ``t`` into a free slot and returns its persistent
    id, or None when every slot is lent (the caller then lets torch share ``t``).

    Args:
        flags: a ``multiprocessing.Array("b", n)`` shared with the main process's
            ``Borrower``: ``flags[i]`` is 1 while slot ``i`` is lent.
        first: slots made at the first lending: the chunks a worker may have in flight (its
            credits) each hold one, so a run needs at least that many at once.
    """

    def __init__(self, flags: Any, first: int = 1):
        self.flags = flags
        self.first = max(1, first)
        self.slots: list[torch.Tensor] = []
        self.sent: list[bool] = []
        self.mine: set[int] = set()  # id() of the slots' tensors: pickled by torch, not lent
        self.last: list[tuple[int, bool]] = []  # slots lent since begin(), each (i, its first time)

    def begin(self) -> None:
        """A new message: ``take_back`` returns only the slots lent from here on."""
        self.last = []

    def take_back(self) -> None:
        """The message packed since ``begin`` was never sent (a new command came first): its
        slots are free again, and a slot it would have handed over first is handed over by
        the next message that lends it."""
        with self.flags.get_lock():
            for i, first in self.last:
                self.flags[i] = 0
        for i, first in self.last:
            if first:
                self.sent[i] = False
        self.last = []

    def _grow(self, nbytes: int) -> bool:
        """Add slots of ``nbytes``: ``first`` of them, then as many as there are (doubling),
        so that the most a run needs at once is reached in a few early steps, not one slot at
        a time over many epochs; within ``MAX_SLOTS``, ``SLOT_BYTES`` (the first slot always)
        and the room ``/dev/shm`` has (``shm_room``). False when not even one fits."""
        slots = self.slots
        held = sum(s.numel() for s in slots)
        budget = (SLOT_BYTES - held) // nbytes
        if not slots:
            budget = max(1, budget)  # the first slot always
        shm = shm_room(nbytes)
        if shm is not None:
            budget = min(budget, shm)
        room = min(len(self.flags) - len(slots), budget)
        for _ in range(min(len(slots) or self.first, room)):
            slots.append(self._new_slot(nbytes))
            self.sent.append(False)
            self.mine.add(id(slots[-1]))
        return room > 0

    def _new_slot(self, nbytes: int) -> torch.Tensor:
        """A slot of ``nbytes``: torch's shared memory, handed over by torch's reduction
        (``named_slots`` makes them as files, for a process the main one did not fork)."""
        return torch.empty(nbytes, dtype=torch.uint8).share_memory_()

    def lend(self, t: torch.Tensor) -> tuple | None:
        nbytes = t.numel() * t.element_size()
        flags, slots = self.flags, self.slots
        with flags.get_lock():
            free = [i for i in range(len(slots)) if not flags[i] and slots[i].numel() >= nbytes]
        if free:
            i = min(free, key=lambda k: slots[k].numel())
        else:
            i = len(slots)
            if not self._grow(nbytes):
                return None
        slots[i][:nbytes].view(t.dtype).view(t.shape).copy_(t)
        with flags.get_lock():
            flags[i] = 1
        first = not self.sent[i]
        self.sent[i] = True
        self.last.append((i, first))
        return (LENT, i, t.dtype, tuple(t.shape), slots[i] if first else None)


class Borrower:
    """The main process's side for one worker: ``view(pid)`` is the lent tensor, a view of
    the slot; ``release()`` hands back the slots nothing uses any more."""

    def __init__(self, flags: Any):
        self.flags = flags
        self.slots: dict[int, torch.Tensor] = {}
        self.lent: set[int] = set()

    def view(self, pid: tuple) -> torch.Tensor:
        _, i, dtype, shape, slot = pid
        if slot is not None:  # the slot's first lending: its segment, mapped here once
            self.slots[i] = slot
        elif i not in self.slots:
            raise RuntimeError(f"shared-memory slot {i} was never handed over (a lost message?)")
        self.lent.add(i)
        return self.slots[i][: math.prod(shape) * dtype.itemsize].view(dtype).view(shape)

    def release(self) -> int:
        """Clear the flag of every lent slot whose storage only this borrower holds; returns
        how many slots are still lent."""
        freed = [i for i in self.lent if _use_count(self.slots[i]) <= _ALONE]
        if freed:
            with self.flags.get_lock():
                for i in freed:
                    self.flags[i] = 0
            self.lent.difference_update(freed)
        return len(self.lent)

"""Shared-memory slots named by a file, for a copy the main process did not start: a Ray actor
on the driver's own node lends the driver its big tensors as a worker process does.

A worker process hands its first use of a slot over through torch's reduction (a file
descriptor through ``multiprocessing``); an actor has only Ray between it and the driver. So
here a slot is a file in ``/dev/shm`` that both map (``torch.from_file(..., shared=True)``):
the actor's ``FileLender`` makes it and sends its name with the slot's first lending, the
driver's ``FileBorrower`` maps it then and removes the name (the memory lives on in the two
mappings; at close the driver removes the names of slots whose first lending never came). The
lent flags are a file too (``FileFlags``), one per life of the actor: a restarted actor, a new
process with new slots, never sees the flags of batches the trainer still holds from the one
before. Everything else (when a slot is free again, what happens with every slot lent) is
``shared_slots``'s.

No lock guards the flags: a flag is set only by the lender (0 to 1, or back for a message it
never sent) and cleared only by the borrower (1 to 0), one byte each.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

import numpy as np
import torch

from conveyor.nodes._workers.child_processes import state
from conveyor.nodes._workers.shared_slots import MAX_SLOTS, SHM, Borrower, Lender


class FileFlags:
    """The lent flags of one life of a copy: a byte a slot, in a file both processes map.

    Args:
        path: the file (in ``SHM``); ``create`` makes it (the driver), else it must exist.
        slots: the number of flags.
    """

    def __init__(self, path: str, *, slots: int = MAX_SLOTS, create: bool = False):
        if create:
            with open(path, "xb") as f:
                f.write(bytes(slots))
        self.path = path
        self.array = np.memmap(path, dtype=np.uint8, mode="r+", shape=(slots,))

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, i: int) -> int:
        return int(self.array[i])

    def __setitem__(self, i: int, value: int) -> None:
        self.array[i] = value

    def get_lock(self) -> contextlib.nullcontext:
        return contextlib.nullcontext()  # one writer a transition (see the module's docstring)

    def remove(self) -> None:
        """Remove the file's name (the mappings stay valid)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


class FileLender(Lender):
    """The actor's side: slots made as files named ``<prefix>-s<i>`` in ``SHM``."""

    def __init__(self, flags: FileFlags, prefix: str, first: int = 1):
        super().__init__(flags, first)
        self.prefix = prefix
        self.names: list[str] = []

    def _new_slot(self, nbytes: int) -> torch.Tensor:
        path = os.path.join(SHM, f"{self.prefix}-s{len(self.names)}")
        with open(path, "xb") as f:
            f.truncate(nbytes)
        self.names.append(path)
        return torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8)

    def lend(self, t: torch.Tensor) -> tuple | None:
        pid = super().lend(t)
        if pid is not None and pid[4] is not None:  # the slot's first lending: its name, not its memory
            pid = pid[:4] + (self.names[pid[1]],)
        return pid


class FileBorrower(Borrower):
    """The driver's side: a slot's file is mapped at its first lending, and its name removed."""

    def __init__(self, flags: FileFlags):
        super().__init__(flags)
        self.nbytes = 0  # bytes of the tensors viewed: what came through shared memory

    def view(self, pid: tuple) -> torch.Tensor:
        name = pid[4]
        if isinstance(name, str):
            slot = torch.from_file(name, shared=True, size=os.path.getsize(name), dtype=torch.uint8)
            os.unlink(name)
            pid = pid[:4] + (slot,)
        t = super().view(pid)
        self.nbytes += t.numel() * t.element_size()
        return t


def remove_slots(prefix: str) -> int:
    """Remove the names of slots ``<prefix>-s*`` never mapped here (a lending lost with its
    message, a closing loader); how many there were."""
    gone = 0
    head = f"{prefix}-s"
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(SHM):
            if entry.name.startswith(head):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                    gone += 1
    return gone


ORPHAN_AGE = 3600.0  # seconds a name of a dead driver must have lain before remove_orphans takes it


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs: a zombie (killed, not yet reaped by its parent) has let its mappings
    go, so its names are orphans too, though ``kill(pid, 0)`` still finds it."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive (unless /proc says it is a zombie)
        pass
    return state(pid) not in ("Z", "X")  # (None, no /proc or gone meanwhile: kill's answer)


def remove_orphans(head: str = "conveyor-ray-", *, older_than: float = ORPHAN_AGE) -> list[int]:
    """Remove the names ``<head><pid>-...`` that drivers killed before they closed (SIGKILL, an
    OOM kill) left in ``SHM``: each holds memory until the machine restarts. A name is taken
    only when its driver's pid is gone and it has lain ``older_than`` seconds: a live job maps
    and unnames its slots within seconds, and the age keeps a driver this process cannot see
    (another pid namespace sharing ``/dev/shm``) safe. The pids whose names went, sorted."""
    now = time.time()
    gone: set[int] = set()
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(SHM):
            name = entry.name
            if not name.startswith(head):
                continue
            pid_text = name[len(head):].split("-", 1)[0]
            if not pid_text.isdigit() or _alive(int(pid_text)):
                continue
            with contextlib.suppress(FileNotFoundError):
                if now - entry.stat(follow_symlinks=False).st_mtime < older_than:
                    continue
                os.unlink(entry.path)
                gone.add(int(pid_text))
    return sorted(gone)


def lender_for(share: tuple[str, str, str] | None, node: str, first: int) -> FileLender | None:
    """The lender for an actor on ``node`` given the driver's ``share`` (its node, the flags
    file, the slots' prefix): None (the object store) on another node."""
    if share is None or share[0] != node:
        return None
    flags = FileFlags(share[1])
    flags.remove()  # mapped on both sides now: the name has done its work
    return FileLender(flags, share[2], first=first)


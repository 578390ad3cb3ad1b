"""Big tensors from worker processes travel in shared-memory slots the workers reuse
(``conveyor/nodes/_workers/shared_slots.py``): a slot is written again only once the main process holds no
view of it, so a batch the trainer keeps never changes under it."""

from __future__ import annotations

import contextlib
import time

import pytest

from conveyor.nodes._workers.shared_slots import MAX_SLOTS, available

pytestmark = pytest.mark.skipif(not available(), reason="this torch cannot tell a storage's use count")


@contextlib.contextmanager
def _copies():
    """Two worker processes sending 5 MiB items, one per chunk; started, closed at the end."""
    from conveyor.nodes.copies import WorkerCopies
    from helpers_fns import endless_batches

    node = WorkerCopies(endless_batches, copies=2, method="process", mp_context="forkserver")
    try:
        node.reset(None)
        yield node
    finally:
        node.close()


def _value(n: int) -> float:
    return float(n // 2 + 1)  # item n: copy n % 2's (n // 2 + 1)-th, filled with that count


@pytest.mark.timeout(120)
def test_kept_tensors_never_change_and_the_slots_are_reused() -> None:
    with _copies() as node:
        kept = {}
        for n in range(120):
            t = next(node)
            assert t[0].item() == t[-1].item() == _value(n)
            if n % 7 == 0:
                kept[n] = t  # the trainer holds these; the others it lets go at once
        for n, t in kept.items():  # written by nobody since they were handed over
            assert bool((t == _value(n)).all()), n
        borrowers = node._borrowers
        # 60 items from each worker went through at most depth + kept + a few slots each
        assert all(0 < len(b.slots) <= node.depth + len(kept) + 3 for b in borrowers), \
            [len(b.slots) for b in borrowers]
        kept.clear()
        # what is still lent: at most the chunk each worker's current item came from
        assert all(b.release() <= 1 for b in borrowers)


@pytest.mark.timeout(120)
def test_a_trainer_keeping_every_tensor_gets_them_unchanged_past_the_slots() -> None:
    with _copies() as node:
        kept = [next(node) for _ in range(2 * MAX_SLOTS + 20)]  # more than every slot of both
        assert all(len(b.slots) == MAX_SLOTS for b in node._borrowers)
        for n, t in enumerate(kept):  # past the slots, tensors went torch's way: all intact
            assert bool((t == _value(n)).all()), n


@pytest.mark.timeout(120)
def test_chunks_dropped_at_a_restore_give_their_slots_back() -> None:
    with _copies() as node:
        for _ in range(4):
            next(node)
        state = node.state_dict()
        for _ in range(12):  # each restore drops the chunks the workers had sent ahead
            node.reset(state)
            for n in range(4, 8):
                t = next(node)
                assert t[0].item() == _value(n)
            del t
        for n in range(8, 40):
            assert next(node)[0].item() == _value(n)
        # a dropped chunk's slots were released like any other: nothing leaked (lent now, once
        # the workers have run ahead: the chunks sent, at most depth per worker, the one packed
        # and waiting for a credit, and the current one)
        time.sleep(0.5)
        assert all(b.release() <= 1 for b in node._borrowers)
        assert all(sum(b.flags[:]) <= node.depth + 2 for b in node._borrowers), \
            [sum(b.flags[:]) for b in node._borrowers]


@pytest.mark.timeout(120)
def test_kept_tensors_outlive_the_workers_that_lent_them() -> None:
    with _copies() as node:
        kept = [next(node) for _ in range(6)]
        workers = list(node._workers)
    assert all(p.exitcode is not None for p in workers)  # the lenders are gone
    for n, t in enumerate(kept):  # their slots stay mapped here for as long as the tensors live
        assert bool((t == _value(n)).all()), n


def test_slots_are_added_in_doublings_within_the_byte_budget(monkeypatch) -> None:
    import multiprocessing as mp

    import torch

    import conveyor.nodes._workers.shared_slots as lent

    big = torch.ones(1 << 18)  # 1 MiB
    lender = lent.Lender(mp.get_context("spawn").Array("b", MAX_SLOTS))
    counts = []
    for _ in range(9):  # none comes back: each lend needs a slot of its own
        assert lender.lend(big) is not None
        counts.append(len(lender.slots))
    assert counts == [1, 2, 4, 4, 8, 8, 8, 8, 16]  # the most needed at once is reached in few steps
    first = lent.Lender(mp.get_context("spawn").Array("b", MAX_SLOTS), first=8)
    assert first.lend(big) is not None and len(first.slots) == 8  # a worker's credits' worth at once
    monkeypatch.setattr(lent, "SLOT_BYTES", 3 << 20)
    capped = lent.Lender(mp.get_context("spawn").Array("b", MAX_SLOTS))
    pids = [capped.lend(big) for _ in range(4)]
    assert [p is not None for p in pids] == [True, True, True, False]  # the 4th goes torch's way
    assert len(capped.slots) == 3


def test_slots_leave_half_of_dev_shm_free(monkeypatch) -> None:
    """In a container's 64 MB /dev/shm the slots kept for the loader's life take at most half."""
    import multiprocessing as mp
    import os
    from types import SimpleNamespace

    import torch

    import conveyor.nodes._workers.shared_slots as lent

    size, block = 64 << 20, 4096
    lender = lent.Lender(mp.get_context("spawn").Array("b", MAX_SLOTS), first=8)

    def statvfs(path):  # a 64 MB tmpfs that the lender's slots fill
        assert path == lent.SHM
        used = sum(s.numel() for s in lender.slots)
        return SimpleNamespace(f_frsize=block, f_blocks=size // block, f_bavail=(size - used) // block)

    monkeypatch.setattr(os, "statvfs", statvfs)
    batch = torch.ones(5 << 20, dtype=torch.uint8)  # 5 MiB: 6 fit in the free half
    pids = [lender.lend(batch) for _ in range(8)]  # none comes back
    assert len(lender.slots) == 6  # 8 asked for at once (the credits); 6 made
    assert [p is not None for p in pids] == [True] * 6 + [False] * 2  # the rest go torch's way
    assert statvfs(lent.SHM).f_bavail * block >= size // 2

    def missing(path):
        raise FileNotFoundError(path)

    monkeypatch.setattr(os, "statvfs", missing)  # macOS: no /dev/shm to ask
    assert lent.shm_room(1 << 20) is None
    assert lent.Lender(mp.get_context("spawn").Array("b", MAX_SLOTS), first=8).lend(batch) is not None

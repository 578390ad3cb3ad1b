"""Small map/filter functions that the spec and node tests name as ``helpers_fns:<name>``.

``tests/`` is on ``sys.path`` while pytest runs (conftest.py makes sure of it), so specs can
name these like any user function.
"""

from __future__ import annotations

import random


def ident(item):
    """The item unchanged."""
    return item


def heavy_decode(item):
    """Stands for a decoder: its outputs are big, so shuffling them after it is refused."""
    return item


heavy_decode.heavy_output = True

# a module-level lambda: importable by name, but pickle cannot find it by its qualname
unpicklable = lambda item: item  # noqa: E731


def times(item, *, k: int = 2):
    """``item * k``."""
    return item * k


def noisy(item, *, rng: random.Random):
    """``(item, a random draw)``: the draw must depend only on the seed, epoch and sample."""
    return item, rng.random()


def fail_on_three(item):
    """Raise ``KeyError`` for multiples of 3, else return the item."""
    if item % 3 == 0:
        raise KeyError(f"no key for {item}")
    return item


def is_even(item) -> bool:
    return item % 2 == 0


class _Endless:
    """Endless tensors of ``numel`` floats, each filled with its copy's count (1, 2, ...)."""

    def __init__(self, numel: int):
        self.numel = numel

    def __call__(self, w: int):
        import torch
        from torchdata.nodes import BaseNode

        numel = self.numel

        class Filled(BaseNode):
            def reset(self, initial_state=None):
                super().reset(initial_state)
                self.i = 0 if initial_state is None else initial_state["i"]

            def next(self):
                self.i += 1
                return torch.full((numel,), float(self.i))

            def get_state(self):
                return {"i": self.i}

        node = Filled()
        return node, {"filled": node}


endless_big_items = _Endless(1 << 18)  # 1 MiB: a worker copy sending them fills its pipe and blocks
endless_batches = _Endless(5 << 18)  # 5 MiB: one per chunk, as an image batch of imagenet-procs.yaml


def exit_in_copy(w: int):
    """A copy factory whose worker process exits at once with the given code."""
    import os

    os._exit(1)


# ----- test_hangs.py ------------------------------------------------------------------------
import threading  # noqa: E402

GATE = threading.Event()  # block_after waits on it; a test replaces it and sets it at its end
BLOCKED = [0]             # calls of block_after waiting on GATE now


def block_after(item, *, n: int = 20):
    """The item, except that items whose index is ``n`` or more block until ``GATE`` is set."""
    if item["index"] >= n:
        BLOCKED[0] += 1
        try:
            GATE.wait()
        finally:
            BLOCKED[0] -= 1
    return item["index"]


class TwoArgError(Exception):
    """Pickles, but does not unpickle: ``Exception.__reduce__`` gives back one argument."""

    def __init__(self, a, b):
        super().__init__(f"{a} {b}")


def two_arg_error_on_three(item):
    """Raise ``TwoArgError`` for multiples of 3, else return the item."""
    if item % 3 == 0:
        raise TwoArgError("no", item)
    return item


def takes_any(item, **kwargs):
    """Accepts any keyword arguments (for specs that test params, not the call)."""
    return item


def indexes(batch):
    """The ``index`` of each record of a batch, as a tensor."""
    import torch

    return torch.tensor([r["index"] for r in batch])


def announce_then_sleep(item, *, path: str, ms: float = 50.0):
    """Create the file ``path`` (once items flow), then sleep ``ms`` milliseconds: lets a test
    interrupt ``conveyor run`` in the middle of an epoch (test_cli_interrupt)."""
    import os
    import time

    if not os.path.exists(path):
        open(path, "w").close()
    time.sleep(ms / 1000.0)
    return item


def slow(item, *, seconds: float = 1.0):
    """The item, after ``seconds``: an input that keeps a prefetch thread busy."""
    import time

    time.sleep(seconds)
    return item


def slow_list(items, *, seconds: float = 0.05):
    """The items, after ``seconds`` (map_batches' fn): keeps worker processes busy."""
    import time

    time.sleep(seconds)
    return list(items)


def stop_on_three(item):
    """Raise ``StopIteration`` for 3 (a fn that calls ``next()`` on an exhausted iterator)."""
    if item == 3:
        raise StopIteration("nothing left")
    return item


def stop_on_three_list(items):
    """``stop_on_three`` for map_batches."""
    return [stop_on_three(i) for i in items]


class StopsAtThree:
    """A map-style dataset of 0..5 whose ``__getitem__`` raises ``StopIteration`` for index 3."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> dict:
        if i == 3:
            raise StopIteration
        return {"x": i}


def fails_at_two():
    """A generator of 0, 1, then a ``ValueError`` (an iterable source that breaks)."""
    yield 0
    yield 1
    raise ValueError("the stream broke")


def two_arg_error_at_index_three(record):
    """Raise ``TwoArgError("no", 3)`` for the record of index 3, else return it."""
    if record["index"] == 3:
        raise TwoArgError("no", 3)
    return record


def fail_on_seven(item):
    """``conveyor.files:read_numbers``, raising ``ValueError`` for the sample of index 7."""
    from conveyor.files import read_numbers

    out = read_numbers(item)
    if int(out["index"]) == 7:
        raise ValueError("sample 7 is bad")
    return out


def numbers_and_a_big_row(item):
    """``conveyor.files:read_numbers`` and ``"big"``: 1 MiB of float32, each the sample's index
    (a batch of 4 is a tensor that goes through shared memory, not by value)."""
    import torch

    from conveyor.files import read_numbers

    record = read_numbers(item)
    record["big"] = torch.full((1 << 18,), float(record["index"]))
    return record


def numbers_one_huge(item, *, mib: int = 300):
    """``conveyor.files:read_numbers`` and ``"big"``: ``mib`` MiB of ones for the sample of index
    7, one byte for the others (more than a test cluster's object store holds, in one chunk)."""
    import torch

    from conveyor.files import read_numbers

    record = read_numbers(item)
    record["big"] = torch.ones(mib << 20 if record["index"] == 7 else 1, dtype=torch.uint8)
    return record


def byte_ids_by_hand(items, *, max_length: int = 64):
    """What ``conveyor.text:byte_tokenize`` gives a list, but declaring nothing: ``batch`` stays a
    param that changes the data for it (tests/test_batch_invariant.py)."""
    from conveyor.text import byte_tokenize

    return byte_tokenize(items, max_length=max_length, dtype="uint8")

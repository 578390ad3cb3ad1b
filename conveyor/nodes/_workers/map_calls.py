"""What a map's workers run per item, and what comes back when ``fn`` fails.

``Call`` is the picklable callable every map engine runs (``map_engines``): it seeds the
item's ``rng``/``generator`` from (seed, epoch, sample index), calls ``fn`` and turns an
exception into a ``Failed`` value, so that the caller's thread decides what to do with it
(``_skips.OnError``). ``Enumerate`` numbers the items (the position seeds items without an
``"index"``, and slabs place them); ``Slotted`` gives each item its row of a batch slab
(``batch_slabs``) in the caller's thread, in input order.

A ``Failed`` carries the exception back: in threads the exception itself; from a worker
process only when it survives pickling both ways (an exception whose ``__init__`` takes other
arguments than ``args`` pickles but fails to unpickle, which would kill torchdata's receiving
thread and hang ``next()``), else its text and traceback. What the caller needs of it is
decided where it was raised, as plain data that crosses any boundary: the type's name (for
the skip ledger) and ``never_skip`` (a ``SourceError``: a source that cannot be read at all
is no bad item), so that a ``SourceError`` whose object could not travel is still one.
"""

from __future__ import annotations

import inspect
import os
import random
from typing import Any, Callable

import torch
from torchdata.nodes import BaseNode

from conveyor.errors import SampleError, SourceError
from conveyor.nodes._rng import derive_seed
from conveyor.nodes._skips import sample_id
from conveyor.nodes._workers.batch_slabs import Slabs
from conveyor.nodes._workers.parent_watch import watch_parent
from conveyor.nodes._workers.torchdata_threads import Raised, Untravelled, portable
from conveyor.nodes.state_shape import Child, Fields, Int

_SEED_MASK = (1 << 63) - 1  # torch.Generator seeds are signed 64-bit


class Enumerate(BaseNode):
    """(position, item) pairs; the position is part of the state."""

    SOURCE_KEY = "source"
    POS_KEY = "pos"
    STATE_SHAPE = Fields({SOURCE_KEY: Child(), POS_KEY: Int()})

    def __init__(self, source: BaseNode):
        super().__init__()
        self.source = source
        self.pos = 0

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self.source.reset(None if initial_state is None else initial_state[self.SOURCE_KEY])
        self.pos = 0 if initial_state is None else initial_state[self.POS_KEY]

    def next(self):
        item = next(self.source)
        self.pos += 1
        return self.pos - 1, item

    def get_state(self) -> dict:
        return {self.SOURCE_KEY: self.source.state_dict(), self.POS_KEY: self.pos}


class Failed:
    """An exception raised by ``fn``, carried back to the caller's thread (see the module's
    docstring); ``never_skip``: raised even with ``on_error="skip"`` (a ``SourceError``)."""

    __slots__ = ("exc", "text", "sample", "kind", "never_skip")

    def __init__(self, exc: BaseException | None, text: str | None = None, sample: str = "?",
                 kind: str | None = None, never_skip: bool | None = None):
        self.exc = exc
        self.kind = kind or (type(exc).__name__ if exc is not None else "Exception")
        self.text = text if text is not None else f"{self.kind}: {_message(exc)}"
        self.sample = sample  # the failed item, named for the skip ledger (_skips.sample_id)
        self.never_skip = isinstance(exc, SourceError) if never_skip is None else never_skip

    @property
    def message(self) -> str:
        """What failed, without the exception's type (the ledger keeps that apart)."""
        return _message(self.exc) if self.exc is not None else self.text.removeprefix(f"{self.kind}: ")

    def error(self, where: str = "") -> BaseException:
        """The exception to raise: the original, or (where it could not travel) an
        ``Untravelled`` that starts with ``where``, the type and the message."""
        if isinstance(self.exc, Untravelled):
            return self.exc.at(where)
        return self.exc if self.exc is not None else RuntimeError(self.text)

    def __reduce__(self) -> tuple:
        exc = None if self.exc is None else portable(self.exc)
        return (Failed, (exc, self.text, self.sample, self.kind, self.never_skip))


def _message(exc: BaseException | None) -> str:
    return exc.text if isinstance(exc, Untravelled) else str(exc)


def stopped(exc: Exception, fn: Callable, item: Any) -> Exception:
    """``exc``, or for a ``StopIteration`` a ``SampleError`` naming ``fn`` and the item, with
    ``exc``'s notes (``conveyor.dataset.getitem``'s names the dataset and index).

    Raised as it is, a ``StopIteration`` from ``fn`` (or a Dataset's ``__getitem__``) would
    end the stream there without a word: the iterator protocol takes it for the end.

    Example:
        >>> type(stopped(StopIteration(), len, {"index": 3})).__name__
        'SampleError'
    """
    if not isinstance(exc, StopIteration):
        return exc
    name = getattr(fn, "__name__", type(fn).__name__)
    said = f" ({exc})" if str(exc) else ""
    err = SampleError(f"fn {name!r} raised StopIteration{said} on item {sample_id(item)}: a StopIteration "
                      "would end the stream there, silently; raise another exception for a bad item")
    for note in getattr(exc, "__notes__", []):
        err.add_note(note)
    err.__cause__ = exc
    return err


def parameters(fn: Callable) -> dict[str, Any]:
    """``fn``'s parameters by name (none where its signature cannot be read)."""
    try:
        return dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return {}


class Call:
    """The picklable callable that workers run: seeds the rng, calls fn, catches errors.

    Given ``parent`` (the main process's pid, and whether its main thread starts the
    workers), a copy of it in a worker process makes that process end with the main one
    (``parent_watch``): as it is unpickled there (spawn, forkserver) or after a fork.
    """

    def __init__(self, fn: Callable, args: dict[str, Any], seed: int, rank: int):
        self.parent: tuple[int, bool] | None = None
        self.fn = fn
        self.args = dict(args)
        self.seed = seed
        self.rank = rank
        self.epoch = 0
        params = parameters(fn)
        self.wants_rng = "rng" in params
        self.wants_generator = "generator" in params
        self.wants_into = "into" in params  # given only with slabs (Slotted), else left out

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.watch_parent()

    def watch_parent(self) -> None:
        """In a worker process (not the one that made ``parent``): end with that one."""
        if self.parent is not None and os.getpid() != self.parent[0]:
            watch_parent(self.parent[0], what="conveyor map worker", from_main_thread=self.parent[1])

    def sample_seed(self, pos: int, item: Any) -> int:
        index = item.get("index") if isinstance(item, dict) else None
        if isinstance(index, int):
            return derive_seed(self.seed, self.epoch, index)
        return derive_seed(self.seed, self.epoch, self.rank, pos, 1)

    def _randomness(self, pos: int, item: Any) -> dict[str, Any]:
        """``rng`` (a ``random.Random``) and/or ``generator`` (a ``torch.Generator``), seeded
        from this sample alone."""
        seed = self.sample_seed(pos, item)
        out: dict[str, Any] = {}
        if self.wants_rng:
            out["rng"] = random.Random(seed)
        if self.wants_generator:
            out["generator"] = torch.Generator().manual_seed(derive_seed(seed, 2) & _SEED_MASK)
        return out

    def __call__(self, pair: tuple[int, Any], into: Any = None) -> Any:
        pos, item = pair
        if isinstance(item, Raised):
            return item  # an error upstream, not in fn: re-raised by Map.next as it is
        try:
            if into is not None:
                return self.fn(item, **self._randomness(pos, item), into=into, **self.args)
            if self.wants_rng or self.wants_generator:
                return self.fn(item, **self._randomness(pos, item), **self.args)
            return self.fn(item, **self.args)
        except Exception as exc:  # carried to the caller, re-raised or counted there
            return Failed(stopped(exc, self.fn, item), sample=sample_id(item))


class Slotted:
    """With slabs: gives each (position, item) its slot in the caller's thread (``prepare``);
    in a worker thread, runs ``call`` with an ``into`` for that slot.

    Args:
        call: the map's ``Call``.
        slabs: the slabs the map's outputs are written into.
        skips: the map's ``OnError`` (its ``skipped`` count this epoch places the items).
    """

    __slots__ = ("call", "slabs", "skips")

    def __init__(self, call: Call, slabs: Slabs, skips: Any):
        self.call = call
        self.slabs = slabs
        self.skips = skips

    def prepare(self, pair: tuple[int, Any]) -> tuple[tuple[int, Any], Any, int]:
        # where the item lands in the output if none of the items in flight before it is skipped
        slab, row = self.slabs.assign(pair[0] - self.skips.skipped)
        return pair, slab, row

    def __call__(self, job: tuple[tuple[int, Any], Any, int]) -> Any:
        pair, slab, row = job
        return self.call(pair, self.slabs.into(slab, row))

"""iterable: the items of any iterable (a torch ``IterableDataset``, a Hugging Face
``IterableDataset``, a generator) as a source node, resumable.

The iterable comes from a factory, called once (a factory that returns a one-shot iterator,
such as a generator function, is called again each epoch). If it has ``set_epoch``, it is
told the epoch before each pass (Hugging Face reshuffles by it). Resume:

- an iterable with ``state_dict``/``load_state_dict`` (torchdata's Stateful, Hugging Face's
  ``IterableDataset``) saves its own state, and a restore loads it: nothing is re-read (as
  exact as that state: Hugging Face's ``shuffle`` buffer is not in it, so a shuffled Hugging
  Face stream refills its buffer and does not resume exactly);
- any other iterable is re-read from the start of the epoch and the items already yielded
  are skipped (exact if the iterable yields the same items in the same order each time); the
  first restore that does this says so in the log, once.

The state is ``{"yielded": n, "inner": <the iterable's own state or None>}``; an inner state
that is not plain data (JSON types) is not kept, and the restore re-reads and skips instead.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Callable, Iterator

from torchdata.nodes import BaseNode

log = logging.getLogger(__name__)


def _plain(state: Any) -> bool:
    try:
        json.dumps(state)
    except (TypeError, ValueError):
        return False
    return True


class IterableSource(BaseNode):
    """Yield the items of ``make()``'s iterable, epoch after epoch.

    Args:
        make: a callable returning the iterable (called once; again each epoch when it
            returns a one-shot iterator).
        name: how to name the iterable in log messages.

    Example:
        >>> node = IterableSource(lambda: range(3))
        >>> list(node)
        [0, 1, 2]
    """

    YIELDED_KEY = "yielded"
    INNER_KEY = "inner"

    def __init__(self, make: Callable[[], Any], *, name: str | None = None):
        super().__init__()
        self.make = make
        self.name = name or getattr(make, "__name__", repr(make))
        self.epoch = 0
        self._obj: Any = None
        self._fresh: Any = None  # a stateful iterable's state before any item: where an epoch starts
        self._it: Iterator | None = None
        self._yielded = 0
        self._said_skip = False

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    @property
    def stateful(self) -> bool:
        obj = self._iterable()
        return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))

    def _iterable(self) -> Any:
        if self._obj is None:
            obj = self.make()
            if iter(obj) is obj:  # a one-shot iterator: made again each epoch
                return obj
            self._obj = obj
            if callable(getattr(obj, "state_dict", None)):
                self._fresh = obj.state_dict()
        return self._obj

    def count(self) -> int | None:
        """Items per epoch when the iterable has a length, else ``None``."""
        obj = self._iterable()
        try:
            return len(obj)
        except TypeError:
            return None

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        obj = self._iterable()
        stateful = self.stateful
        inner = None if initial_state is None else initial_state.get(self.INNER_KEY)
        if stateful:
            obj.load_state_dict(inner if inner is not None else self._fresh)
        if callable(getattr(obj, "set_epoch", None)):
            obj.set_epoch(self.epoch)
        self._it = iter(obj)
        self._yielded = 0
        if initial_state is None:
            return
        skip = initial_state[self.YIELDED_KEY]
        if not (stateful and inner is not None) and skip:
            if not self._said_skip:
                self._said_skip = True
                log.warning("iterable %s has no state_dict/load_state_dict: resuming re-reads it from the "
                            "start of the epoch and skips the %d items already yielded (exact only if it "
                            "yields the same items in the same order each pass)", self.name, skip)
            for _ in range(skip):
                next(self._it)
        self._yielded = skip

    def next(self) -> Any:
        item = next(self._it)  # type: ignore[arg-type]
        self._yielded += 1
        return item

    def get_state(self) -> dict:
        inner = None
        if self._obj is not None and self.stateful:
            inner = self._obj.state_dict()
            if not _plain(inner):
                inner = None
        return {self.YIELDED_KEY: self._yielded, self.INNER_KEY: inner}

"""iterable: the items of any iterable (a torch ``IterableDataset``, a Hugging Face
``IterableDataset``, a generator, mosaicml-streaming's ``StreamingDataset``) as a source node,
resumable.

The iterable comes from a factory, called once (a factory that returns a one-shot iterator,
such as a generator function, is called again each epoch). If it has ``set_epoch``, it is
told the epoch before each pass (Hugging Face reshuffles by it). Resume, by what the
signature of its ``state_dict`` says (read before it is called):

- ``state_dict()`` with no required argument, and ``load_state_dict`` (torchdata's Stateful,
  Hugging Face's ``IterableDataset``): it saves its own state, and a restore loads it: nothing
  is re-read (as exact as that state: Hugging Face's ``shuffle`` buffer is not in it, so a
  shuffled Hugging Face stream refills its buffer and does not resume exactly);
- ``state_dict(num_samples, from_beginning)`` (mosaicml-streaming's ``StreamingDataset``): the
  iterable counts its own passes (each ``iter()`` is its next epoch) and is told how many of
  the pass's samples were consumed, its documented protocol:
  ``state_dict(num_samples=<items handed on since this pass began>, from_beginning=False)``,
  and ``load_state_dict`` before the pass that resumes. Each pass is started (its first item
  read ahead) when the epoch starts, so a state taken before the first item names the new
  pass, not the last one; an epoch started again begins that pass again;
- any other iterable (no ``state_dict``, or one whose required arguments mean nothing to
  conveyor: the log says which) is re-read from the start of the epoch and the items already
  yielded are skipped (exact if the iterable yields the same items in the same order each
  time); the first restore that does this says so in the log, once.

An error raised by the iterable (or its factory) keeps its type and gains a note naming the
node and its position: the epoch and the item being read, as every other source's errors do.

The state is ``{"yielded": n, "inner": <the iterable's own state or None>}``; an inner state
that is not plain data (JSON types) is not kept, and the restore re-reads and skips instead.
"""

from __future__ import annotations

import inspect
import json
import logging
from typing import Any, Callable, Iterator

from torchdata.nodes import BaseNode
from conveyor.nodes.state_shape import Fields, Int, Plain

log = logging.getLogger(__name__)

PLAIN = "plain"      # state_dict(): its own state
COUNTED = "counted"  # state_dict(num_samples, from_beginning): mosaicml-streaming's protocol
_COUNTED_ARGS = {"num_samples", "from_beginning"}
_NOTHING = object()


def _plain(state: Any) -> bool:
    try:
        json.dumps(state)
    except (TypeError, ValueError):
        return False
    return True


def state_protocol(obj: Any) -> tuple[str | None, str]:
    """How ``obj``'s own state can be taken, read from its ``state_dict``'s signature:
    ``(PLAIN | COUNTED | None, why not)``.

    Example:
        >>> state_protocol(range(3))
        (None, 'it has no state_dict/load_state_dict')
    """
    save, load = getattr(obj, "state_dict", None), getattr(obj, "load_state_dict", None)
    if not (callable(save) and callable(load)):
        return None, "it has no state_dict/load_state_dict"
    try:
        sig = inspect.signature(save)
    except (TypeError, ValueError):  # a builtin without a signature: called as state_dict()
        return PLAIN, ""
    params = list(sig.parameters.values())
    required = [p.name for p in params if p.default is p.empty
                and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if not required:
        return PLAIN, ""
    named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    if set(required) <= _COUNTED_ARGS <= named:
        return COUNTED, ""
    shown = ", ".join(p.name for p in params)
    return None, (f"its state_dict({shown}) takes required arguments conveyor cannot give "
                  f"({', '.join(required)}; it knows state_dict() and mosaicml-streaming's "
                  "state_dict(num_samples, from_beginning))")


class IterableSource(BaseNode):
    """Yield the items of ``make()``'s iterable, epoch after epoch.

    Args:
        make: a callable returning the iterable (called once; again each epoch when it
            returns a one-shot iterator).
        name: how to name the iterable in log messages.
        where: the node, for the note an error of the iterable gets (with its position).

    Example:
        >>> node = IterableSource(lambda: range(3))
        >>> list(node)
        [0, 1, 2]
    """

    YIELDED_KEY = "yielded"
    INNER_KEY = "inner"
    STATE_SHAPE = Fields({YIELDED_KEY: Int(), INNER_KEY: Plain()}, optional=(INNER_KEY,))

    def __init__(self, make: Callable[[], Any], *, name: str | None = None, where: str | None = None):
        super().__init__()
        self.make = make
        self.name = name or getattr(make, "__name__", repr(make))
        self.where = where or f"iterable {self.name}"
        self.epoch = 0
        self._obj: Any = None
        self._protocol: str | None = None
        self._why_not = ""
        self._fresh: Any = None  # a stateful iterable's state before any item: where an epoch starts
        self._it: Iterator | None = None
        self._yielded = 0
        self._said_skip = False
        # COUNTED: the item read ahead, the items handed on since this pass began, and where
        # the pass of which conveyor epoch began (to begin it again)
        self._ahead: Any = _NOTHING
        self._passed = 0
        self._pass_start: tuple[int, Any] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    @property
    def stateful(self) -> bool:
        """Whether the iterable's own state is saved (``state_dict`` with a protocol conveyor
        knows, and ``load_state_dict``)."""
        self._iterable()
        return self._protocol is not None

    def _iterable(self) -> Any:
        if self._obj is None:
            obj = self.make()
            if iter(obj) is obj:  # a one-shot iterator: made again each epoch
                self._protocol, self._why_not = None, "it is a one-shot iterator"
                return obj
            self._obj = obj
            self._protocol, self._why_not = state_protocol(obj)
            if self._protocol is None and callable(getattr(obj, "state_dict", None)):
                log.warning("iterable %s: %s: its state is not saved; resuming re-reads it from the start "
                            "of the epoch and skips the items already yielded", self.name, self._why_not)
            if self._protocol == PLAIN:
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
        try:
            self._reset(initial_state)
        except Exception as exc:
            at = "" if initial_state is None else f" at item {initial_state[self.YIELDED_KEY]} (a resume)"
            exc.add_note(f"in {self.where}, starting epoch {self.epoch}{at} of {self.name}")
            raise

    def _reset(self, initial_state: dict | None) -> None:
        obj = self._iterable()
        inner = None if initial_state is None else initial_state.get(self.INNER_KEY)
        if self._protocol == PLAIN:
            obj.load_state_dict(inner if inner is not None else self._fresh)
        elif self._protocol == COUNTED:
            if inner is not None:
                obj.load_state_dict(inner)
            elif self._pass_start is not None and self._pass_start[0] == self.epoch:
                obj.load_state_dict(self._pass_start[1])  # this epoch again: its pass from its start
        if callable(getattr(obj, "set_epoch", None)):
            obj.set_epoch(self.epoch)
        self._it = iter(obj)
        self._yielded = 0
        self._passed = 0
        self._ahead = _NOTHING
        if self._protocol == COUNTED:
            self._start_pass(obj, fresh=inner is None)
        if initial_state is None:
            return
        skip = initial_state[self.YIELDED_KEY]
        if not (self._protocol is not None and inner is not None) and skip:
            if not self._said_skip:
                self._said_skip = True
                log.warning("iterable %s keeps no saved state (%s): resuming re-reads it from the start of "
                            "the epoch and skips the %d items already yielded (exact only if it yields the "
                            "same items in the same order each pass)", self.name,
                            self._why_not or "its state is not plain data", skip)
            for _ in range(skip):
                self._take()
        self._yielded = skip

    def _start_pass(self, obj: Any, *, fresh: bool) -> None:
        """Begin the iterable's pass now (its epoch counter moves on its first item): read one
        item ahead, and note where a fresh pass began."""
        try:
            self._ahead = next(self._it)  # type: ignore[arg-type]
        except StopIteration:
            self._ahead = _NOTHING
            self._it = iter(())
        if fresh:
            self._pass_start = (self.epoch, obj.state_dict(num_samples=0, from_beginning=False))

    def _take(self) -> Any:
        if self._ahead is not _NOTHING:
            item, self._ahead = self._ahead, _NOTHING
        else:
            item = next(self._it)  # type: ignore[arg-type]
        self._passed += 1
        return item

    def next(self) -> Any:
        try:
            item = self._take()
        except StopIteration:
            raise
        except Exception as exc:  # the position says which item: the epoch's first is item 0
            exc.add_note(f"in {self.where}, reading item {self._yielded} of epoch {self.epoch} of {self.name}")
            raise
        self._yielded += 1
        return item

    def get_state(self) -> dict:
        inner = None
        if self._obj is not None and self._protocol == PLAIN:
            inner = self._obj.state_dict()
        elif self._obj is not None and self._protocol == COUNTED:
            inner = self._obj.state_dict(num_samples=self._passed, from_beginning=False)
        if not _plain(inner):
            inner = None
        return {self.YIELDED_KEY: self._yielded, self.INNER_KEY: inner}

"""Private helpers for nodes that run torchdata's threaded iterators.

torchdata 0.11 keeps the running iterator of ``ParallelMapper``, ``Prefetcher`` and
``PinMemory`` a few attributes deep and stops its threads only from ``__del__``. A dropped
loader whose iterator is still referenced keeps its threads alive, and at interpreter exit
that can abort the process. ``shutdown_torchdata`` reaches the iterator and stops it now.

Exceptions raised in those threads come back re-created from their text ("Caught X in
_populate_queue. Original Traceback ..."); ``CarryErrors`` sends them through the queue as
values instead, so the consumer re-raises the original exception with its notes.
"""

from __future__ import annotations

import pickle
import threading
import time
import traceback
from typing import Any

from torchdata.nodes import BaseNode

from conveyor.nodes import capabilities as cap
from conveyor.nodes.state_shape import Same


class Untravelled(RuntimeError):
    """An exception that could not be pickled back from a worker process, as text: its type's
    name, its message, where it was raised and its traceback there, in that order.

    ``where`` is the node (``node 'decode' (map)``): given, or taken from the first
    ``in ...`` note the exception had (the nodes' notes), or given later by the node that
    raises it in the main process (``at``). It pickles (it is what crosses back).

    Args:
        kind: the original exception's type name.
        text: its message.
        trace: its traceback in the worker, notes included.
        where: the node, if known; else from ``notes``.
        notes: the original's notes, kept as this error's own.
    """

    def __init__(self, kind: str, text: str, trace: str, where: str = "", notes: tuple[str, ...] = ()):
        self.kind, self.text, self.trace, self.notes = kind, text, trace, tuple(notes)
        self.where = where or next((n[3:] for n in self.notes if n.startswith("in ")), "")
        head = f"{self.where}: " if self.where else ""
        super().__init__(f"{head}{kind}: {text}\n(the exception could not be pickled back from the worker "
                         f"process; its traceback there:)\n{trace}")
        for note in self.notes:
            self.add_note(note)

    def __reduce__(self) -> tuple:
        return (Untravelled, (self.kind, self.text, self.trace, self.where, self.notes), self.__dict__)

    def at(self, where: str) -> "Untravelled":
        """This error, named after ``where`` if it names no node yet."""
        return self if self.where else Untravelled(self.kind, self.text, self.trace, where, self.notes)


def portable(exc: BaseException) -> BaseException:
    """``exc`` when it survives pickling both ways, else an ``Untravelled`` (a ``RuntimeError``)
    with its type, text and traceback (an exception whose ``__init__`` takes other arguments
    than ``args`` pickles but does not unpickle; unpickled in a queue's reader thread it kills
    that thread)."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - any failure means it cannot travel
        return Untravelled(type(exc).__name__, str(exc), "".join(traceback.format_exception(exc)).rstrip(),
                           notes=tuple(getattr(exc, "__notes__", ())))


def shutdown_torchdata(node: Any) -> list[threading.Thread]:
    """Stop the threads (and worker processes) of a torchdata threaded node, if it runs any.

    torchdata joins each thread for 0.5 s only; returns those still alive after that (busy
    inside their input's ``next()``), for the caller to join within its own bound.
    """
    seen = 0
    it = node
    # ParallelMapper._it -> _ParallelMapperImpl._it -> _ParallelMapperIter; Prefetcher._it -> iter
    while it is not None and seen < 4:
        stop = getattr(it, "_shutdown", None)
        if callable(stop):
            _readers_first(it)
            stop()
            threads = [getattr(it, a, None) for a in ("_thread", "_read_thread", "_sort_thread")]
            threads += [t for t in getattr(it, "_workers", []) if isinstance(t, threading.Thread)]
            return [t for t in threads if isinstance(t, threading.Thread) and t.is_alive()]
        it = getattr(it, "_it", None)
        seen += 1
    return []


def _readers_first(it: Any) -> None:
    """Stop a ``ParallelMapper``'s reading threads before its worker processes: torchdata's
    ``_shutdown`` tells both at once, and a reader unpickling a result as its worker left died
    on the worker's gone resource sharer (a FileNotFoundError traceback from ``_sort_worker``
    on stderr at each restore right after ``iter()``, issue 29's webdataset test). The workers
    go on until ``_shutdown`` tells them, so the readers' last results still unpickle."""
    stop, mp_stop = getattr(it, "_stop", None), getattr(it, "_mp_stop", None)
    if stop is None or mp_stop is None or mp_stop is stop:
        return
    stop.set()
    for name in ("_read_thread", "_sort_thread"):
        thread = getattr(it, name, None)
        if isinstance(thread, threading.Thread) and thread.is_alive():
            thread.join(timeout=READER_WAIT)


READER_WAIT = 0.5  # seconds a reading thread gets to leave (torchdata polls its queues every 0.1 s)


def join_threads(threads: list[threading.Thread], wait: float) -> list[threading.Thread]:
    """Join ``threads`` within ``wait`` seconds in all; returns those still alive."""
    deadline = time.monotonic() + wait
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    return [t for t in threads if t.is_alive()]


class Raised:
    """An exception carried as a value through torchdata's queues, so that the consumer can
    re-raise the original object (torchdata would re-create it from its text). Sent to a
    process (map's worker processes), it is ``portable(exc)``."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException):
        self.exc = exc

    def __reduce__(self) -> tuple:
        return (Raised, (portable(self.exc),))


class CarryErrors(BaseNode):
    """Pass-through that turns an exception of its input into a ``Raised`` value and then ends;
    its state is its input's state."""

    STATE_SHAPE = Same("source")  # its state is its input's

    def __init__(self, source: BaseNode):
        super().__init__()
        self.source = source
        self._failed = False

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self._failed = False
        self.source.reset(initial_state)

    def next(self):
        if self._failed:
            raise StopIteration
        try:
            return next(self.source)
        except StopIteration:
            raise
        except Exception as exc:  # carried to the consumer, raised there as itself
            self._failed = True
            return Raised(exc)

    def get_state(self) -> dict:
        return self.source.state_dict()

    def count(self) -> int | None:
        return cap.count(self.source)

"""prefetch: run the graph above in a background thread, ``depth`` items ahead.

One thread pulls from the input and hands the items over, each with the input's state after
it (every ``snapshot_every`` items), through C-level queues: the items, in lists of up to
``depth``, and ``depth`` credits that bound how far the thread runs ahead. Every wake-up of a
waiting consumer costs two thread switches and two passes of the GIL, tens of microseconds
on a busy machine: on the text graph, whose batches cost a few hundred microseconds,
torchdata's ``Prefetcher`` (a semaphore, a snapshot store and a queue with Python-level
locks, a wake-up per item) had cost ~2 us per record; lists wake it once per list. A list
is half the credits (``_group``): with lists of all ``depth`` the thread spent its last credit
on each list and then stopped until the consumer woke and took an item, once per list (on a
busy host a wake-up waits for a core: milliseconds); with half, it goes on with the other
half while the consumer wakes, and waits only where the consumer is the slower. No item
waits on a list: the first item of an epoch goes alone, the thread hands over what it holds
before it waits for a credit, and a consumer that has waited ``_LOOK`` seconds takes what the
thread holds (an input that stalls mid-list does not keep a made item back for longer).

``close()`` stops the thread now rather than when the garbage collector gets to it (a thread
busy in its input's ``next()`` ends after that item: ``lingering()`` gives it to the loader to
join). The state is the input's state at the last snapshot before the last emitted item plus
how many items were emitted after it (torchdata's layout), so nothing made is lost or
repeated on resume. An exception in the input reaches the consumer as itself, after the
items before it.

A thread only pays where the consumer spends time away between items (a training step: CUDA
launches and waits release the GIL, and the thread makes the next batch meanwhile). A consumer
that comes straight back for the next item (a loop that counts, a cache fill, a pass that
only reads) waits on the thread every time, and each wait is two thread switches and two
GIL passes: on this project's 2-core VM a text graph ran at ~0.75 of its speed without the
node (benchmarks/text_throughput.py). So with ``adapt`` (the default) the node starts by making
the items in the caller's thread, nothing ahead, and watches, over its first ``FIRST_WINDOW``
items and then over each ``WINDOW``, the consumer's time away (the median) against the time
an item takes to make (the mean: a packer makes a pool's rows at once): away over
``TO_THREAD`` of it, a thread is started; away under ``TO_INLINE`` of it, the thread is parked
after its current item (what it made is handed out first) and the items are made inline
again. A thread is parked too where the consumer waited longer for each item than the item
takes to make: its time away holds the GIL (Python work), so the thread cannot run meanwhile,
and each hand-over costs thread switches (a graph whose output is records, ~1 us each, had
paid ~17 us an item so on this project's VM, against ~3 inline); it is started again only for a
time away twice that one. The mode holds across epochs. A trainer thus waits for its first ``FIRST_WINDOW``
batches as they are made (their make time, once in the loader's life); a consumer that comes
straight back never pays for a thread (one started first, then parked, had cost
pretrain.yaml's loader its first epoch's start: ``benchmarks/checkouts_ab.py``). Made inline,
the state is the input's state taken when asked (nothing is ahead of the consumer), so a
restore re-reads nothing. ``adapt: false`` keeps the thread always.
"""

from __future__ import annotations

import queue
import threading
from time import perf_counter
from typing import Any

from torchdata.nodes import BaseNode

from conveyor.errors import StateError
from conveyor.nodes._elastic import Cursor
from conveyor.nodes.state_shape import Child, Fields, Int

_END = object()     # the input ended
_STOP = object()    # a credit that tells the thread to stop
_PARKED = object()  # the thread stopped, asked to (adapt): what follows is made inline
_LOOK = 0.02        # seconds a waiting consumer sleeps before it takes what the thread holds
_POLL = 0.5         # seconds between checks that the thread is still alive
STOP_WAIT = 0.5     # seconds close() waits for a thread busy in its input before leaving it lingering
WINDOW = 32         # items between two looks at which mode pays (adapt)
FIRST_WINDOW = 8    # items before the node's first look: a trainer waits for these as they are made
TO_INLINE = 0.1     # the consumer's time away per item, as a share of an item's make time, under
TO_THREAD = 0.25    # which items are made inline, and over which a thread is started again


def _group(depth: int) -> int:
    """Items per list handed over: half the credits, rounded up (see the module docstring)."""
    return (depth + 1) // 2


class _Failed:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException):
        self.exc = exc


class _Held:
    """Items the thread made and has not handed over yet, and the lock under which the thread
    hands a list over and the consumer takes one (so lists keep their order)."""

    __slots__ = ("items", "lock", "park", "made", "make_s")

    def __init__(self) -> None:
        self.items: list = []
        self.lock = threading.Lock()
        self.park = False    # set by the consumer: stop after the current item (adapt)
        self.made = 0        # items made and seconds spent making them since the consumer
        self.make_s = 0.0    # last zeroed them (a heuristic's figures: a lost update is harmless)

    def hand_over(self, put: Any) -> None:
        with self.lock:
            if self.items:
                put(self.items)
                self.items = []


def _run(source: BaseNode, lists: queue.SimpleQueue, credits: queue.SimpleQueue, held: _Held,
         every: int, group: int) -> None:
    """The thread: one item per credit, with the input's state every ``every`` items, handed
    over in lists of ``group``; the first item of the epoch alone, the last with the end, and
    what it holds before it waits for a credit."""
    n = 0
    get, get_now, put, lock = credits.get, credits.get_nowait, lists.put, held.lock
    try:
        while True:
            try:
                credit = get_now()
            except queue.Empty:
                held.hand_over(put)  # the consumer is behind: it may have all that is made
                credit = get()
            if credit is _STOP:
                return
            if held.park:
                with lock:
                    held.items.append((_PARKED, None))
                held.hand_over(put)
                return
            t0 = perf_counter()
            try:
                item = next(source)
            except StopIteration:
                with lock:
                    held.items.append((_END, None))
                held.hand_over(put)
                return
            held.make_s += perf_counter() - t0
            held.made += 1
            n += 1
            entry = (item, source.state_dict() if n % every == 0 else None)
            with lock:
                held.items.append(entry)
                if n == 1 or len(held.items) >= group:
                    put(held.items)
                    held.items = []
    except BaseException as exc:  # noqa: BLE001 - carried to the consumer, raised there as itself
        with lock:
            held.items.append((_Failed(exc), None))
        held.hand_over(put)


class Prefetch(BaseNode):
    """Fill a queue of ``depth`` items from ``source`` in a background thread.

    Args:
        source: the input stream.
        depth: items kept ready, > 0.
        snapshot_every: take the input's state every N items (1: every item; a larger N
            trades a longer replay on restore for less work per item).
        adapt: make items in the caller's thread while the consumer comes straight back for
            each one (the module's docstring says when); False keeps the thread always.

    Example:
        >>> from torchdata.nodes import IterableWrapper
        >>> with_prefetch = Prefetch(IterableWrapper(range(3)), depth=2)
        >>> list(with_prefetch)
        [0, 1, 2]
    """

    IT_KEY = "it"
    STATE_SHAPE = Fields({IT_KEY: Fields({"snapshot": Child(), "steps_since_snapshot": Int()})})

    def __init__(self, source: BaseNode, *, depth: int = 2, snapshot_every: int = 1, adapt: bool = True):
        super().__init__()
        if not isinstance(depth, int) or depth <= 0:
            raise ValueError(f"{depth=} must be a positive int")
        if not isinstance(snapshot_every, int) or snapshot_every <= 0:
            raise ValueError(f"{snapshot_every=} must be a positive int")
        if not isinstance(adapt, bool):
            raise ValueError(f"{adapt=} must be true or false")
        self.source = source
        self.depth = depth
        self.snapshot_every = snapshot_every
        self.adapt = adapt
        self._thread: threading.Thread | None = None
        self._lingering: list[threading.Thread] = []
        self._items: queue.SimpleQueue = queue.SimpleQueue()
        self._credits: queue.SimpleQueue = queue.SimpleQueue()
        self._snapshot: Any = None
        self._steps = 0
        self._done = False
        self._closed = False
        self._got: list = []  # the list of (item, state) being handed out, from index _at
        self._at = 0
        self._held = _Held()
        # adapt: the mode, the mode the next reset starts in, and this window's figures
        self.inline = False
        self._prefer_inline = adapt  # nothing is known yet: made inline until a look says a thread pays
        self.switches = 0
        self._back: float | None = None  # when the consumer last got an item
        self._aways: list[float] = []    # its time away before each item of this window
        self._taken = 0
        self._made = 0
        self._make_s = 0.0
        self._wait_s = 0.0  # the consumer's time waiting for the thread's lists, this window
        self._lost_away = 0.0  # the time away at which a thread last lost (see _look); 0: none
        self._window = FIRST_WINDOW

    def close(self) -> None:
        self._closed = True
        thread = self._thread
        if thread is not None:
            self._thread = None
            self._credits.put(_STOP)
            thread.join(timeout=STOP_WAIT)
            if thread.is_alive():  # busy in its input's next(): it stops after that item
                self._lingering.append(thread)

    def lingering(self) -> list[threading.Thread]:
        """Threads of this node asked to stop that were still busy inside their input's
        ``next()`` when ``close()`` returned (the loader joins them after closing the nodes
        above them: a thread left running torch code at interpreter exit can abort it)."""
        self._lingering = [t for t in self._lingering if t.is_alive()]
        return list(self._lingering)

    def ready(self) -> int:
        """Items made and not yet taken (the stats' queue samples): those of the lists in the
        queue (counted as a list's length each), those the thread holds, and those left of the list
        being handed out; none while items are made inline."""
        if self.inline:
            return 0
        group = _group(self.depth)
        return (min(self.depth, self._items.qsize() * group) + len(self._held.items)
                + len(self._got) - self._at)

    def _left_input(self) -> None:
        """Wait until no thread of this node is inside its input's ``next()``: one asked to
        stop finishes the item it is making first, and resetting the input under it had two
        threads in one tar shard (a restore right after ``iter()``: reads of a closed file,
        headers read at another thread's offset, samples of the old position)."""
        self.close()
        for thread in self._lingering:
            thread.join()
        self._lingering = []

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self._left_input()
        self.inline = self._prefer_inline
        if initial_state is None:
            self.source.reset()
            self._snapshot, self._steps = None, 0
        else:
            it = initial_state[self.IT_KEY]
            self._snapshot, self._steps = it["snapshot"], it["steps_since_snapshot"]
            self.source.reset(self._snapshot)
            for i in range(self._steps):  # the items emitted after that snapshot
                try:
                    next(self.source)
                except StopIteration:
                    raise StateError(f"prefetch: the state says {self._steps} items were emitted after its "
                                     f"snapshot, but the input ended after {i}: not the input the state "
                                     "was taken from") from None
        self._done = self._closed = False
        self._got, self._at = [], 0
        self._back = None
        self._aways, self._taken, self._made, self._make_s, self._wait_s = [], 0, 0, 0.0, 0.0
        if not self.inline:
            self._start()

    def _start(self) -> None:
        """A thread that makes items from the input's position now."""
        if self._snapshot is None or self.inline:  # (inline, the state was the input's own)
            self._snapshot, self._steps = self.source.state_dict(), 0
        self.inline = False
        self._got, self._at = [], 0
        self._items, self._credits, self._held = queue.SimpleQueue(), queue.SimpleQueue(), _Held()
        for _ in range(self.depth):
            self._credits.put(True)
        self._thread = threading.Thread(
            target=_run, args=(self.source, self._items, self._credits, self._held, self.snapshot_every,
                               _group(self.depth)),
            name="conveyor-prefetch", daemon=True)
        self._thread.start()

    def next(self):
        if self._done or self._closed:  # ended, or closed (what the thread made is dropped)
            raise StopIteration
        back = self._back
        if back is not None:
            self._aways.append(perf_counter() - back)
        item = self._next_inline() if self.inline else self._next_threaded()
        self._taken += 1
        if self._taken >= self._window and self.adapt:
            self._look()
        self._back = perf_counter()
        return item

    def _next_inline(self) -> Any:
        t0 = perf_counter()
        try:
            item = next(self.source)
        except StopIteration:
            self._done = True
            raise
        except BaseException:  # the input's error as itself: this epoch is over
            self._done = True
            if self._closed:  # closed meanwhile (by another thread): the error is the closing's (a
                raise StopIteration from None  # map told it was closed), as with the thread
            raise
        self._make_s += perf_counter() - t0
        self._made += 1
        return item

    def _next_threaded(self) -> Any:
        if self._thread is None:  # closed meanwhile
            raise StopIteration
        if self._at >= len(self._got):
            t0 = perf_counter()
            self._got, self._at = self._wait(), 0
            self._wait_s += perf_counter() - t0
        item, state = self._got[self._at]
        self._at += 1
        if item is _PARKED:  # everything the thread made has been handed out: go on inline
            thread, self._thread = self._thread, None
            if thread is not None:
                thread.join()
            self.inline = True
            self.switches += 1
            self._snapshot, self._steps = None, 0
            return self._next_inline()
        if item is _END:
            self._done = True
            raise StopIteration
        if type(item) is _Failed:
            self._done = True
            if self._thread is None:  # closed meanwhile: the error is the closing's (a map told
                raise StopIteration   # its pool was closed), not the input's
            raise item.exc
        self._credits.put(True)
        if state is None:
            self._steps += 1
        else:
            self._snapshot, self._steps = state, 0
        return item

    def _look(self) -> None:
        """End of a window: park the thread, or start one, where the figures say so."""
        held = self._held
        if self.inline:
            made, make_s = self._made, self._make_s
        else:
            made, make_s = held.made, held.make_s
            held.made, held.make_s = 0, 0.0
        aways = sorted(self._aways)
        away = aways[len(aways) // 2] if aways else 0.0  # the median: a consumer preempted now and
        make = make_s / made if made else 0.0             # then on a busy host still comes straight back
        wait = self._wait_s / self._taken if self._taken else 0.0
        self._aways, self._taken, self._made, self._make_s, self._wait_s = [], 0, 0, 0.0, 0.0
        self._window = WINDOW
        if not make:
            return
        # wait > make: the consumer waited longer for each item than making it takes; its time
        # away holds the GIL (Python work), so the thread cannot run meanwhile, and each
        # hand-over costs thread switches. Parked, the thread stops after its current item
        # and its items come first.
        if not self.inline and not held.park and (away < TO_INLINE * make or wait > make):
            if wait > make:
                self._lost_away = away
            held.park = True
            self._prefer_inline = True
        elif self.inline and away > TO_THREAD * make and away > 2 * self._lost_away:
            self._prefer_inline = False
            self.switches += 1
            self._start()

    def _wait(self) -> list:
        """The next list of items: the thread's next one, or, after ``_LOOK`` seconds of
        waiting, what it holds (its input may be slow to give the rest of the list)."""
        items, held = self._items, self._held
        slept = 0.0
        while True:
            try:
                return items.get(timeout=_LOOK)
            except queue.Empty:
                with held.lock:
                    if held.items and items.empty():
                        got, held.items = held.items, []
                        return got
                slept += _LOOK
                if slept < _POLL:
                    continue
                slept = 0.0
                if self._thread is None:  # closed (by another thread) while waiting: done
                    self._done = True
                    raise StopIteration from None
                if not self._thread.is_alive() and items.empty():
                    self._done = True
                    raise RuntimeError("prefetch: its thread ended without a word") from None

    def stats(self) -> dict[str, Any]:
        """Where the items are made now (``made_in``: ``thread`` or ``caller``, see ``adapt``) and
        the switches between the two so far."""
        return {"made_in": "caller" if self.inline else "thread", "mode_switches": self.switches}

    def get_state(self) -> dict:
        if self.inline:  # nothing made ahead: the input's state now is the state after the last item
            return {self.IT_KEY: {"snapshot": self.source.state_dict(), "steps_since_snapshot": 0}}
        return {self.IT_KEY: {"snapshot": self._snapshot, "steps_since_snapshot": self._steps}}

    @staticmethod
    def elastic_input(cursor: Cursor) -> Cursor:
        """Consumed input items (elastic resume): the snapshot plus the items taken after it."""
        if cursor.state is None:
            return cursor
        it = cursor.state[Prefetch.IT_KEY]
        return Cursor(it["snapshot"], it["steps_since_snapshot"] + cursor.more, cursor.extra)

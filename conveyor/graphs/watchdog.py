"""watchdog: says where a stalled graph waits, instead of a silent hang.

A worker process stopped with SIGSTOP, an ``fn`` blocked on a dead server or a lock, a
source that never answers: iteration stops with no word. Each loader has a ``Watchdog`` that
looks every few seconds at two things: whether the caller is inside ``next()``, and whether
any node emitted an item (the graph's counters, which are exact). When the caller has waited
``after`` seconds with nothing moving anywhere, it logs a warning that walks the graph from
the output to its inputs, each node with its items this epoch and, where a node can tell,
what it waits on (a worker copy and its process state, items inside ``fn``), and repeats it
every ``after`` seconds while the stall lasts.

The caller's side costs two integer increments per batch. One daemon thread of the process
does the looking for every started watchdog (a thread a loader had cost each fresh loader
its start, ~0.5 ms of its first epoch on this project's 2-core VM, and a thread each); it ends
``_IDLE`` seconds after the last watchdog stopped, so a process that makes loaders one after
another keeps one. It holds the watchdogs, not their loaders, so a loader nobody closes is
still collected (and closed, which stops its watchdog) by the GC.

The delay is the spec's top-level ``watchdog`` (seconds, default 60; 0 turns it off).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Callable

log = logging.getLogger(__name__)

DEFAULT_AFTER = 60.0
_IDLE = 1.0  # seconds the shared thread waits, with no watchdog started, before it ends


class Watchdog:
    """Warns when the caller waited ``after`` seconds in ``next()`` and no item moved.

    Args:
        after: seconds of stall before the first warning (and between repeats); > 0.
        progress: returns a number that changes whenever any item moves in the graph.
        report: ``report(seconds)``: the warning's text for a stall that has lasted so long.

    Example:
        >>> dog = Watchdog(60, progress=lambda: 0, report=lambda s: f"stalled {s:.0f} s")
        >>> dog.start()
        >>> dog.entered += 1; dog.left += 1   # around each pull of a batch
        >>> dog.stop()
    """

    def __init__(self, after: float, *, progress: Callable[[], int], report: Callable[[float], str]):
        if not after > 0:
            raise ValueError(f"{after=} must be > 0")
        self.after = float(after)
        self.tick = min(max(self.after / 4, 0.05), 5.0)  # seconds between two looks
        self.progress = progress
        self.report = report
        self.entered = 0  # pulls begun
        self.left = 0     # pulls ended (returned or raised)
        self.warnings = 0
        self._stopped = False
        self._due = 0.0   # when the shared thread looks next (time.monotonic())
        self._seen: tuple = ()
        self._since = 0.0
        self._warned_at: float | None = None
        self._home: _Watchers | None = None  # the watchers it was added to (None: not started)

    def start(self) -> None:
        """Start watching (once; later calls, and calls after ``stop``, do nothing)."""
        if self._home is None and not self._stopped:
            now = time.monotonic()
            self._since, self._due = now, now + self.tick
            self._home = _watchers
            self._home.add(self)

    def look(self, now: float) -> None:
        """One look (the shared thread's): warn if the caller has waited ``after`` seconds with
        nothing moving, and again every ``after`` seconds while that lasts."""
        try:
            sig = (self.entered, self.left, self.progress())
        except Exception:  # noqa: BLE001 - a counter read half-way through a reset: look again
            return
        if sig != self._seen or self.entered == self.left:  # something moved, or nobody waits
            self._seen, self._since, self._warned_at = sig, now, None
            return
        if now - self._since >= self.after and (self._warned_at is None or now - self._warned_at >= self.after):
            self._warned_at = now
            self.warnings += 1
            try:
                log.warning("%s", self.report(now - self._since))
            except Exception:  # noqa: BLE001 - the report must not end the watch
                log.warning("no item has moved for %.0f s while the caller waits for a batch",
                            now - self._since, exc_info=True)

    def stop(self) -> None:
        """Stop watching (safe to call twice, and from any thread)."""
        self._stopped = True
        if self._home is not None:
            self._home.discard(self)


class _Watchers:
    """The started watchdogs of the process and the one thread that looks at them, each at its
    own ``tick``; the thread starts with the first watchdog and ends ``_IDLE`` seconds after
    the last one stopped."""

    def __init__(self) -> None:
        self._forget()

    def _forget(self) -> None:
        """No watchdog, no thread: at the start, and in a forked child (which has no thread; its
        lock may have been held by the parent's thread at the fork)."""
        self._cond = threading.Condition(threading.Lock())
        self._dogs: set[Watchdog] = set()
        self._thread: threading.Thread | None = None
        self._wake = 0.0  # when the thread wakes next by itself (time.monotonic())
        self._adds = 0    # watchdogs added so far: one that came and went while the thread slept
                          # idle starts its idle time again

    def add(self, dog: Watchdog) -> None:
        with self._cond:
            self._dogs.add(dog)
            self._adds += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="conveyor-watchdog", daemon=True)
                self._thread.start()
            elif dog._due < self._wake:  # (else the thread finds it when it wakes: woken now, it
                self._cond.notify()       # would take the GIL from a loader's first batches)

    def discard(self, dog: Watchdog) -> None:
        with self._cond:
            self._dogs.discard(dog)
            if not self._dogs:  # the thread goes idle now, and ends _IDLE seconds later
                self._cond.notify()

    def _run(self) -> None:
        cond = self._cond
        idle_since, adds = None, -1
        while True:
            with cond:
                now = time.monotonic()
                if not self._dogs:
                    if idle_since is None or adds != self._adds:
                        idle_since, adds = now, self._adds
                    left = idle_since + _IDLE - now
                    if left <= 0:
                        self._thread = None
                        return
                    self._wake = now + left
                    cond.wait(left)
                    continue
                idle_since = None
                wake = min(d._due for d in self._dogs)
                if wake > now:
                    self._wake = wake
                    cond.wait(wake - now)
                    continue
                due = [d for d in self._dogs if d._due <= now]
                for d in due:
                    d._due = now + d.tick
            for d in due:  # outside the lock: a report walks the graph, and may be slow
                if not d._stopped:
                    d.look(now)


_watchers = _Watchers()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_watchers._forget)


def graph_report(compiled: Any) -> Callable[[float], str]:
    """The ``report`` for a compiled graph: the chain of nodes from the output to its inputs.
    (No closure that calls itself: its cell would make a reference cycle holding every node,
    and a closed loader's buffers would wait for the garbage collector's rare full passes.)"""
    plan, nodes = compiled.plan, compiled.nodes
    copies = getattr(plan, "copies", None)
    merged = copies.until if copies is not None and copies.count > 1 else None  # the copies merge there

    def report(seconds: float) -> str:
        return (f"{plan.path}: no item has moved anywhere in the graph for {seconds:.0f} s while the "
                f"caller waits for a batch; it waits on {_chain(plan, nodes, merged, plan.output)} (spec key "
                "'watchdog' sets this delay)")

    return report


def _chain(plan: Any, nodes: dict, merged: str | None, name: str, depth: int = 0) -> str:
    """``name`` and, after ``<-``, the chains of its inputs."""
    text = _one(plan, nodes, merged, name)
    inputs = [i for i in plan.nodes[name].inputs if i in nodes]
    if not inputs or depth > 64:
        return text
    if len(inputs) == 1:
        return f"{text} <- {_chain(plan, nodes, merged, inputs[0], depth + 1)}"
    return f"{text} <- [" + "; ".join(_chain(plan, nodes, merged, i, depth + 1) for i in inputs) + "]"


def _one(plan: Any, nodes: dict, merged: str | None, name: str) -> str:
    """One node of the chain: its name, op, items so far and what it waits on, if it says."""
    counted = nodes[name]
    op = plan.nodes[name].op.name
    kind = f"{op}, in worker copies up to here" if name == merged else op
    text = f"'{name}' ({kind}, {counted.items} items)"
    waiting_on = getattr(counted.inner, "waiting_on", None)
    said = waiting_on() if callable(waiting_on) else None
    return f"{text}: {said}" if said else text


def graph_progress(compiled: Any) -> Callable[[], int]:
    """The ``progress`` for a compiled graph: items emitted by all nodes, plus the chunks
    worker copies received."""
    counted = list(compiled.nodes.values())

    def progress() -> int:
        return sum(c.items + getattr(c.inner, "received", 0) for c in counted)

    return progress

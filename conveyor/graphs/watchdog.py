"""watchdog: says where a stalled graph waits, instead of a silent hang.

A worker process stopped with SIGSTOP, an ``fn`` blocked on a dead server or a lock, a
source that never answers: iteration stops with no word. The loader's ``Watchdog`` is one
daemon thread that looks every few seconds at two things: whether the caller is inside
``next()``, and whether any node emitted an item (the graph's counters, which are exact).
When the caller has waited ``after`` seconds with nothing moving anywhere, it logs a warning
that walks the graph from the output to its inputs, each node with its items this epoch and,
where a node can tell, what it waits on (a worker copy and its process state, items inside
``fn``), and repeats it every ``after`` seconds while the stall lasts.

The caller's side costs two integer increments per batch. The thread holds no reference to
the loader, so a loader nobody closes is still collected (and closed) by the GC.

The delay is the spec's top-level ``watchdog`` (seconds, default 60; 0 turns it off).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

log = logging.getLogger(__name__)

DEFAULT_AFTER = 60.0


class Watchdog:
    """Warns when the caller waited ``after`` seconds in ``next()`` and no item moved.

    Args:
        after: seconds of stall before the first warning (and between repeats); > 0.
        progress: returns a number that changes whenever any item moves in the graph.
        report: ``report(seconds)``: the warning's text for a stall that has lasted so long.

    Example:
        >>> dog = Watchdog(60, progress=lambda: 0, report=lambda s: f"stalled {s:.0f} s")
        >>> dog.entered += 1; dog.left += 1   # around each pull of a batch
        >>> dog.stop()
    """

    def __init__(self, after: float, *, progress: Callable[[], int], report: Callable[[float], str]):
        if not after > 0:
            raise ValueError(f"{after=} must be > 0")
        self.after = float(after)
        self.progress = progress
        self.report = report
        self.entered = 0  # pulls begun
        self.left = 0     # pulls ended (returned or raised)
        self.warnings = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread (once; later calls do nothing)."""
        if self._thread is None and not self._stop.is_set():
            self._thread = threading.Thread(target=self._run, name="conveyor-watchdog", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        tick = min(max(self.after / 4, 0.05), 5.0)
        seen: tuple = ()
        since = time.monotonic()
        warned_at: float | None = None
        while not self._stop.wait(tick):
            now = time.monotonic()
            try:
                sig = (self.entered, self.left, self.progress())
            except Exception:  # noqa: BLE001 - a counter read half-way through a reset: look again
                continue
            if sig != seen or self.entered == self.left:  # something moved, or nobody waits
                seen, since, warned_at = sig, now, None
                continue
            if now - since >= self.after and (warned_at is None or now - warned_at >= self.after):
                warned_at = now
                self.warnings += 1
                try:
                    log.warning("%s", self.report(now - since))
                except Exception:  # noqa: BLE001 - the report must not end the watch
                    log.warning("no item has moved for %.0f s while the caller waits for a batch",
                                now - since, exc_info=True)

    def stop(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=1)


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

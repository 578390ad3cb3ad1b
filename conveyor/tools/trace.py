"""``--trace FILE``: per-node spans of a short run as a Chrome trace (chrome://tracing, Perfetto).

Every ``next()`` of every node becomes a complete event (``"ph": "X"``) named after the node,
on the thread that called it, so the nesting of a same-thread chain and the hand-offs
between threads (a prefetch's background thread, a map's reader and workers) show on the
timeline. A map with thread workers also records its ``fn`` calls, as ``"<node>.fn"`` spans
on the worker threads. Each thread is labelled with its name and the nodes seen on it.

The span count is bounded: the trace holds at most ``max_spans`` spans, shared fairly: each
node (and each map's ``fn``) records at most ``per_node`` spans and at most its share of
``max_spans``; a node that reached its limit stops recording (the run goes on).

Example:
    >>> rec = TraceRecorder()                      # doctest: +SKIP
    >>> rec.attach(loader); list(loader); rec.write("trace.json")

``trace_recorder`` and ``write_trace`` are ``--trace FILE`` for the commands that take it
(``conveyor run``, ``conveyor bench``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from typing import Any

from conveyor.graphs.instrument import Counted


class TraceRecorder:
    """Records spans of the nodes of a loader (see the module docstring).

    Args:
        max_spans: spans in the whole trace, at most.
        per_node: spans per node (and per map's ``fn``), at most.
    """

    def __init__(self, *, max_spans: int = 20_000, per_node: int = 2_000):
        self.max_spans = max_spans
        self.per_node = per_node
        self.spans: list[tuple[str, float, float, int, int]] = []  # name, t0, t1, tid, n
        self._names: dict[int, str] = {}         # id(counted) -> node name
        self._ops: dict[str, str] = {}           # node name -> op
        self._counts: dict[str, int] = {}
        self._threads: dict[int, tuple[str, list[str]]] = {}  # tid -> (thread name, nodes seen)
        self._attached: list[Counted] = []
        self._origin = time.perf_counter()
        self._lock = threading.Lock()
        self._limit = per_node

    @property
    def full(self) -> bool:
        return len(self.spans) >= self.max_spans

    def attach(self, loader: Any) -> None:
        """Start recording the nodes of ``loader`` (built in this process)."""
        plan = loader._c.plan
        self._origin = time.perf_counter()
        for name, c in loader._c.nodes.items():
            self._names[id(c)] = name
            self._ops[name] = plan.nodes[name].op.name
            self._counts[name] = 0
            c.watch(self._on_item)
            if c.timed_fn:
                fn_name = f"{name}.fn"
                self._ops[fn_name] = f"{self._ops[name]} fn"
                self._counts[fn_name] = 0
                c.work.trace = self._fn_recorder(fn_name)
            self._attached.append(c)
        self._limit = min(self.per_node, self.max_spans // max(1, len(self._counts)))

    def detach(self) -> None:
        """Stop recording (the spans so far are kept)."""
        for c in self._attached:
            c.unwatch(self._on_item)
            if c.work.trace is not None:
                c.work.trace = None
        self._attached = []

    def _record(self, name: str, t0: float, t1: float) -> bool:
        n = self._counts.get(name, 0)
        if n >= self._limit or len(self.spans) >= self.max_spans:
            return False
        tid = threading.get_ident()
        thread = self._threads.get(tid)
        if thread is None:
            with self._lock:
                thread = self._threads.setdefault(tid, (threading.current_thread().name, []))
        if name not in thread[1]:
            thread[1].append(name)
        self._counts[name] = n + 1
        self.spans.append((name, t0, t1, tid, n))
        return True

    def _on_item(self, c: Counted, item: Any, t0: float, t1: float) -> None:
        name = self._names.get(id(c))
        if name is not None and not self._record(name, t0, t1):
            c.unwatch(self._on_item)  # this node has recorded its share

    def _fn_recorder(self, name: str):
        def record(t0: float, t1: float) -> None:
            self._record(name, t0, t1)
        return record

    def events(self) -> list[dict[str, Any]]:
        """The trace as Chrome trace events: thread names, then the spans in time order."""
        pid = os.getpid()
        events: list[dict[str, Any]] = [
            {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
             "args": {"name": f"{thread}: {', '.join(nodes)}"}}
            for tid, (thread, nodes) in self._threads.items()]
        for name, t0, t1, tid, n in sorted(self.spans, key=lambda s: s[1]):
            events.append({"name": name, "ph": "X", "ts": round((t0 - self._origin) * 1e6, 3),
                           "dur": round((t1 - t0) * 1e6, 3), "pid": pid, "tid": tid,
                           "args": {"op": self._ops.get(name, ""), "n": n}})
        return events

    def write(self, path: str | os.PathLike[str]) -> int:
        """Write the trace as a JSON list of events; returns the number of spans."""
        events = self.events()
        with open(path, "w", encoding="utf-8") as f:
            json.dump(events, f, separators=(",", ":"))
        return len(self.spans)


def trace_recorder(args: argparse.Namespace) -> TraceRecorder | None:
    """A recorder for ``--trace FILE``, or None when the command was not given one."""
    if not getattr(args, "trace", None):
        return None
    return TraceRecorder()


def write_trace(recorder: TraceRecorder, path: str) -> None:
    """Stop recording and write the trace to ``path``, saying so on stderr."""
    recorder.detach()
    n = recorder.write(path)
    print(f"trace: {n} spans written to {path} (open it in ui.perfetto.dev or chrome://tracing)",
          file=sys.stderr)


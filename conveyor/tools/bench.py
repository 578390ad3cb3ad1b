"""``conveyor bench``: run a graph with no model and say where the time goes.

The graph runs for a warm-up, then ``seconds`` more while every node's counters (see
conveyor/graphs/instrument.py) are summed over the epochs it crosses. The report has a row
per node (items out, items/s, busy, wait, queue fill, measured item size), one sentence
naming the node that limits the graph, and the memory the buffers hold (measured item sizes
times their capacities) beside the process's measured peak RSS.

With ``step_time`` a trainer taking that long per batch is simulated (it sleeps) and can be
the limit itself; the report then gives the share of time it would wait for data. The run is
``measure.drive``, the limiting node ``bottleneck.find_bottleneck``, the table
``tables.node_table``; the command line is ``bench_commands``.

Example:
    >>> from conveyor.graphs.api import check_spec
    >>> result = run_bench(check_spec("specs/numbers.yaml"), seconds=1)   # doctest: +SKIP
    >>> print(format_report(result))                                      # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from conveyor.graphs.compile import compile_plan
from conveyor.graphs.loader import Loader
from conveyor.graphs.validate import Plan
from conveyor.tools.bottleneck import find_bottleneck, node_rows
from conveyor.tools.measure import Drive, SizeSampler, counted_nodes, drive, reset_peak_rss, status_bytes
from conveyor.tools.tables import fmt_bytes, node_table, pct


@dataclass
class BenchResult:
    """Everything ``conveyor bench`` prints, as data."""

    spec: str
    drive: Drive
    nodes: dict[str, dict[str, Any]]   # per node: op, items, perf figures, item_bytes
    bottleneck: str | None             # the limiting node's name, "trainer", or None
    sentence: str                      # the bottleneck in words
    step_time: float
    data_wait: float                   # share of the window the trainer waited for data
    buffers: list[dict[str, Any]]      # per buffering node: items held, bytes each, total
    rss_before: int | None
    peak_rss: int | None
    peak_is_run: bool                  # the peak was reset at the start (else: since process start)
    notes: list[str] = field(default_factory=list)
    padding: list[dict[str, Any]] = field(default_factory=list)  # per node counting real/padded tokens

    @property
    def buffer_bytes(self) -> float:
        return sum(b["bytes"] for b in self.buffers)



def buffers_of(loader: Loader, sizes: SizeSampler) -> list[dict[str, Any]]:
    """Items each buffering node can hold, times its measured item size."""
    from conveyor.nodes import Batch, Map, Prefetch, ShuffleBuffer, WorkerCopies

    counted = counted_nodes(loader)
    plan = loader._c.plan
    out = []
    for name, c in counted.items():
        inner = c.inner
        own = sizes.mean(c)
        ins = [counted[i] for i in plan.nodes[name].inputs if i in counted]
        in_size = sizes.mean(ins[0]) if ins else None
        held, each, what = 0, own, ""
        if isinstance(inner, Prefetch):
            held, what = inner.depth + 1, f"{inner.depth} ready + 1 being made"
        elif isinstance(inner, Map) and inner.workers:
            held = inner.window
            what = f"{held} in flight ({inner.workers} workers)"
        elif isinstance(inner, ShuffleBuffer):
            now = len(getattr(inner, "_buf", None) or ()) + len(getattr(inner, "_ahead", None) or ())
            held, what = (now or 2 * inner.size), f"window of {inner.size} + the next one filling"
        elif isinstance(inner, Batch):
            held, each, what = inner.size, in_size, "partial batch"
        elif isinstance(inner, WorkerCopies):
            held = inner.depth * inner.copies
            what = f"{inner.depth} ready x {inner.copies} copies"
        if held and each is not None:
            out.append({"node": name, "items": held, "item_bytes": each, "bytes": held * each, "what": what})
    return out


def padding_of(stats: dict[str, Any]) -> list[dict[str, Any]]:
    """The nodes whose ``stats()`` count real and padded tokens (pad_collate, bucket_batch,
    pack_tokens), with their counts in the current epoch."""
    out = []
    for name, entry in stats.get("nodes", {}).items():
        if "real_tokens" in entry and "padded_tokens" in entry:
            out.append({"node": name, "op": entry.get("op", ""), "real": entry["real_tokens"],
                        "padded": entry["padded_tokens"]})
    return out


def bench_warmup(seconds: float) -> float:
    """The bench's warm-up when none is given: a quarter of the measured time, at most 3 s."""
    return min(3.0, seconds / 4)


def run_bench(plan: Plan, *, seconds: float = 10.0, warmup: float | None = None,
              step_time: float = 0.0, on_loader: Callable[[Loader], None] | None = None,
              timeline: Any = None, progress: Callable[[float, int], None] | None = None) -> BenchResult:
    """Run ``plan`` with no model and measure where the time goes.

    Args:
        plan: a checked spec (``conveyor.graphs.api.check_spec``).
        seconds: the measured window.
        warmup: seconds before measuring (default: a quarter of ``seconds``, at most 3).
        step_time: seconds per batch of a simulated trainer (0: none).
        on_loader: called with the loader before it runs (``--trace`` attaches here).
        timeline: a ``conveyor.tools.report.Timeline`` to sample the run (``--report``).
        progress: passed to ``drive`` (seconds measured so far, samples in them).
    """
    warmup = bench_warmup(seconds) if warmup is None else warmup
    rss_before = status_bytes("VmRSS").get("VmRSS")
    peak_is_run = reset_peak_rss()
    sizes = SizeSampler()
    with Loader(compile_plan(plan)) as loader:
        counted = counted_nodes(loader)
        for c in counted.values():
            c.watch(sizes)  # while watched, every call is timed: the bench is exact
        try:
            if on_loader is not None:
                on_loader(loader)
            if timeline is not None:
                timeline.start(loader)
            d = drive(loader, seconds=seconds, warmup=warmup, step_time=step_time, progress=progress)
        finally:
            if timeline is not None:
                timeline.stop()
            for c in counted.values():
                c.unwatch(sizes)
        rows = node_rows(loader, d.raws, d.seconds)
        for name, c in counted.items():
            rows[name]["item_bytes"] = sizes.mean(c)
        buffers = buffers_of(loader, sizes)
        padding = padding_of(loader.stats())
        notes = []
        if loader._c.copied:
            notes.append(f"nodes {', '.join(loader._c.copied)} ran in worker copies: their time is "
                         "measured there and not shown")
    peak = status_bytes("VmHWM").get("VmHWM")
    wall = d.seconds
    data_wait = d.data_wait_s / wall if wall > 0 else 0.0
    trainer_busy = d.trainer_s / wall if wall > 0 and step_time > 0 else None
    name, sentence = find_bottleneck(rows, wall, trainer_busy=trainer_busy, step_time=step_time,
                                     data_wait=data_wait, starts=d.starts_s / wall if wall > 0 else None)
    if wall <= 0:
        name, sentence = None, "nothing was measured: the run ended during the warm-up (empty data?)"
    return BenchResult(spec=plan.path, drive=d, nodes=rows, bottleneck=name, sentence=sentence,
                       step_time=step_time, data_wait=data_wait, buffers=buffers,
                       rss_before=rss_before, peak_rss=peak, peak_is_run=peak_is_run, notes=notes,
                       padding=padding)



def format_report(r: BenchResult) -> str:
    """What ``conveyor bench`` prints: the run, the table, the bottleneck, the memory."""
    d = r.drive
    out = [f"bench {r.spec}: {d.seconds:.1f} s measured ({d.epochs} epoch(s) started), {d.batches} batches, "
           f"{d.samples} samples: {d.samples_per_s:,.1f} samples/s, {d.batches / max(d.seconds, 1e-9):,.2f} batches/s",
           "", node_table(r.nodes), "",
           "busy: share of the time the node was producing (per worker thread); wait: share of the time it",
           "spent getting items from its inputs; queue: items ready when its consumer asked (mean/capacity)",
           "", r.sentence + "."]
    if r.step_time > 0 and r.bottleneck not in ("trainer", None):
        out.append(f"With a {1000 * r.step_time:g} ms step the trainer waits for data {pct(r.data_wait)} "
                   "of the time.")
    elif r.step_time == 0 and r.bottleneck is not None:
        out.append(f"(no trainer: the loop only takes batches; it waited for data {pct(r.data_wait)} of the time)")
    for p in r.padding:
        waste = (p["padded"] - p["real"]) / p["padded"] if p["padded"] else 0.0
        out.append(f"padding: {p['node']} ({p['op']}) {100 * waste:.2f} % of its {p['padded']:,} tokens are padding "
                   f"({p['real']:,} real, this epoch)")
    out.append("")
    out.append(f"memory: the buffers hold up to ~{fmt_bytes(r.buffer_bytes)} (measured item sizes x capacity)")
    for b in r.buffers:
        out.append(f"  {b['node']:<12} {b['items']:>6} x {fmt_bytes(b['item_bytes']):>10} = "
                   f"{fmt_bytes(b['bytes']):>10}  ({b['what']})")
    if r.peak_rss is not None:
        since = "during the run" if r.peak_is_run else "since the process started"
        out.append(f"peak RSS {fmt_bytes(r.peak_rss)} {since} (RSS before the run: {fmt_bytes(r.rss_before)})")
    out.extend(f"note: {n}" for n in r.notes)
    return "\n".join(out)

"""``conveyor bench``: run a graph with no model and say where the time goes.

The graph runs for a warm-up, then ``seconds`` more while every node's counters (see
conveyor/graphs/instrument.py) are summed over the epochs it crosses. The report has a row
per node (items out, items/s, busy, wait, queue fill, measured item size), one sentence
naming the node that limits the graph, and the memory the buffers hold (measured item sizes
times their capacities) beside the process's measured peak RSS.

The limiting node is the busiest one, relative to the threads it has: in a pipeline every
stage but the slowest waits part of the time, so the stage that is busy nearly all the time
sets the pace. With ``step_time`` a trainer taking that long per batch is simulated (it
sleeps) and can be the limit itself; the report then gives the share of time it would wait
for data.

Example:
    >>> from conveyor.graphs.api import check_spec
    >>> result = run_bench(check_spec("specs/numbers.yaml"), seconds=1)   # doctest: +SKIP
    >>> print(format_report(result))                                      # doctest: +SKIP
"""

from __future__ import annotations

import bisect
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from conveyor.graphs.compile import compile_plan
from conveyor.graphs.instrument import Counted
from conveyor.graphs.loader import Loader
from conveyor.graphs.stats import add_raw, node_perf
from conveyor.graphs.validate import Plan

_SIZE_EVERY = 32  # a node's item size is measured on its 1st item and every 32nd after


# ----- small measures ----------------------------------------------------------------------

def batch_len(batch: Any) -> int:
    """Samples in a batch: the leading dim of its first tensor, or its length."""
    first = batch
    while isinstance(first, (dict, list, tuple)) and not hasattr(first, "shape"):
        if isinstance(first, dict):
            if not first:
                return 0
            first = next(iter(first.values()))
        elif isinstance(first, (list, tuple)):
            if not first or not isinstance(first[0], (dict, list, tuple)) and not hasattr(first[0], "shape"):
                return len(first)
            if isinstance(batch, list) and first is batch:
                return len(first)
            first = first[0]
    shape = getattr(first, "shape", None)
    return int(shape[0]) if shape else 1


def nbytes(obj: Any, _depth: int = 0) -> int:
    """Roughly the memory an item holds: tensor and array data, bytes and text, containers."""
    if _depth > 8:
        return 0
    n = getattr(obj, "nbytes", None)  # numpy arrays, and torch tensors since 2.1
    if isinstance(n, int):
        return n
    if hasattr(obj, "element_size") and hasattr(obj, "nelement"):
        return int(obj.element_size() * obj.nelement())
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return len(obj)
    if isinstance(obj, str):
        return len(obj) + 49
    if isinstance(obj, dict):
        return 64 + sum(nbytes(k, _depth + 1) + nbytes(v, _depth + 1) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return 56 + 8 * len(obj) + sum(nbytes(v, _depth + 1) for v in obj)
    size = getattr(obj, "size", None)  # a PIL image: width x height x bands
    if isinstance(size, tuple) and hasattr(obj, "getbands"):
        return size[0] * size[1] * len(obj.getbands())
    return sys.getsizeof(obj)


def status_bytes(*keys: str) -> dict[str, int]:
    """Fields of /proc/self/status (VmRSS, VmHWM) in bytes; empty where there is no /proc."""
    out: dict[str, int] = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name in keys:
                    out[name] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


def reset_peak_rss() -> bool:
    """Make VmHWM restart from the current RSS (Linux >= 4.0); False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def pct(x: float | None) -> str:
    return "-" if x is None else f"{round(100 * x)} %"


class SizeSampler:
    """A ``Counted`` watcher that measures item sizes: the first item, then every 32nd."""

    def __init__(self) -> None:
        self.seen: dict[int, list] = {}  # id(counted) -> [calls, bytes summed, sampled]

    def __call__(self, c: Counted, item: Any, t0: float, t1: float) -> None:
        st = self.seen.get(id(c))
        if st is None:
            st = self.seen[id(c)] = [0, 0, 0]
        st[0] += 1
        if st[0] % _SIZE_EVERY == 1:
            st[1] += nbytes(item)
            st[2] += 1

    def mean(self, c: Counted) -> float | None:
        st = self.seen.get(id(c))
        return st[1] / st[2] if st and st[2] else None


# ----- driving a loader --------------------------------------------------------------------

@dataclass
class Drive:
    """What one timed run of a loader measured (after its warm-up)."""

    seconds: float = 0.0          # the measured window
    batches: int = 0
    samples: int = 0
    epochs: int = 0               # epochs started, warm-up included
    data_wait_s: float = 0.0      # time the trainer spent in iter()/next()
    starts_s: float = 0.0         # of which: iter() to the first batch of each epoch
    trainer_s: float = 0.0        # time the simulated trainer spent on its steps
    raws: dict[str, dict] = field(default_factory=dict)  # counters over the window, per node

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0


def counted_nodes(loader: Loader) -> dict[str, Counted]:
    """The ``Counted`` wrapper of each node built in this process, by name."""
    return dict(loader._c.nodes)


class Meter:
    """Sums a loader's per-node counters over epochs (the loader zeroes them at each epoch).

    Call ``mark()`` where measuring starts (mid-epoch is fine) and ``fold()`` at the end of
    every epoch and where measuring stops; ``raws`` then holds the counters in between.
    """

    def __init__(self, loader: Loader):
        self.counted = counted_nodes(loader)
        self.raws: dict[str, dict] = {n: {} for n in self.counted}
        self._mark: dict[str, dict] | None = None

    def mark(self) -> None:
        self._mark = {n: c.raw() for n, c in self.counted.items()}

    def fold(self) -> None:
        for n, c in self.counted.items():
            now = c.raw()
            if self._mark is not None:
                now = add_raw(now, self._mark[n], -1)
            self.raws[n] = add_raw(self.raws[n], now)
        self._mark = None


def drive(loader: Loader, *, seconds: float, warmup: float, step_time: float = 0.0,
          max_seconds: float | None = None, stable: float | None = None,
          progress: Callable[[float, int], None] | None = None, every: float = 1.0) -> Drive:
    """Iterate ``loader`` (epoch after epoch) for ``warmup`` then ``seconds`` seconds.

    Args:
        loader: a fresh or used loader.
        seconds: the measured window, after the warm-up (and after the first batch).
        warmup: seconds to run before measuring.
        step_time: seconds a simulated trainer sleeps per batch.
        max_seconds: with ``stable``, keep measuring up to this long while the rates of the
            window's two halves differ by more than ``stable`` (a fraction).
        stable: see ``max_seconds``.
        progress: called every ``every`` seconds of the measured window with the seconds
            measured so far and the samples in them (for a progress line).
        every: see ``progress``.
    """
    meter = Meter(loader)
    out = Drive(raws=meter.raws)
    clock = time.perf_counter
    t_begin = clock()
    t_meas = None
    next_report = 0.0
    times: list[float] = []  # when each measured batch came, and the samples so far
    totals: list[int] = []

    def done(now: float) -> bool:
        if t_meas is None or now - t_meas < seconds:
            return False
        if stable is None or max_seconds is None or now - t_meas >= max_seconds:
            return True
        # the samples of the window's second half against its first half
        i = bisect.bisect_right(times, t_meas + (now - t_meas) / 2)
        n1 = totals[i - 1] if i else 0
        n2 = (totals[-1] if totals else 0) - n1
        return n1 > 0 and abs(n2 - n1) <= stable * max(n1, n2)

    stop = False
    while not stop:
        out.epochs += 1
        t = t_iter = clock()
        it = iter(loader)
        got = 0
        if t_meas is not None:
            out.data_wait_s += clock() - t
        while True:
            t = clock()
            try:
                batch = next(it)
            except StopIteration:
                if t_meas is not None:
                    out.data_wait_s += clock() - t
                break
            now = clock()
            got += 1
            if t_meas is not None:
                out.data_wait_s += now - t
                if got == 1:
                    out.starts_s += now - t_iter
                out.batches += 1
                out.samples += batch_len(batch)
                times.append(now)
                totals.append(out.samples)
            if step_time > 0:
                time.sleep(step_time)
                if t_meas is not None:
                    out.trainer_s += clock() - now
                now = clock()
            if t_meas is None and now - t_begin >= warmup:
                t_meas = next_report = now
                meter.mark()
            elif t_meas is not None and progress is not None and now >= next_report + every:
                next_report = now
                progress(now - t_meas, out.samples)
            if t_meas is not None and done(now):
                stop = True
                break
        if t_meas is not None:
            meter.fold()
        if got == 0:  # an empty epoch: nothing more will come
            break
    if t_meas is None:  # the run ended inside the warm-up: nothing measured
        return out
    out.seconds = clock() - t_meas
    return out


# ----- bench --------------------------------------------------------------------------------

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

    @property
    def buffer_bytes(self) -> float:
        return sum(b["bytes"] for b in self.buffers)


def node_rows(loader: Loader, raws: dict[str, dict], wall: float) -> dict[str, dict[str, Any]]:
    """Per node: op, items over ``wall`` seconds and the perf figures (instrument.node_perf)."""
    counted = counted_nodes(loader)
    plan = loader._c.plan
    perf = node_perf(counted, {n: plan.nodes[n].inputs for n in counted}, raws, wall)
    rows: dict[str, dict[str, Any]] = {}
    for name in loader._c.order:
        row: dict[str, Any] = {"op": plan.nodes[name].op.name, "items": None, "perf": None}
        if name in counted:
            row["items"] = raws[name].get("items", 0)
            row["perf"] = perf.get(name)
        rows[name] = row
    return rows


def find_bottleneck(rows: dict[str, dict[str, Any]], wall: float, *, trainer_busy: float | None = None,
                    step_time: float = 0.0, data_wait: float | None = None,
                    starts: float | None = None) -> tuple[str | None, str]:
    """The node (or ``"trainer"``) that limits the graph, and a sentence saying so.

    The limit is the busiest stage, relative to its threads: a node, or the trainer. A node
    whose work runs out of sight (process workers, worker copies) is named when its
    consumer waits on it most of the time while it hardly waits on its inputs. When nothing
    is busy half the time, nothing is named, and the sentence says where the time went.

    Args:
        rows: per node ``{"op", "perf"}`` as from ``node_rows`` or ``Loader.stats()["nodes"]``.
        wall: the seconds the figures cover.
        trainer_busy: share of the time a simulated trainer spent on its steps.
        step_time: that trainer's seconds per batch (for the sentence).
        data_wait: share of the time the trainer (or the loop) waited for data.
        starts: share of the time spent starting epochs (``iter()`` to the first batch).
    """
    def label(name: str) -> str:
        row = rows[name]
        runs = (row.get("perf") or {}).get("runs")
        return f"{name} ({row['op']}{', ' + runs if runs else ''})"

    known = [(p["busy"], name) for name, row in rows.items()
             if (p := row.get("perf")) and p.get("busy") is not None]
    best_busy, best = max(known) if known else (0.0, None)
    # the nodes that share one thread (not a map's workers) add up to that thread's load
    # (less their reset work, which ran in the thread that started the epoch)
    threads: dict[str, list[tuple[float, str]]] = {}
    for busy, name in known:
        p = rows[name]["perf"]
        if p.get("thread") and p.get("threads", 1) == 1 and wall > 0:
            own = max(0.0, busy - (p.get("reset_s") or 0.0) / wall)
            threads.setdefault(p["thread"], []).append((own, name))
    load = {t: min(1.0, sum(b for b, _ in members)) for t, members in threads.items()}  # past 1: noise
    busiest = max(load, key=lambda t: load[t]) if load else None
    best_thread = load[rows[best]["perf"]["thread"]] if best and rows[best]["perf"].get("thread") in load else 0.0
    restarts = f"; epoch starts (iter() to the first batch) take {pct(starts)} of the time" \
        if starts is not None and starts >= 0.1 else ""
    if best is not None and best_busy >= 0.5 and best_busy >= 0.75 * best_thread \
            and best_busy >= (trainer_busy or 0.0):
        p = rows[best]["perf"]
        return best, (f"{label(best)} limits the graph: {pct(best_busy)} busy; inputs wait {pct(p.get('wait'))}"
                      + restarts)
    if busiest is not None and load[busiest] >= 0.5 and load[busiest] >= (trainer_busy or 0.0):
        members = sorted(threads[busiest], reverse=True)
        shares = ", ".join(f"{n} {pct(b)}" for b, n in members if b >= 0.01) or "each under 1 %"
        first = next(n for n in rows if n in {m for _, m in members})
        return f"thread:{busiest}", (
            f"one thread runs {first} to {busiest} and limits the graph: {pct(load[busiest])} busy between "
            f"them ({shares}); give the heaviest its own workers (map workers) or run the graph in worker "
            "copies" + restarts)
    trainer = f"the trainer ({1000 * step_time:g} ms a step)"
    if trainer_busy is not None and step_time > 0 and trainer_busy >= 0.5 and (data_wait or 0.0) < 0.25:
        tail = f"; the busiest node, {label(best)}, is {pct(best_busy)} busy" if best else ""
        return "trainer", (f"{trainer} limits the graph: it waits for data {pct(data_wait or 0.0)} of the "
                           f"time{tail}{restarts}")
    hidden = []  # work out of sight: a node its consumer waits on, that hardly waits itself
    for name, row in rows.items():
        p = row.get("perf") or {}
        if p.get("busy") is None and p.get("runs") and p.get("seconds") is not None and wall > 0:
            consumer_waits = p["seconds"] / wall
            if consumer_waits > 0.5 and (p.get("wait") or 0.0) < 0.5:
                hidden.append((consumer_waits, name))
    if hidden:
        w, name = max(hidden)
        return name, (f"{label(name)} limits the graph: its consumer waits on it {pct(w)} of the time; "
                      f"inputs wait {pct(rows[name]['perf'].get('wait'))}")
    if best is None:
        return None, "no node could be timed (none ran in this process)"
    waits = f"; {'the trainer' if step_time > 0 else 'the loop'} waits for data {pct(data_wait)}" \
        if data_wait is not None else ""
    where = restarts or "; start-up, epoch starts, thread hand-offs or the GIL take the rest of the time"
    return None, f"no node limits the graph: the busiest, {label(best)}, is {pct(best_busy)} busy{waits}{where}"


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
        timeline: a ``conveyor.report.Timeline`` to sample the run (``--report``).
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
                       rss_before=rss_before, peak_rss=peak, peak_is_run=peak_is_run, notes=notes)


# ----- the report ---------------------------------------------------------------------------

NODE_COLUMNS = ["node", "op", "runs", "items", "items/s", "busy", "wait", "queue", "item size"]


def node_cells(rows: dict[str, dict[str, Any]]) -> list[list[str]]:
    """Per node, the cells of ``NODE_COLUMNS`` as text (the text table and the HTML report)."""
    lines = []
    for name, row in rows.items():
        p = row.get("perf") or {}
        q = p.get("queue")
        queue = "" if not q else (f"{q['mean']:.1f}/{q['capacity']}" if q.get("mean") is not None
                                  else f"-/{q['capacity']}")
        lines.append([name, row["op"], p.get("runs") or "", "-" if row.get("items") is None else str(row["items"]),
                      f"{p['items_per_s']:,.1f}" if p else "-", pct(p.get("busy")), pct(p.get("wait")),
                      queue, fmt_bytes(row.get("item_bytes"))])
    return lines


def node_table(rows: dict[str, dict[str, Any]], sizes: bool = True) -> str:
    """A fixed-width table: one row per node (``sizes``: with the measured item sizes)."""
    head, lines = list(NODE_COLUMNS), node_cells(rows)
    if not sizes:
        head, lines = head[:-1], [r[:-1] for r in lines]
    widths = [max(len(h), *(len(r[i]) for r in lines)) if lines else len(h) for i, h in enumerate(head)]
    right = {3, 4, 5, 6, 7, 8}

    def fmt(cells: list[str]) -> str:
        padded = (c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
        return "  ".join(padded).rstrip()

    return "\n".join([fmt(head)] + [fmt(r) for r in lines])


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

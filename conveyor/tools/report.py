"""``conveyor bench --report FILE``: one self-contained HTML page of where the time goes.

The page holds, with no script, font or style fetched from anywhere (it opens offline and
can be mailed): the graph drawn with each node's busy and wait shares, the bottleneck
sentence, a table and bars of items/s per node, each buffered node's queue fill over time,
items/s per node over time, the memory (the buffers' capacity times the measured item sizes,
and the measured RSS over time) and, when ``conveyor tune --report`` made it, the tune curve.

``Timeline`` samples a running loader every ``interval`` seconds from a background thread:
per node the items emitted so far (all epochs) and, for buffered nodes, how many items are
ready; and the process's RSS.

Example:
    >>> tl = Timeline()                                              # doctest: +SKIP
    >>> result = run_bench(plan, seconds=5, timeline=tl)               # doctest: +SKIP
    >>> write_report("report.html", result, tl)                        # doctest: +SKIP
"""

from __future__ import annotations

import datetime
import os
import platform
import threading
import time
from html import escape
from typing import Any, Sequence

from conveyor.tools.bench import BenchResult
from conveyor.tools.measure import status_bytes
from conveyor.tools.plots import graph_svg, line_chart, node_colors, tune_svg
from conveyor.tools.tables import NODE_COLUMNS, fmt_bytes, node_cells, node_table, pct

__all__ = ["Timeline", "render_report", "render_tune_page", "write_report"]


class Timeline:
    """Samples a loader's per-node items, queue fill and the RSS while it runs.

    Args:
        interval: seconds between samples.
        max_samples: samples kept at most (later ones are dropped; the run goes on).
    """

    def __init__(self, *, interval: float = 0.1, max_samples: int = 3000):
        self.interval = interval
        self.max_samples = max_samples
        self.times: list[float] = []
        self.items: dict[str, list[int]] = {}          # node -> items so far, all epochs
        self.queues: dict[str, list[int | None]] = {}  # buffered node -> items ready
        self.capacity: dict[str, int] = {}
        self.rss: list[int | None] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0

    def start(self, loader: Any) -> None:
        """Start sampling ``loader``'s nodes (those built in this process)."""
        counted = dict(loader._c.nodes)
        self._t0 = time.perf_counter()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, args=(counted,), name="conveyor-timeline",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _run(self, counted: dict[str, Any]) -> None:
        while not self._stop.wait(self.interval) and len(self.times) < self.max_samples:
            self.sample(counted, time.perf_counter() - self._t0)

    def sample(self, counted: dict[str, Any], t: float) -> None:
        """Record one sample at ``t`` seconds (called by the thread; tests call it directly)."""
        self.times.append(t)
        for name, c in counted.items():
            seen = self.items.setdefault(name, [])
            # read while the loop may start an epoch: never let the count go back
            seen.append(max(int(c.items_before + c.items), seen[-1] if seen else 0))
            if getattr(c, "queue_capacity", 0):
                self.capacity[name] = c.queue_capacity
                ready: int | None = None
                if c._qsize is not None:
                    try:
                        ready = int(c._qsize())
                    except Exception:  # a queue that cannot say its size (closing): no sample
                        ready = None
                self.queues.setdefault(name, []).append(ready)
        self.rss.append(status_bytes("VmRSS").get("VmRSS"))

    def window(self, start: float, seconds: float) -> "Timeline":
        """The samples from ``start`` seconds (on this timeline's clock) for ``seconds``, with the
        clock restarted at 0 there: the measured window of a bench, without its warm-up."""
        keep = [i for i, t in enumerate(self.times) if start <= t <= start + seconds + self.interval / 2]
        out = Timeline(interval=self.interval, max_samples=self.max_samples)
        out.times = [self.times[i] - start for i in keep]
        out.items = {n: [v[i] for i in keep] for n, v in self.items.items()}
        out.queues = {n: [v[i] for i in keep] for n, v in self.queues.items()}
        out.capacity = dict(self.capacity)
        out.rss = [self.rss[i] for i in keep]
        out._t0 = self._t0 + start
        return out

    def rates(self, window: float = 0.5) -> dict[str, list[tuple[float, float]]]:
        """Items/s per node over time, each point over the last ``window`` seconds."""
        out: dict[str, list[tuple[float, float]]] = {}
        for name, items in self.items.items():
            pts = []
            j = 0
            for i, t in enumerate(self.times):
                while self.times[j] < t - window:
                    j += 1
                if i > j:
                    pts.append((t, (items[i] - items[j]) / (t - self.times[j])))
            out[name] = pts
        return out


_CSS = """
body{font-family:sans-serif;margin:24px auto;max-width:1000px;color:#222;line-height:1.4}
h1{font-size:22px;margin-bottom:4px} h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
.meta{color:#555;font-size:13px} .verdict{background:#fff4e5;border-left:5px solid #ff7f0e;
padding:10px 14px;font-size:15px;margin:14px 0} table{border-collapse:collapse;font-size:13px}
td,th{padding:3px 9px;border-bottom:1px solid #eee;text-align:right} td:first-child,th:first-child,
td:nth-child(2),th:nth-child(2){text-align:left} .bar{background:#1f77b4;height:12px;display:inline-block}
pre{background:#f6f8fa;padding:10px;font-size:12px;overflow-x:auto} .note{color:#555;font-size:13px}
"""


def _rows_html(result: BenchResult) -> str:
    head = [c if c != "queue" else "queue (mean/cap)" for c in NODE_COLUMNS]
    out = ["<table id='nodes'><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"]
    for cells in node_cells(result.nodes):
        out.append("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in cells) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def _unit(row: dict[str, Any]) -> str:
    return row.get("unit") or "items"


def _rate_bars(result: BenchResult, colors: dict[str, str]) -> str:
    """A bar per node, to one scale per unit: items/s beside items/s, batches/s beside batches/s."""
    rates = {n: (r.get("perf") or {}).get("items_per_s") for n, r in result.nodes.items()}
    tops: dict[str, float] = {}
    for name, v in rates.items():
        unit = _unit(result.nodes[name])
        tops[unit] = max(tops.get(unit, 0.0), v or 0.0)
    out = ["<table id='rates'>"]
    for name, v in rates.items():
        unit = _unit(result.nodes[name])
        top = tops[unit]
        width = 0 if not v or not top else round(400 * v / top)
        per = "batches/s" if unit == "batches" else "items/s"
        out.append(f"<tr><td>{escape(name)}</td><td>{'-' if v is None else f'{v:,.1f} {per}'}</td>"
                   f"<td style='text-align:left'><span class='bar' style='width:{width}px;"
                   f"background:{colors.get(name, '#1f77b4')}'></span></td></tr>")
    out.append("</table>")
    return "\n".join(out)


def _memory_html(result: BenchResult, timeline: Timeline | None, span: float | None) -> str:
    out = [f"<p>The buffers can hold up to <b>~{fmt_bytes(result.buffer_bytes)}</b> (each buffering node's "
           "capacity x its measured item size):</p>", "<table id='memory'><tr><th>node</th><th>holds</th>"
           "<th>items</th><th>item size</th><th>bytes</th></tr>"]
    for b in result.buffers:
        out.append(f"<tr><td>{escape(b['node'])}</td><td>{escape(b['what'])}</td><td>{b['items']}</td>"
                   f"<td>{fmt_bytes(b['item_bytes'])}</td><td>{fmt_bytes(b['bytes'])}</td></tr>")
    out.append("</table>")
    if result.peak_rss is not None:
        since = "during the run" if result.peak_is_run else "since the process started"
        out.append(f"<p>Measured: peak RSS <b>{fmt_bytes(result.peak_rss)}</b> {since}; RSS before the run "
                   f"{fmt_bytes(result.rss_before)}.</p>")
    if timeline is not None and any(v is not None for v in timeline.rss):
        pts = [(t, v / 2**20) for t, v in zip(timeline.times, timeline.rss) if v is not None]
        out.append(line_chart({"RSS": pts}, title="resident memory over time", y_label="MiB", x_max=span))
    return "\n".join(out)


def render_report(result: BenchResult, timeline: Timeline | None = None, *, order: Sequence[str] | None = None,
                  inputs: dict[str, Sequence[str]] | None = None, tune: tuple[Sequence[Any], Any] | None = None,
                  title: str | None = None) -> str:
    """The report as one HTML document (see the module docstring).

    Args:
        result: what ``run_bench`` measured.
        timeline: what a ``Timeline`` sampled during the same run.
        order: node names in topological order (default: the order of ``result.nodes``).
        inputs: each node's inputs, for the drawing (default: none drawn).
        tune: ``(points, verdict)`` from ``conveyor.tools.tune``, drawn as the tune curve.
        title: the page's heading.
    """
    d = result.drive
    order = list(order or result.nodes)
    colors = node_colors(order)  # one colour per node, the same in every chart
    span = d.seconds or None
    if timeline is not None and d.t_measured is not None and timeline._t0:
        timeline = timeline.window(d.t_measured - timeline._t0, d.seconds)  # the measured span only
    boxes = {}
    for name in order:
        row = result.nodes.get(name, {})
        p = row.get("perf") or {}
        lines = [f"{p['items_per_s']:,.1f} items/s" if p else "ran in worker copies"]
        if p.get("runs"):
            lines.append(str(p["runs"]))
        boxes[name] = {"title": f"{name} ({row.get('op', '?')})", "lines": lines,
                       "busy": p.get("busy"), "wait": p.get("wait")}
    now = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    try:
        import torch
        torch_v = torch.__version__
    except ImportError:  # pragma: no cover - torch is a dependency
        torch_v = "?"
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>conveyor bench: {escape(result.spec)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{escape(title or 'conveyor bench: ' + result.spec)}</h1>",
        f"<p class='meta'>{now} on {escape(platform.node() or 'this machine')}: {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, torch {escape(torch_v)}. Measured {d.seconds:.1f} s "
        f"({d.epochs} epoch(s) started): {d.batches} batches, {d.samples} samples, "
        f"<b>{d.samples_per_s:,.1f} samples/s</b>.</p>",
        f"<div class='verdict' id='bottleneck'>{escape(result.sentence)}.</div>",
    ]
    if result.step_time > 0:
        parts.append(f"<p>With a {1000 * result.step_time:g} ms step the trainer waits for data "
                     f"{pct(result.data_wait)} of the time.</p>")
    parts += ["<h2>The graph</h2>",
              "<p class='note'>Each box: the node's items/s, what runs it, and its shares of the time "
              "busy (producing) and waiting on its inputs. The node that limits the graph is outlined.</p>",
              graph_svg(order, inputs or {}, boxes, highlight=result.bottleneck),
              "<h2>Per node</h2>",
              f"<p class='note'>Counts over the measured {d.seconds:.1f} s (after the warm-up), as in the "
              "text below; the charts over time cover the same span.</p>", _rows_html(result),
              "<h2>Items/s per node</h2>", _rate_bars(result, colors)]
    if timeline is not None and timeline.times:
        if timeline.queues:
            series, shades = {}, {}
            for n, vals in timeline.queues.items():
                label = f"{n} (of {timeline.capacity.get(n, '?')})"
                series[label] = [(t, float(v)) for t, v in zip(timeline.times, vals) if v is not None]
                shades[label] = colors.get(n, "#1f77b4")
            parts += ["<h2>Queue fill over time</h2>",
                      "<p class='note'>Items ready in each buffered node when sampled: a queue that stays "
                      "empty waits on its inputs; one that stays full waits on its consumer.</p>",
                      line_chart(series, title="items ready", y_label="items", x_max=span, colors=shades)]
        rates = timeline.rates()
        parts.append("<h2>Items/s over time</h2>")
        for unit, title in (("items", "items/s per node before batching (0.5 s windows)"),
                            ("batches", "batches/s per node from batching on (0.5 s windows)")):
            chosen = {n: pts for n, pts in rates.items() if _unit(result.nodes.get(n, {})) == unit}
            if chosen:
                parts.append(line_chart(chosen, title=title, y_label=f"{unit}/s", x_max=span, colors=colors))
    parts += ["<h2>Memory</h2>", _memory_html(result, timeline, span)]
    if tune is not None:
        parts += _tune_parts(*tune)
    parts += ["<h2>As text</h2>", f"<pre>{escape(node_table(result.nodes))}</pre>"]
    parts += [f"<p class='note'>note: {escape(n)}</p>" for n in result.notes]
    parts.append("</body></html>")
    return "\n".join(parts)


def _tune_parts(points: Sequence[Any], verdict: Any) -> list[str]:
    from conveyor.tools.tune import format_curve

    return ["<h2>Tune curve</h2>", tune_svg(points, verdict, title="samples/s by setting"),
            f"<p id='tune-verdict'>{escape(verdict.sentence)}.</p>",
            f"<pre>{escape(format_curve(points, verdict))}</pre>"]


def render_tune_page(points: Sequence[Any], verdict: Any, *, title: str) -> str:
    """``conveyor tune --report`` when the sweep named no pick: the curve and the verdict, and
    no bench (there is no setting to bench: benching the fastest would contradict the verdict)."""
    now = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    return "\n".join([
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{escape(title)}</h1>",
        f"<p class='meta'>{now} on {escape(platform.node() or 'this machine')}: {os.cpu_count()} cores, "
        f"Python {platform.python_version()}.</p>",
        "<div class='verdict' id='bottleneck'>No setting was benched: the sweep named no pick. Measure "
        "longer (--seconds) or with more rounds (--rounds), or bench a setting yourself with "
        "conveyor bench SPEC --set K=V --report FILE.</div>",
        *_tune_parts(points, verdict), "</body></html>"])


def write_report(path: str, result: BenchResult, timeline: Timeline | None = None, **kwargs: Any) -> None:
    """Write ``render_report(result, timeline, **kwargs)`` to ``path`` (UTF-8)."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(render_report(result, timeline, **kwargs))

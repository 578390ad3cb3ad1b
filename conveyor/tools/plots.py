"""Small SVG charts with no plotting dependency: the tune curve, line charts, the graph.

Each function returns one ``<svg>`` element as text, self-contained (no scripts, no fonts
fetched, no external references), so it can be written to a ``.svg`` file or inlined in the
HTML report (conveyor/tools/report.py). Text is escaped; numbers are rounded to 0.1 px.

Example:
    >>> svg = line_chart({"prefetch": [(0.0, 1.0), (1.0, 3.0)]}, title="queue", y_label="items")
    >>> svg.startswith("<svg") and "prefetch" in svg
    True
"""

from __future__ import annotations

import math
import os
from html import escape
from typing import Any, Mapping, Sequence

__all__ = ["graph_svg", "line_chart", "node_colors", "tune_svg"]

_FONT = "font-family='sans-serif'"
_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


def node_colors(names: Sequence[str]) -> dict[str, str]:
    """A colour for each name, all different: the palette, then hues spread evenly past it."""
    names = list(names)
    if len(names) <= len(_COLORS):
        return dict(zip(names, _COLORS))
    import colorsys

    out = {}
    for i, name in enumerate(names):  # golden-ratio steps keep neighbours apart
        r, g, b = colorsys.hls_to_rgb((i * 0.618034) % 1.0, 0.42 + 0.12 * (i % 3), 0.65)
        out[name] = f"#{round(255 * r):02x}{round(255 * g):02x}{round(255 * b):02x}"
    return out


def _f(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".")


def _nice_max(v: float) -> float:
    """A round number at or above ``v`` for an axis top."""
    if v <= 0:
        return 1.0
    mag = 10 ** math.floor(math.log10(v))
    for step in (1, 2, 2.5, 5, 10):
        if step * mag >= v:
            return step * mag
    return 10 * mag


def _text(x: float, y: float, s: str, *, size: int = 12, anchor: str = "start", extra: str = "") -> str:
    return (f"<text x='{_f(x)}' y='{_f(y)}' font-size='{size}' text-anchor='{anchor}' {_FONT} {extra}>"
            f"{escape(s)}</text>")


def _wrap(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width`` characters, broken at spaces."""
    import textwrap

    return textwrap.wrap(text, width) or [""]


def _y_axis(x0: float, y0: float, h: float, top: float, label: str, width: float) -> list[str]:
    out = [f"<line x1='{_f(x0)}' y1='{_f(y0)}' x2='{_f(x0)}' y2='{_f(y0 - h)}' stroke='#333'/>"]
    for i in range(5):
        v = top * i / 4
        y = y0 - h * i / 4
        out.append(f"<line x1='{_f(x0)}' y1='{_f(y)}' x2='{_f(x0 + width)}' y2='{_f(y)}' stroke='#eee'/>")
        out.append(_text(x0 - 6, y + 4, f"{v:,.0f}" if top >= 10 else f"{v:g}", size=11, anchor="end"))
    out.append(_text(14, y0 - h / 2, label, size=12, anchor="middle",
                     extra=f"transform='rotate(-90 14 {_f(y0 - h / 2)})'"))
    return out


def tune_svg(points: Sequence[Any], verdict: Any, *, title: str = "", cores: int | None = None,
             width: int = 640, height: int = 400) -> str:
    """The tune curve: each setting's median with a bar over its rounds' range.

    The pick is ringed and labelled; the best is labelled where it differs. When one param
    with numbers was swept, the x axis is that param and the machine's core count is drawn
    as a dashed reference line; otherwise the settings stand side by side in their order.

    Args:
        points: ``conveyor.tools.tune.Point`` objects, in sweep order.
        verdict: the ``conveyor.tools.tune.Verdict`` of those points.
        title: the chart's title.
        cores: the reference line (default: ``os.cpu_count()``).
    """
    cores = os.cpu_count() if cores is None else cores
    caption = _wrap(verdict.sentence, 110)
    height += 12 * (len(caption) - 1)  # room for the whole verdict below the axis
    left, right, top_m, bottom = 70, 20, 40, 60 + 12 * (len(caption) - 1)
    pw, ph = width - left - right, height - top_m - bottom
    x0, y0 = left, top_m + ph
    keys = list(points[0].params) if points else []
    numeric = len(keys) == 1 and all(isinstance(p.params[keys[0]], (int, float))
                                     and not isinstance(p.params[keys[0]], bool) for p in points)
    if numeric:
        xs = [float(p.params[keys[0]]) for p in points]
        lo, hi = min(xs), max(xs)
        if cores and lo <= cores <= 2 * hi:
            hi = max(hi, cores)
        span = (hi - lo) or 1.0
        pos = [x0 + 30 + (pw - 60) * (x - lo) / span for x in xs]
    else:
        pos = [x0 + pw * (i + 0.5) / max(1, len(points)) for i in range(len(points))]
    ymax = _nice_max(max((p.high for p in points), default=1.0) * 1.1)

    def y(v: float) -> float:
        return y0 - ph * v / ymax

    out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
           f"viewBox='0 0 {width} {height}' role='img'>",
           f"<rect width='{width}' height='{height}' fill='white'/>",
           _text(width / 2, 22, title or "throughput by setting", size=15, anchor="middle",
                 extra="font-weight='bold'")]
    out += _y_axis(x0, y0, ph, ymax, "samples/s (median of rounds)", pw)
    out.append(f"<line x1='{_f(x0)}' y1='{_f(y0)}' x2='{_f(x0 + pw)}' y2='{_f(y0)}' stroke='#333'/>")
    if numeric and cores and lo <= cores <= hi:
        cx = x0 + 30 + (pw - 60) * (cores - lo) / span
        out.append(f"<line x1='{_f(cx)}' y1='{_f(y0)}' x2='{_f(cx)}' y2='{_f(top_m)}' stroke='#888' "
                   "stroke-dasharray='6 4'/>")
        out.append(_text(cx + 4, top_m + 12, f"{cores} cores", size=11, extra="fill='#555'"))
    path = " ".join(f"{'M' if i == 0 else 'L'}{_f(px)},{_f(y(p.samples_per_s))}" for i, (px, p) in
                    enumerate(zip(pos, points)))
    if path:
        out.append(f"<path d='{path}' fill='none' stroke='{_COLORS[0]}' stroke-width='2'/>")
    for px, p in zip(pos, points):
        if len(p.rates) > 1:
            out.append(f"<line x1='{_f(px)}' y1='{_f(y(p.low))}' x2='{_f(px)}' y2='{_f(y(p.high))}' "
                       f"stroke='{_COLORS[0]}' stroke-width='1.5'/>")
            for v in (p.low, p.high):
                out.append(f"<line x1='{_f(px - 5)}' y1='{_f(y(v))}' x2='{_f(px + 5)}' y2='{_f(y(v))}' "
                           f"stroke='{_COLORS[0]}'/>")
        is_pick = p is verdict.pick
        out.append(f"<circle cx='{_f(px)}' cy='{_f(y(p.samples_per_s))}' r='{6 if is_pick else 4}' "
                   f"fill='{_COLORS[2] if is_pick else _COLORS[0]}'><title>{escape(p.label())}: "
                   f"{p.samples_per_s:,.1f} samples/s</title></circle>")
        if is_pick:
            out.append(f"<circle cx='{_f(px)}' cy='{_f(y(p.samples_per_s))}' r='11' fill='none' "
                       f"stroke='{_COLORS[2]}' stroke-width='2'/>")
        mark = "pick" if is_pick else "best" if p is verdict.best else "tied" if p in verdict.tied else ""
        if mark:
            out.append(_text(px, y(p.high) - 10, mark, size=11, anchor="middle", extra="font-weight='bold'"))
        lab = _f(float(p.params[keys[0]])) if numeric else p.label()
        out.append(_text(px, y0 + 16, lab, size=11, anchor="middle"))
    out.append(_text(x0 + pw / 2, y0 + 38, keys[0] if numeric else "setting", size=12, anchor="middle"))
    for i, line in enumerate(caption):  # the whole sentence, on as many lines as it needs
        out.append(_text(x0 + pw / 2, height - 6 - 12 * (len(caption) - 1 - i), line, size=10,
                         anchor="middle", extra="fill='#555'"))
    out.append("</svg>")
    return "\n".join(out)


def line_chart(series: Mapping[str, Sequence[tuple[float, float]]], *, title: str, y_label: str,
               x_label: str = "seconds", y_max: float | None = None, x_max: float | None = None,
               colors: Mapping[str, str] | None = None, width: int = 640, height: int = 260) -> str:
    """Lines of ``(x, y)`` points, one per named series, with a legend.

    Args:
        series: name -> points (in x order).
        title: the chart's title.
        y_label: the y axis's label.
        x_label: the x axis's label.
        y_max: the axis top (default: from the data).
        x_max: the x axis's end (default: the last point); points past it are left out.
        colors: name -> colour (default: the palette, in the series' order).
    """
    left, right, top_m, bottom = 70, 150, 34, 40
    pw, ph = width - left - right, height - top_m - bottom
    x0, y0 = left, top_m + ph
    if x_max:
        series = {name: [(x, v) for x, v in pts if x <= x_max] for name, pts in series.items()}
    xs = [x for pts in series.values() for x, _ in pts]
    ys = [v for pts in series.values() for _, v in pts]
    xmax = x_max or max(xs, default=1.0) or 1.0
    palette = node_colors(list(series)) if colors is None else colors
    top = y_max if y_max else _nice_max(max(ys, default=1.0) * 1.05)
    out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
           f"viewBox='0 0 {width} {height}' role='img'>",
           f"<rect width='{width}' height='{height}' fill='white'/>",
           _text(left, 20, title, size=14, extra="font-weight='bold'")]
    out += _y_axis(x0, y0, ph, top, y_label, pw)
    out.append(f"<line x1='{_f(x0)}' y1='{_f(y0)}' x2='{_f(x0 + pw)}' y2='{_f(y0)}' stroke='#333'/>")
    for i in range(5):
        v = xmax * i / 4
        out.append(_text(x0 + pw * i / 4, y0 + 15, f"{v:.1f}", size=11, anchor="middle"))
    out.append(_text(x0 + pw / 2, height - 6, x_label, size=12, anchor="middle"))
    for k, (name, pts) in enumerate(series.items()):
        color = palette.get(name) or _COLORS[k % len(_COLORS)]
        if pts:
            d = " ".join(f"{'M' if i == 0 else 'L'}{_f(x0 + pw * x / xmax)},{_f(y0 - ph * min(v, top) / top)}"
                         for i, (x, v) in enumerate(pts))
            out.append(f"<path d='{d}' fill='none' stroke='{color}' stroke-width='1.6'/>")
        ly = top_m + 14 + 16 * k
        out.append(f"<rect x='{_f(x0 + pw + 12)}' y='{_f(ly - 9)}' width='10' height='10' fill='{color}'/>")
        out.append(_text(x0 + pw + 27, ly, name, size=11))
    out.append("</svg>")
    return "\n".join(out)


def graph_svg(order: Sequence[str], inputs: Mapping[str, Sequence[str]], boxes: Mapping[str, Mapping[str, Any]],
              *, highlight: str | None = None, width: int = 900) -> str:
    """The graph as boxes in layers (a node below its inputs), with arrows.

    Args:
        order: node names in topological order.
        inputs: each node's inputs (names not in ``order`` are ignored).
        boxes: per node ``{"title": str, "lines": [str], "busy": float|None, "wait": float|None}``;
            busy and wait (fractions) are drawn as two bars in the box.
        highlight: the node to outline in red (the bottleneck).
    """
    layer: dict[str, int] = {}
    for n in order:
        ins = [i for i in inputs.get(n, ()) if i in layer]
        layer[n] = 1 + max((layer[i] for i in ins), default=-1)
    rows: dict[int, list[str]] = {}
    for n in order:
        rows.setdefault(layer[n], []).append(n)
    bw, bh, gap_y = 230, 78, 34
    height = 20 + len(rows) * (bh + gap_y)
    width = max(width, 20 + max((len(r) for r in rows.values()), default=1) * (bw + 20))
    pos: dict[str, tuple[float, float]] = {}
    for li, names in rows.items():
        total = len(names) * bw + (len(names) - 1) * 20
        for j, n in enumerate(names):
            pos[n] = ((width - total) / 2 + j * (bw + 20), 10 + li * (bh + gap_y))
    out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
           f"viewBox='0 0 {width} {height}' role='img'>",
           "<defs><marker id='arrow' viewBox='0 0 10 10' refX='10' refY='5' markerWidth='7' "
           "markerHeight='7' orient='auto-start-reverse'><path d='M0,0 L10,5 L0,10 z' fill='#555'/></marker></defs>"]
    for n in order:
        for i in inputs.get(n, ()):
            if i in pos:
                (ax, ay), (bx, by) = pos[i], pos[n]
                out.append(f"<line x1='{_f(ax + bw / 2)}' y1='{_f(ay + bh)}' x2='{_f(bx + bw / 2)}' "
                           f"y2='{_f(by - 2)}' stroke='#555' marker-end='url(#arrow)'/>")
    for n in order:
        x, y = pos[n]
        box = boxes.get(n, {})
        hot = n == highlight
        out.append(f"<rect x='{_f(x)}' y='{_f(y)}' width='{bw}' height='{bh}' rx='6' "
                   f"fill='{'#fff1f0' if hot else '#f7f9fc'}' stroke='{'#d62728' if hot else '#99a'}' "
                   f"stroke-width='{3 if hot else 1}'/>")
        out.append(_text(x + 8, y + 17, box.get("title", n), size=13, extra="font-weight='bold'"))
        for k, line in enumerate(box.get("lines", [])[:2]):
            out.append(_text(x + 8, y + 33 + 14 * k, line, size=11, extra="fill='#444'"))
        for k, (what, color) in enumerate((("busy", "#d62728"), ("wait", "#1f77b4"))):
            v = box.get(what)
            by = y + 56 + 10 * k
            out.append(_text(x + 8, by + 7, what, size=9, extra="fill='#555'"))
            out.append(f"<rect x='{_f(x + 38)}' y='{_f(by)}' width='150' height='7' fill='#e6e6e6'/>")
            if v is not None:
                out.append(f"<rect x='{_f(x + 38)}' y='{_f(by)}' width='{_f(150 * max(0.0, min(1.0, v)))}' "
                           f"height='7' fill='{color}'/>")
            out.append(_text(x + 194, by + 7, "-" if v is None else f"{round(100 * v)} %", size=9))
    out.append("</svg>")
    return "\n".join(out)

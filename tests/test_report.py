"""The pictures: the tune curve as SVG, ``conveyor bench --report`` as one HTML page, and that
page rendered in a real browser (headless Chromium, Debian's package; .ci/run installs it)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from PIL import Image, ImageStat

from conveyor.tools import tune
from conveyor.tools.plots import graph_svg, line_chart, tune_svg
from conveyor.tools.report import Timeline

REPO = Path(__file__).resolve().parent.parent
SVG = "{http://www.w3.org/2000/svg}"
NODES = ["files", "shard", "shuffle", "parse", "batch", "collate", "out"]  # specs/numbers.yaml


def _texts(svg: str) -> list[str]:
    return [t.text for t in ET.fromstring(svg).iter(f"{SVG}text")]


def _points(rates: dict[int, list[float]]) -> list[tune.Point]:
    return [tune.Point({"workers": w}, (i,), r, [x / 8 for x in r], 3.0) for i, (w, r) in enumerate(rates.items())]


def test_tune_svg_draws_medians_spreads_the_pick_and_the_cores():
    points = _points({1: [240.0, 250.0, 260.0], 2: [490.0, 500.0, 515.0], 4: [495.0, 505.0, 520.0]})
    verdict = tune.decide(points)
    svg = tune_svg(points, verdict, title="a <curve>", cores=2)
    root = ET.fromstring(svg)  # well-formed XML, title escaped
    texts = _texts(svg)
    assert "a <curve>" in texts and "2 cores" in texts and "workers" in texts
    assert texts.count("pick") == 1 and texts.count("best") == 1
    assert [t for t in texts if t in ("1", "2", "4")] == ["1", "2", "4"]
    circles = list(root.iter(f"{SVG}circle"))
    assert len(circles) == 4  # a dot per setting and a ring around the pick
    assert [c.find(f"{SVG}title").text for c in circles if c.find(f"{SVG}title") is not None] == [
        "workers=1: 250.0 samples/s", "workers=2: 500.0 samples/s", "workers=4: 505.0 samples/s"]
    assert sum(1 for ln in root.iter(f"{SVG}line") if ln.get("stroke-dasharray")) == 1  # the cores line
    assert verdict.sentence[:60] in " ".join(texts)
    # settings of two params stand side by side, labelled, with no cores line
    two = [tune.Point({"w": w, "d": d}, (i, j), [100.0 * (i + 1)]) for i, w in enumerate((1, 2))
           for j, d in enumerate((2, 4))]
    svg2 = tune_svg(two, tune.decide(two), cores=2)
    assert "w=1, d=2" in _texts(svg2) and "2 cores" not in _texts(svg2)


def test_line_chart_and_graph_are_well_formed():
    chart = line_chart({"a & b": [(0.0, 1.0), (1.0, 2.0)], "c": []}, title="t", y_label="items")
    assert "a & b" in _texts(chart)
    g = graph_svg(["x", "y", "z"], {"y": ["x"], "z": ["x", "y"]},
                  {"x": {"title": "x (list_files)", "lines": ["10 items/s"], "busy": 0.5, "wait": None}},
                  highlight="y")
    root = ET.fromstring(g)
    assert len(list(root.iter(f"{SVG}rect"))) >= 3 and sum(
        1 for ln in root.iter(f"{SVG}line") if ln.get("marker-end")) == 3
    assert "x (list_files)" in _texts(g) and "50 %" in _texts(g)


class _FakeCounted:
    def __init__(self, capacity: int = 0):
        self._n, self.items_before, self.queue_capacity = 0, 0, capacity
        self._qsize = (lambda: 3) if capacity else None

    @property
    def items(self) -> int:
        return self._n

    @items.setter
    def items(self, value: int) -> None:  # as instrument.Counted: a new epoch
        self.items_before += self._n
        self._n = value


def test_timeline_counts_items_across_epochs_and_samples_queues():
    a, q = _FakeCounted(), _FakeCounted(capacity=4)
    tl = Timeline()
    for t, n in ((0.0, 0), (0.5, 50), (1.0, 100)):
        a._n = q._n = n
        tl.sample({"a": a, "q": q}, t)
    a.items = q.items = 0  # the loader starts an epoch
    a._n = 20
    tl.sample({"a": a, "q": q}, 1.5)
    assert tl.items["a"] == [0, 50, 100, 120]
    assert tl.queues == {"q": [3, 3, 3, 3]} and tl.capacity == {"q": 4}
    rates = dict(tl.rates(window=0.5))
    assert rates["a"] == [(0.5, 100.0), (1.0, 100.0), (1.5, 40.0)]
    assert len(tl.rss) == 4


def test_timeline_window_keeps_the_measured_span_from_zero():
    a = _FakeCounted()
    tl = Timeline(interval=0.5)
    for t in (0.0, 0.5, 1.0, 1.5, 2.0, 2.5):
        a._n = int(100 * t)
        tl.sample({"a": a}, t)
    w = tl.window(1.0, 1.0)  # a warm-up of 1 s, then 1 s measured
    assert w.times == [0.0, 0.5, 1.0] and w.items["a"] == [100, 150, 200] and len(w.rss) == 3


def test_every_node_has_its_own_colour_and_charts_end_at_the_span():
    from conveyor.tools.plots import node_colors

    for n in (3, 8, 9, 17):
        colours = node_colors([f"n{i}" for i in range(n)])
        assert len(set(colours.values())) == n
    chart = line_chart({"a": [(0.0, 1.0), (1.0, 2.0), (2.5, 9.0)]}, title="t", y_label="items", x_max=2.0)
    ticks = [t for t in _texts(chart) if re.fullmatch(r"\d+\.\d", t)]
    assert ticks[-1] == "2.0"  # the axis ends at the span, and the point past it is not drawn
    paths = [el.get("d") for el in ET.fromstring(chart).iter(f"{SVG}path")]
    assert len(paths) == 1 and paths[0].count("L") == 1  # two points drawn, the third left out


def test_tune_svg_shows_the_whole_verdict():
    long = [tune.Point({"workers": w}, (i,), [100.0 + (i % 2) * 60, 140.0, 90.0]) for i, w in enumerate((1, 2, 3, 4))]
    verdict = tune.decide(long)
    svg = tune_svg(long, verdict, cores=2)
    ET.fromstring(svg)
    caption = " ".join(t for t in _texts(svg) if t and t[0].isalpha() and t not in ("pick", "best", "tied",
                                                                                       "workers", "2 cores"))
    assert verdict.sentence in caption, (verdict.sentence, caption)


@pytest.fixture(scope="module")
def report(tmp_path_factory, forker):
    """``conveyor bench specs/numbers.yaml --report`` run once: (html path, stdout, stderr)."""
    path = tmp_path_factory.mktemp("report") / "report.html"
    proc = forker.run([sys.executable, "-m", "conveyor", "bench", "specs/numbers.yaml", "--seconds", "1.5",
                       "--warmup", "0.2", "--report", str(path)], timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    return path, proc.stdout, proc.stderr


@pytest.mark.timeout(120)
def test_bench_report_is_one_self_contained_page(report):
    path, out, err = report
    html = path.read_text(encoding="utf-8")
    sentence = next(ln for ln in out.splitlines() if "limits the graph" in ln or ln.startswith("no node"))
    assert f"<div class='verdict' id='bottleneck'>{sentence.replace('(', '(')}</div>" in html.replace(
        "&#x27;", "'")
    for name in NODES:
        assert f"{name} (" in html
    for section in ("The graph", "Per node", "Items/s per node", "Queue fill over time", "Items/s over time",
                    "Memory", "peak RSS"):
        assert section in html
    assert html.count("<svg") >= 5  # graph, queues, rates of items and of batches, RSS
    # items/s and batches/s each on their own axis (issue 29, item 7)
    assert "items/s per node before batching" in html and "batches/s per node from batching on" in html
    assert "Counts over the measured 1.5 s" in html
    # nothing is fetched: no scripts, stylesheets, images, fonts or imports from anywhere
    assert not re.search(r"<script|<link|<img|<iframe|\bsrc=|@import|url\(\s*['\"]?http", html)
    assert "http" not in html.replace("http://www.w3.org/2000/svg", "")
    # progress while measuring, then where the report went
    assert err.splitlines()[0].startswith("bench specs/numbers.yaml: warming up 0.2 s, then measuring 1.5 s")
    # (a line each second of the window, at the first batch after it: after a stall on a busy
    # machine that batch may come past 1.5 s, and the line reads 2/1.5 s)
    assert any(re.fullmatch(r"measuring: [12]/1\.5 s, [\d,.]+ samples/s so far", ln) for ln in err.splitlines())
    assert f"report: written to {path}" in err


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.timeout(120)
def test_report_renders_in_a_real_browser(report, tmp_path):
    browser = _chromium()
    if browser is None:
        pytest.skip("no Chromium on this machine: .ci/run installs Debian's 'chromium' package; "
                    "here `apt-get install chromium` could not be done")
    path, out, _ = report
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run(flags + ["--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=90)
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = dom.stdout
    for name in NODES:
        assert f">{name} (" in page  # drawn in the graph and named in the table
    sentence = next(ln for ln in out.splitlines() if "limits the graph" in ln or ln.startswith("no node"))
    text = re.sub(r"<[^>]+>", "", page).replace("&amp;", "&").replace("&#x27;", "'")
    assert sentence in text
    shot = tmp_path / "report.png"
    png = subprocess.run(flags + ["--window-size=1100,1600", f"--screenshot={shot}", path.as_uri()],
                         capture_output=True, text=True, timeout=90)
    assert png.returncode == 0 and shot.exists(), png.stderr[-2000:]
    with Image.open(shot) as img:
        stat = ImageStat.Stat(img.convert("L"))
        assert img.size == (1100, 1600)
        assert stat.stddev[0] > 10, "the screenshot is blank"
        colours = img.convert("RGB").getcolors(maxcolors=1 << 16)
        assert colours is None or len(colours) > 20  # text, bars, lines: not one flat fill

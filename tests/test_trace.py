"""``--trace FILE``: a Chrome trace of per-node spans, valid JSON, bounded."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from conveyor import load_graph
from conveyor.tools import cli
from conveyor.graphs import instrument
from conveyor.tools.trace import TraceRecorder

REPO = Path(__file__).resolve().parent.parent
NODES = ["files", "shard", "shuffle", "parse", "batch", "collate", "out"]


def _spans(path: Path) -> list[dict]:
    events = json.loads(path.read_text())
    assert isinstance(events, list)
    for e in events:
        assert e["ph"] in ("X", "M")
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int) and isinstance(e["args"], dict)
        if e["ph"] == "X":
            assert set(e) == {"name", "ph", "ts", "dur", "pid", "tid", "args"}
            assert e["ts"] >= 0 and e["dur"] >= 0
    return [e for e in events if e["ph"] == "X"]


@pytest.mark.timeout(60)
def test_run_trace_has_a_span_per_node_call(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    path = tmp_path / "trace.json"
    assert cli.main(["run", "specs/numbers.yaml", "--epochs", "2", "-q", "--trace", str(path)]) == 0
    err = capsys.readouterr().err
    assert f"spans written to {path}" in err
    spans = _spans(path)
    counts = Counter(s["name"] for s in spans)
    assert set(counts) == set(NODES) | {"parse.fn"}  # the map's fn on its worker threads too
    assert counts["files"] == counts["parse"] == counts["parse.fn"] == 80  # 40 files x 2 epochs
    assert counts["batch"] == counts["collate"] == counts["out"] == 10
    assert {s["args"]["op"] for s in spans if s["name"] == "shuffle"} == {"shuffle_buffer"}
    # collate calls batch: batch spans nest in collate spans
    by_tid: dict[int, list[dict]] = {}
    for s in spans:
        by_tid.setdefault(s["tid"], []).append(s)
    collate_tids = {s["tid"] for s in spans if s["name"] == "collate"}
    out_tids = {s["tid"] for s in spans if s["name"] == "out"}
    # the run comes straight back for each batch: prefetch makes them in the caller's thread
    assert collate_tids == out_tids and len(out_tids) == 1
    nested = 0
    for tid in collate_tids:
        for c in (s for s in by_tid[tid] if s["name"] == "collate"):
            nested += any(b["name"] == "batch" and c["ts"] <= b["ts"] and b["ts"] + b["dur"] <= c["ts"] + c["dur"] + 1
                          for b in by_tid[tid])
    assert nested == 10
    names = [e["args"]["name"] for e in json.loads(path.read_text()) if e["ph"] == "M"]
    assert any("parse.fn" in n for n in names)
    assert instrument._exact[0] == 0  # every watcher left: calls are sampled again


def test_trace_is_bounded(tmp_path):
    rec = TraceRecorder(max_spans=60, per_node=10)
    with load_graph(REPO / "specs/numbers.yaml") as loader:
        rec.attach(loader)
        for _ in range(2):
            for _ in loader:
                pass
        rec.detach()
    assert instrument._exact[0] == 0
    n = rec.write(tmp_path / "t.json")
    spans = _spans(tmp_path / "t.json")
    counts = Counter(s["name"] for s in spans)
    assert n == len(spans) <= 60
    share = 60 // 8  # 7 nodes and the map's fn share the 60 spans
    assert max(counts.values()) <= share + 1  # two fn threads may race past the limit
    assert counts["out"] == counts["files"] == share


@pytest.mark.timeout(60)
def test_bench_trace(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    path = tmp_path / "bench.json"
    assert cli.main(["bench", "specs/numbers.yaml", "--seconds", "0.5", "--trace", str(path)]) == 0
    spans = _spans(path)
    assert {s["name"] for s in spans} == set(NODES) | {"parse.fn"}
    assert len(spans) <= TraceRecorder().max_spans
    assert instrument._exact[0] == 0

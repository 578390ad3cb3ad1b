"""Per-node stats, always on: ``Counted``, ``Loader.stats()["nodes"][name]["perf"]``."""

from __future__ import annotations

import re

import json
import time
from pathlib import Path

import pytest
from torchdata.nodes import BaseNode, IterableWrapper

import conveyor.graphs.compile as compile_mod
from conveyor import load_graph
from conveyor.tools import cli
from conveyor.graphs import instrument
from conveyor.graphs.instrument import BareCounted, Counted
from conveyor.nodes.shard import Shard
from planted_fns import SAMPLE

REPO = Path(__file__).resolve().parent.parent
NUMBERS = REPO / "specs/numbers.yaml"
PERF_KEYS = {"seconds", "reset_s", "busy_s", "wait_s", "threads", "busy", "wait", "items_per_s", "runs", "queue",
             "thread"}


def _chain(write_spec, *lines: str, output: str) -> Path:
    body = "\n".join(f"  {ln}" for ln in lines)
    return write_spec(f'nodes:\n  files: {{op: list_files, url: "{SAMPLE.as_posix()}/*/*.JPEG"}}\n'
                      f"{body}\noutput: {output}\n")


def test_counted_is_importable_from_compile_and_forwards_count():
    assert compile_mod.Counted is Counted
    c = Counted(Shard(IterableWrapper(range(10)), rank=0, world=1))
    assert c.count() == getattr(c.inner, "count")()
    assert Counted(IterableWrapper(range(3))).count() is None


def test_items_setter_zeroes_every_counter():
    c = Counted(IterableWrapper(range(5)))
    c.reset()
    assert list(c) == [0, 1, 2, 3, 4]
    assert c.items == 5 and c.seconds > 0 and c.tid is not None
    c.items = 0
    assert c.raw() == {"items": 0, "seconds": 0.0, "reset_seconds": 0.0, "work_seconds": 0.0,
                       "q_n": 0, "q_sum": 0, "q_max": 0}


def test_watchers_see_every_item_and_can_leave():
    seen = []

    def watcher(c, item, t0, t1):
        assert t1 >= t0
        seen.append(item)

    c = Counted(IterableWrapper(range(4)))
    c.watch(watcher)
    c.reset()
    assert [next(c), next(c)] == [0, 1]
    c.unwatch(watcher)
    assert list(c) == [2, 3] and seen == [0, 1]


def test_state_is_the_same_with_and_without_instrumentation(monkeypatch):
    def states() -> list[str]:
        out = []
        with load_graph(NUMBERS, batch_size=4) as loader:
            for _ in range(2):
                for _ in loader:
                    out.append(json.dumps(loader.state_dict(), sort_keys=True))
        return out

    timed = states()
    monkeypatch.setattr(compile_mod, "Counted", BareCounted)
    assert states() == timed


@pytest.mark.parametrize("adapt", [False, True])
def test_stats_have_perf_for_every_node_as_plain_data(tmp_path, adapt):
    spec = tmp_path / "numbers.yaml"
    spec.write_text(NUMBERS.read_text().replace("${spec_dir}/../examples", str(REPO / "examples"))
                    .replace("{op: prefetch, depth: 2}", f"{{op: prefetch, depth: 2, adapt: {str(adapt).lower()}}}"))
    with load_graph(spec) as loader:
        for _ in loader:
            pass
        stats = loader.stats()
    json.dumps(stats)
    nodes = stats["nodes"]
    assert list(nodes) == ["files", "shard", "shuffle", "parse", "batch", "collate", "out"]
    for name, entry in nodes.items():
        p = entry["perf"]
        assert set(p) == PERF_KEYS, name
        assert p["items_per_s"] > 0
        for k in ("busy", "wait"):
            assert p[k] is None or 0.0 <= p[k] <= 1.05, (name, k, p[k])
    assert nodes["parse"]["perf"]["runs"] == "2 thread workers" and nodes["parse"]["perf"]["threads"] == 2
    assert nodes["parse"]["perf"]["queue"]["capacity"] == 16  # 8 in flight per ordered thread
    if adapt:  # this loop comes straight back for each batch: they are made in the caller's thread
        assert loader.nodes["out"].inline
        assert nodes["out"]["perf"]["thread"] == nodes["collate"]["perf"]["thread"] == "out"
        assert nodes["out"]["perf"]["busy"] is not None  # its own time: its input runs in its thread
    else:
        assert nodes["out"]["perf"]["busy"] is None  # a prefetch with its thread only moves items
        assert nodes["out"]["perf"]["queue"]["capacity"] == 2 and nodes["out"]["perf"]["queue"]["samples"] >= 1
        # its thread waits for collate (how much depends on how busy the machine is: only measured)
        assert 0.0 < nodes["out"]["perf"]["wait"] <= 1.05
    assert 0 < stats["data_wait_s"] <= stats["seconds"] + 0.5
    assert nodes["batch"]["items"] == 5


@pytest.mark.timeout(60)
def test_self_time_is_own_time_minus_same_thread_inputs(write_spec):
    # everything runs in the caller's thread: files -> slow (2 ms an item) -> batch
    path = _chain(write_spec, 'slow: {op: map, fn: "planted_fns:slow", args: {ms: 2}}',
                  "batch: {op: batch, size: 10}", output="batch")
    with load_graph(path) as loader:
        t0 = time.perf_counter()
        assert len(list(loader)) == 20
        wall = time.perf_counter() - t0
        nodes = {n: e["perf"] for n, e in loader.stats()["nodes"].items()}
    assert 0.4 <= nodes["slow"]["busy_s"] <= wall
    assert nodes["slow"]["wait_s"] == nodes["files"]["seconds"]
    assert nodes["batch"]["wait_s"] == nodes["slow"]["seconds"]
    assert nodes["batch"]["busy_s"] < 0.05 and nodes["files"]["busy_s"] < 0.25 * nodes["slow"]["busy_s"]
    assert nodes["slow"]["busy"] > 0.8


@pytest.mark.timeout(60)
def test_threaded_map_busy_is_the_time_in_fn_over_its_workers(write_spec):
    path = _chain(write_spec, 'slow: {op: map, fn: "planted_fns:slow", args: {ms: 3}, workers: 2}',
                  "batch: {op: batch, size: 10}", output="batch")
    with load_graph(path) as loader:
        t0 = time.perf_counter()
        assert len(list(loader)) == 20
        wall = time.perf_counter() - t0
        slow = loader.stats()["nodes"]["slow"]
    p = slow["perf"]
    assert p["threads"] == 2
    # 200 x 3 ms, summed over the 2 workers: at least that, and at most both threads all along
    # (how much more depends on how busy the machine is: a 3 ms sleep took 7 ms beside the
    # suite's other workers, and the threads waited for a starved consumer: only bounded here)
    assert 0.6 <= p["busy_s"] <= 2 * wall
    covered = slow["items"] / p["items_per_s"]  # the seconds the counters cover
    assert p["busy"] == pytest.approx(p["busy_s"] / (2 * covered), rel=1e-3, abs=1e-4)  # per worker thread
    assert 0.0 < p["busy"] <= 1.05 and 0.0 <= p["wait"] <= 1.05 and p["queue"]["samples"] > 0


def test_counters_start_again_each_epoch():
    with load_graph(NUMBERS) as loader:
        for _ in loader:
            pass
        first = loader.stats()["nodes"]["files"]
        for _ in loader:
            pass
        second = loader.stats()
    assert first["items"] == second["nodes"]["files"]["items"] == 40
    assert second["data_wait_s"] <= second["seconds"] + 0.5


def test_nodes_in_worker_copies_have_counts_but_no_perf(write_spec):
    path = write_spec(f"""workers: {{copies: 2, method: thread}}
nodes:
  files:   {{op: list_files, url: "{REPO.as_posix()}/examples/data/numbers/*/*.txt"}}
  shard:   {{op: shard}}
  parse:   {{op: map, fn: "conveyor.files:read_numbers"}}
  batch:   {{op: batch, size: 4}}
  collate: {{op: collate}}
""")
    with load_graph(path) as loader:
        for _ in loader:
            pass
        nodes = loader.stats()["nodes"]
    assert nodes["files"]["items"] == 80 and nodes["files"]["perf"] is None  # each copy lists all 40
    assert nodes["parse"]["copies"] == 2
    assert nodes["parse"]["perf"]["runs"] == "2 thread copies" and nodes["parse"]["perf"]["busy"] is None
    assert nodes["batch"]["perf"]["busy"] is not None


def test_run_prints_where_the_time_went(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert cli.main(["run", "specs/numbers.yaml", "-q"]) == 0
    res = capsys.readouterr()
    out = res.out.splitlines()
    assert out[0].split() == ["node", "op", "runs", "items", "items/s", "busy", "wait", "queue", "counts"]
    assert [ln.split()[0] for ln in out[1:8]] == ["files", "shard", "shuffle", "parse", "batch", "collate", "out"]
    assert out[1].split()[:3] == ["files", "list_files", "40"]
    assert out[8].startswith("done: ") and len(out) == 9
    err = res.err.splitlines()[-1]
    waited = re.match(r"where the time went \([0-9.]+ s, all epochs\): the loop waited for data (\d+) % of "
                      r"the time; .*limits the graph", err)
    assert waited and 0 <= int(waited[1]) <= 100, err


def test_the_instrumentation_costs_well_under_a_microsecond_per_item_and_node():
    def ns_per(cls) -> float:
        best = float("inf")
        for _ in range(3):
            node = IterableWrapper(range(50_000))
            for _ in range(4):
                node = cls(node)
            node.reset()
            t0 = time.perf_counter()
            for _ in node:
                pass
            best = min(best, (time.perf_counter() - t0) / 200_000 * 1e9)
        return best

    assert ns_per(Counted) - ns_per(BareCounted) < 1000  # measured ~100-150 ns (stats_overhead.py)
    assert instrument._QUEUE_EVERY >= 1


class _Ticks(BaseNode):
    """Passes items through, advancing a fake clock by ``cost`` per item (before its source)."""

    def __init__(self, source, clock: list, cost: float):
        super().__init__()
        self.source, self.clock, self.cost = source, clock, cost

    def reset(self, initial_state=None):
        super().reset(initial_state)
        self.source.reset(initial_state)

    def next(self):
        self.clock[0] += self.cost
        return next(self.source)

    def get_state(self):
        return self.source.state_dict()


def _ticking_chain(monkeypatch, n: int):
    clock = [0.0]
    monkeypatch.setattr(instrument, "_clock", lambda: clock[0])
    monkeypatch.setattr(instrument, "_random", __import__("random").Random(0).random)
    monkeypatch.setattr(instrument, "_TIMING_COST", 300e-9)  # the arithmetic below, whatever the calibration
    inner = Counted(_Ticks(IterableWrapper(range(n)), clock, 2e-6))
    outer = Counted(_Ticks(inner, clock, 1e-6))
    outer.reset()
    return outer, inner


def test_light_calls_are_timed_in_sampled_groups_with_unbiased_weights(monkeypatch):
    outer, inner = _ticking_chain(monkeypatch, 20_000)
    assert sum(1 for _ in outer) == 20_000 and inner.items == 20_000
    # a 3 us call making 1 nested call: timing both costs ~40x the 0.5 % target: 1 call in 40
    assert outer._every == 40 and inner in outer._group
    assert outer.seconds == pytest.approx(20_000 * 3e-6, rel=0.15)
    assert inner.seconds == pytest.approx(20_000 * 2e-6, rel=0.15)
    # both timed over the same calls: the outer node's own time is exactly a third
    assert (outer.seconds - inner.seconds) / outer.seconds == pytest.approx(1 / 3, rel=1e-6)


def test_nodes_that_move_to_another_thread_mid_epoch_are_timed_there(monkeypatch):
    # prefetch moves what is above it between its thread and the caller's mid-epoch (adapt):
    # the nodes follow into the thread they run in now, and are timed there as before
    import threading

    outer, inner = _ticking_chain(monkeypatch, 20_000)
    it = iter(outer)
    assert sum(1 for _ in zip(range(10_000), it)) == 10_000
    here = threading.get_ident()
    assert outer.tid == inner.tid == here and inner in outer._group
    seen: dict = {}

    def elsewhere():
        seen["n"] = sum(1 for _ in it)
        seen["tids"] = (threading.get_ident(), outer.tid, inner.tid, inner in outer._group)

    t = threading.Thread(target=elsewhere)
    t.start()
    t.join()
    tid, outer_tid, inner_tid, grouped = seen["tids"]
    assert seen["n"] == 10_000 and outer_tid == inner_tid == tid != here and grouped
    assert outer.seconds == pytest.approx(20_000 * 3e-6, rel=0.15)
    assert inner.seconds == pytest.approx(20_000 * 2e-6, rel=0.15)
    # still timed over the same calls after the move: the outer node's own time is a third
    assert (outer.seconds - inner.seconds) / outer.seconds == pytest.approx(1 / 3, rel=1e-3)


def test_with_a_watcher_every_call_is_timed(monkeypatch):
    outer, inner = _ticking_chain(monkeypatch, 5_000)
    seen = []

    def watcher(c, item, t0, t1):
        seen.append(t1 - t0)

    inner.watch(watcher)
    try:
        assert sum(1 for _ in outer) == 5_000
        assert instrument._exact[0] == 1
    finally:
        inner.unwatch(watcher)
    assert instrument._exact[0] == 0
    assert len(seen) == 5_000
    assert outer.seconds == pytest.approx(5_001 * 3e-6) and inner.seconds == pytest.approx(5_001 * 2e-6)  # + the end

"""``conveyor bench``: planted bottlenecks are named, the trainer is simulated, memory is estimated.

Each planted spec (tests/planted_fns.py) runs the bundled sample's 200 file records through
the same chain with one node made slow on purpose: a sleeping or CPU-burning filter in the
source, a sleeping map with 2 thread workers, a slow "collate" (a map over batches, in the
prefetch thread), and a slow stand-in for a to-device copy after the prefetch (in the
caller's thread). ``bench`` must name that node every time.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conveyor.tools import cli
from conveyor.tools.bench import run_bench
from conveyor.tools.measure import nbytes
from conveyor.tools.tables import fmt_bytes
from conveyor.graphs.api import check_spec
from planted_fns import planted_spec

REPO = Path(__file__).resolve().parent.parent
SECONDS = 1.5
SLOW_SOURCE = '  slow_source: {op: filter, fn: "planted_fns:slow_keep", args: {ms: 4}}'
BURN_SOURCE = '  burn_source: {op: filter, fn: "planted_fns:burn_keep", args: {ms: 3}}'
SLOW_GPU = '  gpu:     {op: map, fn: "planted_fns:slow", args: {ms: 30}}'

PLANTED = {
    "slow_source": dict(source=SLOW_SOURCE),
    "burn_source": dict(source=BURN_SOURCE),
    "decode": dict(decode="planted_fns:slow", decode_args="{ms: 8}"),
    "collate": dict(collate="planted_fns:slow", collate_args="{ms: 30}"),
    "gpu": dict(after=SLOW_GPU),
}
LABELS = {"slow_source": "slow_source (filter)", "burn_source": "burn_source (filter)",
          "decode": "decode (map, 2 thread workers)", "collate": "collate (map)", "gpu": "gpu (map)"}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("slow", list(PLANTED))
def test_bench_names_the_planted_bottleneck(slow, write_spec):
    plan = check_spec(write_spec(planted_spec(**PLANTED[slow])))
    result = run_bench(plan, seconds=SECONDS, warmup=0.4)
    assert result.bottleneck == slow, result.sentence
    assert result.sentence.startswith(f"{LABELS[slow]} limits the graph: ")
    busy = {n: (r["perf"] or {}).get("busy") or 0.0 for n, r in result.nodes.items()}
    assert busy[slow] >= 0.5
    assert all(b < busy[slow] / 2 for n, b in busy.items() if n != slow), busy
    assert result.drive.samples > 0 and result.drive.seconds >= SECONDS


@pytest.mark.timeout(60)
@pytest.mark.parametrize("adapt", [False, True])
def test_a_thread_shared_by_slow_nodes_is_named(write_spec, adapt):
    # two maps over batches, 12 ms each, both above the prefetch: neither passes half the
    # time, together they fill the thread they run in. With adapt: false that is prefetch's
    # thread (a trainer away between batches keeps it too); with adapt the bench's consumer
    # comes straight back, the batches are made in its thread, and the bench names that one
    text = planted_spec(collate="planted_fns:slow", collate_args="{ms: 12}",
                        before_out='  pin:     {op: map, fn: "planted_fns:slow", args: {ms: 12}}')
    if not adapt:
        text = text.replace("{op: prefetch, depth: 2}", "{op: prefetch, depth: 2, adapt: false}")
    result = run_bench(check_spec(write_spec(text)), seconds=SECONDS, warmup=0.4)
    last = "out" if adapt else "pin"  # the thread's last node names it
    assert result.bottleneck == f"thread:{last}", result.sentence
    # decode's threads map; its input is read in the thread that asks it, so the thread's span
    # starts at whichever of decode's upstream nodes it was seen running (files are listed
    # rarely: within the timed window that may be shard or shuffle)
    assert re.match(rf"one thread runs (files|shard|shuffle) to {last} and limits the graph: ", result.sentence), \
        result.sentence
    assert "collate" in result.sentence
    assert result.nodes["pin"]["perf"]["thread"] == result.nodes["collate"]["perf"]["thread"] == last
    assert result.nodes["decode"]["perf"]["thread"] == last  # its consumer's thread waits on it


@pytest.mark.timeout(60)
def test_a_slow_trainer_is_named_and_waits_little(write_spec):
    plan = check_spec(write_spec(planted_spec(batch_size=32)))
    result = run_bench(plan, seconds=SECONDS, warmup=0.4, step_time=0.1)
    assert result.bottleneck == "trainer", result.sentence
    assert result.sentence.startswith("the trainer (100 ms a step) limits the graph: it waits for data ")
    assert result.data_wait < 0.25


@pytest.mark.timeout(60)
def test_with_a_slow_map_the_trainer_waits_for_data(write_spec):
    # decode gives 2 items / 8 ms = 250/s = 31 batches/s; a 10 ms step needs 100/s
    plan = check_spec(write_spec(planted_spec(decode="planted_fns:slow", decode_args="{ms: 8}")))
    result = run_bench(plan, seconds=SECONDS, warmup=0.4, step_time=0.01)
    assert result.bottleneck == "decode"
    assert 0.4 < result.data_wait < 1.0


@pytest.mark.timeout(60)
def test_bench_prints_the_table_the_sentence_and_memory(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert cli.main(["bench", "specs/numbers.yaml", "--seconds", "1", "--set", "batch_size=4"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert re.match(r"bench specs/numbers\.yaml: [\d.]+ s measured \(\d+ epoch\(s\) started\), \d+ batches, "
                    r"\d+ samples: [\d,.]+ samples/s", lines[0])
    header = next(i for i, ln in enumerate(lines) if ln.startswith("node "))
    assert lines[header].split() == ["node", "op", "runs", "items", "items/s", "busy", "wait", "queue",
                                     "item", "size"]
    table = [ln.split()[0] for ln in lines[header + 1:header + 8]]
    assert table == ["files", "shard", "shuffle", "parse", "batch", "collate", "out"]
    assert any("limits the graph" in ln or ln.startswith("no node limits the graph") for ln in lines)
    mem = next(ln for ln in lines if ln.startswith("memory: the buffers hold up to ~"))
    assert mem
    buffers = {ln.split()[0] for ln in lines[lines.index(mem) + 1:] if ln.startswith("  ")}
    assert buffers == {"shuffle", "parse", "batch", "out"}
    assert any(ln.startswith("peak RSS ") for ln in lines)


@pytest.mark.timeout(60)
def test_memory_estimate_uses_measured_sizes_and_capacities(write_spec):
    plan = check_spec(write_spec(planted_spec(decode="conveyor.image:train_transform",
                                              decode_args="{size: 64}")))
    result = run_bench(plan, seconds=0.8, warmup=0.3)
    by = {b["node"]: b for b in result.buffers}
    sample = 3 * 64 * 64  # a uint8 image tensor, plus its small fields
    assert sample <= by["decode"]["item_bytes"] < sample + 2000
    assert by["decode"]["items"] == 16  # 8 per ordered thread in flight
    assert by["out"]["items"] == 3     # depth 2 + 1 being made
    assert by["batch"]["items"] == 8
    assert result.buffer_bytes == sum(b["items"] * b["item_bytes"] for b in result.buffers)
    assert result.peak_rss and result.peak_rss >= result.buffer_bytes


def test_nbytes_and_fmt_bytes():
    import numpy as np
    import torch

    assert nbytes(torch.zeros(10, 10, dtype=torch.uint8)) == 100
    assert nbytes(np.zeros(5, dtype=np.float32)) == 20
    assert nbytes(b"abc") == 3
    assert nbytes({"x": torch.zeros(4)}) > 16
    assert fmt_bytes(512) == "512 B" and fmt_bytes(2048) == "2.0 KiB" and fmt_bytes(3 * 2**20) == "3.0 MiB"


def test_bench_usage_errors(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert cli.main(["bench", "specs/numbers.yaml", "--seconds", "0"]) == 2
    assert "--seconds must be > 0" in capsys.readouterr().err
    assert cli.main(["bench", "specs/numbers.yaml", "--set", "batch_sise=3"]) == 1
    assert "did you mean 'batch_size'" in capsys.readouterr().err



def test_bench_shows_the_padding_of_packed_rows(capsys, monkeypatch):
    """pack_tokens counts real and padded tokens as pad_collate does; bench prints the waste."""
    from conveyor.tools import cli

    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    assert cli.main(["bench", "specs/pretrain.yaml", "--seconds", "1", "--set", "seq_len=256"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"padding: pack \(pack_tokens\) \d+\.\d\d % of its [\d,]+ tokens are padding", out), out

"""Padding waste and throughput of bucket_batch against plain shuffled fixed-size batches.

Runs variants of ``specs/text.yaml`` on the bundled docstring corpus
(``examples/data/text-sample``), changing only the batching node:

* ``plain``: ``batch`` of a fixed size (the bucketed run's mean batch size, so both see
  batches of about the same number of samples), then the same pad_collate;
* ``plain, budget-sized``: ``batch`` sized so that its *longest* possible batch fits the
  token budget (what a budget forces on plain batching: max_tokens / max_length);
* ``buckets, batch_sizes``: bucket_batch with a fixed size per bucket (max_tokens / upper bound);
* ``buckets, max_tokens``: the spec itself (a token budget), at several ``pool`` sizes.

For each it reports padding efficiency (real / padded tokens, from pad_collate's stats),
the waste (padded - real) / padded, batches per epoch, and real tokens per second over the
whole graph (list, read, shuffle, tokenize, batch, pad, prefetch), the median of ``--repeats``
timed runs of ``--epochs`` epochs each (runs alternate between variants, so drift hits all),
both per wall second and per CPU second of the process (all its threads).
Whole-graph tokens/s mostly measures padding (a plain batch pads ~5x more memory), so a
second line isolates the batcher's own cost: the graph cut after the batching node,
bucket_batch against batch of the same mean size, in samples/s.

    python benchmarks/padding.py                  # the table
    python benchmarks/padding.py --epochs 3 --repeats 5 --root examples/data/text-sample
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from conveyor import load_graph

SPEC = Path(__file__).resolve().parents[1] / "specs" / "text.yaml"


def variant(base: dict[str, Any], batch_node: dict[str, Any]) -> dict[str, Any]:
    spec = copy.deepcopy(base)
    spec["nodes"]["batch"] = batch_node
    return spec


def run(spec: dict[str, Any], root: str, epochs: int) -> dict[str, float]:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(spec, f, sort_keys=False)
        path = f.name
    try:
        real = padded = batches = 0
        with load_graph(path, root=root) as loader:
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(epochs):
                for _batch in loader:
                    batches += 1
                st = loader.stats()["nodes"]["collate"]
                real += st["real_tokens"]
                padded += st["padded_tokens"]
            seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        os.unlink(path)
    return {"real": real, "padded": padded, "batches": batches / epochs, "tokens_s": real / seconds,
            "tokens_cpu_s": real / cpu}


def count(spec: dict[str, Any], root: str, epochs: int) -> tuple[float, float]:
    """Samples per second (wall, CPU) of a graph whose output is a list of samples per batch."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(spec, f, sort_keys=False)
        path = f.name
    try:
        samples = 0
        with load_graph(path, root=root) as loader:
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(epochs):
                for batch in loader:
                    samples += len(batch)
            seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        os.unlink(path)
    return samples / seconds, samples / cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=str(SPEC.parents[1] / "examples" / "data" / "text-sample"))
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    base = yaml.safe_load(SPEC.read_text())
    bucket = base["nodes"]["batch"]
    max_tokens = int(base["params"]["max_tokens"])
    max_length = int(base["params"]["max_length"])
    bounds = bucket["boundaries"]

    # the bucketed spec's mean batch size sets the plain batch size
    probe = run(base, args.root, 1)
    n_records = sum(len(p.read_bytes().splitlines()) for p in Path(args.root).glob("*.jsonl"))
    mean_bs = max(round(n_records / probe["batches"]), 1)

    variants: dict[str, dict[str, Any]] = {
        f"plain, size {mean_bs} (mean of buckets)": variant(base, {"op": "batch", "size": mean_bs}),
        f"plain, size {max_tokens // max_length} (fits budget)":
            variant(base, {"op": "batch", "size": max(max_tokens // max_length, 1)}),
        "buckets, batch_sizes": variant(base, {**{k: v for k, v in bucket.items() if k != "max_tokens"},
                                               "batch_sizes": [max(max_tokens // b, 1) for b in bounds]}),
    }
    for pool in (1, 2, 4, 8, 16):
        variants[f"buckets, max_tokens, pool {pool}" + (" (spec)" if pool == 8 else "")] = \
            variant(base, {**bucket, "pool": pool})

    results: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    for name, spec in variants.items():  # warm-up: page cache, imports, lazy inits
        run(spec, args.root, 1)
    for _ in range(args.repeats):
        for name, spec in variants.items():
            results[name].append(run(spec, args.root, args.epochs))

    # the batcher's own cost: the same graph cut after the batching node (no padding, no
    # prefetch thread), bucket_batch against batch of the same mean size
    def cut(spec: dict[str, Any]) -> dict[str, Any]:
        spec = copy.deepcopy(spec)
        for name in ("collate", "out"):
            spec["nodes"].pop(name)
        spec["output"] = "batch"
        return spec

    cost = {"batch": cut(variants[next(iter(variants))]), "bucket_batch": cut(base)}
    cost_runs: dict[str, list[tuple[float, float]]] = {k: [] for k in cost}
    for name, spec in cost.items():
        count(spec, args.root, 1)
    for _ in range(args.repeats):
        for name, spec in cost.items():
            cost_runs[name].append(count(spec, args.root, args.epochs))

    print(f"corpus {args.root}: {n_records} records; max_tokens {max_tokens}, max_length {max_length}, "
          f"boundaries {bounds}; {args.epochs} epochs x {args.repeats} runs, median; Python {sys.version.split()[0]}")
    head = (f"{'variant':<44} {'efficiency':>10} {'waste':>7} {'batches/ep':>10} {'tokens/s':>11} "
            f"{'tokens/cpu-s':>12} {'vs plain':>8}")
    print(head)
    print("-" * len(head))
    plain = results[next(iter(variants))]
    plain_wall = statistics.median(r["tokens_s"] for r in plain)
    plain_cpu = statistics.median(r["tokens_cpu_s"] for r in plain)
    for name, runs in results.items():
        r = runs[0]
        eff = r["real"] / r["padded"]
        wall = statistics.median(x["tokens_s"] for x in runs)
        cpu = statistics.median(x["tokens_cpu_s"] for x in runs)
        print(f"{name:<44} {eff:>10.4f} {1 - eff:>7.2%} {r['batches']:>10.1f} {wall:>11,.0f} {cpu:>12,.0f} "
              f"{cpu / plain_cpu:>8.2f}")
    bw, bc = (statistics.median(x[i] for x in cost_runs["batch"]) for i in (0, 1))
    bbw, bbc = (statistics.median(x[i] for x in cost_runs["bucket_batch"]) for i in (0, 1))
    print(f"\nbatcher cost, the graph cut after the batching node (samples/s wall, per cpu-s): "
          f"batch(size {mean_bs}) {bw:,.0f} / {bc:,.0f}; bucket_batch(max_tokens) {bbw:,.0f} / {bbc:,.0f}; "
          f"ratio {bbw / bw:.3f} / {bbc / bc:.3f}")
    print("(vs plain: tokens per CPU-second against the first row; CPU time counts every thread of the "
          "process and is steadier than wall time on a shared machine)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

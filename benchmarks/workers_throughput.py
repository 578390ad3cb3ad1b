"""Graph-level worker copies on GIL-bound per-item work: 1 process vs 2 worker processes vs
2 worker threads, on the bundled text sample with a pure-Python tokenizer.

    python benchmarks/workers_throughput.py            # ~2.5 minutes on 2 cores
    python benchmarks/workers_throughput.py --rounds 1 --epochs 1 --records 200 --mp-context fork  # smoke test

Each configuration: one warm-up epoch (worker start-up is reported separately), then the
records/s of ``--epochs`` epochs; configurations alternate, ``--rounds`` times, medians.
"cores busy" is the machine's non-idle CPU during the timed epochs (Linux ``/proc/stat``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # worker processes import gil_tokenizer from here too

from conveyor import load_graph  # noqa: E402

ROOT = HERE.parent
SPEC = """
params: {{root: "{root}"}}
{workers}
nodes:
  files:    {{op: list_files, url: "${{root}}/*.jsonl"}}
  shard:    {{op: shard, by: [rank, worker]}}
  read:     {{op: read_jsonl, field: text}}
  tokenize: {{op: map, fn: "gil_tokenizer:wordpiece"}}
  batch:    {{op: batch, size: 32}}
  collate:  {{op: pad_collate, fields: [input_ids]}}
"""
CONFIGS = {
    "1 process (inline)": "",
    "2 worker threads": "workers: {copies: 2, method: thread}",
    "2 worker processes": "workers: {copies: 2, method: process}",
    "2 worker processes, batches cut in the copies": "workers: {copies: 2, method: process, until: batch}",
}


def _busy_ticks() -> tuple[int, int] | None:
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return None
    return sum(ticks) - ticks[3] - ticks[4], os.sysconf("SC_CLK_TCK")  # all but idle and iowait


def measure(spec: Path, epochs: int) -> tuple[float, float, float | None]:
    t0 = time.perf_counter()
    with load_graph(spec) as loader:
        first = None
        for _ in loader:  # warm-up epoch (includes worker start-up)
            if first is None:
                first = time.perf_counter() - t0
        n = 0
        busy0 = _busy_ticks()
        t = time.perf_counter()
        for _ in range(epochs):
            for batch in loader:
                n += len(batch["index"])
        dt = time.perf_counter() - t
        busy1 = _busy_ticks()
        cores = None if busy0 is None or busy1 is None else (busy1[0] - busy0[0]) / busy0[1] / dt
        return n / dt, first or 0.0, cores


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--records", type=int, default=0, help="only the first N records of each file (0: all)")
    ap.add_argument("--mp-context", default=None, help="the worker processes' start method (default: spawn)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = ROOT / "examples/data/text-sample"
        if args.records > 0:
            part = Path(tmp, "text")
            part.mkdir()
            for f in sorted(root.glob("*.jsonl")):
                with open(f, encoding="utf-8") as src:
                    (part / f.name).write_text("".join(line for _, line in zip(range(args.records), src)),
                                               encoding="utf-8")
            root = part
        specs = {}
        for name, workers in CONFIGS.items():
            path = Path(tmp, f"{len(specs)}.yaml")
            if args.mp_context and "method: process" in workers:
                workers = workers.replace("method: process", f"method: process, mp_context: {args.mp_context}")
            path.write_text(SPEC.format(root=root, workers=workers))
            specs[name] = path
        rates: dict[str, list[float]] = {n: [] for n in CONFIGS}
        firsts: dict[str, list[float]] = {n: [] for n in CONFIGS}
        cores: dict[str, list[float]] = {n: [] for n in CONFIGS}
        for _ in range(args.rounds):
            for name, path in specs.items():
                rate, first, busy = measure(path, args.epochs)
                rates[name].append(rate)
                firsts[name].append(first)
                if busy is not None:
                    cores[name].append(busy)
    base = statistics.median(rates["1 process (inline)"])
    print(f"| configuration | records/s (median of {args.rounds}) | × 1 process | per round | cores busy "
          "| first batch after start |")
    print("|---|---|---|---|---|---|")
    for name in CONFIGS:
        med = statistics.median(rates[name])
        rounds = " ".join(f"{r:,.0f}" for r in rates[name])
        busy = f"{statistics.median(cores[name]):.2f}" if cores[name] else "—"
        print(f"| {name} | {med:,.0f} | {med / base:.2f} | {rounds} | {busy} "
              f"| {statistics.median(firsts[name]):.2f} s |")


if __name__ == "__main__":
    main()

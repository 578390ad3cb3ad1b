"""Worker copies as Ray actors against worker copies as processes: specs/imagenet-procs.yaml
with ``workers: {copies: 2, method: process}`` and the same with ``method: ray``.

    python benchmarks/ray_copies.py                      # ~3 minutes on 2 cores
    RAY_ADDRESS=127.0.0.1:6379 python benchmarks/ray_copies.py   # on a cluster you started

Each round builds a fresh loader per contender, in alternating order: its start-up (the
workers or actors starting, up to the first batch; with no ``RAY_ADDRESS``, the local Ray
started by the loader counts here) is reported apart; the steady rate is images/s from the
10th batch to the end of ``--epochs`` epochs. Nothing of one contender runs while the other is
timed (each loader is closed, its processes ended, before the next starts). The Ray rows also
give the bytes per batch that crossed the object store (``object_store_bytes`` over the
batches the actors sent, from the loader's stats) and those that came through shared memory
(``shared_memory_bytes``: actors on the driver's node lend it their big tensors in slots, as
worker processes do; on a cluster, the actors on other nodes use the object store).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "specs" / "imagenet-procs.yaml"
SAMPLE = ROOT / "examples" / "data" / "imagenet-sample" / "train"
METHODS = ("process", "ray")


def _spec(tmp: Path, method: str) -> Path:
    text = SPEC.read_text(encoding="utf-8")
    marker = "method: process"
    if marker not in text:
        raise SystemExit(f"{SPEC}: no '{marker}' to replace; update this benchmark")
    path = tmp / f"imagenet-{method}.yaml"
    path.write_text(text.replace(marker, f"method: {method}", 1), encoding="utf-8")
    return path


def _find(stats: dict, key: str) -> int:
    """The sum of ``key`` over every node's stats (the copies' figures sit on their node)."""
    return sum(int(entry.get(key) or 0) for entry in stats.get("nodes", {}).values())


def measure(spec: Path, epochs: int, image_size: int) -> dict:
    from conveyor import load_graph

    t0 = time.perf_counter()
    n = batches = 0
    t_steady = None
    with load_graph(spec, root=str(SAMPLE), workers=2, image_size=image_size) as loader:
        first = None
        for _ in range(epochs):
            for batch in loader:
                now = time.perf_counter()
                batches += 1
                if first is None:
                    first = now - t0
                if batches == 10:
                    t_steady, n = now, 0
                elif t_steady is not None:
                    n += int(batch["label"].shape[0])
        end = time.perf_counter()
        stats = loader.stats()  # the copies' counters run over the loader's life
        sent_bytes = _find(stats, "object_store_bytes")
        sent_chunks = _find(stats, "object_store_chunks")
        shared_bytes = _find(stats, "shared_memory_bytes")
    rate = n / (end - t_steady) if t_steady is not None and end > t_steady else float("nan")
    return {"startup": first or float("nan"), "rate": rate, "batches": batches,
            "bytes": sent_bytes, "chunks": sent_chunks, "shared": shared_bytes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=3, help="epochs of the 200-image sample per loader")
    ap.add_argument("--image-size", type=int, default=224)
    args = ap.parse_args()
    try:
        import ray  # noqa: F401
    except ImportError:
        raise SystemExit("ray is not installed: pip install -c constraints.txt -e '.[ray]'") from None
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    results: dict[str, list[dict]] = {m: [] for m in METHODS}
    with tempfile.TemporaryDirectory() as tmp:
        specs = {m: _spec(Path(tmp), m) for m in METHODS}
        for r in range(args.rounds):
            order = METHODS if r % 2 == 0 else tuple(reversed(METHODS))
            for m in order:
                res = measure(specs[m], args.epochs, args.image_size)
                results[m].append(res)
                print(f"round {r + 1}: {m}: start-up {res['startup']:.2f} s, {res['rate']:,.1f} images/s",
                      file=sys.stderr, flush=True)
    rate = {m: statistics.median(x["rate"] for x in results[m]) for m in METHODS}
    start = {m: statistics.median(x["startup"] for x in results[m]) for m in METHODS}
    ratios = [a["rate"] / b["rate"] for a, b in zip(results["ray"], results["process"])]
    ray_rows = results["ray"]
    per_batch = [x["bytes"] / x["batches"] for x in ray_rows if x["batches"]]
    shared = [x["shared"] / x["batches"] for x in ray_rows if x["batches"]]
    print(f"# ray_copies: {datetime.date.today()}, {platform.node()}, {os.cpu_count()} cores, "
          f"{args.rounds} rounds x {args.epochs} epochs, image_size {args.image_size}, "
          f"cluster {os.environ.get('RAY_ADDRESS') or 'local (started by the loader)'}")
    print()
    print("| contender | start-up (s, median) | images/s (median) | rounds |")
    print("|---|---:|---:|---|")
    for m in METHODS:
        rounds = ", ".join(f"{x['rate']:,.0f}" for x in results[m])
        print(f"| 2 {'Ray actors' if m == 'ray' else 'process copies'} | {start[m]:.2f} | {rate[m]:,.1f} | {rounds} |")
    print()
    print(f"Ray / process, per round: median {statistics.median(ratios):.2f} "
          f"(rounds {min(ratios):.2f}-{max(ratios):.2f}; target >= 0.9)")
    if per_batch:
        chunks = statistics.median(x["chunks"] for x in ray_rows)
        print(f"object store: {statistics.median(per_batch) / 2**20:.3f} MiB per batch crossed it, "
              f"shared memory {statistics.median(shared) / 2**20:.2f} MiB (median over rounds; "
              f"{chunks:.0f} chunks a loader)")


if __name__ == "__main__":
    main()

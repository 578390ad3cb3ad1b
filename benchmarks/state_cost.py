"""What exact resume costs: state size, time to take a state, time to restore, and the
throughput cost of snapshotting the input's state on every item.

    python benchmarks/state_cost.py            # ~1 minute on 2 cores

Part 1 uses specs/imagenet.yaml with its default 10,000-item shuffle window. Part 2 runs a
cheap per-item pipeline (where per-item overhead shows most) and the imagenet spec with the
map's ``snapshot_every`` at 1 (every item) and at 1000, alternating runs, medians of 5.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from conveyor import load_graph

ROOT = Path(__file__).resolve().parent.parent
IMAGENET = ROOT / "specs/imagenet.yaml"

CHEAP_SPEC = """
params: {root: ".", snapshot_every: 1}
nodes:
  files:   {op: list_files, url: "${root}/*.txt", shuffle: true}
  shuffle: {op: shuffle_buffer, size: 1000}
  parse:   {op: map, fn: "conveyor.files:read_numbers", workers: 2, snapshot_every: "${snapshot_every}"}
  batch:   {op: batch, size: 64}
  collate: {op: collate}
  out:     {op: prefetch, depth: 4}
"""


def state_size_and_time() -> dict:
    with load_graph(IMAGENET, batch_size=8) as loader:
        it = iter(loader)
        for _ in range(5):
            next(it)
        state = loader.state_dict()
        size = len(json.dumps(state))
        times = []
        for _ in range(2000):
            t = time.perf_counter()
            s = loader.state_dict()
            json.dumps(s)  # what saving it costs, beyond taking it
            times.append(time.perf_counter() - t)
    t = time.perf_counter()
    with load_graph(IMAGENET, batch_size=8) as again:
        again.load_state_dict(json.loads(json.dumps(state)))
        next(iter(again))
        restore = time.perf_counter() - t
    return {"bytes": size, "take_ms": statistics.median(times) * 1e3,
            "take_p99_ms": sorted(times)[int(len(times) * 0.99)] * 1e3, "restore_s": restore}


def throughput(spec: Path, epochs: int, **overrides) -> float:
    with load_graph(spec, **overrides) as loader:
        for _ in loader:  # warm-up epoch
            pass
        n = 0
        t = time.perf_counter()
        for _ in range(epochs):
            for batch in loader:
                n += len(batch["index"])
        return n / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--files", type=int, default=4000)
    args = ap.parse_args()

    st = state_size_and_time()
    print("## State of specs/imagenet.yaml (shuffle window 10,000)\n")
    print("| state (JSON bytes) | take + json.dumps, median | p99 | restore + first batch |")
    print("|---|---|---|---|")
    print(f"| {st['bytes']} | {st['take_ms']:.4f} ms | {st['take_p99_ms']:.4f} ms | {st['restore_s']:.2f} s |\n")

    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.files):
            Path(tmp, f"{i:05d}.txt").write_text(f"{i}, 1.5, 2.5, 3.5\n")
        cheap = Path(tmp, "cheap.yaml")
        cheap.write_text(CHEAP_SPEC)
        # the imagenet spec with the map's snapshot_every exposed as a param
        text = IMAGENET.read_text().replace("  seed: 0", "  seed: 0\n  snapshot_every: 1", 1)
        text = text.replace('    workers: "${workers}"', '    workers: "${workers}"\n'
                            '    snapshot_every: "${snapshot_every}"', 1)
        imagenet = Path(tmp, "imagenet.yaml")
        imagenet.write_text(text)
        sample = str(ROOT / "examples/data/imagenet-sample/train")  # the spec's own root is ${spec_dir}-relative
        cases = [("cheap items (read 4 numbers)", cheap, 2, {"root": tmp}),
                 ("imagenet sample (decode+crop)", imagenet, 3, {"batch_size": 32, "root": sample})]
        freqs = (1, 16, 1000)
        print("## Map snapshot frequency: items/s, median of "
              f"{args.rounds} alternating runs\n")
        print("| pipeline | " + " | ".join(f"every {f}" for f in freqs) + " | cost of every 1 | cost of every 16 |")
        print("|---|" + "---|" * (len(freqs) + 2))
        for name, path, epochs, over in cases:
            res: dict[int, list[float]] = {f: [] for f in freqs}
            for _ in range(args.rounds):
                for every in freqs:
                    res[every].append(throughput(path, epochs, snapshot_every=every, **over))
            med = {f: statistics.median(v) for f, v in res.items()}
            best = med[1000]
            print(f"| {name} | " + " | ".join(f"{med[f]:,.0f}" for f in freqs)
                  + f" | {(1 - med[1] / best) * 100:+.1f} % | {(1 - med[16] / best) * 100:+.1f} % |")


if __name__ == "__main__":
    main()

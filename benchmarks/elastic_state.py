"""What elastic resume costs: state sizes, and the time to plan and start the resumed epoch.

    python benchmarks/elastic_state.py                      # ImageNet-sized: 1,281,167 items
    python benchmarks/elastic_state.py --n 100000 --old 4 --new 3

A dataset of ``n`` indexes (a map-style Dataset, sampler: shuffle) is dealt to ``--old`` ranks,
shuffled in windows of 10,000 and batched by 256, as specs/imagenet.yaml does; each old rank
takes ``--steps`` batches (by default 50: 12,800 items, in the middle of its second window) and
saves. Then one rank of ``--new`` loads all old states. Reported: the JSON size of an old
rank's state, of a new rank's state (which carries the deal: a few ints per old slot and a
bitmap of each partly drained window), of a plain state of the same graph for comparison, the
time ``load_state_dict`` takes (walking every old state, naming what was consumed) and the
time to the first batch after it (the shard lists the positions left and reads up to its first).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from conveyor import load_graph

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the spec names elastic_state:Indexes
SPEC = """
params: {n: 1281167, window: 10000, batch_size: 256}
nodes:
  items:   {op: dataset, dataset: "elastic_state:Indexes", args: {n: "${n}"}, sampler: shuffle}
  shard:   {op: shard, by: [rank]}
  shuffle: {op: shuffle_buffer, size: "${window}"}
  batch:   {op: batch, size: "${batch_size}"}
output: batch
"""


class Indexes:
    """A map-style dataset of ``n`` items (only its length matters here)."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def _open(spec: Path, rank: int, world: int, n: int):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world))
    return load_graph(spec, n=n)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1281167)
    ap.add_argument("--old", type=int, default=8)
    ap.add_argument("--new", type=int, default=6)
    ap.add_argument("--steps", type=int, default=50)
    args = ap.parse_args()
    per_rank = -(-(args.n // args.old) // 256)  # batches in an old rank's epoch (the smallest share)
    if not 0 < args.steps < per_rank:
        ap.error(f"--steps {args.steps}: an old rank has {per_rank} batches of 256 in its epoch; "
                 f"take at least 1 and leave some (--n {args.n}, --old {args.old})")
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "elastic.yaml"
        spec.write_text(SPEC)
        states = []
        for rank in range(args.old):
            with _open(spec, rank, args.old, args.n) as loader:
                it = iter(loader)
                for _ in range(args.steps):
                    next(it)
                states.append(json.loads(json.dumps(loader.state_dict())))
        old_bytes = max(len(json.dumps(s)) for s in states)
        with _open(spec, 0, args.new, args.n) as loader:
            t0 = time.perf_counter()
            loader.load_state_dict(states)
            t_load = time.perf_counter() - t0  # includes starting the epoch and its first batch
            new_bytes = len(json.dumps(loader.state_dict()))
            t0 = time.perf_counter()
            batches = sum(1 for _ in loader)
            t_rest = time.perf_counter() - t0
        with _open(spec, 0, args.new, args.n) as plain:
            next(iter(plain))
            plain_bytes = len(json.dumps(plain.state_dict()))
    print(f"n={args.n} old world {args.old} -> new world {args.new}, {args.steps} batches of 256 taken per old rank")
    print(f"state of an old rank:           {old_bytes:8d} bytes")
    print(f"state of a new rank (the deal): {new_bytes:8d} bytes  (a plain state of this graph: {plain_bytes} bytes)")
    print(f"load_state_dict + first batch:  {t_load:8.3f} s")
    print(f"rest of the resumed epoch:      {batches} batches in {t_rest:.1f} s on this rank")


if __name__ == "__main__":
    main()

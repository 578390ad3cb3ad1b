"""What even_batches' agreement costs: one all-reduce (MIN of one int32, over gloo) per batch.

    torchrun --nproc_per_node=2 --master_addr=127.0.0.1 benchmarks/even_batches_cost.py

Rank 0 prints (a) microseconds per agreement, bare, median of ``--rounds`` rounds of
``--calls`` calls, and (b) specs/text.yaml's batches/s per rank over ``--epochs`` epochs with
``even_batches: auto`` (the ranks agree: read_jsonl and bucket_batch make them uneven) and
``never``, alternating, medians; plus the batches each rank yielded in the first epoch.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from conveyor import load_graph
from conveyor.graphs.even import Agreement

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--epochs", type=int, default=2)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    agree = Agreement()
    agree.all_have(True)
    bare = []
    for _ in range(args.rounds):
        dist.barrier()
        t = time.perf_counter()
        for _ in range(args.calls):
            agree.all_have(True)
        bare.append((time.perf_counter() - t) / args.calls * 1e6)
    text = (ROOT / "specs/text.yaml").read_text()
    sample = str(ROOT / "examples/data/text-sample")  # the spec's own root is ${spec_dir}-relative
    rates: dict[str, list[float]] = {"auto": [], "never": []}
    counts: dict[str, list[int]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for mode in rates:
                spec = Path(tmp, f"{mode}-{rank}.yaml")
                spec.write_text(f"even_batches: {mode}\n" + text)
                with load_graph(spec, root=sample) as loader:
                    first = sum(1 for _ in loader)
                    dist.barrier()
                    n, t = 0, time.perf_counter()
                    for _ in range(args.epochs):
                        n += sum(1 for _ in loader)
                    rates[mode].append(n / (time.perf_counter() - t))
                got = [torch.zeros(1, dtype=torch.long) for _ in range(world)]
                dist.all_gather(got, torch.tensor([first]))
                counts[mode] = [int(g) for g in got]
                dist.barrier()
    if rank == 0:
        print(f"{world} ranks, gloo on loopback, torch {torch.__version__}")
        print(f"agreement, bare: {statistics.median(bare):.0f} us per batch "
              f"(rounds: {' '.join(f'{b:.0f}' for b in bare)})")
        for mode, rs in rates.items():
            print(f"specs/text.yaml, even_batches: {mode}: {statistics.median(rs):,.0f} batches/s on rank 0 "
                  f"(rounds: {' '.join(f'{r:,.0f}' for r in rs)}); first epoch's batches per rank: {counts[mode]}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

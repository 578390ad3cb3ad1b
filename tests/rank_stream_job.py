"""A torchrun job for tests/test_torchrun.py: a spec over an IterableDataset that shards itself
by rank (tests/byo_fns.py:RankStream, 9 items: 5 on rank 0, 4 on rank 1), iterated for two
epochs with one all-reduce per batch as DDP does; each rank prints its batch counts.

    torchrun --nproc_per_node=2 tests/rank_stream_job.py SPEC
"""

from __future__ import annotations

import datetime
import sys

import torch
import torch.distributed as dist

from conveyor import load_graph


def main() -> None:
    # a short timeout: a rank left waiting fails the job in seconds instead of hanging it
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))
    counts = []
    with load_graph(sys.argv[1]) as loader:
        for _ in range(2):
            n = 0
            for _batch in loader:
                dist.all_reduce(torch.ones(1))  # DDP's gradient all-reduce
                n += 1
            counts.append(n)
    print(f"rank {dist.get_rank()} batches {counts}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""A torchrun job for tests/test_torchrun.py: ranks with uneven data (a filter keeps fewer items
on odd ranks) run one epoch, each taking its state after every batch; then each rank resumes
from the state taken after the epoch's last batch and writes, as JSON, the epoch it resumes in
and the batches it then yields, beside the uninterrupted run's next epoch.

    torchrun --nproc_per_node=2 tests/uneven_resume_job.py SPEC OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist

from conveyor import load_graph


def main() -> None:
    spec, out = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    with load_graph(spec, batch_size=2) as loader:
        last = None
        for _ in loader:
            last = loader.state_dict()  # after the last batch: the next epoch is next
        following = [b["index"].tolist() for b in loader]
    with load_graph(spec, batch_size=2) as loader:
        loader.load_state_dict(last)
        epoch = loader.epoch
        resumed = [b["index"].tolist() for b in loader]
        after = loader.epoch
    (out / f"rank{rank}.json").write_text(json.dumps({"epoch": epoch, "after": after, "resumed": resumed,
                                                      "following": following}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

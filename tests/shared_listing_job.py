"""A torchrun job for tests/test_listings_shared.py: every rank loads a spec whose list_files
lists an S3 URL (moto, through the AWS_* variables the test sets), two epochs, and writes the
indices it read to ``OUT/rank<R>.json``; rank 0 lists, the others take its listing from the
process group's store (list_files share: auto).

    torchrun --nproc_per_node=4 tests/shared_listing_job.py URL OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist

from conveyor import load_graph


def main() -> None:
    url, out = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    spec = out / f"spec{rank}.yaml"
    spec.write_text(f"nodes:\n  files: {{op: list_files, url: \"{url}\"}}\n  shard: {{op: shard}}\n"
                    "  batch: {op: batch, size: 50}\noutput: batch\n")
    seen = []
    with load_graph(str(spec)) as loader:
        for epoch in range(2):
            loader.set_epoch(epoch) if hasattr(loader, "set_epoch") else None
            seen.append([r["path"] for b in loader for r in b])
    (out / f"rank{rank}.json").write_text(json.dumps(seen))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

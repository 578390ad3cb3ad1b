"""Loaders built before ``init_process_group`` in processes that ``torch.multiprocessing.spawn``
starts (no RANK or WORLD_SIZE in the environment; tests/test_torchrun.py):
one untouched until the process group is up, one peeked at before, one read from before.

    python tests/spawn_job.py OUT_DIR WORLD PORT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp

from conveyor import ConveyorError, load_graph

ROOT = Path(__file__).resolve().parent.parent


def train(rank: int, out: str, world: int, port: int) -> None:
    loader = load_graph(ROOT / "specs/numbers.yaml", batch_size=4)
    peeked = load_graph(ROOT / "specs/numbers.yaml", batch_size=4)
    peeked.peek()
    used = load_graph(ROOT / "specs/numbers.yaml", batch_size=4)
    next(iter(used))
    dist.init_process_group("gloo", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}")
    with loader, peeked, used:
        seen = [[i for b in loader for i in b["index"].tolist()] for _ in range(2)]
        after_peek = [i for b in peeked for i in b["index"].tolist()]
        try:
            next(iter(used))
            error = None
        except ConveyorError as exc:
            error = str(exc)
        result = {"seen": seen, "len": len(loader), "keys": sorted(loader.state_dict()), "error": error,
                  "after_peek": after_peek, "peeked_epoch": peeked.epoch}
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    out, world, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    mp.spawn(train, args=(out, world, port), nprocs=world)

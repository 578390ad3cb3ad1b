"""A torchrun job whose ranks list a folder while a file is added to it: rank 0 lists before,
the others after (tests/test_torchrun.py). Each rank writes what it read, or the error it got,
to ``OUT/rank<R>.json``; ``--same`` adds no file (both ranks list the same files). ``--runs``
takes a JSON list of such runs (``{"data", "out", "same", "copies"}``), done in turn by one job:
one start-up of torch and the process group for all of them.

    torchrun --nproc_per_node=2 tests/listing_job.py DATA OUT [--same] [--copies N]
    torchrun --nproc_per_node=2 tests/listing_job.py --runs JSON
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch.distributed as dist

from conveyor import ConveyorError, load_graph

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("data", nargs="?")
    ap.add_argument("out", nargs="?")
    ap.add_argument("--same", action="store_true")
    ap.add_argument("--copies", type=int, default=1)
    ap.add_argument("--runs", help="a JSON list of runs, each {data, out, same, copies}")
    args = ap.parse_args()
    if args.runs is None and (args.data is None or args.out is None):
        ap.error("DATA and OUT, or --runs")
    runs = ([argparse.Namespace(**{"same": False, "copies": 1, **run}) for run in json.loads(args.runs)]
            if args.runs is not None else [args])
    dist.init_process_group("gloo")
    for run in runs:
        _one(run, dist.get_rank())
        dist.barrier()
    dist.destroy_process_group()


def _one(args: argparse.Namespace, rank: int) -> None:
    spec = Path(args.out) / "numbers.yaml"
    if rank == 0:
        text = (ROOT / "specs/numbers.yaml").read_text()
        if args.copies > 1:
            # forked: how the copies start is not what this is about, and spawning them cost
            # seconds a copy on a busy host
            text = (f"workers: {{copies: {args.copies}, method: process, mp_context: fork, until: collate}}\n"
                    + text.replace("by: [rank]", "by: [rank, worker]"))
        spec.write_text(text)
    dist.barrier()
    loader = load_graph(spec, root=args.data, batch_size=4)
    seen, error = [], None
    with loader:
        if rank == 0:
            loader.peek()  # rank 0 lists the folder
        dist.barrier()
        if rank == 0 and not args.same:  # a file lands between the ranks' listings
            first = sorted(Path(args.data, "even").iterdir())[0]
            shutil.copy(first, first.with_name("zz-new.txt"))
        dist.barrier()
        try:
            for _ in range(2):
                seen.append([i for b in loader for i in b["index"].tolist()])
        except ConveyorError as exc:
            error = str(exc)
    Path(args.out, f"rank{rank}.json").write_text(json.dumps({"seen": seen, "error": error}))


if __name__ == "__main__":
    main()

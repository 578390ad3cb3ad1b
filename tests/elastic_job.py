"""A torchrun job for tests/test_torchrun_elastic.py: interrupt an epoch on one world size, go on
on another, and write each rank's sample-id ledger.

    torchrun --nproc_per_node=2 tests/elastic_job.py --phase save --steps 3 --dir D --jobs JSON
    torchrun --nproc_per_node=3 tests/elastic_job.py --phase resume --dir D --jobs JSON

``--jobs`` is a JSON list of ``{"name", "spec", "params", "steps", "dcp"}``: one loader each, in
turn; with ``dcp`` the states also go through torch.distributed.checkpoint and come back
with ``conveyor.dcp_states``.
``save``: every rank takes ``steps`` batches, writes the ids it took and its state. ``resume``:
every rank loads the states of all old ranks, then writes the ids of the rest of the epoch and
of the next epoch (per batch), and the epoch it resumed in.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch.distributed as dist

from conveyor import dcp_states, load_graph


def _ids(batch) -> list[int]:
    return [int(i) for i in batch["index"]]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--phase", choices=["save", "resume"], required=True)
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--jobs", required=True)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for job in json.loads(args.jobs):
        out = args.dir / job["name"]
        out.mkdir(parents=True, exist_ok=True)
        with load_graph(job["spec"], **job["params"]) as loader:
            if args.phase == "save":
                it = iter(loader)
                taken = [i for _ in range(job["steps"]) for i in _ids(next(it))]
                (out / f"old{rank}.json").write_text(json.dumps(taken))
                (out / f"state{rank}.json").write_text(json.dumps(loader.state_dict()))
                if job.get("dcp"):
                    import torch.distributed.checkpoint as dcp

                    dcp.save({"data": loader}, checkpoint_id=str(out / "dcp"))
            else:
                if job.get("dcp"):  # every old rank's entry, read from the DCP checkpoint
                    states = dcp_states(out / "dcp")
                else:
                    states = [json.loads(p.read_text()) for p in sorted(out.glob("state*.json"))]
                loader.load_state_dict(states)
                epoch = loader.epoch
                rest = [i for b in loader for i in _ids(b)]
                following = [_ids(b) for b in loader]
                (out / f"new{rank}.json").write_text(json.dumps({"epoch": epoch, "rest": rest,
                                                                 "next": following}))
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

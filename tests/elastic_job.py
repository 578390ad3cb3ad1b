"""A torchrun job for tests/test_torchrun_elastic.py: interrupt an epoch on one world size, go on
on another, and write each rank's sample-id ledger.

    torchrun --nproc_per_node=2 tests/elastic_job.py --phase save --steps 3 --dir D --jobs JSON
    torchrun --nproc_per_node=3 tests/elastic_job.py --phase resume --dir D --jobs JSON

``--jobs`` is a JSON list of ``{"name", "spec", "params", "steps", "dcp"}``: one loader each, in
turn; with ``dcp`` the states also go through torch.distributed.checkpoint and come back
with ``conveyor.dcp_states``.
``save``: every rank takes ``steps`` batches, writes the ids it took and its state. ``resume``:
every rank loads the states of all old ranks, then writes the ids of the rest of the epoch and
of the next epoch (per batch), and the epoch it resumed in. ``--runs`` takes a JSON list of
``{"phase", "dir", "jobs"}``, done in turn by one job (one start-up for all of them):

    torchrun --nproc_per_node=3 tests/elastic_job.py --runs '[{"phase": "resume", ...}, ...]'
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
    ap.add_argument("--phase", choices=["save", "resume"])
    ap.add_argument("--dir", type=Path)
    ap.add_argument("--jobs")
    ap.add_argument("--runs", help="a JSON list of {phase, dir, jobs}, done in turn")
    args = ap.parse_args()
    if args.runs is not None:
        runs = [(r["phase"], Path(r["dir"]), r["jobs"]) for r in json.loads(args.runs)]
    elif None in (args.phase, args.dir, args.jobs):
        ap.error("--phase, --dir and --jobs, or --runs")
    else:
        runs = [(args.phase, args.dir, json.loads(args.jobs))]
    dist.init_process_group("gloo")
    for phase, folder, jobs in runs:
        if phase not in ("save", "resume"):
            ap.error(f"phase {phase!r}: save or resume")
        _run(phase, folder, jobs, dist.get_rank())
    dist.destroy_process_group()


def _run(phase: str, folder: Path, jobs: list[dict], rank: int) -> None:
    for job in jobs:
        out = folder / job["name"]
        out.mkdir(parents=True, exist_ok=True)
        with load_graph(job["spec"], **job["params"]) as loader:
            if phase == "save":
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


if __name__ == "__main__":
    main()

"""Elastic resume under torchrun (CPU, gloo, loopback): a job interrupted mid-epoch on 2 ranks
goes on on 3, and one on 3 on 2, on an imagenet.yaml-shaped graph (the bundled sample, tiny
images) and a text-shaped one; the sample-id ledger proves every sample came exactly once."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from conveyor import load_graph
from test_elastic import _exactly_once, _ids
from test_torchrun import _free_port, _run

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "tests/elastic_job.py"
IMAGE_PARAMS = {"batch_size": 4, "image_size": 32, "shuffle_window": 16, "workers": 1}


def _torchrun(nproc: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
            "--master_addr=127.0.0.1", f"--master_port={_free_port()}", str(JOB), *args]


def _fresh_epoch(spec: str, params: dict, rank: int, world: int, epoch: int) -> list[list[int]]:
    """Epoch ``epoch`` of rank ``rank`` of a run that was never interrupted."""
    saved = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE")}
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world))
    try:
        with load_graph(spec, **params) as loader:
            loader.set_epoch(epoch)
            return [_ids(b) for b in loader]
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


CASES = [(2, 3, 1, 2), (3, 2, 2, 3)]  # old world, new world, image steps, text steps


def _jobs(text_root: Path, image_steps: int, text_steps: int) -> list[dict]:
    return [{"name": "image", "spec": str(ROOT / "specs/imagenet.yaml"), "params": IMAGE_PARAMS,
             "steps": image_steps, "dcp": True},  # saved and read back through DCP
            {"name": "text", "spec": str(ROOT / "tests/elastic_text.yaml"),
             "params": {"root": str(text_root), "window": 16}, "steps": text_steps}]


@pytest.fixture(scope="module")
def elastic_runs(tmp_path_factory) -> dict[tuple, tuple[Path, list[dict]]]:
    """Each case's run folder and jobs. Three torchrun jobs do both cases: 2 ranks save the
    first case, 3 ranks resume it and save the second, 2 ranks resume the second."""
    tmp = tmp_path_factory.mktemp("elastic")
    text_root = tmp / "text"
    text_root.mkdir()
    for f in range(3):  # 120 records
        lines = [json.dumps({"text": f"record {f}-{i} " + "y" * (i % 5)}) for i in range(40)]
        (text_root / f"part-{f}.jsonl").write_text("\n".join(lines) + "\n")
    a, b = CASES
    folders = {case: (tmp / "-".join(map(str, case)), _jobs(text_root, *case[2:])) for case in CASES}
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}

    def run(world: int, *runs: tuple[str, tuple]) -> None:
        spec = [{"phase": phase, "dir": str(folders[case][0]), "jobs": folders[case][1]} for phase, case in runs]
        _run(_torchrun(world, "--runs", json.dumps(spec)), env=env)

    assert a[0] == b[1] and a[1] == b[0]
    run(a[0], ("save", a))
    run(a[1], ("resume", a), ("save", b))
    run(b[1], ("resume", b))
    return folders


@pytest.mark.timeout(300)
# imagenet.yaml batches with drop_last: the steps are chosen so that what is left divides into
# whole batches on the new ranks (200 images: 2 x 1 x 4 taken, 192 left = 3 x 16 x 4; 3 x 2 x 4
# taken, 176 left = 2 x 22 x 4); else each new rank drops its last partial batch, as drop_last does
@pytest.mark.parametrize("old,new,image_steps,text_steps", CASES)
def test_torchrun_job_resumes_on_another_world_size(elastic_runs, old: int, new: int, image_steps: int,
                                                    text_steps: int) -> None:
    folder, jobs = elastic_runs[(old, new, image_steps, text_steps)]
    for job in jobs:
        out = folder / job["name"]
        taken = [i for r in range(old) for i in json.loads((out / f"old{r}.json").read_text())]
        results = [json.loads((out / f"new{r}.json").read_text()) for r in range(new)]
        with load_graph(job["spec"], **job["params"]) as one:  # world 1: every sample id once
            everything = sorted(i for b in one for i in _ids(b))
        number = {i: k for k, i in enumerate(everything)}
        _exactly_once(len(everything), [number[i] for i in taken],
                      [[number[i] for i in res["rest"]] for res in results])
        epoch = results[0]["epoch"]
        assert epoch == 0 and all(res["epoch"] == epoch for res in results)
        for r, res in enumerate(results):  # the next epoch is the new world's own
            assert res["next"] == _fresh_epoch(job["spec"], job["params"], r, new, epoch + 1), (job["name"], r)

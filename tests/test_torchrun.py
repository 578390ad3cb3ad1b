"""Real torchrun jobs on the CPU (gloo, loopback only): disjoint equal shares, a killed job
resumed from per-rank checkpoints, and torch.distributed.checkpoint."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples/train_ddp.py"
N_ITEMS = 40  # examples/data/numbers


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(nproc: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
            "--master_addr=127.0.0.1", f"--master_port={_free_port()}", str(SCRIPT), *args]


def _logs(folder: Path, nproc: int) -> dict[int, list[tuple[int, int, list[int]]]]:
    out = {}
    for r in range(nproc):
        rows = []
        for line in (folder / f"rank{r}.log").read_text().splitlines():
            step, epoch, idx = line.split(" ")
            rows.append((int(step), int(epoch), [int(i) for i in idx.split(",")]))
        out[r] = rows
    return out


def _run(cmd: list[str], timeout: float = 180, env: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[int, list[tuple[int, int, list[int]]]]:
    """The sample logs of one uninterrupted 2-rank job (3 epochs, batches of 4, a checkpoint
    every 2 steps), shared by the tests below that need one: the samples depend on neither
    the checkpoint interval nor on --dcp, and epochs 0-1 of 3 are those of a 2-epoch job."""
    tmp = tmp_path_factory.mktemp("reference")
    _run(_torchrun(2, "--ckpt", str(tmp / "ref"), "--log-samples", str(tmp / "ref_logs"),
                   "--epochs", "3", "--every", "2", "--set", "batch_size=4"))
    return _logs(tmp / "ref_logs", 2)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("nproc", [2, 3])
def test_ranks_get_disjoint_equal_shares(tmp_path: Path, nproc: int, request) -> None:
    if nproc == 2:  # the shared 2-rank job (its epochs 0 and 1 are checked here)
        logs = request.getfixturevalue("reference")
    else:
        _run(_torchrun(nproc, "--ckpt", str(tmp_path / "ck"), "--epochs", "2", "--every", "100",
                       "--log-samples", str(tmp_path / "logs"), "--set", "batch_size=4"))
        logs = _logs(tmp_path / "logs", nproc)
    for epoch in (0, 1):
        per_rank = {r: [i for _, e, idx in rows if e == epoch for i in idx] for r, rows in logs.items()}
        batches = {r: sum(1 for _, e, _ in rows if e == epoch) for r, rows in logs.items()}
        assert len(set(batches.values())) == 1, f"uneven batch counts {batches}"
        share = -(-N_ITEMS // nproc)  # equalize: repeat (default) -> ceil(n / world) each
        assert all(len(v) == share for v in per_rank.values()), {r: len(v) for r, v in per_rank.items()}
        everything = [i for v in per_rank.values() for i in v]
        assert set(everything) == set(range(N_ITEMS))  # the whole dataset
        repeated = len(everything) - N_ITEMS
        assert repeated == share * nproc - N_ITEMS    # only the documented padding repeats
        if nproc == 2:
            assert not set(per_rank[0]) & set(per_rank[1])  # disjoint when it divides evenly


@pytest.mark.timeout(400)
def test_killed_job_resumes_every_rank_exactly(tmp_path: Path, reference) -> None:
    nproc = 2
    common = ["--epochs", "3", "--every", "2", "--set", "batch_size=4"]  # those of `reference`

    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(_torchrun(nproc, "--ckpt", str(tmp_path / "ck"), "--log-samples",
                                      str(tmp_path / "logs1"), "--step-sleep", "0.15", *common),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                            start_new_session=True)
    log0 = tmp_path / "logs1" / "rank0.log"
    try:
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            if log0.exists() and len(log0.read_text().splitlines()) >= 7:  # mid-epoch 1
                break
            assert proc.poll() is None, "the job ended before it could be killed"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)
    out = _run(_torchrun(nproc, "--ckpt", str(tmp_path / "ck"), "--log-samples", str(tmp_path / "logs2"),
                         *common))
    resumed_at = {int(m) for m in re.findall(r"resumed at step (\d+)", out.stdout)}
    assert len(resumed_at) == 1, out.stdout
    step = resumed_at.pop()
    first, second = _logs(tmp_path / "logs1", nproc), _logs(tmp_path / "logs2", nproc)
    for r in range(nproc):
        combined = [row for row in first[r] if row[0] <= step] + second[r]
        assert combined == reference[r], f"rank {r} differs after resuming at step {step}"
    seen = defaultdict(list)
    for r in range(nproc):
        for _, e, idx in reference[r]:
            seen[e].extend(idx)
    assert all(sorted(v) == list(range(N_ITEMS)) for v in seen.values())


@pytest.mark.timeout(300)
def test_distributed_checkpoint_round_trip(tmp_path: Path, reference) -> None:
    # train_ddp.py --dcp hands DCP the loader itself ({"data": loader}, the same key on every
    # rank): each rank's entry in its state is keyed by rank, so the global plan keeps both
    # and each rank restores its own position (a flat state was kept for one rank only)
    nproc = 2
    args = ["--every", "2", "--set", "batch_size=4", "--dcp"]
    # the uninterrupted job is the shared reference's first 2 epochs (--dcp changes how the
    # states are saved, not which samples come)
    reference = {r: [row for row in rows if row[1] < 2] for r, rows in reference.items()}
    # the same job in two runs: one epoch, then resumed from the DCP checkpoint for the second
    _run(_torchrun(nproc, "--ckpt", str(tmp_path / "ck"), "--epochs", "1", "--log-samples",
                   str(tmp_path / "logs1"), *args))
    out = _run(_torchrun(nproc, "--ckpt", str(tmp_path / "ck"), "--epochs", "2", "--log-samples",
                         str(tmp_path / "logs2"), *args))
    steps = {int(m) for m in re.findall(r"resumed at step (\d+)", out.stdout)}
    assert len(steps) == 1 and out.stdout.count("resumed at step") == nproc, out.stdout
    step = steps.pop()
    first, second = _logs(tmp_path / "logs1", nproc), _logs(tmp_path / "logs2", nproc)
    for r in range(nproc):
        assert [row for row in first[r] if row[0] <= step] + second[r] == reference[r]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("nproc", [2, 3])
def test_ranks_with_uneven_counts_after_the_shard_end_each_epoch_together(tmp_path: Path, nproc: int) -> None:
    spec = tmp_path / "uneven.yaml"
    spec.write_text((ROOT / "specs/numbers.yaml").read_text().replace(
        "  shuffle: {op: shuffle_buffer, size: 16}",
        "  keep:    {op: filter, fn: 'chain_fns:fewer_on_odd_ranks'}\n  shuffle: {op: shuffle_buffer, size: 16}"
    ).replace("${spec_dir}/..", str(ROOT)))
    env_path = os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])
    out = _run(_torchrun(nproc, "--spec", str(spec), "--ckpt", str(tmp_path / "ck"), "--epochs", "2",
                         "--every", "100", "--log-samples", str(tmp_path / "logs"), "--set", "batch_size=2"),
               env={"PYTHONPATH": env_path})
    logs = _logs(tmp_path / "logs", nproc)
    for epoch in (0, 1):
        batches = {r: sum(1 for _, e, _ in rows if e == epoch) for r, rows in logs.items()}
        per_rank = {r: [i for _, e, idx in rows if e == epoch for i in idx] for r, rows in logs.items()}
        assert len(set(batches.values())) == 1, batches  # without agreeing, DDP would hang here
        # the even ranks kept all their items but stopped with the odd ones: they had more
        odd = [i for r, idx in per_rank.items() if r % 2 for i in idx]
        assert odd and all(i % 2 == 0 for i in odd)
        if nproc == 2:  # 40 items divide evenly: still disjoint
            seen = [i for idx in per_rank.values() for i in idx]
            assert len(seen) == len(set(seen))
    assert "epoch 0 ends after" in out.stderr  # the cut is said, not silent


@pytest.mark.timeout(300)
def test_text_spec_under_ddp_ends_each_epoch_together(tmp_path: Path) -> None:
    # files are sharded by rank, records read after: the ranks get uneven batch counts (57 and
    # 58 on the sample), which would leave DDP waiting on the rank that has more
    out = _run(_torchrun(2, "--spec", str(ROOT / "specs/text.yaml"), "--ckpt", str(tmp_path / "ck"),
                         "--epochs", "1", "--every", "1000", "--log-samples", str(tmp_path / "logs"),
                         "--set", f"root={ROOT / 'examples/data/text-sample'}"))
    logs = _logs(tmp_path / "logs", 2)
    counts = [len(rows) for rows in logs.values()]
    assert counts[0] == counts[1] > 10, counts
    assert "epoch 0 ends after" in out.stderr  # one rank had more, left unread and said so
    assert "terminate called" not in out.stderr  # (1 run in 12 aborted at exit: train_ddp.py's end)


@pytest.mark.timeout(120)
def test_a_state_taken_after_an_uneven_epochs_last_batch_resumes_every_rank_in_the_next(tmp_path: Path) -> None:
    # rank 0 has twice rank 1's items; the ranks end epoch 0 together after rank 1's last batch.
    # A state taken there left rank 0 with batches of epoch 0 still to read and rank 1 with none:
    # on resume rank 1 began epoch 1 and rank 0 went on with epoch 0's rest, so the ranks were in
    # different epochs (a trainer looping over loader.epoch.. ran one epoch more on rank 0: a hang)
    spec = tmp_path / "uneven.yaml"
    spec.write_text((ROOT / "specs/numbers.yaml").read_text().replace(
        "  shuffle: {op: shuffle_buffer, size: 16}",
        "  keep:    {op: filter, fn: 'chain_fns:fewer_on_odd_ranks'}\n  shuffle: {op: shuffle_buffer, size: 16}"
    ).replace("${spec_dir}/..", str(ROOT)))
    env_path = os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])
    cmd = _torchrun(2, str(spec), str(tmp_path))
    cmd[cmd.index(str(SCRIPT))] = str(ROOT / "tests/uneven_resume_job.py")
    _run(cmd, timeout=90, env={"PYTHONPATH": env_path})
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for r, got in enumerate(ranks):
        assert (got["epoch"], got["after"]) == (1, 1), f"rank {r}: {got}"
        assert got["resumed"] == got["following"], f"rank {r} differs from the uninterrupted epoch 1"
    assert len(ranks[0]["resumed"]) == len(ranks[1]["resumed"]) > 0


@pytest.mark.timeout(120)
def test_an_iterable_dataset_that_shards_itself_by_rank_ends_each_epoch_together(tmp_path: Path) -> None:
    # no shard in the graph, so nothing made the ranks agree: rank 0 (3 batches) waited for
    # rank 1 (2 batches) in its third all-reduce until the process group timed out
    spec = tmp_path / "stream.yaml"
    spec.write_text('nodes:\n  stream:  {op: iterable, iterable: "byo_fns:RankStream", args: {n: 9}}\n'
                    '  batch:   {op: batch, size: 2}\n  collate: {op: collate}\n')
    env_path = os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])
    cmd = _torchrun(2, str(spec))
    cmd[cmd.index(str(SCRIPT))] = str(ROOT / "tests/rank_stream_job.py")
    out = _run(cmd, timeout=90, env={"PYTHONPATH": env_path})
    assert sorted(re.findall(r"rank \d batches \[2, 2\]", out.stdout)) == ["rank 0 batches [2, 2]",
                                                                            "rank 1 batches [2, 2]"], out.stdout


@pytest.mark.timeout(120)
def test_a_loader_built_before_init_process_group_follows_the_process_group(tmp_path: Path) -> None:
    # mp.spawn (and Lightning's DDP, which sets LOCAL_RANK but no RANK) start processes without
    # RANK/WORLD_SIZE: a loader built before init_process_group was rank 0 of world 1 on every
    # process, so each read the whole dataset and DDP's all-reduces went out of step
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    world = 2
    out = subprocess.run([sys.executable, str(ROOT / "tests/spawn_job.py"), str(tmp_path), str(world),
                          str(_free_port())], capture_output=True, text=True, timeout=90, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    for epoch in range(2):
        shares = [res["seen"][epoch] for res in results]
        assert [len(s) for s in shares] == [N_ITEMS // world] * world
        assert sorted(shares[0] + shares[1]) == list(range(N_ITEMS))  # disjoint, all of it
    for r, res in enumerate(results):
        assert res["len"] == 5 and res["keys"] == ["format", f"rank{r}"]
        # peeked at before (the model's shapes, say): its first epoch is this rank's
        assert res["after_peek"] == res["seen"][0] and res["peeked_epoch"] == 0
        # one that gave a batch as rank 0 of world 1 cannot change: said, not read wrong
        assert "built and used as rank 0 of world 1" in res["error"]
        assert f"runs this process as rank {r} of world 2" in res["error"]


LISTING_OPTS = {"plain": {}, "copies": {"copies": 2}, "same": {"same": True}}


@pytest.fixture(scope="module")
def listing_runs(tmp_path_factory) -> dict[str, Path]:
    """The folder (data/, out/) of each run of LISTING_OPTS, all done in turn by one listing_job."""
    tmp = tmp_path_factory.mktemp("listing")
    runs, folders = [], {}
    for name, opts in LISTING_OPTS.items():
        data, out = tmp / name / "data", tmp / name / "out"
        shutil.copytree(ROOT / "examples/data/numbers", data)
        out.mkdir()
        runs.append({"data": str(data), "out": str(out), **opts})
        folders[name] = tmp / name
    cmd = _torchrun(2, "--runs", json.dumps(runs))
    cmd[cmd.index(str(SCRIPT))] = str(ROOT / "tests/listing_job.py")
    _run(cmd, timeout=150, env={"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    return folders


@pytest.mark.timeout(180)
@pytest.mark.parametrize("opts", list(LISTING_OPTS))
def test_ranks_that_list_different_files_are_told_so(listing_runs, opts: str) -> None:
    # a file landed between rank 0's listing and rank 1's: rank 1 dealt positions of 41 files,
    # rank 0 of 40, so the ranks read overlapping shares without a word, with 6 batches on one
    # rank and 5 on the other (DDP's all-reduces out of step, then a hang or a crash at the end)
    data, out = listing_runs[opts] / "data", listing_runs[opts] / "out"
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    if opts == "same":  # the same files: no word, the usual disjoint shares
        assert [r["error"] for r in ranks] == [None, None]
        assert sorted(ranks[0]["seen"][0] + ranks[1]["seen"][0]) == list(range(N_ITEMS))
        return
    # the rank that takes its first batch last sees both listings there (the other one may have
    # read on: this job has no all-reduce to hold the ranks in step, as DDP has)
    errors = [r["error"] for r in ranks if r["error"] is not None]
    assert errors
    for error in errors:
        assert f"the ranks list different data at 'files' (list_files '{data}/*/*.txt')" in error
        assert "rank 0: 40 listed" in error and "rank 1: 41 listed" in error

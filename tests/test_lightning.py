"""examples/train_lightning.py: a Lightning fit stopped mid-epoch and resumed with
ckpt_path="last" sees exactly the batches of the uninterrupted fit, in both epochs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import lightning  # noqa: F401  (a test dependency: pyproject's test extra)
import pytest

ROOT = Path(__file__).resolve().parent.parent


def _example():
    spec = importlib.util.spec_from_file_location("train_lightning", ROOT / "examples/train_lightning.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows(path: Path) -> list[tuple[int, int, str]]:
    return [(int(s), int(e), idx) for s, e, idx in (line.split() for line in path.read_text().splitlines())]


@pytest.mark.timeout(120)
def test_fit_stopped_mid_epoch_resumes_from_last_checkpoint_exactly(tmp_path):
    example = _example()
    common = ["--epochs", "2", "--every", "3", "--batch-size", "4"]
    example.main([*common, "--ckpt", str(tmp_path / "ref"), "--log-samples", str(tmp_path / "ref.log")])
    reference = _rows(tmp_path / "ref.log")
    assert len(reference) == 20 and {e for _, e, _ in reference} == {0, 1}  # 10 batches an epoch

    ck, log = str(tmp_path / "ck"), tmp_path / "run.log"
    with pytest.raises(RuntimeError, match="crash after step 7"):  # epoch 0, last.ckpt at step 6
        example.main([*common, "--ckpt", ck, "--log-samples", str(log), "--crash-after", "7"])
    with pytest.raises(RuntimeError, match="crash after step 14"):  # epoch 1, last.ckpt at step 12
        example.main([*common, "--ckpt", ck, "--log-samples", str(log), "--crash-after", "14", "--resume"])
    trainer = example.main([*common, "--ckpt", ck, "--log-samples", str(log), "--resume"])
    assert trainer.global_step == 20
    rows = _rows(log)
    # what each run saw after the checkpoint it resumed from is what the uninterrupted fit saw
    kept = [r for r in rows[:7] if r[0] <= 6] + [r for r in rows[7:15] if r[0] <= 12] + rows[15:]
    assert [r[0] for r in rows[:7]] == list(range(1, 8)) and rows[7][0] == 7 and rows[15][0] == 13
    assert kept == reference


@pytest.mark.timeout(120)
@pytest.mark.parametrize("exact", [True, False])
def test_a_loader_of_unknown_length_resumes_exactly_with_exact_resume(tmp_path, exact):
    # a filter makes len() unknown: Lightning then reads one batch ahead of the training step,
    # and the state it saves is past that batch unless ExactResume puts the earlier one in
    spec = tmp_path / "filtered.yaml"
    spec.write_text((ROOT / "specs/numbers.yaml").read_text()
                    .replace("${spec_dir}/../examples", str(ROOT / "examples"))
                    .replace("  batch:", "  keep:    {op: filter, fn: chain_fns:keep_two_of_three}\n  batch:"))
    example = _example()
    common = ["--spec", str(spec), "--epochs", "2", "--every", "3", "--batch-size", "4"]
    if not exact:
        common.append("--no-exact-resume")
    example.main([*common, "--ckpt", str(tmp_path / "ref"), "--log-samples", str(tmp_path / "ref.log")])
    reference = _rows(tmp_path / "ref.log")
    assert len(reference) == 14 and {e for _, e, _ in reference} == {0, 1}  # 26 of 40 kept: 7 batches

    ck, log = str(tmp_path / "ck"), tmp_path / "run.log"
    with pytest.raises(RuntimeError, match="crash after step 5"):  # epoch 0, last.ckpt at step 3
        example.main([*common, "--ckpt", ck, "--log-samples", str(log), "--crash-after", "5"])
    with pytest.raises(RuntimeError, match="crash after step 11"):  # epoch 1, last.ckpt at step 9
        example.main([*common, "--ckpt", ck, "--log-samples", str(log), "--crash-after", "11", "--resume"])
    example.main([*common, "--ckpt", ck, "--log-samples", str(log), "--resume"])
    rows = _rows(log)
    runs, kept = [], []
    for row in rows:  # split the log into runs where the step goes back
        if runs and row[0] <= runs[-1][-1][0]:
            runs.append([row])
        else:
            (runs[-1].append(row) if runs else runs.append([row]))
    assert [len(r) for r in runs[:2]] == [5, 8] and len(runs) == 3
    kept = [r for r in runs[0] if r[0] <= 3] + [r for r in runs[1] if r[0] <= 9] + runs[2]
    if exact:
        assert kept == reference
    else:  # what ExactResume is for: each resume skipped the batch Lightning had read ahead
        assert len(kept) < len(reference)


def _reference_epochs(rank: int, world: int, epochs: int) -> list[str]:
    """The batches (``idx,idx,...``) rank ``rank`` of ``world`` reads in an uninterrupted run."""
    import os

    from conveyor import load_graph

    saved = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE")}
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world))
    try:
        with load_graph(ROOT / "specs/numbers.yaml", batch_size=4) as loader:
            return [",".join(map(str, b["index"].tolist())) for _ in range(epochs) for b in loader]
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


@pytest.mark.timeout(180)
def test_a_ddp_fit_resumes_every_rank_exactly_from_last_checkpoint(tmp_path):
    # Lightning writes rank 0's checkpoint only: it held rank 0's loader state alone, and rank 1
    # failed to resume ("state was saved by rank 0 of world 2, this is rank 1"); ExactResume
    # gathers every rank's state into it
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
    log = tmp_path / "log"
    out = subprocess.run([sys.executable, str(ROOT / "tests/lightning_ddp_job.py"), str(tmp_path / "ck"), str(log),
                          "--crash-after", "7"], capture_output=True, text=True, timeout=150, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for rank in range(2):
        rows = _rows(Path(f"{log}.{rank}"))
        assert [r[0] for r in rows] == [1, 2, 3, 4, 5, 6, 7, 7, 8, 9, 10]  # crashed after 7, saved at 6
        kept = rows[:6] + rows[7:]
        assert [idx for _, _, idx in kept] == _reference_epochs(rank, 2, 2), f"rank {rank}"
        assert [e for _, e, _ in kept] == [0] * 5 + [1] * 5

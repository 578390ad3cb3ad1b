"""conveyor.hf: a Hugging Face Trainer (one process, and DDP under torchrun) and an accelerate
loop, stopped mid-epoch and resumed from their last checkpoint, train on exactly the batches of
the uninterrupted run, on every rank (tests/hf_job.py runs them and logs each batch)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import accelerate  # noqa: F401  (test dependencies: pyproject's test extra)
import pytest
import transformers  # noqa: F401

from conveyor.errors import StateError
from test_torchrun import _free_port

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import hf_job  # noqa: E402  (tests/ is on sys.path: conftest.py)

ROOT = Path(__file__).resolve().parent.parent


def _phases(log: Path) -> dict[str, list[tuple[int, int, str]]]:
    out: dict[str, list] = {}
    for line in log.read_text().splitlines():
        phase, step, epoch, idx = line.split()
        out.setdefault(phase, []).append((int(step), int(epoch), idx))
    return out


def _check_resumed(log: Path, crashes: list[int], every: int = 2) -> None:
    """What each run trained on up to the checkpoint the next one resumed from, then the last
    run, is the uninterrupted run's, batch for batch (step, loader epoch, sample indices)."""
    phases = _phases(log)
    reference = phases.pop("ref")
    kept = []
    for i, crash in enumerate(crashes):
        rows, saved = phases[str(i)], crash - crash % every
        assert rows[-1][0] == crash and phases[str(i + 1)][0][0] == saved + 1, "not resumed where saved"
        kept += [r for r in rows if r[0] <= saved]
    kept += phases[str(len(crashes))]
    assert kept == reference
    assert {e for _, e, _ in reference} == {0, 1}


def _torchrun(tmp_path: Path, *args: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
           f"--master_port={_free_port()}", str(ROOT / "tests/hf_job.py"), *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=200, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("ga", "crashes"), [(3, [3, 7]), (1, [11, 15])])
def test_trainer_stopped_mid_epoch_resumes_exactly(tmp_path, ga, crashes):
    # ga=3: 10 batches an epoch in 4 optimizer steps (the last of one batch): the Trainer skips
    # 6 batches of epoch 0, then 6 of epoch 1; ga=1: resumed at an epoch's end (step 10), then
    # 4 batches into epoch 1. Without ExactResume the Trainer's skip failed ('Loader' object has
    # no attribute 'dataset')
    hf_job.trainer_job(tmp_path, crashes, ga)
    _check_resumed(tmp_path / "log.0", crashes)
    assert (tmp_path / "ck/checkpoint-2/conveyor_loader.json").is_file()


@pytest.mark.timeout(240)
def test_a_ddp_trainer_and_an_accelerate_loop_resume_every_rank_exactly(tmp_path):
    # the Trainer writes its checkpoint from rank 0: ExactResume gathers every rank's loader
    # state into it. accelerate's save_state writes registered objects from the main process
    # only: EveryRank's state_dict gathers every rank's (a loader registered itself kept rank
    # 0's, and rank 1 failed to load it). Each rank resumes its own.
    _torchrun(tmp_path, "both", str(tmp_path), "--crash", "3", "7")
    for job in ("trainer", "accelerate"):
        for rank in range(2):
            _check_resumed(tmp_path / job / f"log.{rank}", [3, 7])
        assert _phases(tmp_path / job / "log.0")["ref"] != _phases(tmp_path / job / "log.1")["ref"]


@pytest.mark.timeout(120)
def test_accelerate_save_state_resumes_exactly_in_one_process(tmp_path):
    hf_job.accelerate_job(tmp_path, [3, 7])
    _check_resumed(tmp_path / "log.0", [3, 7])


@pytest.mark.timeout(120)
def test_ignore_data_skip_starts_the_resumed_epoch_over(tmp_path):
    hf_job.trainer_run(tmp_path, "ck", "0", 1, 3, resume=False)
    hf_job.trainer_run(tmp_path, "ck", "1", 1, None, resume=True, ignore_data_skip=True)
    phases = _phases(tmp_path / "log.0")
    assert [r[2] for r in phases["1"][:3]] == [r[2] for r in phases["0"][:3]]  # epoch 0 from its start


@pytest.mark.timeout(120)
def test_a_trainer_of_ones_own_without_exact_resume_gets_a_clear_error(tmp_path):
    from transformers import Trainer, TrainingArguments

    from conveyor import load_graph

    hf_job.trainer_run(tmp_path, "ck", "0", 1, 3, resume=False)  # checkpoint-2, with the loader's state

    class Mine(Trainer):
        def get_train_dataloader(self):
            return self.loader

    loader = load_graph(hf_job.SPEC, batch_size=4)
    try:
        args = TrainingArguments(output_dir=str(tmp_path / "ck"), num_train_epochs=2, report_to="none",
                                 use_cpu=True, disable_tqdm=True, save_strategy="no")
        trainer = Mine(model=hf_job.Tiny(loader, []), args=args)
        trainer.loader = loader
        with pytest.raises(StateError, match=r"was not restored: add conveyor.hf.ExactResume"):
            trainer.train(resume_from_checkpoint=True)
    finally:
        loader.close()


@pytest.mark.timeout(120)
def test_checkpoints_that_disagree_with_the_loader_state_are_refused(tmp_path):
    hf_job.trainer_run(tmp_path, "ck", "0", 1, 5, resume=False)  # checkpoint-4: 4 batches in
    with pytest.raises(StateError, match=r"resumes 8 batch\(es\) into epoch 0, but the loader's saved "
                                         r"state resumes after 4"):
        hf_job.trainer_run(tmp_path, "ck", "1", 2, None, resume=True)  # another accumulation
    os.remove(tmp_path / "ck/checkpoint-4/conveyor_loader.json")
    with pytest.raises(StateError, match=r"conveyor_loader.json: the Trainer resumes from step 4, but the "
                                         r"checkpoint holds no conveyor loader state"):
        hf_job.trainer_run(tmp_path, "ck", "2", 1, None, resume=True)

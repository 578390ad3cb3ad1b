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

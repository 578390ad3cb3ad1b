"""A Lightning DDP fit on the CPU (2 processes, gloo) that crashes mid-epoch and is resumed from
last.ckpt in the same processes; each rank logs ``step epoch idx,...`` per training step to
``LOG.<rank>`` (tests/test_lightning.py). The loader is built in ``train_dataloader()``.

    python tests/lightning_ddp_job.py CKPT_DIR LOG --crash-after 7
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint

from conveyor import load_graph
from conveyor.lightning import ExactResume

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
from train_lightning import Classifier, CrashAfter  # noqa: E402 - the example's module and crash


class Numbers(Classifier):
    """The example's module, building its loader in ``train_dataloader()`` (where DDP has set
    the rank) and logging each rank's steps to ``LOG.<rank>``."""

    def __init__(self, log: str):
        super().__init__(None)
        self.log_path = log

    def train_dataloader(self):
        self.loader = load_graph(ROOT / "specs/numbers.yaml", batch_size=4)
        self.log_samples = Path(f"{self.log_path}.{self.global_rank}")
        return self.loader


def fit(ckpt: str, log: str, crash: int | None) -> None:
    callbacks = [ExactResume(), ModelCheckpoint(dirpath=ckpt, save_last=True, save_top_k=0, every_n_train_steps=2)]
    if crash is not None:
        callbacks.append(CrashAfter(crash))
    trainer = L.Trainer(max_epochs=2, accelerator="cpu", devices=2, strategy="ddp", logger=False,
                        callbacks=callbacks, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0)
    model = Numbers(log)
    try:
        trainer.fit(model, ckpt_path=None if crash is not None else "last")
    except RuntimeError as exc:
        if crash is None or f"crash after step {crash}" not in str(exc):
            raise
    finally:
        if model.loader is not None:
            model.loader.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("log")
    ap.add_argument("--crash-after", type=int, required=True)
    args = ap.parse_args()
    logging.getLogger("lightning").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    fit(args.ckpt, args.log, args.crash_after)
    fit(args.ckpt, args.log, None)  # fit(ckpt_path="last") in the same processes: as after a restart


if __name__ == "__main__":
    main()

"""A Lightning DDP fit on the CPU (2 processes, gloo) that crashes mid-epoch and is resumed from
last.ckpt in the same processes; each rank logs ``step epoch idx,...`` per training step to
``LOG.<rank>`` (tests/test_lightning.py). The loader is built in ``train_dataloader()``.

    python tests/lightning_ddp_job.py CKPT_DIR LOG --crash-after 7
"""

from __future__ import annotations

import argparse
import logging
import warnings
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch import nn

from conveyor import load_graph
from conveyor.lightning import ExactResume

ROOT = Path(__file__).resolve().parent.parent


class Numbers(L.LightningModule):
    def __init__(self, log: str):
        super().__init__()
        self.net = nn.Linear(4, 2)
        self.log_path = log
        self.loader = None

    def train_dataloader(self):
        self.loader = load_graph(ROOT / "specs/numbers.yaml", batch_size=4)
        return self.loader

    def training_step(self, batch, batch_idx):
        with open(f"{self.log_path}.{self.global_rank}", "a") as f:
            f.write(f"{self.global_step + 1} {self.current_epoch} {','.join(map(str, batch['index'].tolist()))}\n")
        return nn.functional.cross_entropy(self.net(batch["x"]), batch["label"] % 2)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class CrashAfter(Callback):
    def __init__(self, n: int):
        self.n = n

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step >= self.n:
            raise RuntimeError(f"crash after step {self.n}")


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

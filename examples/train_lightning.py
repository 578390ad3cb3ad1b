"""PyTorch Lightning with a conveyor loader: ``train_dataloader`` returns it, and Lightning's
checkpoints carry its state, so ``fit(ckpt_path="last")`` resumes mid-epoch at exactly the
next batch.

    python examples/train_lightning.py --ckpt runs/lightning --epochs 2
    python examples/train_lightning.py --ckpt runs/lightning --epochs 2 --resume   # after a crash

Lightning sees a loader with ``state_dict``/``load_state_dict`` and saves its state in every
checkpoint (``loops.fit_loop.state_dict.combined_loader``). Where ``len(loader)`` gives it the
steps per epoch, it takes each batch as the training step asks for it; where the data decide
the length (a filter, say), it reads one batch ahead, and ``conveyor.lightning.ExactResume``
saves the loader's state from before that batch (without it, a resumed fit skips it).
``--every N`` saves ``last.ckpt`` every N steps; ``--crash-after N`` raises after step N (a stand-in for a crash);
``--log-samples FILE`` appends ``step epoch idx,idx,...`` lines.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch import nn

from conveyor import load_graph
from conveyor.lightning import ExactResume

ROOT = Path(__file__).resolve().parent.parent


class Classifier(L.LightningModule):
    """A linear layer over numbers.yaml's 4 numbers: enough to train, small enough to be quick."""

    def __init__(self, loader, log_samples: Path | None = None):
        super().__init__()
        self.net = nn.Linear(4, 2)
        self.loader = loader
        self.log_samples = log_samples

    def train_dataloader(self):
        return self.loader

    def training_step(self, batch, batch_idx):
        if self.log_samples is not None:
            with open(self.log_samples, "a") as f:
                f.write(f"{self.global_step + 1} {self.current_epoch} "
                        f"{','.join(map(str, batch['index'].tolist()))}\n")
        return nn.functional.cross_entropy(self.net(batch["x"]), batch["label"] % 2)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class CrashAfter(Callback):
    """Raises after training step ``n``: a crash in the middle of an epoch."""

    def __init__(self, n: int):
        self.n = n

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step >= self.n:
            raise RuntimeError(f"crash after step {self.n}")


def main(argv: list[str] | None = None) -> L.Trainer:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default=str(ROOT / "specs/numbers.yaml"))
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--ckpt", type=Path, required=True)
    ap.add_argument("--every", type=int, default=3, help="save last.ckpt every N steps")
    ap.add_argument("--crash-after", type=int, default=None)
    ap.add_argument("--resume", action="store_true", help='fit(ckpt_path="last")')
    ap.add_argument("--log-samples", type=Path, default=None)
    ap.add_argument("--no-exact-resume", action="store_true",
                    help="leave out conveyor.lightning.ExactResume (to see what it fixes)")
    args = ap.parse_args(argv)
    logging.getLogger("lightning").setLevel(logging.WARNING)

    torch.manual_seed(0)
    callbacks: list[Callback] = [] if args.no_exact_resume else [ExactResume()]
    callbacks += [ModelCheckpoint(dirpath=args.ckpt, save_last=True, save_top_k=0,
                                  every_n_train_steps=args.every)]
    if args.crash_after is not None:
        callbacks.append(CrashAfter(args.crash_after))
    trainer = L.Trainer(max_epochs=args.epochs, accelerator="cpu", devices=1, logger=False,
                        callbacks=callbacks, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0)
    with load_graph(args.spec, batch_size=args.batch_size) as loader:
        model = Classifier(loader, args.log_samples)
        trainer.fit(model, ckpt_path="last" if args.resume else None)
    print(f"done: {trainer.global_step} steps, {trainer.current_epoch} epochs", flush=True)
    return trainer


if __name__ == "__main__":
    main()

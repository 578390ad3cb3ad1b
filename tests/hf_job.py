"""Hugging Face Trainer and accelerate jobs on the CPU that stop mid-epoch and resume in the same
processes, one process or under torchrun (gloo); tests/test_hf.py compares what they logged.
Each rank appends ``phase step epoch idx,...`` lines (one a batch) to ``OUT/<job>/log.<rank>``.

    python tests/hf_job.py trainer OUT --ga 2 --crash 3 7
    torchrun --nproc_per_node=2 tests/hf_job.py both OUT --crash 3 7

``trainer``: an uninterrupted ``LoaderTrainer`` run (phase ``ref``), then runs that raise after
each ``--crash`` step and resume with ``train(resume_from_checkpoint=True)`` (phases ``0``,
``1``, ...; checkpoints every 2 steps). ``accelerate``: the same loop by hand, with
``save_state`` every 2 steps and ``EveryRank(loader)`` registered for checkpointing.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from torch import nn  # noqa: E402

from conveyor import load_graph  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs/numbers.yaml"
EPOCHS = 2


class Tiny(nn.Module):
    """A linear layer over numbers.yaml's 4 numbers, logging each batch it trains on."""

    def __init__(self, loader, rows: list):
        super().__init__()
        self.net = nn.Linear(4, 2)
        self.loader, self.rows = loader, rows

    def forward(self, x, label, index):
        self.rows.append((self.loader.epoch, ",".join(map(str, index.tolist()))))
        return {"loss": nn.functional.cross_entropy(self.net(x), label % 2)}


class Crash(Exception):
    pass


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def _write(out: Path, phase: str, step: int, rows: list) -> None:
    with open(out / f"log.{_rank()}", "a") as f:
        for epoch, idx in rows:
            f.write(f"{phase} {step} {epoch} {idx}\n")
    rows.clear()


def trainer_run(out: Path, folder: str, phase: str, ga: int, crash: int | None, resume: bool,
                ignore_data_skip: bool = False) -> None:
    from transformers import TrainerCallback, TrainingArguments

    from conveyor.hf import LoaderTrainer

    class Log(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            _write(out, phase, state.global_step, rows)
            if crash is not None and state.global_step == crash:
                raise Crash(f"crash after step {crash}")

    rows: list = []
    loader = load_graph(SPEC, batch_size=4)
    torch.manual_seed(0)
    args = TrainingArguments(output_dir=str(out / folder), num_train_epochs=EPOCHS, save_strategy="steps",
                             save_steps=2, gradient_accumulation_steps=ga, logging_strategy="no",
                             report_to="none", use_cpu=True, disable_tqdm=True, seed=0,
                             dataloader_pin_memory=False, ddp_find_unused_parameters=False,
                             ignore_data_skip=ignore_data_skip)
    trainer = LoaderTrainer(model=Tiny(loader, rows), args=args, train_loader=loader, callbacks=[Log()])
    try:
        trainer.train(resume_from_checkpoint=True if resume else None)
    except Crash:
        pass
    finally:
        loader.close()


def accelerate_run(out: Path, phase: str, crash: int | None, resume: str | None) -> str | None:
    """One run of a hand-written loop; returns the folder of its last save_state."""
    from accelerate import Accelerator

    from conveyor.hf import EveryRank

    accelerator = Accelerator(cpu=True)
    rows: list = []
    loader = load_graph(SPEC, batch_size=4)
    torch.manual_seed(0)
    model = Tiny(loader, rows)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = accelerator.prepare(model, opt)
    accelerator.register_for_checkpointing(EveryRank(loader))
    step, saved = 0, None
    try:
        if resume is not None:
            accelerator.load_state(resume)
            step = int(Path(resume).name.split("-")[1])
        for _ in range(loader.epoch if resume else 0, EPOCHS):
            for batch in loader:
                opt.zero_grad()
                accelerator.backward(model(**batch)["loss"])
                opt.step()
                step += 1
                _write(out, phase, step, rows)
                if step % 2 == 0:
                    saved = str(out / "acc" / f"step-{step}")
                    accelerator.save_state(saved)
                if step == crash:
                    return saved
        return saved
    finally:
        loader.close()


def trainer_job(out: Path, crashes: list[int], ga: int = 1) -> None:
    """The uninterrupted run, then one run a crash, each resumed from the last checkpoint."""
    out.mkdir(parents=True, exist_ok=True)
    trainer_run(out, "ref", "ref", ga, None, False)
    for i, crash in enumerate([*crashes, None]):
        trainer_run(out, "ck", str(i), ga, crash, resume=i > 0)


def accelerate_job(out: Path, crashes: list[int], ga: int = 1) -> None:
    out.mkdir(parents=True, exist_ok=True)
    accelerate_run(out, "ref", None, None)
    saved = None
    for i, crash in enumerate([*crashes, None]):
        saved = accelerate_run(out, str(i), crash, saved)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["trainer", "accelerate", "both"])
    ap.add_argument("out", type=Path)
    ap.add_argument("--ga", type=int, default=1, help="gradient accumulation steps (trainer)")
    ap.add_argument("--crash", type=int, nargs="*", default=[])
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    if args.what in ("trainer", "both"):  # both: one torchrun start-up for the two jobs
        trainer_job(args.out / "trainer", args.crash, args.ga)
    if args.what in ("accelerate", "both"):
        accelerate_job(args.out / "accelerate", args.crash, args.ga)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())

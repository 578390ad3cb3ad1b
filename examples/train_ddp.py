"""DDP on the CPU (gloo) with conveyor: every rank loads its own share, checkpoints its own
loader state beside the model, and resumes exactly after a crash.

    torchrun --nproc_per_node=2 examples/train_ddp.py --ckpt runs/ddp --epochs 3
    torchrun --nproc_per_node=2 examples/train_ddp.py --ckpt runs/ddp --epochs 3   # resumes

``shard`` reads rank and world from torch.distributed, and ``equalize`` gives every rank the
same number of items; where later nodes can still make the counts differ (a filter, a reader
of records, length buckets), the loaders agree on each epoch's last batch (``even_batches``),
so no rank waits forever at an epoch's end. Each rank writes
``rank<R>-step<N>.pt`` (model, optimizer, its loader state) and keeps the last two; on a
restart the ranks agree on the newest step that all of them saved (a kill can land between
two ranks' saves). ``--dcp`` saves through torch.distributed.checkpoint instead: the loader
goes in as it is (``{"model": ..., "data": loader}``); it is a DCP ``Stateful`` whose state is
keyed by rank, so every rank saves and loads its own position.
``--log-samples DIR`` appends ``step epoch idx,idx,...`` lines to ``DIR/rank<R>.log``.
After training, a rank ends with ``os._exit(0)``: see the end of ``main()`` for why.
``--spec`` takes the numbers sample (default), an ImageNet spec or specs/text.yaml (whose ranks
get uneven record counts: the loaders agree on each epoch's last batch).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from conveyor import load_graph
from conveyor.graphs.params import parse_set

ROOT = Path(__file__).resolve().parent.parent


class BagOfTokens(nn.Module):
    """Mean of token embeddings (padding masked out) -> 2 classes: enough to train on text."""

    def __init__(self, vocab: int = 1 << 16):
        super().__init__()
        self.vocab = vocab
        self.embed = nn.Embedding(vocab, 16)
        self.out = nn.Linear(16, 2)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        weights = mask.float().unsqueeze(-1)
        mean = (self.embed(ids % self.vocab) * weights).sum(1) / weights.sum(1).clamp(min=1)
        return self.out(mean)


def make_model(batch: dict) -> nn.Module:
    if "image" in batch:
        return nn.Sequential(nn.Conv2d(3, 8, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                             nn.Flatten(), nn.Linear(8, 10))
    if "input_ids" in batch:
        return BagOfTokens()
    return nn.Linear(batch["x"].shape[1], 2)


def forward(model: nn.Module, batch: dict) -> torch.Tensor:
    """The loss of one batch: images, text (token ids with a mask) or the numbers sample."""
    if "image" in batch:
        return nn.functional.cross_entropy(model(batch["image"].float() / 255), batch["label"])
    if "input_ids" in batch:  # no labels in the text sample: learn the length's parity
        return nn.functional.cross_entropy(model(batch["input_ids"], batch["attention_mask"]),
                                           batch["lengths"] % 2)
    return nn.functional.cross_entropy(model(batch["x"]), batch["label"] % 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default=str(ROOT / "specs/numbers.yaml"))
    ap.add_argument("--set", action="append", default=[], metavar="K=V")
    ap.add_argument("--ckpt", type=Path, required=True)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--every", type=int, default=2, help="checkpoint every N steps")
    ap.add_argument("--dcp", action="store_true", help="use torch.distributed.checkpoint")
    ap.add_argument("--log-samples", type=Path, default=None)
    ap.add_argument("--step-sleep", type=float, default=0.0)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    loader = load_graph(args.spec, **parse_set(args.set))
    first = loader.peek()  # shapes for the model; the first epoch still begins with this batch
    model = DDP(make_model(first))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = 0
    args.ckpt.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    dcp_dir = args.ckpt / "dcp"
    if args.dcp and (dcp_dir / ".metadata").exists():
        import torch.distributed.checkpoint as dcp

        state = {"model": model.state_dict(), "opt": opt.state_dict(),
                 "data": loader, "step": torch.zeros((), dtype=torch.long)}
        dcp.load(state, checkpoint_id=str(dcp_dir))
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = int(state["step"])
        print(f"rank {rank}: resumed at step {step}", flush=True)
    elif not args.dcp:
        saved = sorted(int(p.stem.split("-step")[1]) for p in args.ckpt.glob(f"rank{rank}-step*.pt"))
        newest = torch.tensor(saved[-1] if saved else 0)
        dist.all_reduce(newest, op=dist.ReduceOp.MIN)  # the newest step every rank has
        if int(newest) > 0:
            ckpt = torch.load(args.ckpt / f"rank{rank}-step{int(newest)}.pt")
            model.load_state_dict(ckpt["model"])
            opt.load_state_dict(ckpt["opt"])
            loader.load_state_dict(ckpt["data"])
            step = ckpt["step"]
            print(f"rank {rank}: resumed at step {step}", flush=True)

    log = None
    if args.log_samples:
        args.log_samples.mkdir(parents=True, exist_ok=True)
        log = open(args.log_samples / f"rank{rank}.log", "a")
    batches_per_epoch: dict[int, int] = {}
    with loader:
        # after a restore, loader.epoch is the epoch the state resumes in (-1 when fresh)
        for _ in range(max(loader.epoch, 0), args.epochs):
            for batch in loader:
                loss = forward(model, batch)
                opt.zero_grad()
                loss.backward()  # DDP all-reduces here: a rank with fewer batches would hang
                opt.step()
                step += 1
                batches_per_epoch[loader.epoch] = batches_per_epoch.get(loader.epoch, 0) + 1
                if log:
                    log.write(f"{step} {loader.epoch} {','.join(map(str, batch['index'].tolist()))}\n")
                    log.flush()
                if args.step_sleep:
                    time.sleep(args.step_sleep)
                if step % args.every == 0:
                    if args.dcp:
                        import torch.distributed.checkpoint as dcp

                        dcp.save({"model": model.state_dict(), "opt": opt.state_dict(),
                                  "data": loader, "step": torch.tensor(step)},
                                 checkpoint_id=str(dcp_dir))
                    else:
                        path = args.ckpt / f"rank{rank}-step{step}.pt"
                        torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                                    "data": loader.state_dict(), "step": step}, path.with_suffix(".tmp"))
                        os.replace(path.with_suffix(".tmp"), path)
                        for old in args.ckpt.glob(f"rank{rank}-step*.pt"):
                            if int(old.stem.split("-step")[1]) < step - args.every:
                                old.unlink()  # keep this step's and the one before
    if log:
        log.close()
    print(f"rank {rank}/{world}: done at step {step}, batches per epoch {batches_per_epoch}", flush=True)
    dist.destroy_process_group()
    # DDP keeps the gloo process group, and its three native threads (gloo_tcp_loop and two
    # pt_gloo_runloop), alive after destroy_process_group(): at interpreter exit the C++ teardown
    # then runs beside them and can abort the process ("terminate called without an active
    # exception", 1 run in 12). Everything is saved, closed and flushed: leave without it.
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()

"""Train a small CNN on the CPU from ``specs/imagenet.yaml``, checkpointing model + loader.

Run it, kill it at any point (even with SIGKILL), run it again with the same arguments: it
resumes from the last checkpoint with exactly the batches the uninterrupted run would have
seen — no sample repeated, none lost.

    python examples/train_imagenet.py --ckpt runs/cnn --steps 300
    python examples/train_imagenet.py --ckpt runs/cnn --steps 300     # resumes

``--log-samples FILE`` appends one line per step (``step epoch idx,idx,...``) so a test can
check the sequence of samples across a kill and a restart.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
from torch import nn

from conveyor import load_graph
from conveyor.image import normalize

SPEC = Path(__file__).resolve().parent.parent / "specs" / "imagenet.yaml"


def make_model(classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, classes),
    )


def save_atomic(obj: dict, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)  # a kill mid-save leaves the previous checkpoint intact


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", type=Path, required=True, help="checkpoint folder")
    ap.add_argument("--steps", type=int, default=300, help="total training steps")
    ap.add_argument("--every", type=int, default=20, help="checkpoint every N steps")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--root", default=None, help="ImageNet-layout train folder (default: the sample)")
    ap.add_argument("--log-samples", type=Path, default=None)
    ap.add_argument("--step-sleep", type=float, default=0.0, help="extra seconds per step (tests)")
    args = ap.parse_args()

    torch.manual_seed(0)
    overrides = {"batch_size": args.batch_size, "image_size": args.image_size, "workers": args.workers}
    if args.root:
        overrides["root"] = args.root
    loader = load_graph(SPEC, **overrides)
    model = make_model(classes=1000)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step = 0
    args.ckpt.mkdir(parents=True, exist_ok=True)
    last = args.ckpt / "last.pt"
    if last.exists():
        ckpt = torch.load(last)  # plain data and tensors: torch's default weights_only=True reads it
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        loader.load_state_dict(ckpt["data"])
        step = ckpt["step"]
        print(f"resumed at step {step} (epoch {loader.epoch})", flush=True)

    log = open(args.log_samples, "a") if args.log_samples else None
    t0 = time.perf_counter()
    with loader:
        while step < args.steps:
            for batch in loader:
                x = normalize(batch["image"])
                loss = nn.functional.cross_entropy(model(x), batch["label"])
                opt.zero_grad()
                loss.backward()
                opt.step()
                step += 1
                if log:
                    log.write(f"{step} {loader.epoch} {','.join(map(str, batch['index'].tolist()))}\n")
                    log.flush()
                if args.step_sleep:
                    time.sleep(args.step_sleep)
                if step % args.every == 0 or step == args.steps:
                    save_atomic({"model": model.state_dict(), "opt": opt.state_dict(),
                                 "data": loader.state_dict(), "step": step}, last)
                if step % 50 == 0:
                    print(f"step {step} epoch {loader.epoch} loss {loss.item():.3f}", flush=True)
                if step >= args.steps:
                    break
    print(f"done: {step} steps in {time.perf_counter() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()

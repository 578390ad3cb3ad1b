"""Does specs/imagenet-shards.yaml on S3 stall at its shuffle windows? Gaps between batches.

    python benchmarks/s3_stalls.py [--copies 8] [--window 256] [--epochs 2]

The bundled sample linked ``--copies`` times (1,600 images at 8) is packed into 1 MB tar
shards and uploaded to moto's S3 server on 127.0.0.1; ``specs/imagenet-shards.yaml`` reads it
from there with a shuffle window of ``--window`` samples, so an epoch crosses many windows.
Every gap between consecutive batches is timed. A window that had to fill before it emitted
(the old shuffle_buffer) made the batch at each window boundary wait for a whole window's
reads; the table compares the gaps at the batches where a new window starts with the others.
The first batch of each epoch (the first window's fill, which no window shuffle can avoid) is
reported apart.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import link_subset, machine, md_table  # noqa: E402
from s3_server import MotoS3, aws_env, clear_fs_cache, upload_dir  # noqa: E402

from conveyor import load_graph  # noqa: E402
from conveyor.pack import pack  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--copies", type=int, default=8)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    args = ap.parse_args()
    server = MotoS3().start()
    try:
        os.environ.update(aws_env(server.endpoint))
        clear_fs_cache()
        with tempfile.TemporaryDirectory() as tmp:
            folder, shards = Path(tmp, "train"), Path(tmp, "shards")
            n = link_subset(ROOT / "examples/data/imagenet-sample/train", folder, 10_000, copies=args.copies)
            pack(str(folder), str(shards), shard_size="1MB")
            bucket = server.bucket()
            upload_dir(server.client(), shards, bucket, "shards")
            root = f"s3://{bucket}/shards"
            gaps: list[tuple[int, int, float]] = []  # epoch, batch, seconds since the previous one
            with load_graph(ROOT / "specs/imagenet-shards.yaml", root=root, shuffle_window=args.window,
                            batch_size=args.batch_size, image_size=112) as loader:
                for epoch in range(args.epochs):
                    t = time.perf_counter()
                    for b, _ in enumerate(loader):
                        now = time.perf_counter()
                        gaps.append((epoch, b, now - t))
                        t = now
    finally:
        server.stop()
    bs, w = args.batch_size, args.window
    first = [g for e, b, g in gaps if b == 0]

    def starts_window(b: int) -> bool:  # a sample of batch b is the first of a window
        return any(k % w == 0 for k in range(b * bs, (b + 1) * bs))

    boundary = [g for e, b, g in gaps if b > 0 and starts_window(b)]
    other = [g for e, b, g in gaps if b > 0 and not starts_window(b)]
    rest = [g for e, b, g in gaps if b > 0]

    def row(name: str, xs: list[float]) -> list[str]:
        if not xs:
            return [name, "0", "-", "-", "-"]
        xs = sorted(xs)
        return [name, str(len(xs)), f"{1000 * statistics.median(xs):.1f}",
                f"{1000 * xs[max(0, -(-95 * len(xs) // 100) - 1)]:.1f}", f"{1000 * xs[-1]:.1f}"]

    print(md_table(["batches", "count", "median gap ms", "p95 ms", "max ms"],
                   [row("first of an epoch", first), row("a new window starts in it", boundary),
                    row("inside a window", other), row("all but the first", rest)],
                   [False, True, True, True, True]))
    if boundary and other:
        print(f"\nmax gap after the first batch / median gap: {max(rest) / statistics.median(rest):.1f}; "
              f"window-boundary median / other median: "
              f"{statistics.median(boundary) / statistics.median(other):.2f}")
    else:
        print(f"\nno ratio: {len(boundary)} batches start a window after the first and {len(other)} do "
              f"not; give more --copies or --epochs, or a smaller --window")
    m = machine()
    print(f"{n} samples x {args.epochs} epochs from moto S3 (127.0.0.1), window {w}, batch {bs}, image 112 px; "
          f"{m.get('cpu', '?')}, {m.get('cpus (nproc)', '?')} cores, load average {m.get('load average at start', '?')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

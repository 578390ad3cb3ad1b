"""Per-image cost of ``conveyor.image.train_transform`` against a naive Pillow pipeline, and
how its kernels scale over threads.

No loader: this measures the map function alone. The naive pipeline is what torchvision's
``ImageFolder`` + ``RandomResizedCrop`` + ``RandomHorizontalFlip`` does with PIL: full decode,
``convert("RGB")``, crop, bilinear resize, flip, to a CHW uint8 tensor. Both draw the same crop
from the same rng, so the work differs only in how it is done.

Inputs, generated (not the bundled sample): ``--count`` ImageNet-sized JPEGs (450x360,
quality 90, ~50 kB) and 8 camera-sized ones (3000x2000).

1. Per image, one thread: the median over ``--repeats`` of the mean CPU time of the calling
   thread (``time.thread_time``), so other processes on a shared machine barely move it.
2. Threads: ``train_transform`` over the ImageNet-sized images, read from memory, by 1 thread
   and by ``--threads`` threads (each its share of the list), in alternating rounds; the
   speed-up of each round is its N-thread rate over its 1-thread rate. A speed-up well under
   N means something holds the GIL (or the machine is busy: the share of the CPUs other
   processes used is printed with each round).

    python benchmarks/decode_micro.py [--repeats 3] [--rounds 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import io
import random
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import _common as C  # noqa: E402
from conveyor.image import random_resized_crop_box, train_transform  # noqa: E402


def naive(item: dict, *, size: int = 224, rng: random.Random) -> dict:
    """Full decode, then crop and resize: the usual PIL pipeline."""
    img = Image.open(io.BytesIO(item["bytes"])).convert("RGB")
    top, left, h, w = random_resized_crop_box(img.width, img.height, rng=rng)
    img = img.crop((left, top, left + w, top + h)).resize((size, size), Image.Resampling.BILINEAR)
    if rng.random() < 0.5:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    image = torch.from_numpy(np.asarray(img).transpose(2, 0, 1).copy())
    return {"image": image, "label": item["label"], "index": item["index"]}


def per_image_ms(fn, items: list[dict], repeats: int) -> float:
    """Median over repeats of the mean CPU time of this thread per item, in milliseconds."""
    runs = []
    for r in range(repeats):
        start = time.thread_time()
        for item in items:
            fn(item, rng=random.Random(r * 100003 + item["index"]))
        runs.append((time.thread_time() - start) / len(items) * 1e3)
    return statistics.median(runs)


def rate(items: list[dict], threads: int, passes: int) -> tuple[float, float]:
    """(images/s, share of the CPUs other processes used) of ``threads`` threads, each doing
    train_transform on its share of ``items``, ``passes`` times over."""
    def work(part: list[dict]) -> None:
        for p in range(passes):
            for item in part:
                train_transform(item, rng=random.Random(p * 100003 + item["index"]))

    parts = [items[k::threads] for k in range(threads)]
    ts = [threading.Thread(target=work, args=(part,)) for part in parts]
    cpu0 = C.cpu_snapshot()
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    return len(items) * passes / wall, C.foreign_share(cpu0, C.cpu_snapshot(), wall)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--count", type=int, default=200, help="ImageNet-sized images")
    parser.add_argument("--rounds", type=int, default=5, help="alternating thread rounds")
    parser.add_argument("--passes", type=int, default=3, help="passes over the images per run")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    def jpeg(w: int, h: int, i: int) -> dict:
        return {"bytes": C.camera_like_jpeg(w, h, seed=i), "label": 0, "index": i}

    items = [jpeg(450, 360, i) if i % 4 else jpeg(360, 450, i) for i in range(args.count)]
    big = [jpeg(3000, 2000, 10_000 + i) for i in range(8)]
    kb = statistics.mean(len(x["bytes"]) for x in items) / 1024
    print(f"torch {torch.__version__}, intra-op threads {torch.get_num_threads()}, "
          f"{C.machine()['cpus (nproc)']} CPUs, load average {C.machine()['load average at start']}")
    print()
    print(f"{'input (CPU ms per image)':<34}{'naive PIL':>10}{'conveyor':>10}{'speed-up':>10}")
    for name, batch in ((f"{len(items)} JPEGs ~450x360, {kb:.0f} kB", items), ("8 JPEGs 3000x2000", big)):
        per_image_ms(train_transform, batch[:4], 1)  # warm up
        slow = per_image_ms(naive, batch, args.repeats)
        fast = per_image_ms(train_transform, batch, args.repeats)
        print(f"{name:<34}{slow:>10.2f}{fast:>10.2f}{slow / fast:>9.2f}x")
    print()
    n = args.threads
    print(f"train_transform, {len(items)} ImageNet-sized JPEGs from memory, "
          f"{args.passes} passes per run, alternating rounds:")
    print(f"{'round':<7}{'1 thread /s':>12}{f'{n} threads /s':>14}{'speed-up':>10}{'others CPU':>12}")
    ratios = []
    rate(items[:16], 1, 1)  # warm up
    for r in range(args.rounds):
        order = (1, n) if r % 2 == 0 else (n, 1)
        got = {k: rate(items, k, args.passes) for k in order}
        ratios.append(got[n][0] / got[1][0])
        others = max(got[1][1], got[n][1])
        print(f"{r + 1:<7}{got[1][0]:>12.0f}{got[n][0]:>14.0f}{ratios[-1]:>9.2f}x{others:>11.0%}")
    print(f"median speed-up of {n} threads over 1: {statistics.median(ratios):.2f}x "
          f"(target >= {0.85 * n:.2f}x)")


if __name__ == "__main__":
    main()

"""Per-image cost of ``conveyor.image.train_transform`` against a naive Pillow pipeline.

One thread, no loader: this measures the map function alone. The naive pipeline is what
torchvision's ``ImageFolder`` + ``RandomResizedCrop`` + ``RandomHorizontalFlip`` does with
PIL: full decode, ``convert("RGB")``, crop, bilinear resize, flip, to a CHW uint8 tensor.
Both draw the same crop from the same rng, so the work differs only in how it is done.

Two inputs: the bundled ImageNet-sized sample (``examples/data/imagenet-sample/train``) and
one generated camera-sized JPEG (3000x2000).

    python benchmarks/decode_micro.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import io
import random
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from conveyor.image import random_resized_crop_box, train_transform

SAMPLE = Path(__file__).resolve().parents[1] / "examples/data/imagenet-sample/train"


def naive(item: dict, *, size: int = 224, rng: random.Random) -> dict:
    """Full decode, then crop and resize: the usual PIL pipeline."""
    img = Image.open(io.BytesIO(item["bytes"])).convert("RGB")
    top, left, h, w = random_resized_crop_box(img.width, img.height, rng=rng)
    img = img.crop((left, top, left + w, top + h)).resize((size, size), Image.Resampling.BILINEAR)
    if rng.random() < 0.5:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    image = torch.from_numpy(np.asarray(img).transpose(2, 0, 1).copy())
    return {"image": image, "label": item["label"], "index": item["index"]}


def camera_jpeg(width: int = 3000, height: int = 2000, seed: int = 0) -> bytes:
    """A camera-sized JPEG with smooth structure and fine grain, quality 90."""
    rng = np.random.default_rng(seed)
    small = Image.fromarray(rng.integers(0, 256, (height // 50, width // 50, 3), dtype=np.uint8))
    base = np.asarray(small.resize((width, height), Image.Resampling.BICUBIC), np.float32)
    base = base + rng.normal(0, 6, (height, width, 1)).astype(np.float32)
    buf = io.BytesIO()
    Image.fromarray(np.clip(base, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def per_image_ms(fn, items: list[dict], repeats: int) -> float:
    """Median over repeats of the mean time per item, in milliseconds."""
    runs = []
    for r in range(repeats):
        start = time.perf_counter()
        for item in items:
            fn(item, rng=random.Random(r * 100003 + item["index"]))
        runs.append((time.perf_counter() - start) / len(items) * 1e3)
    return statistics.median(runs)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    files = sorted(SAMPLE.glob("*/*.JPEG"))
    items = [{"bytes": f.read_bytes(), "label": 0, "index": i} for i, f in enumerate(files)]
    big = [{"bytes": camera_jpeg(), "label": 0, "index": i} for i in range(8)]
    print(f"{'input':<28}{'naive ms':>10}{'conveyor ms':>13}{'speed-up':>10}")
    for name, batch in ((f"sample ({len(items)} JPEGs)", items), ("3000x2000 JPEG", big)):
        per_image_ms(train_transform, batch[:4], 1)  # warm up
        slow = per_image_ms(naive, batch, args.repeats)
        fast = per_image_ms(train_transform, batch, args.repeats)
        print(f"{name:<28}{slow:>10.2f}{fast:>13.2f}{slow / fast:>9.2f}x")


if __name__ == "__main__":
    main()

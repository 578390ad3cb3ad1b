"""Camera-size shards packed as-is against packed with ``--resize 320`` (issue 12.6).

Generates ``--count`` camera-like JPEGs (3000x2000, ``_common.camera_like_jpeg``: smooth colour
fields, hard edges, stripes and grain; deterministic) in a temporary ImageNet-layout folder,
packs them twice — as they are, and with ``pack(..., resize=320)`` — and prints:

* pack time and bytes of each;
* ``specs/imagenet-shards.yaml`` (224 px train crops, 2 decode threads) on each: a fresh loader
  per round, rounds alternating, 3 epochs per loader, the rate over epochs 2-3 (after start-up)
  and the first-batch latency;
* per image on one thread: ``conveyor.image.train_transform`` (224 px) on the samples of each,
  the median of 3 alternating passes over all of them (what decode costs, free of the
  per-epoch start-up that dominates an epoch of 60 small images);
* quality: PSNR of each packed-resized image against the original decoded in full and resized
  to the same size with Lanczos in one step (no re-encode), for ``--quality`` 90 (the default)
  and 95, and for the bundled ImageNet-size sample at ``--resize 256``.

    flock /tmp/bench.lock python benchmarks/pack_resize.py [--count 60] [--rounds 3]
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import _common as C  # noqa: E402

from conveyor import load_graph  # noqa: E402
from conveyor.pack import pack  # noqa: E402
from conveyor.pack import shrink, target_size  # noqa: E402


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


def quality_of(files: list[Path], shorter: int, quality: int) -> list[float]:
    """PSNR of shrink() against a full decode resized with Lanczos to the same size."""
    out = []
    for f in files:
        data = f.read_bytes()
        small = shrink(data, shorter, quality=quality)
        if small is None:
            continue
        with Image.open(io.BytesIO(data)) as img:
            ref = img.convert("RGB").resize(target_size(*img.size, shorter), Image.Resampling.LANCZOS)
        with Image.open(io.BytesIO(small)) as img:
            got = img.convert("RGB")
        out.append(psnr(np.asarray(ref), np.asarray(got)))
    return out


def kernel_ms(root: Path) -> float:
    """Median ms of train_transform per sample of the shards under ``root``, one thread."""
    import random

    import torch

    from conveyor.image import train_transform
    from conveyor.nodes.list_files import ListFiles
    from conveyor.nodes.read_tar import ReadTar

    torch.set_num_threads(1)
    node = ReadTar(ListFiles(url=f"{root}/*.tar"))
    samples = list(node)
    node.close()
    times = []
    for s in samples:
        t = time.perf_counter()
        train_transform(s, rng=random.Random(s["index"]), size=224)
        times.append(time.perf_counter() - t)
    return 1000 * C.median(times)


BATCH = 8  # the shards spec's batch size here


def epochs_rate(root: Path, epochs: int = 3) -> tuple[float, float]:
    """(images/s over epochs 2.., first-batch seconds) of the shards spec on ``root``."""
    with load_graph(ROOT / "specs/imagenet-shards.yaml", root=str(root), batch_size=BATCH,
                    shuffle_window=64) as loader:
        t0 = time.perf_counter()
        first = None
        n, t1 = 0, None
        for e in range(epochs):
            for batch in loader:
                if first is None:
                    first = time.perf_counter() - t0
                if e >= 1:
                    n += len(batch["label"])
            if e == 0:
                t1 = time.perf_counter()
        return n / (time.perf_counter() - t1), first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--resize", type=int, default=320)
    args = ap.parse_args()
    if args.count < BATCH:
        ap.error(f"--count {args.count}: at least one batch of {BATCH} images is needed for a rate")
    with tempfile.TemporaryDirectory(prefix="pack-resize-") as tmp:
        src = Path(tmp) / "src"
        t = time.perf_counter()
        files = C.write_imagenet_folder(src, args.count, classes=4, width=3000, height=2000)
        print(f"generated {len(files)} images of 3000x2000 in {time.perf_counter() - t:.1f} s", flush=True)
        packed = {}
        for name, kw in [("as-is", {}), (f"--resize {args.resize}", {"resize": args.resize})]:
            dst = Path(tmp) / name.replace(" ", "").replace("-", "")
            t = time.perf_counter()
            index = pack(str(src), str(dst), shard_size="64MB", **kw)
            took = time.perf_counter() - t
            size = sum(s["bytes"] for s in index["shards"])
            packed[name] = dst
            print(f"pack {name}: {took:.1f} s, {size / 1e6:.1f} MB in {len(index['shards'])} shard(s)", flush=True)
        rates: dict[str, list[tuple[float, float]]] = {n: [] for n in packed}
        for r in range(args.rounds):
            for name in (list(packed) if r % 2 == 0 else list(reversed(packed))):
                cpu0, t = C.cpu_snapshot(), time.perf_counter()
                rate, first = epochs_rate(packed[name])
                share = C.foreign_share(cpu0, C.cpu_snapshot(), time.perf_counter() - t)
                rates[name].append((rate, first))
                print(f"round {r} {name:>13}: {rate:7.1f} img/s (epochs 2-3), first batch {first:.2f} s, "
                      f"others used {share:.0%} of the CPUs", flush=True)
        kernel: dict[str, list[float]] = {n: [] for n in packed}
        for r in range(3):
            for name in (list(packed) if r % 2 == 0 else list(reversed(packed))):
                kernel[name].append(kernel_ms(packed[name]))
        print("train_transform ms per image, one thread:", {n: [round(x, 2) for x in v] for n, v in kernel.items()})
        base = C.median([x[0] for x in rates["as-is"]])
        print()
        k0 = C.median(kernel["as-is"])
        print(C.md_table(["shards", "img/s, epochs 2-3 (median)", "x as-is", "first batch s (median)",
                          "train_transform ms/img, 1 thread", "x as-is"],
                         [[n, f"{C.median([x[0] for x in v]):.1f}", f"{C.median([x[0] for x in v]) / base:.2f}",
                           f"{C.median([x[1] for x in v]):.2f}", f"{C.median(kernel[n]):.2f}",
                           f"{k0 / C.median(kernel[n]):.1f}"] for n, v in rates.items()],
                         [False, True, True, True, True, True]))
        print()
        rows = []
        for q in (90, 95):
            p = quality_of(files, args.resize, q)
            rows.append([f"camera-like 3000x2000, --resize {args.resize}", q, len(p),
                         f"{np.median(p):.1f}", f"{min(p):.1f}"])
        sample = sorted((ROOT / "examples/data/imagenet-sample/train").glob("*/*.JPEG"))
        for q in (90, 95):
            p = quality_of(sample, 256, q)
            rows.append(["bundled sample (ImageNet-size), --resize 256", q, len(p),
                         f"{np.median(p):.1f}", f"{min(p):.1f}"])
        print(C.md_table(["images", "--quality", "n", "median PSNR dB", "min PSNR dB"], rows,
                         [False, True, True, True, True]))


if __name__ == "__main__":
    main()

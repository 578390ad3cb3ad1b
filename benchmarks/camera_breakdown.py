"""Where a camera-sized sample's time goes, per core: conveyor's kernel against the Pillow
transform the DataLoader contender runs (issue 12, camera-sized target).

Generated 3000x2000 JPEGs (``_common.camera_like_jpeg``, quality 90, ~1.7 MB, 4:2:0) and the
crop boxes ``train_transform`` draws for seeds 0..``--samples``; each stage is timed alone on
one thread, as CPU time of the calling thread (user + system, ``RUSAGE_THREAD``), so a shared
machine moves it little; the stages take turns (``--repeats`` rounds, medians), so a change
in the machine's load moves them alike. Stages:

* conveyor: file read; header + crop box; libjpeg decode at the DCT scale the box allows (and,
  for reference, every sample decoded at 1/1, 1/2, 1/4 and 1/8, and with simplejpeg's
  ``fastdct``/``fastupsample``); the resize of the box (torch's kernel, shifted for boxes
  between pixels, or Pillow's box resize, the path before); flip + tensor copy; the whole
  ``train_transform``.
* Pillow (``_common.full_train_transform``): decode + ``convert("RGB")``; crop + BILINEAR
  resize; flip + tensor; the whole transform.

    python benchmarks/camera_breakdown.py [--images 8] [--samples 64] [--repeats 5]
"""

from __future__ import annotations

import argparse
import io
import random
import resource
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Callable

import numpy as np
import simplejpeg
from PIL import Image

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import _common as C  # noqa: E402
from conveyor import _pixels as px  # noqa: E402
from conveyor import image as ci  # noqa: E402

OUT = 224


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_THREAD)
    return r.ru_utime + r.ru_stime


def per_sample(fn: Callable[[int], object], n: int, repeats: int) -> float:
    """Median over ``repeats`` of the mean CPU ms of ``fn(i)`` for i in 0..n-1."""
    runs = []
    for _ in range(repeats):
        t = cpu()
        for i in range(n):
            fn(i)
        runs.append(1e3 * (cpu() - t) / n)
    return statistics.median(runs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=8)
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--dir", default=None, help="where to write the JPEGs (default: a temp dir)")
    a = p.parse_args(argv)
    import tempfile

    tmp = Path(a.dir or tempfile.mkdtemp(prefix="conveyor-camera-"))
    paths = []
    for k in range(a.images):
        f = tmp / f"camera_{k}.JPEG"
        if not f.exists():
            f.write_bytes(C.camera_like_jpeg(3000, 2000, seed=k))
        paths.append(f)
    datas = [f.read_bytes() for f in paths]
    n = a.samples
    items = [{"path": str(paths[i % len(paths)]), "index": i, "label": 0} for i in range(n)]
    boxes, scales = [], []
    for i in range(n):
        top, left, h, w = ci.random_resized_crop_box(3000, 2000, rng=random.Random(i))
        boxes.append((left, top, left + w, top + h))
        scales.append(ci._draft_scale(w, h, OUT, OUT))
    decoded = {}
    for i in range(n):
        s = scales[i]
        key = (i % len(datas), s)
        if key not in decoded:
            decoded[key] = simplejpeg.decode_jpeg(datas[key[0]], min_width=-(-3000 // s),
                                                  min_height=-(-2000 // s))

    def arr(i: int) -> np.ndarray:
        return decoded[(i % len(datas), scales[i])]

    def rbox(i: int) -> tuple[float, ...]:
        return tuple(v / scales[i] for v in boxes[i])

    def decode_at(s: int, **kw) -> Callable[[int], object]:
        return lambda i: simplejpeg.decode_jpeg(datas[i % len(datas)], min_width=-(-3000 // s),
                                                min_height=-(-2000 // s), strict=True, **kw)

    def read(i: int) -> bytes:
        with open(items[i]["path"], "rb") as f:
            return f.read()

    def header_box(i: int) -> tuple[int, int, int, int]:
        pic = px.Picture(datas[i % len(datas)])
        return ci.random_resized_crop_box(pic.width, pic.height, rng=random.Random(i))

    def pil_resize(i: int) -> np.ndarray:
        img = Image.fromarray(arr(i)).resize((OUT, OUT), Image.Resampling.BILINEAR, box=rbox(i))
        return np.asarray(img).transpose(2, 0, 1)

    full = {k: Image.open(io.BytesIO(d)).convert("RGB") for k, d in enumerate(datas)}
    small = px.resize_box(arr(0), rbox(0), OUT, OUT)
    mix = ", ".join(f"1/{s} ×{c}" for s, c in sorted(Counter(scales).items()))
    stages: list[tuple[str, str, Callable[[int], object]]] = [
        ("conveyor", "read the file (~1.7 MB, page cache)", read),
        ("conveyor", "header + crop box", header_box),
        ("conveyor", f"libjpeg decode at the box's DCT scale ({mix})", lambda i: decode_at(scales[i])(i)),
        ("conveyor", "  same, fastdct + fastupsample",
         lambda i: decode_at(scales[i], fastdct=True, fastupsample=True)(i)),
        *[("conveyor", f"  every sample at 1/{s}", decode_at(s)) for s in (1, 2, 4, 8)],
        ("conveyor", "resize of the box: torch's kernel (shifted where the box is between pixels)",
         lambda i: px.resize_box(arr(i), rbox(i), OUT, OUT)),
        ("conveyor", "  same boxes through Pillow's box resize (the path before)", pil_resize),
        ("conveyor", "flip + tensor copy", lambda i: ci._to_tensor(small, flip=True)),
        ("conveyor", "whole train_transform (read included)",
         lambda i: ci.train_transform(items[i], rng=random.Random(i))),
        ("Pillow", "decode + convert(\"RGB\")",
         lambda i: Image.open(io.BytesIO(datas[i % len(datas)])).convert("RGB")),
        ("Pillow", "crop + BILINEAR resize",
         lambda i: full[i % len(datas)].crop(boxes[i]).resize((OUT, OUT), Image.Resampling.BILINEAR)),
        ("Pillow", "whole full_train_transform (read included)",
         lambda i: C.full_train_transform(items[i], rng=random.Random(i))),
    ]
    # round-robin: every stage once per repeat, so a change in the machine's load moves all alike
    times: list[list[float]] = [[] for _ in stages]
    for _ in range(a.repeats):
        for k, (_, _, fn) in enumerate(stages):
            times[k].append(per_sample(fn, n, 1))
    r = a.repeats
    rows = [(x, y, statistics.median(t)) for (x, y, _), t in zip(stages, times)]
    shifted = sum(px._interpolate_shifted(arr(i), rbox(i), OUT, OUT) is not None for i in range(n))
    print(f"{n} samples over {len(paths)} generated 3000x2000 JPEGs; CPU ms per sample "
          f"(median of {r}); {shifted}/{n} boxes between pixels went through torch's kernel")
    print()
    print(C.md_table(["path", "stage", "CPU ms per sample"], [(x, y, f"{z:.2f}") for x, y, z in rows],
                     [False, False, True]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

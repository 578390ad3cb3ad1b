"""Generate the small ImageNet-shaped sample that the examples, specs and tests read.

Writes ``imagenet-sample/{train,val}/<wnid>/<wnid>_<n>.JPEG`` next to this file: 10 classes
(Imagenette's wnids), 20 train and 4 val images each, at ImageNet's typical sizes (sides
of 333 to 500 pixels, landscape and portrait), JPEG quality 87. Each class has its own
procedural scene (fractal noise, gradients, stripes, shapes) and every image varies it, so
crops and flips change the pixels the way they do on photographs. Like ImageNet, train
holds a few grayscale JPEGs and one CMYK JPEG.

Deterministic: every image comes from a numpy generator seeded by (seed, class, split, n),
so running it again writes the same files (given the same Pillow/libjpeg). Stale
``.JPEG`` files in the class folders are removed.

Usage::

    python examples/data/make_imagenet_sample.py            # writes, prints the total size
    python examples/data/make_imagenet_sample.py --out /tmp/sample --seed 1
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter


DEFAULT_OUT = Path(__file__).resolve().parent / "imagenet-sample"
TRAIN_PER_CLASS = 20
VAL_PER_CLASS = 4
QUALITY = 87

# wnid, name, palette (dark, mid, light RGB), background, shapes
CLASSES: list[tuple[str, str, tuple, str, str]] = [
    ("n01440764", "tench", ((30, 45, 25), (90, 110, 60), (170, 160, 110)), "fbm", "fish"),
    ("n02102040", "English springer",
     ((60, 35, 20), (140, 90, 50), (235, 225, 210)), "blobs", "ellipses"),
    ("n02979186", "cassette player",
     ((20, 20, 25), (110, 110, 120), (200, 200, 205)), "gradient", "rects"),
    ("n03000684", "chain saw", ((25, 25, 20), (200, 90, 20), (240, 190, 60)), "fbm", "polygons"),
    ("n03028079", "church", ((70, 60, 55), (150, 140, 130), (150, 190, 235)), "stripes", "church"),
    ("n03394916", "French horn",
     ((40, 25, 10), (170, 120, 40), (250, 215, 120)), "gradient", "rings"),
    ("n03417042", "garbage truck",
     ((50, 50, 45), (60, 130, 60), (210, 210, 190)), "gradient", "truck"),
    ("n03425413", "gas pump", ((40, 20, 20), (190, 30, 30), (235, 235, 230)), "stripes", "rects"),
    ("n03445777", "golf ball", ((20, 70, 20), (60, 140, 50), (245, 245, 240)), "fbm", "ball"),
    ("n03888605", "parachute",
     ((60, 110, 170), (120, 170, 220), (230, 240, 250)), "gradient", "wedges"),
]
# (class index, train image index) saved as grayscale / CMYK JPEGs, as ImageNet has some.
GRAYSCALE = {(2, 3), (5, 7), (9, 11)}
CMYK = {(6, 5)}


def _size(rng: np.random.Generator) -> tuple[int, int]:
    """(width, height) in ImageNet's usual range, mostly landscape."""
    short = int(rng.choice([333, 334, 375, 375, 375, 400, 450, 500]))
    long = 500 if short < 500 else int(rng.integers(375, 501))
    return (long, short) if rng.random() < 0.7 else (short, long)


def _fbm(rng: np.random.Generator, w: int, h: int, octaves: int, persistence: float) -> np.ndarray:
    """Fractal (plasma-like) noise in [0, 1], float32 (h, w)."""
    out = np.zeros((h, w), np.float32)
    amp, total = 1.0, 0.0
    for o in range(octaves):
        cells = 2 ** (o + 1)
        grid = rng.random((cells + 1, cells + 1)).astype(np.float32)
        layer = Image.fromarray(grid, mode="F").resize((w, h), Image.Resampling.BICUBIC)
        out += amp * np.asarray(layer)
        total += amp
        amp *= persistence
    out /= total
    lo, hi = out.min(), out.max()
    return (out - lo) / max(hi - lo, 1e-6)


def _colorize(t: np.ndarray, palette: tuple) -> np.ndarray:
    """Map values in [0, 1] through a 3-stop palette to uint8 RGB."""
    stops = np.array(palette, np.float32)
    xs = np.array([0.0, 0.5, 1.0], np.float32)
    rgb = np.stack([np.interp(t, xs, stops[:, c]) for c in range(3)], axis=-1)
    return rgb.astype(np.uint8)


def _background(kind: str, rng: np.random.Generator, w: int, h: int, palette: tuple) -> np.ndarray:
    noise = _fbm(rng, w, h, octaves=6, persistence=float(rng.uniform(0.45, 0.6)))
    if kind == "fbm":
        t = noise
    elif kind == "blobs":  # patchy fur-like areas
        t = np.clip((noise - 0.5) * 4 + 0.5, 0, 1) * 0.8 + 0.2 * _fbm(rng, w, h, 7, 0.7)
    elif kind == "gradient":
        angle = rng.uniform(0, np.pi)
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        g = xx * np.cos(angle) + yy * np.sin(angle)
        g = (g - g.min()) / (g.max() - g.min())
        t = 0.7 * g + 0.3 * noise
    elif kind == "stripes":
        angle = rng.uniform(-0.3, 0.3) + (np.pi / 2 if rng.random() < 0.5 else 0)
        period = rng.uniform(12, 40)
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        s = 0.5 + 0.5 * np.sin((xx * np.cos(angle) + yy * np.sin(angle)) * 2 * np.pi / period)
        t = 0.5 * s + 0.5 * noise
    else:
        raise ValueError(f"unknown background {kind=}")
    return _colorize(t, palette)


def _jitter(color: tuple, rng: np.random.Generator, amount: int = 40) -> tuple[int, int, int]:
    return tuple(int(np.clip(c + rng.integers(-amount, amount + 1), 0, 255)) for c in color)


def _shapes(kind: str, rng: np.random.Generator, img: Image.Image, palette: tuple) -> None:
    """Draw the class's foreground onto ``img`` in place."""
    w, h = img.size
    d = ImageDraw.Draw(img)
    dark, mid, light = palette

    def ri(lo: int, hi: int) -> int:
        return int(rng.integers(lo, hi))

    def jit(color: tuple, amount: int = 40) -> tuple[int, int, int]:
        return _jitter(color, rng, amount)

    cx, cy = ri(w // 4, 3 * w // 4), ri(h // 4, 3 * h // 4)
    r = int(min(w, h) * rng.uniform(0.2, 0.4))
    if kind == "fish":
        for _ in range(ri(1, 3)):
            x, y = ri(0, w), ri(0, h)
            lw, lh = ri(120, 260) // 2, ri(40, 90) // 2  # half length, half height
            col = jit(mid)
            d.ellipse([x - lw, y - lh, x + lw, y + lh], fill=col, outline=dark, width=3)
            d.polygon([(x + lw - 5, y), (x + lw + 40, y - 30), (x + lw + 40, y + 30)], fill=col)
            for k in range(12):  # scales
                sx = x - 2 * lw // 3 + k * 2 * lw // 18
                d.arc([sx - 10, y - 15, sx + 10, y + 15], 270, 90, fill=jit(dark, 20), width=2)
            d.ellipse([x - lw + 12, y - 8, x - lw + 24, y + 4], fill=(10, 10, 10))
    elif kind == "ellipses":
        for _ in range(ri(6, 14)):
            x, y = ri(0, w), ri(0, h)
            a, b = ri(15, 90), ri(15, 90)
            d.ellipse([x - a, y - b, x + a, y + b], fill=jit(dark if rng.random() < 0.6 else light))
    elif kind == "rects":
        x0, y0, y1 = cx - r, cy - int(r * 0.7), cy + int(r * 0.7)
        d.rectangle([x0, y0, cx + r, y1], fill=jit(mid), outline=dark, width=4)
        for k in range(ri(3, 7)):  # buttons / display
            bx = x0 + 10 + k * (2 * r - 20) // 6
            d.rectangle([bx, y0 + 10, bx + (2 * r - 20) // 8, y0 + 10 + r // 3], fill=jit(dark, 15))
        for k in (0.35, 0.65):  # reels / dials
            ex, er = int(x0 + 2 * r * k), r // 5
            d.ellipse([ex - er, cy, ex + er, cy + 2 * er], fill=jit(light), outline=dark, width=3)
    elif kind == "polygons":
        for _ in range(ri(3, 7)):
            pts = [(ri(0, w), ri(0, h)) for _ in range(ri(3, 6))]
            d.polygon(pts, fill=jit(mid if rng.random() < 0.7 else light))
        ya, yb = ri(0, h), ri(0, h)
        d.line([(0, ya), (w, yb)], fill=dark, width=ri(8, 20))
    elif kind == "church":
        bw, bh = int(w * rng.uniform(0.3, 0.5)), int(h * rng.uniform(0.35, 0.55))
        x0, y1 = cx - bw // 2, h - ri(0, h // 8)
        top = y1 - bh
        d.rectangle([x0, top, x0 + bw, y1], fill=jit(mid), outline=dark, width=3)
        roof = [(x0 - 10, top), (x0 + bw // 2, top - int(bh * 0.6)), (x0 + bw + 10, top)]
        d.polygon(roof, fill=jit(dark))
        for k in range(3):  # windows
            wx = x0 + bw // 6 + k * bw // 3 - 8
            glass = jit((40, 60, 120), 20)
            d.rounded_rectangle([wx, top + 20, wx + 16, y1 - bh // 3], radius=8, fill=glass)
    elif kind == "rings":
        for k in range(ri(5, 10), 0, -1):
            rr = r * k // 8
            col = jit(light if k % 2 else mid)
            d.ellipse([cx - rr, cy - rr, cx + rr, cy + rr], outline=col, width=ri(4, 10))
        d.line([(cx, cy), (cx + r * 2, cy - r)], fill=jit(light), width=12)
    elif kind == "truck":
        tw, th = int(w * rng.uniform(0.5, 0.75)), int(h * rng.uniform(0.3, 0.45))
        x0, y1 = max(0, cx - tw // 2), int(h * rng.uniform(0.7, 0.9))
        d.rectangle([x0, y1 - th, x0 + tw, y1], fill=jit(mid), outline=dark, width=4)
        cab = [x0 + tw, y1 - th // 2, x0 + tw + tw // 4, y1]
        d.rectangle(cab, fill=jit(light), outline=dark, width=4)
        for wx in (x0 + tw // 6, x0 + tw // 2, x0 + tw + tw // 8):
            wheel = [wx - 25, y1 - 25, wx + 25, y1 + 25]
            d.ellipse(wheel, fill=(25, 25, 25), outline=(120, 120, 120), width=6)
    elif kind == "ball":
        ball = [cx - r, cy - r, cx + r, cy + r]
        d.ellipse(ball, fill=jit(light, 10), outline=(180, 180, 180), width=2)
        for _ in range(60):  # dimples
            a, rad = rng.uniform(0, 2 * np.pi), r * np.sqrt(rng.uniform(0, 0.85))
            px, py = cx + rad * np.cos(a), cy + rad * np.sin(a)
            d.ellipse([px - 5, py - 5, px + 5, py + 5], fill=(200, 200, 195))
    elif kind == "wedges":
        turn = rng.uniform(0, 360) % 10
        n = ri(6, 12)
        base = ((220, 40, 40), (240, 200, 40), (40, 80, 200), (250, 250, 250))
        colors = [jit(c, 30) for c in base]
        canopy = [cx - r, cy - r, cx + r, cy + r]
        for k in range(n):
            a0 = 180 + k * 180 / n + turn
            d.pieslice(canopy, a0, a0 + 180 / n, fill=colors[k % 4])
        for k in range(n + 1):  # lines
            a = np.pi + k * np.pi / n
            rim = (cx + r * np.cos(a), cy + r * np.sin(a))
            d.line([rim, (cx, cy + 1.6 * r)], fill=(60, 60, 60), width=1)
    else:
        raise ValueError(f"unknown shapes {kind=}")


def make_image(class_index: int, split: str, n: int, seed: int = 0) -> Image.Image:
    """One RGB image of a class; the same arguments always give the same pixels."""
    _, _, palette, background, shapes = CLASSES[class_index]
    rng = np.random.default_rng([seed, class_index, 0 if split == "train" else 1, n])
    palette = tuple(_jitter(c, rng, 25) for c in palette)
    w, h = _size(rng)
    img = Image.fromarray(_background(background, rng, w, h, palette))
    _shapes(shapes, rng, img, palette)
    img = img.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.6, 1.2))))
    grain = rng.normal(0.0, 2.5, (h, w, 1)).astype(np.float32)
    arr = np.clip(np.asarray(img, np.float32) + grain, 0, 255).astype(np.uint8)
    return Image.fromarray(arr)


def _file_ids(class_index: int, seed: int) -> list[int]:
    """ImageNet-looking file numbers, unique within the class."""
    rng = np.random.default_rng([seed, class_index, 2])
    ids = rng.choice(np.arange(1, 15000), TRAIN_PER_CLASS + VAL_PER_CLASS, replace=False)
    return sorted(int(i) for i in ids)


def generate(out: Path = DEFAULT_OUT, seed: int = 0) -> int:
    """Write the sample under ``out``; returns its total size in bytes."""
    total = 0
    for c, (wnid, *_rest) in enumerate(CLASSES):
        ids = _file_ids(c, seed)
        for split, numbers in (("train", ids[:TRAIN_PER_CLASS]), ("val", ids[TRAIN_PER_CLASS:])):
            folder = out / split / wnid
            folder.mkdir(parents=True, exist_ok=True)
            wanted = set()
            for n, number in enumerate(numbers):
                img = make_image(c, split, n, seed)
                if split == "train" and (c, n) in GRAYSCALE:
                    img = img.convert("L")
                elif split == "train" and (c, n) in CMYK:
                    img = img.convert("CMYK")
                path = folder / f"{wnid}_{number}.JPEG"
                img.save(path, "JPEG", quality=QUALITY, optimize=True)
                wanted.add(path.name)
                total += path.stat().st_size
            for stale in folder.glob("*.JPEG"):
                if stale.name not in wanted:
                    stale.unlink()
    return total


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="sample root (default: %(default)s)"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    total = generate(args.out, args.seed)
    n = len(CLASSES) * (TRAIN_PER_CLASS + VAL_PER_CLASS)
    print(f"wrote {n} images to {args.out}: {total / 1e6:.2f} MB ({total / n / 1e3:.1f} KB each)")


if __name__ == "__main__":
    main()

"""The image kernels (simplejpeg decode, torch antialiased resize): the same pixels as a plain
Pillow pipeline on the same boxes, bad JPEGs that fail instead of decoding into wrong pixels,
and no intra-op threads started by a transform."""

from __future__ import annotations

import io
import math
import os
import random
import statistics
import tarfile
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conveyor import image as ci
from conveyor._pixels import mirror_into
from conveyor.errors import SampleError
from conveyor.nodes.list_files import ListFiles
from conveyor.nodes.read_tar import ReadTar

OUT = 224
BILINEAR = Image.Resampling.BILINEAR


def _photo(width: int, height: int, seed: int) -> bytes:
    """A JPEG (quality 90) of smooth colour structure plus grain, like a photograph."""
    rng = np.random.default_rng(seed)
    cells = (max(height // 40, 2), max(width // 40, 2), 3)
    small = Image.fromarray(rng.integers(0, 256, cells, dtype=np.uint8))
    base = np.asarray(small.resize((width, height), Image.Resampling.BICUBIC), np.float32)
    base += rng.normal(0, 6, (height, width, 1)).astype(np.float32)
    buf = io.BytesIO()
    Image.fromarray(np.clip(base, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * math.log10(255.0**2 / mse)


def _hwc(t) -> np.ndarray:
    return t.permute(1, 2, 0).numpy()


def _train_vs_pil(data: bytes, seeds: range) -> list[float]:
    """PSNR of train_transform against Pillow on the same box: full decode, BILINEAR resize."""
    full = Image.open(io.BytesIO(data)).convert("RGB")
    out = []
    for seed in seeds:
        ours = ci.train_transform({"bytes": data, "index": 0}, flip=False, rng=random.Random(seed))
        top, left, h, w = ci.random_resized_crop_box(*full.size, rng=random.Random(seed))
        ref = full.resize((OUT, OUT), BILINEAR, box=(left, top, left + w, top + h))
        out.append(_psnr(_hwc(ours["image"]), np.asarray(ref)))
    return out


def _eval_vs_pil(data: bytes) -> float:
    """PSNR of eval_transform against Pillow: full decode, Resize(256) BILINEAR, CenterCrop."""
    full = Image.open(io.BytesIO(data)).convert("RGB")
    w, h = full.size
    new_w, new_h = (256, int(256 * h / w)) if w <= h else (int(256 * w / h), 256)
    top, left = round((new_h - OUT) / 2), round((new_w - OUT) / 2)
    ref = full.resize((new_w, new_h), BILINEAR).crop((left, top, left + OUT, top + OUT))
    return _psnr(_hwc(ci.eval_transform({"bytes": data, "index": 0})["image"]), np.asarray(ref))


# --- same pixels ------------------------------------------------------------------------


def test_imagenet_sized_train_and_eval_match_pillow_on_the_same_box():
    sizes = [(450, 360), (360, 450), (500, 375), (448, 336)]
    train, evals = [], []
    for i, (w, h) in enumerate(sizes):
        data = _photo(w, h, seed=i)
        train += _train_vs_pil(data, range(10 * i, 10 * i + 10))
        evals.append(_eval_vs_pil(data))
    assert statistics.median(train) >= 50, sorted(train)
    assert min(train) >= 40, sorted(train)
    assert statistics.median(evals) >= 50 and min(evals) >= 45, evals


def test_camera_sized_reduced_decode_matches_pillow_on_the_same_box(monkeypatch):
    scales = []
    real = ci.px.Picture.decode

    def spy(self, *args, **kwargs):
        arr, s = real(self, *args, **kwargs)
        scales.append(s)
        return arr, s

    monkeypatch.setattr(ci.px.Picture, "decode", spy)
    data = _photo(3000, 2000, seed=7)
    train = _train_vs_pil(data, range(8))
    assert statistics.median(train) >= 40 and min(train) >= 35, sorted(train)
    assert max(scales) >= 4  # the DCT-reduced decode was used
    # eval: a reduction that divides the image (whole-image resize) and one that does not
    # (the box resized directly)
    evals = [_eval_vs_pil(data), _eval_vs_pil(_photo(2001, 2999, seed=8))]
    assert min(evals) >= 40, evals
    assert min(scales[-2:]) >= 4


def test_a_box_between_pixels_is_resized_by_torch_where_pillow_puts_it():
    """A DCT-reduced decode leaves box edges between pixels; torch's kernel takes them through
    extra leading outputs (px._interpolate_shifted) instead of Pillow's slower box resize."""
    arr = np.asarray(Image.open(io.BytesIO(_photo(750, 500, seed=14))).convert("RGB"))
    rng = random.Random(1)
    scores, by_torch = [], 0
    boxes = [(0.0, 37.25, 500.5, 400.0), (10.75, 0.5, 749.0, 499.75), (400.125, 250.5, 750, 500)]
    for _ in range(27):
        w, h = rng.uniform(224, 700), rng.uniform(224, 480)
        x0, y0 = rng.uniform(0, 750 - w), rng.uniform(0, 500 - h)
        boxes.append((x0, y0, x0 + w, y0 + h))
    for box in boxes:
        ours = ci.px.resize_box(arr, box, OUT, OUT)
        ref = np.asarray(Image.fromarray(arr).resize((OUT, OUT), BILINEAR, box=box))
        assert ours.shape == (3, OUT, OUT)
        scores.append(_psnr(ours.transpose(1, 2, 0), ref))
        by_torch += ci.px._interpolate_shifted(arr, box, OUT, OUT) is not None
    # (edges rounded to whole pixels instead: 45.7 dB median, 39.7 minimum)
    assert statistics.median(scores) >= 55 and min(scores) >= 50, sorted(scores)
    assert by_torch >= 20


def test_the_lead_puts_an_output_on_the_box_edge():
    rng = random.Random(2)
    found = 0
    for _ in range(2000):
        x0, scale = rng.uniform(0, 400) * rng.choice([0, 1]), rng.uniform(1, 3)
        lead = ci.px._lead(x0, scale)
        if lead is None:
            continue
        found += 1
        m, a = lead
        assert abs(x0 - m * scale - a) <= 1 / 64
        assert a >= 0 or x0 - scale / 2 >= 0.5  # padding is read by dropped outputs only
        assert m > 0 or a == 0
    assert found >= 1500
    assert ci.px._lead(0.25, 1.5) is None  # within a pixel of the edge: Pillow's turn


# --- bad input ------------------------------------------------------------------------------


def _scan_corrupted(good: bytes) -> bytes:
    """40 bytes right after the SOS header XOR'd: Pillow decodes this silently."""
    sos = good.find(b"\xff\xda")
    start = sos + 2 + int.from_bytes(good[sos + 2 : sos + 4], "big")
    bad = bytearray(good)
    for i in range(start, start + 40):
        bad[i] ^= 0xFF
    return bytes(bad)


def _bad_files(tmp_path: Path) -> dict[str, Path]:
    good = _photo(450, 360, seed=3)
    files = {
        "truncated.JPEG": good[: len(good) // 2],
        "zero.JPEG": b"",
        "scan.JPEG": _scan_corrupted(good),
        "text.JPEG": b"this is not an image\n" * 20,
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    return {name: tmp_path / name for name in files}


@pytest.mark.parametrize("width", [224, 60, 58, 61, 1])  # 8-, 4-, 2-byte words, bytes, one column
def test_mirror_into_reverses_each_row(width):
    rng = np.random.default_rng(width)
    src = rng.integers(0, 256, (3, 9, width + 3), dtype=np.uint8)
    for view in (src[:, :, :width], src[:, 1:, 3:], src[:, ::-1, :width], np.asfortranarray(src[:, :, :width])):
        dst = np.empty(view.shape, np.uint8)
        mirror_into(dst, view)
        assert np.array_equal(dst, view[..., ::-1])


@pytest.mark.parametrize("size", [[40, 56], [40, 52], [40, 50], [40, 45]])
def test_flipped_outputs_mirror_the_unflipped_ones_at_every_width(size):
    data = _photo(320, 240, 3)
    seen = set()
    for seed in range(10):
        item = {"bytes": data, "index": 0}
        flipped = ci.train_transform(item, size=size, rng=random.Random(seed))["image"]
        plain = ci.train_transform(item, size=size, flip=False, rng=random.Random(seed))["image"]
        assert flipped.is_contiguous() and tuple(flipped.shape) == (3, *size)
        if np.array_equal(flipped.numpy(), plain.numpy()):
            seen.add("kept")
        else:
            assert np.array_equal(flipped.numpy(), plain.numpy()[..., ::-1])
            seen.add("flipped")
    assert seen == {"kept", "flipped"}


@pytest.mark.parametrize("fn", ["train_transform", "eval_transform", "decode"])
def test_bad_jpegs_raise_sample_error_naming_the_file(tmp_path, fn):
    expect = {
        "truncated.JPEG": "truncated",
        "zero.JPEG": "empty",
        "scan.JPEG": "corrupt",
        "text.JPEG": "not a recognised image",
    }
    call = getattr(ci, fn)
    kwargs = {"rng": random.Random(0)} if fn == "train_transform" else {}
    for name, path in _bad_files(tmp_path).items():
        with pytest.raises(SampleError, match=expect[name]) as info:
            call({"path": str(path), "label": 0, "index": 0}, **kwargs)
        assert str(path) in str(info.value), name


def test_a_jpeg_libjpeg_refuses_is_not_retried_with_pillow(tmp_path):
    scan = _bad_files(tmp_path)["scan.JPEG"]
    with Image.open(scan) as img:  # Pillow alone turns it into wrong pixels, without a word
        img.load()
    for fn in (ci.train_transform, ci.eval_transform, ci.decode):
        kwargs = {"rng": random.Random(0)} if fn is ci.train_transform else {}
        with pytest.raises(SampleError, match=r"Corrupt JPEG data") as info:
            fn({"path": str(scan), "index": 0}, **kwargs)
        assert isinstance(info.value.__cause__, ci.px.JpegError)


def test_other_formats_are_found_by_content_not_by_name(tmp_path):
    img = Image.open(io.BytesIO(_photo(300, 200, seed=4)))
    for fmt in ("PNG", "WEBP"):
        path = tmp_path / f"really_{fmt.lower()}.JPEG"
        img.save(path, fmt)
        out = ci.train_transform({"path": str(path), "index": 0}, size=64, rng=random.Random(0))
        assert out["image"].shape == (3, 64, 64)


def test_a_jpeg_over_pillows_pixel_limit_is_refused_like_pillow_refuses_it(monkeypatch):
    data = _photo(450, 360, seed=9)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 450 * 360 // 2 - 1)
    with pytest.raises(SampleError, match="decompression bomb") as info:
        ci.train_transform({"bytes": data, "index": 3}, rng=random.Random(0))
    assert isinstance(info.value.__cause__, Image.DecompressionBombError)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 450 * 360 // 2)
    assert ci.eval_transform({"bytes": data, "index": 3})["image"].shape == (3, OUT, OUT)


def test_bad_jpeg_in_a_tar_shard_names_the_shard_and_key(tmp_path):
    good = _photo(450, 360, seed=5)
    shard = tmp_path / "shard-000000.tar"
    with tarfile.open(shard, "w") as tar:
        for key, data in (("good_1", good), ("bad_2", _scan_corrupted(good))):
            for ext, payload in (("jpg", data), ("cls", b"1")):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    samples = list(ReadTar(ListFiles(url=f"{tmp_path}/*.tar")))
    assert [s["__key__"] for s in samples] == ["good_1", "bad_2"]
    assert ci.train_transform(samples[0], size=32, rng=random.Random(0))["label"] == 1
    with pytest.raises(SampleError) as info:
        ci.train_transform(samples[1], size=32, rng=random.Random(0))
    assert "'bad_2'" in str(info.value) and str(shard) in str(info.value)


# --- threads ----------------------------------------------------------------------------------


def test_transforms_start_no_intra_op_threads():
    """A decode thread must use one core: torch ops that fan out to OpenMP from a worker
    thread start a thread team per caller (a strided crop into interpolate did)."""
    data = [_photo(450, 360, seed=6), _photo(1200, 800, seed=6)]
    seen: dict[str, set[str]] = {}

    def run() -> None:
        tasks = lambda: set(os.listdir("/proc/self/task"))  # noqa: E731
        before = tasks()
        for i in range(6):
            item = {"bytes": data[i % 2], "index": i}
            ci.train_transform(item, rng=random.Random(i))
            ci.eval_transform(item)
        seen["new"] = tasks() - before

    t = threading.Thread(target=run)
    t.start()
    t.join(timeout=60)
    assert seen["new"] == set()


@pytest.mark.parametrize("w, h", [(3, 700), (900, 4), (20, 2000), (2, 4000)])
def test_eval_of_a_long_thin_image_resizes_only_the_kept_box(w, h, monkeypatch):
    """A 2x4000 strip through Resize(256) is 256x512000 pixels (393 MB) before the centre crop:
    only the box is resized, with Pillow's pixels (an upscale: the box placed to within 1/64 of
    an output pixel, its first outputs' windows not cut short)."""
    rng = np.random.default_rng(w * h)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, format="PNG")
    monkeypatch.setattr(ci.px, "resize_whole", lambda *a: pytest.fail("resized the whole strip"))
    assert _eval_vs_pil(buf.getvalue()) >= 50  # noise: the hardest pixels to match

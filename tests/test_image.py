"""Tests for conveyor.image: shapes, determinism, the fused draft decode, colour modes, errors."""

from __future__ import annotations

import importlib.util
import io
import math
import os
import random
from pathlib import Path

import fsspec
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image, UnidentifiedImageError, features

from conveyor import image as ci
from conveyor.errors import SampleError

OUT = 224
BILINEAR = Image.Resampling.BILINEAR


def _textured(width: int, height: int, seed: int = 0) -> Image.Image:
    """Smooth colour structure plus grain, so a shift of a few pixels changes the pixels."""
    rng = np.random.default_rng(seed)
    cells = (max(height // 40, 2), max(width // 40, 2), 3)
    small = Image.fromarray(rng.integers(0, 256, cells, dtype=np.uint8))
    base = np.asarray(small.resize((width, height), Image.Resampling.BICUBIC), np.float32)
    base = base + rng.normal(0, 6, (height, width, 1)).astype(np.float32)
    return Image.fromarray(np.clip(base, 0, 255).astype(np.uint8))


def _encode(img: Image.Image, fmt: str = "JPEG", **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * math.log10(255.0**2 / mse)


def _hwc(t: torch.Tensor) -> np.ndarray:
    return t.permute(1, 2, 0).numpy()


def _full_resize(full: Image.Image, box: tuple) -> np.ndarray:
    """The reference: a box of the fully decoded image, resized like conveyor does."""
    return np.asarray(full.resize((OUT, OUT), BILINEAR, box=box))


@pytest.fixture(scope="module")
def jpeg_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("img") / "n01440764_1.JPEG"
    path.write_bytes(_encode(_textured(500, 375), quality=90))
    return path


@pytest.fixture(scope="module")
def big_jpeg(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("big") / "camera.jpg"
    path.write_bytes(_encode(_textured(3000, 2000, seed=1), quality=90))
    return path


@pytest.fixture(scope="module")
def big_full(big_jpeg) -> Image.Image:
    return Image.open(big_jpeg).convert("RGB")


def _item(path: Path, index: int = 0) -> dict:
    return {"path": str(path), "label": 3, "index": index}


# --- output shape and determinism ------------------------------------------------------


def test_train_output_shape_dtype_contiguous(jpeg_file):
    out = ci.train_transform(_item(jpeg_file, 5), rng=random.Random(0))
    assert set(out) == {"image", "label", "index"}
    assert out["label"] == 3 and out["index"] == 5
    img = out["image"]
    assert img.dtype == torch.uint8 and img.shape == (3, OUT, OUT) and img.is_contiguous()
    assert img.float().std() > 5  # not blank


def test_train_size_height_width(jpeg_file):
    img = ci.train_transform(_item(jpeg_file), size=[160, 192], rng=random.Random(0))["image"]
    assert img.shape == (3, 160, 192) and img.is_contiguous()


def test_same_seed_same_tensor_different_seed_different_crop(jpeg_file):
    a = ci.train_transform(_item(jpeg_file), rng=random.Random(42))["image"]
    b = ci.train_transform(_item(jpeg_file), rng=random.Random(42))["image"]
    assert torch.equal(a, b)
    boxes = {ci.random_resized_crop_box(500, 375, rng=random.Random(s)) for s in range(5)}
    assert len(boxes) == 5
    c = ci.train_transform(_item(jpeg_file), rng=random.Random(43))["image"]
    assert not torch.equal(a, c)


def test_flip_mirrors_the_same_crop(jpeg_file):
    seen = set()
    for seed in range(12):
        flipped = ci.train_transform(_item(jpeg_file), rng=random.Random(seed))["image"]
        plain = ci.train_transform(_item(jpeg_file), flip=False, rng=random.Random(seed))["image"]
        if torch.equal(flipped, plain):
            seen.add("kept")
        else:
            assert torch.equal(flipped, plain.flip(2))
            seen.add("flipped")
    assert seen == {"kept", "flipped"}


def test_crop_box_fallback_is_clamped_centre_crop():
    # a 10:1 strip can never fit a crop of 90-100 % area within ratio 3/4..4/3
    top, left, h, w = ci.random_resized_crop_box(1000, 100, scale=(0.9, 1.0), rng=random.Random(0))
    assert (h, w) == (100, 133) and (top, left) == (0, (1000 - 133) // 2)
    top, left, h, w = ci.random_resized_crop_box(100, 1000, scale=(0.9, 1.0), rng=random.Random(0))
    assert (h, w) == (133, 100) and (top, left) == ((1000 - 133) // 2, 0)


@settings(max_examples=200, deadline=None)
@given(
    width=st.integers(1, 4000),
    height=st.integers(1, 4000),
    seed=st.integers(0, 2**32),
    lo=st.floats(0.01, 1.0),
)
def test_crop_box_inside_image_and_in_range(width, height, seed, lo):
    rng = random.Random(seed)
    top, left, h, w = ci.random_resized_crop_box(width, height, scale=(lo, 1.0), rng=rng)
    assert 0 < h <= height and 0 < w <= width
    assert 0 <= top <= height - h and 0 <= left <= width - w


# --- fused draft decode ---------------------------------------------------------------


def test_draft_matches_full_decode_geometry_and_pixels(big_jpeg, big_full):
    data = big_jpeg.read_bytes()
    scales = set()
    for seed in range(8):
        item = {"bytes": data, "index": 0}
        fused = _hwc(ci.train_transform(item, flip=False, rng=random.Random(seed))["image"])
        top, left, h, w = ci.random_resized_crop_box(3000, 2000, rng=random.Random(seed))
        ref = _full_resize(big_full, (left, top, left + w, top + h))
        # same geometry: far closer to the reference than the reference is to itself
        # shifted by a few output pixels
        shift = max(3 * w // OUT, 3)
        shifted = _full_resize(big_full, (left + shift, top, left + w + shift, top + h))
        assert _psnr(fused, ref) > 30
        assert _psnr(fused, ref) > _psnr(shifted, ref) + 6
        with ci.px.Picture(data) as pic:
            scales.add(ci._crop_resize(pic, (left, top, left + w, top + h), OUT, OUT)[1])
    assert max(scales) > 1  # the draft path was exercised


def _spy_decodes(monkeypatch) -> list[tuple[tuple[int, ...], int]]:
    """Record (decoded array shape, reduction) of every Picture.decode call."""
    seen: list[tuple[tuple[int, ...], int]] = []
    real = ci.px.Picture.decode

    def spy(self, *args, **kwargs):
        arr, s = real(self, *args, **kwargs)
        seen.append((arr.shape, s))
        return arr, s

    monkeypatch.setattr(ci.px.Picture, "decode", spy)
    return seen


def test_draft_never_decodes_below_output_resolution(big_jpeg, monkeypatch):
    data = big_jpeg.read_bytes()
    seen = _spy_decodes(monkeypatch)
    used = set()
    for seed in range(30):
        top, left, h, w = ci.random_resized_crop_box(3000, 2000, rng=random.Random(seed))
        item = {"bytes": data, "index": 0}
        out = ci.train_transform(item, flip=False, rng=random.Random(seed))["image"]
        shape, s = seen[-1]
        # the image really was decoded at 1/s
        assert shape == (math.ceil(2000 / s), math.ceil(3000 / s), 3)
        assert out.shape == (3, OUT, OUT)
        assert w / s >= OUT and h / s >= OUT
        assert s == 8 or w / (2 * s) < OUT or h / (2 * s) < OUT  # the largest such scale
        used.add(s)
    assert len(used) >= 2


@settings(max_examples=300, deadline=None)
@given(
    crop_w=st.floats(1, 5000),
    crop_h=st.floats(1, 5000),
    out_w=st.integers(1, 600),
    out_h=st.integers(1, 600),
)
def test_draft_scale_rule(crop_w, crop_h, out_w, out_h):
    s = ci._draft_scale(crop_w, crop_h, out_w, out_h)
    assert s in (1, 2, 4, 8)
    if s > 1:
        assert crop_w / s >= out_w and crop_h / s >= out_h
    if s < 8:
        assert crop_w / (2 * s) < out_w or crop_h / (2 * s) < out_h


def test_eval_on_big_jpeg_close_to_full_decode(big_jpeg, big_full):
    out = _hwc(ci.eval_transform({"path": str(big_jpeg), "index": 1})["image"])
    # torchvision: Resize(256) -> 384x256, CenterCrop(224) at (16, 80) of the resized image
    ref = np.asarray(big_full.resize((384, 256), BILINEAR).crop((80, 16, 304, 240)))
    assert out.shape == (OUT, OUT, 3)
    assert _psnr(out, ref) > 30


# --- eval ------------------------------------------------------------------------------


@pytest.mark.parametrize("wh", [(500, 375), (333, 500), (256, 256)])
def test_eval_matches_resize_then_centre_crop(tmp_path, wh):
    img = _textured(*wh, seed=2)
    path = tmp_path / "x.png"
    img.save(path)
    out = ci.eval_transform(_item(path))["image"]
    assert out.shape == (3, OUT, OUT) and out.is_contiguous()
    w, h = wh
    new_w, new_h = (256, int(256 * h / w)) if w <= h else (int(256 * w / h), 256)
    top, left = round((new_h - OUT) / 2), round((new_w - OUT) / 2)
    resized = img.resize((new_w, new_h), BILINEAR)
    ref = np.asarray(resized.crop((left, top, left + OUT, top + OUT)))
    assert _psnr(_hwc(out), ref) > 35


def test_eval_size_height_width(jpeg_file):
    out = ci.eval_transform(_item(jpeg_file), size=[192, 160], resize=200)["image"]
    assert out.shape == (3, 192, 160)
    with pytest.raises(ValueError, match="resize"):
        ci.eval_transform(_item(jpeg_file), size=224, resize=200)


# --- colour modes ---------------------------------------------------------------------


def _modes(tmp_path) -> dict[str, Path]:
    rgb = _textured(300, 200, seed=3)
    files = {
        "L.jpg": (rgb.convert("L"), "JPEG"),
        "CMYK.jpg": (rgb.convert("CMYK"), "JPEG"),
        "RGBA.png": (rgb.convert("RGBA"), "PNG"),
        "LA.png": (rgb.convert("LA"), "PNG"),
        "P.png": (rgb.convert("P"), "PNG"),
        "PA.png": (rgb.convert("RGBA").convert("P"), "PNG"),  # palette with transparency
        "I16.png": (Image.fromarray((np.asarray(rgb.convert("L"), np.uint16) * 257)), "PNG"),
        "1.png": (rgb.convert("1"), "PNG"),
    }
    files["PA.png"][0].info["transparency"] = 0
    out = {}
    for name, (img, fmt) in files.items():
        path = tmp_path / name
        img.save(path, fmt)
        out[name] = path
    return out


def _call(name: str, item: dict) -> dict:
    """Call a map function the way the map node does: ``rng`` only where it is a param."""
    fn = getattr(ci, name)
    return fn(item, rng=random.Random(0)) if name == "train_transform" else fn(item)


@pytest.mark.parametrize("fn", ["decode", "train_transform", "eval_transform"])
def test_every_mode_becomes_rgb(tmp_path, fn):
    for name, path in _modes(tmp_path).items():
        out = _call(fn, _item(path))["image"]
        assert out.dtype == torch.uint8 and out.shape[0] == 3 and out.is_contiguous(), name


def test_grayscale_and_16_bit_values(tmp_path):
    arr = np.array([[0, 0x80FF, 0xFFFF, 0x1234]], np.uint16)
    path = tmp_path / "i16.png"
    Image.fromarray(arr).save(path)
    with Image.open(path) as img:
        assert img.mode.startswith("I")
    out = ci.decode(_item(path))["image"]
    assert out[0, 0].tolist() == [0x00, 0x80, 0xFF, 0x12]  # top 8 bits, not clipped
    assert torch.equal(out[0], out[1]) and torch.equal(out[1], out[2])


def test_alpha_is_dropped_not_composited(tmp_path):
    arr = np.zeros((4, 4, 4), np.uint8)
    arr[..., :3] = (200, 100, 50)
    arr[..., 3] = 0  # fully transparent
    path = tmp_path / "a.png"
    Image.fromarray(arr, "RGBA").save(path)
    out = ci.decode(_item(path))["image"]
    assert out[:, 0, 0].tolist() == [200, 100, 50]
    assert ci.decode(_item(path), mode="RGBA")["image"].shape == (4, 4, 4)
    assert ci.decode(_item(path), mode="L")["image"].shape == (1, 4, 4)


def test_cmyk_colours_survive(tmp_path):
    rgb = Image.new("RGB", (64, 64), (200, 40, 40))
    path = tmp_path / "c.jpg"
    rgb.convert("CMYK").save(path, quality=95)
    out = ci.decode(_item(path))["image"].float().mean((1, 2))
    assert torch.allclose(out, torch.tensor([200.0, 40.0, 40.0]), atol=8)


# --- broken inputs --------------------------------------------------------------------


def _broken(tmp_path) -> dict[str, Path]:
    good = _encode(_textured(400, 300), quality=90)
    files = {
        "truncated.JPEG": good[: len(good) // 2],
        "no_end.JPEG": good[:-2],
        "empty.JPEG": b"",
        "text.JPEG": b"this is not an image\n" * 20,
    }
    out = {}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        out[name] = tmp_path / name
    out["missing.JPEG"] = tmp_path / "missing.JPEG"
    return out


@pytest.mark.parametrize("fn", ["decode", "train_transform", "eval_transform"])
def test_broken_inputs_raise_sample_error_naming_the_file(tmp_path, fn):
    for name, path in _broken(tmp_path).items():
        with pytest.raises(SampleError) as info:
            _call(fn, _item(path))
        assert str(path) in str(info.value), name
        if name != "empty.JPEG":
            assert info.value.__cause__ is not None, name


def test_broken_messages_say_what_was_wrong(tmp_path):
    broken = _broken(tmp_path)
    expect = {
        "truncated.JPEG": "truncated",
        "empty.JPEG": "empty",
        "text.JPEG": "not a recognised image",
        "missing.JPEG": "not found",
    }
    for name, words in expect.items():
        with pytest.raises(SampleError, match=words):
            ci.train_transform(_item(broken[name]), rng=random.Random(0))


@pytest.mark.parametrize("fn", ["decode", "train_transform", "eval_transform"])
def test_a_file_that_is_no_image_is_shown_by_its_first_bytes(tmp_path, fn):
    """Pillow's message named only a BytesIO's address; a repository cloned without git lfs has
    a 130-byte text pointer in place of every image, and an HTML error page saved as .jpg
    says what it is in its first bytes."""
    pointer = b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"ab" * 32 + b"\nsize 110592\n"
    (tmp_path / "lfs.JPEG").write_bytes(pointer)
    with pytest.raises(SampleError, match=rf"lfs\.JPEG': a Git LFS pointer \({len(pointer)} bytes\), not the "
                                          r"image \(fetch the files with git lfs pull\)") as info:
        _call(fn, _item(tmp_path / "lfs.JPEG"))
    assert isinstance(info.value.__cause__, UnidentifiedImageError)
    (tmp_path / "page.jpg").write_bytes(b"<!DOCTYPE html><html><body>403 Forbidden</body></html>")
    with pytest.raises(SampleError, match=r"page\.jpg': not a recognised image format \(54 bytes starting "
                                          r"b'<!DOCTYPE html><html><body>403 F'\)$") as info:
        _call(fn, _item(tmp_path / "page.jpg"))
    assert "BytesIO" not in str(info.value)
    # an iPhone photo: an ISO box 'ftyp' with an HEIF brand (a box this short is enough to tell)
    (tmp_path / "phone.jpg").write_bytes(b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic" + bytes(64))
    with pytest.raises(SampleError, match=r"phone\.jpg': an HEIC/HEIF image \(heic\), which Pillow reads only "
                                          r"with the pillow-heif plug-in"):
        _call(fn, _item(tmp_path / "phone.jpg"))


@pytest.mark.skipif(not features.check("avif"), reason="Pillow built without AVIF")
def test_a_corrupt_avif_is_a_sample_error_naming_it(tmp_path):
    """Pillow's AVIF decoder raises RuntimeError for corrupt data: a bare error naming no file
    (any file is read by its content: an AVIF saved as .jpg is one), and pack --resize stopped."""
    from conveyor.pack import pack

    buf = io.BytesIO()
    Image.effect_noise((64, 48), 40).convert("RGB").save(buf, "AVIF")
    data = bytearray(buf.getvalue())
    at = data.index(b"mdat") + 4
    data[at:at + 64] = bytes(64)  # the coded frame's first bytes
    (tmp_path / "src" / "a").mkdir(parents=True)
    path = tmp_path / "src" / "a" / "web.jpg"
    path.write_bytes(bytes(data))
    for fn in ("decode", "train_transform", "eval_transform"):
        with pytest.raises(SampleError, match=r"web\.jpg': cannot decode \(PillowError: ") as info:
            _call(fn, _item(path))
        assert isinstance(info.value.__cause__.__cause__, RuntimeError)
    with pytest.raises(SampleError, match=r"web\.jpg: cannot decode to resize it \(RuntimeError: "):
        pack(str(tmp_path / "src"), str(tmp_path / "out"), resize=20)


def test_broken_bytes_without_path_name_the_index(tmp_path):
    with pytest.raises(SampleError, match="index 17"):
        ci.decode({"bytes": b"\xff\xd8\xff garbage", "index": 17})
    with pytest.raises(SampleError, match="index 4"):
        ci.decode({"label": 1, "index": 4})


# --- sources --------------------------------------------------------------------------


def test_local_reads_return_whole_files_of_any_size(tmp_path, monkeypatch):
    from conveyor import _image_record as image

    monkeypatch.setattr(image, "_CHUNK", 1000)  # files of 0, 1, 2 and 3+ reads
    for n in (0, 1, 999, 1000, 1001, 2000, 3500):
        path = tmp_path / f"f{n}"
        path.write_bytes(os.urandom(n))
        assert image._read_path(str(path), {}) == path.read_bytes(), n
        assert image._read_path(path.as_uri(), {}) == path.read_bytes(), n
    with pytest.raises(SampleError, match=f"image {str(tmp_path)!r}: .*IsADirectoryError"):
        image._read_path(str(tmp_path), {"path": str(tmp_path)})


def test_bytes_in_item_equals_path_read(jpeg_file):
    by_path = {"path": str(jpeg_file), "label": 1, "index": 2}
    by_bytes = {"bytes": jpeg_file.read_bytes(), "path": str(jpeg_file), "label": 1, "index": 2}
    for fn in ("decode", "eval_transform", "train_transform"):
        a, b = _call(fn, by_path), _call(fn, by_bytes)
        assert torch.equal(a["image"], b["image"]) and a["label"] == b["label"] == 1


def test_webdataset_keys_and_urls(jpeg_file):
    data = jpeg_file.read_bytes()
    ref = ci.decode(_item(jpeg_file))["image"]
    wds = ci.decode({"jpg": data, "cls": b"7", "index": 0})
    assert torch.equal(wds["image"], ref) and wds["label"] == 7
    with fsspec.open("memory://conveyor-test/a.JPEG", "wb") as f:
        f.write(data)
    assert torch.equal(ci.decode({"path": "memory://conveyor-test/a.JPEG"})["image"], ref)
    assert torch.equal(ci.decode({"path": jpeg_file.as_uri()})["image"], ref)


# --- misc -----------------------------------------------------------------------------


def test_heavy_output_marker_and_bad_args(jpeg_file):
    for fn in (ci.decode, ci.train_transform, ci.eval_transform):
        assert fn.heavy_output is True
    for bad in ({"size": 0}, {"size": [224]}, {"scale": (1.0, 0.5)}, {"ratio": (0, 1)}):
        with pytest.raises(ValueError):
            ci.train_transform(_item(jpeg_file), rng=random.Random(0), **bad)


def test_normalize():
    x = torch.full((2, 3, 4, 4), 255, dtype=torch.uint8)
    y = ci.normalize(x)
    assert y.dtype == torch.float32 and y.shape == x.shape
    expect = [(1 - m) / s for m, s in zip(ci.IMAGENET_MEAN, ci.IMAGENET_STD)]
    assert torch.allclose(y[0, :, 0, 0], torch.tensor(expect), atol=1e-5)


# --- the bundled sample and its generator ---------------------------------------------

SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "data"


def test_bundled_sample_layout_and_decode():
    files = sorted((SAMPLE / "imagenet-sample").glob("*/*/*.JPEG"))
    assert len(files) == 240, "run examples/data/make_imagenet_sample.py"
    classes = {f.parent.name for f in files}
    assert len(classes) == 10 and all(c.startswith("n0") for c in classes)
    assert sum(f.stat().st_size for f in files) < 8_000_000
    modes = set()
    for i, f in enumerate(files):
        with Image.open(f) as img:
            modes.add(img.mode)
            assert 333 <= min(img.size) and max(img.size) <= 500
        out = ci.train_transform({"path": str(f), "index": i}, rng=random.Random(i))["image"]
        assert out.shape == (3, OUT, OUT)
    assert modes == {"RGB", "L", "CMYK"}


def test_generator_is_deterministic():
    spec = importlib.util.spec_from_file_location("make_sample", SAMPLE / "make_imagenet_sample.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    a, b = gen.make_image(4, "val", 1), gen.make_image(4, "val", 1)
    assert np.array_equal(np.asarray(a), np.asarray(b))
    assert not np.array_equal(np.asarray(a), np.asarray(gen.make_image(4, "val", 2)))
    assert np.asarray(a).std() > 20  # textured, not flat


def test_imagenet_specs_take_an_image_folder_of_any_extension(tmp_path):
    """A user's ImageFolder: .jpg, .JPG, .png and .webp, a stray text file and a hidden one."""
    from conveyor import load_graph
    from conveyor import SpecErrors

    src = sorted((SAMPLE / "imagenet-sample/val").glob("*/*.JPEG"))[:6]
    names = ["a.jpg", "b.JPG", "c.png", "d.webp", "e.jpeg", "f.PNG"]
    for i, (f, name) in enumerate(zip(src, names)):
        folder = tmp_path / ("cat" if i % 2 else "dog")
        folder.mkdir(exist_ok=True)
        with Image.open(f) as img:
            img.convert("RGB").save(folder / name)
    (tmp_path / "cat/README.txt").write_text("not an image")
    (tmp_path / "dog/.DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (tmp_path / "dog/._a.jpg").write_bytes(b"\0\5\26\7 macOS resource fork")  # ends in .jpg, hidden
    (tmp_path / "dog/more").mkdir()
    (tmp_path / "dog/e.jpeg").rename(tmp_path / "dog/more/e.jpeg")  # ImageFolder: still a dog
    root = Path(__file__).resolve().parents[1] / "specs"
    for spec in ("imagenet.yaml", "imagenet-eval.yaml"):
        with load_graph(root / spec, root=str(tmp_path), batch_size=2, image_size=32) as loader:
            got = [(b["index"].tolist(), b["label"].tolist()) for b in loader]
        assert sorted(i for idx, _ in got for i in idx) == list(range(6)), spec
        assert sorted(label for _, labels in got for label in labels) == [0, 0, 0, 1, 1, 1], spec
    with pytest.raises(SpecErrors, match="param 'extensions'"):
        load_graph(root / "imagenet.yaml", root=str(tmp_path), **{"files.extensions": []})

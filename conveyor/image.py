"""Built-in image map functions: decode, train crop, eval crop.

These are the functions a spec names as ``fn: conveyor.image:train_transform`` and the
like. Each is a pure function of ``(item, rng, args)``: the item is a record from
``list_files`` or ``read_tar``, ``rng`` is a ``random.Random`` the map node seeds per
sample from (seed, epoch, sample index), and the result depends on nothing else, so it
is the same whatever the number of workers or the timing.

An item is a dict that names an image either by ``path`` (a local path or any fsspec
URL) or carries its encoded bytes under ``bytes`` (or a WebDataset key: ``jpg``,
``jpeg``, ``png``, ``webp``, ``bmp``, ``ppm``, ``pgm``, ``tif``, ``tiff``), with a ``label`` (or WebDataset ``cls``) and an
``index``. Every function returns ``{"image": uint8 CHW tensor, "label", "index"}``.

Where the time goes, and what is done about it (kernels in :mod:`conveyor._pixels`):

* JPEG decode is most of the cost. JPEGs are decoded by libjpeg-turbo through
  ``simplejpeg`` (0.6 ms for an ImageNet-sized image against Pillow's 0.76 ms plus a copy);
  other formats (PNG, WebP, 16-bit, ...) by Pillow. :func:`train_transform` and
  :func:`eval_transform` pick the crop box from the header size first, then decode at 1/2,
  1/4 or 1/8 scale in the DCT domain when the crop, so reduced, is still at least the
  output size. The crop box is chosen before and independently of that, so randomness and
  geometry are exactly those of a full decode; pixels differ only by the DCT-domain
  downscale (40+ dB PSNR against a full decode).
* The crop is resized by torch's antialiased bilinear kernel on uint8 channels-last data
  (what torchvision's v2 transforms use; the same filter as Pillow's BILINEAR at half the
  cost), on the calling thread: no intra-op threads, so N decode threads use N cores. A box
  whose edges fall between pixels (after a reduced decode) goes through the same kernel,
  placed to within 1/64 pixel (Pillow's box resize for boxes at the top or left edge).
* Normalisation is not done here. A uint8 tensor is a quarter the size of a float32 one
  through every queue, pin and host-to-device copy; normalise on the GPU with
  :func:`normalize` and :data:`IMAGENET_MEAN` / :data:`IMAGENET_STD`.

Colour: grayscale (``1``, ``L``, ``LA``, ``P``, ``I;16``, ``I``, ``F``), CMYK and
YCbCr images come out as RGB. An alpha channel (``RGBA``, ``LA``, ``PA``, a
transparent palette) is dropped, keeping the stored colour, as ``convert("RGB")`` and
torchvision's ``ImageFolder`` loader do; it is not composited. 16-bit images keep their
top 8 bits. EXIF orientation is not applied (as with torchvision's loader).

Errors: an item that cannot be read or decoded (missing file, zero bytes, not an
image, truncated or corrupt data) raises :class:`conveyor.errors.SampleError` naming
the path (or the shard and key of a tar sample, or the index) and the cause, with the
original exception chained. JPEGs are decoded with libjpeg's warnings turned into errors,
so a corrupted scan, which Pillow decodes silently into wrong pixels, fails too (libjpeg
notices most corruptions, not all: one that leaves the entropy-coded data well-formed
cannot be seen without a checksum). A JPEG that libjpeg refuses is never retried with
Pillow. For the other formats, truncated files always fail: this module never sets
``ImageFile.LOAD_TRUNCATED_IMAGES`` and always forces a full ``load()`` (it logs a
warning, once, if some other code has set that global).
"""

from __future__ import annotations

import functools
import logging
import math
import os
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageFile

from conveyor import _pixels as px
from conveyor.errors import SampleError

log = logging.getLogger(__name__)

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "decode",
    "eval_transform",
    "normalize",
    "random_resized_crop_box",
    "train_transform",
]

IMAGENET_MEAN: tuple[float, float, float] = (0.485, 0.456, 0.406)
"""Per-channel mean of ImageNet in [0, 1] RGB, for :func:`normalize`."""

IMAGENET_STD: tuple[float, float, float] = (0.229, 0.224, 0.225)
"""Per-channel standard deviation of ImageNet in [0, 1] RGB, for :func:`normalize`."""

# every extension the imagenet specs list (ImageFolder's), as conveyor pack names the members
_BYTES_KEYS = ("bytes", "jpg", "jpeg", "png", "webp", "bmp", "ppm", "pgm", "tif", "tiff")
_DATA_ERRORS = px.DATA_ERRORS


def decode(item: Mapping[str, Any], *, mode: str = "RGB") -> dict[str, Any]:
    """Decode an item's image at full resolution, with no crop or resize.

    Args:
        item: a record with ``path`` and/or ``bytes`` (or ``jpg``/``jpeg``/``png``/
            ``webp``), ``label`` (or ``cls``) and ``index``.
        mode: ``"RGB"`` (3 channels), ``"L"`` (1 channel) or ``"RGBA"`` (4 channels).

    Returns:
        ``{"image": uint8 tensor of shape (C, H, W), "label": ..., "index": ...}``.

    Raises:
        SampleError: the image cannot be read or decoded; the message names the path.

    Example:
        >>> out = decode({"path": "cat.jpg", "label": 3, "index": 0})
        >>> out["image"].dtype, out["image"].shape[0]
        (torch.uint8, 3)
    """
    if mode not in ("RGB", "L", "RGBA"):
        raise ValueError(f"{mode=} must be one of 'RGB', 'L', 'RGBA'")
    data = _read_bytes(item)
    try:
        with px.Picture(data) as pic:
            arr, _ = pic.decode(1, mode)
    except _DATA_ERRORS as e:
        raise _sample_error(_where(item), e, data) from e
    return _result(item, _to_tensor(arr.transpose(2, 0, 1), flip=False))


def train_transform(
    item: Mapping[str, Any],
    *,
    size: int | Sequence[int] = 224,
    scale: Sequence[float] = (0.08, 1.0),
    ratio: Sequence[float] = (3 / 4, 4 / 3),
    flip: bool = True,
    rng: random.Random,
    into: Callable[..., torch.Tensor | None] | None = None,
) -> dict[str, Any]:
    """Decode, random-resized-crop and maybe flip an image, for training.

    The crop follows torchvision's ``RandomResizedCrop`` rule exactly: up to 10 tries of
    an area drawn uniformly from ``scale`` times the image area and an aspect ratio drawn
    log-uniformly from ``ratio``, the first that fits being placed uniformly; else a
    centre crop of the whole image clamped to the ratio range. The crop is resized to
    ``size`` (bilinear, antialiased), then flipped left-right with probability 0.5.

    Fused decode, and its exactness rule: the crop box is chosen in full-resolution
    coordinates from the JPEG header alone. Then the JPEG is decoded at the largest DCT
    reduction (1/1, 1/2, 1/4, 1/8) at which the crop box, reduced, is still at least the
    output size in both dimensions, so the decode never goes below the output
    resolution for the chosen crop. The box is mapped into the reduced image (1/s of
    its coordinates) and resized to the output by torch's antialiased bilinear kernel
    (placed to within 1/64 pixel when its edges fall between pixels). The
    crop box and the flip are the same as without the reduced decode, so randomness and
    geometry are identical; pixels differ only by the DCT-domain downscale (50 dB PSNR
    median on 3000x2000 images against a full decode). Non-JPEG images are decoded in
    full.

    The output is not normalised; see :func:`normalize`.

    Args:
        item: a record with ``path`` and/or ``bytes`` (or ``jpg``/``jpeg``/``png``/
            ``webp``), ``label`` (or ``cls``) and ``index``.
        size: output size, an int for a square or ``[height, width]``.
        scale: range of the crop's area as a fraction of the image's area.
        ratio: range of the crop's aspect ratio (width / height).
        flip: flip left-right with probability 0.5.
        rng: the per-sample random source; draws the crop, then the flip.
        into: given by a map whose outputs go to ``batch`` then ``collate``
            (``conveyor.nodes._slabs``): ``into("image", shape, dtype)`` is the image's row
            of the batch, which the resize (or the flip's copy) writes into, so that collate
            has nothing to copy; None: a new tensor.

    Returns:
        ``{"image": uint8 contiguous tensor (3, H, W), "label": ..., "index": ...}``.

    Raises:
        SampleError: the image cannot be read or decoded; the message names the path.

    Example:
        >>> out = train_transform({"path": "cat.jpg", "label": 3, "index": 0},
        ...                       size=224, rng=random.Random(0))
        >>> out["image"].shape
        torch.Size([3, 224, 224])
    """
    out_h, out_w = _size_hw(size, "size")
    scale = _range(scale, "scale")
    ratio = _range(ratio, "ratio")
    data = _read_bytes(item)
    try:
        with px.Picture(data) as pic:
            top, left, h, w = random_resized_crop_box(
                pic.width, pic.height, scale=scale, ratio=ratio, rng=rng
            )
            flipped = flip and rng.random() < 0.5
            dst = _slot(into, out_h, out_w)
            direct = None if flipped or dst is None else dst.numpy()  # the resize writes there
            out, _ = _crop_resize(pic, (left, top, left + w, top + h), out_w, out_h, direct)
    except _DATA_ERRORS as e:
        raise _sample_error(_where(item), e, data) from e
    if direct is not None and out is direct:  # written in place: nothing to copy
        return _result(item, dst)
    return _result(item, _to_tensor(out, flip=flipped, into=dst))


def eval_transform(
    item: Mapping[str, Any],
    *,
    size: int | Sequence[int] = 224,
    resize: int = 256,
    into: Callable[..., torch.Tensor | None] | None = None,
) -> dict[str, Any]:
    """Decode, resize the shorter side to ``resize`` and centre-crop ``size``, for eval.

    Same geometry as torchvision's ``Resize(resize)`` then ``CenterCrop(size)``: the
    JPEG is decoded at the largest DCT reduction at which the kept box is still at least
    ``size`` (the same rule as :func:`train_transform`), the whole image resized and the
    centre cut on whole pixels; when the reduction does not divide the image exactly, the
    kept box is resized directly instead. The box never changes.

    Args:
        item: a record with ``path`` and/or ``bytes``, ``label`` and ``index``.
        size: output size, an int for a square or ``[height, width]``.
        resize: the shorter side after resizing; at least the larger of ``size``.
        into: as for :func:`train_transform`: the image's row of the batch, or None.

    Returns:
        ``{"image": uint8 contiguous tensor (3, H, W), "label": ..., "index": ...}``.

    Raises:
        SampleError: the image cannot be read or decoded; the message names the path.

    Example:
        >>> eval_transform({"path": "cat.jpg", "label": 3, "index": 0})["image"].shape
        torch.Size([3, 224, 224])
    """
    out_h, out_w = _size_hw(size, "size")
    if isinstance(resize, bool) or not isinstance(resize, int) or resize < max(out_h, out_w):
        raise ValueError(f"{resize=} must be an int >= the larger side of {size=}")
    data = _read_bytes(item)
    try:
        with px.Picture(data) as pic:
            out = _resize_center_crop(pic, resize, out_h, out_w)
    except _DATA_ERRORS as e:
        raise _sample_error(_where(item), e, data) from e
    return _result(item, _to_tensor(out, flip=False, into=_slot(into, out_h, out_w)))


def random_resized_crop_box(
    width: int,
    height: int,
    *,
    scale: Sequence[float] = (0.08, 1.0),
    ratio: Sequence[float] = (3 / 4, 4 / 3),
    rng: random.Random,
) -> tuple[int, int, int, int]:
    """Choose a crop the way torchvision's ``RandomResizedCrop.get_params`` does.

    Args:
        width: image width in pixels.
        height: image height in pixels.
        scale: range of the crop's area as a fraction of the image's area.
        ratio: range of the crop's aspect ratio (width / height).
        rng: the random source; consumes 2 draws per attempt and 2 for the placement.

    Returns:
        ``(top, left, crop_height, crop_width)`` in pixels.

    Example:
        >>> random_resized_crop_box(500, 375, rng=random.Random(0))
        (3, 5, 372, 432)
    """
    area = width * height
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_lo, log_hi))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = rng.randint(0, height - h)
            left = rng.randint(0, width - w)
            return top, left, h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def normalize(
    images: torch.Tensor,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Turn a uint8 batch into normalised floats, on whatever device it is on.

    Call it in the training step, after the batch is on the GPU, not in the loader.

    Args:
        images: uint8 tensor ``(N, C, H, W)`` or ``(C, H, W)``, values 0..255.
        mean: per-channel mean in [0, 1] units.
        std: per-channel standard deviation in [0, 1] units.
        dtype: floating dtype of the result.

    Returns:
        ``(images / 255 - mean) / std`` as ``dtype``.

    Example:
        >>> x = normalize(batch["image"].cuda(non_blocking=True))
    """
    m = torch.tensor(mean, dtype=dtype, device=images.device).mul_(255).view(-1, 1, 1)
    s = torch.tensor(std, dtype=dtype, device=images.device).mul_(255).view(-1, 1, 1)
    return images.to(dtype).sub_(m).div_(s)


for _fn in (decode, train_transform, eval_transform):
    _fn.heavy_output = True  # type: ignore[attr-defined]
del _fn


# --- helpers -------------------------------------------------------------------------


def _size_hw(size: int | Sequence[int], name: str) -> tuple[int, int]:
    """``size`` as (height, width): an int is a square, a pair is [height, width]."""
    if isinstance(size, int) and not isinstance(size, bool):
        hw = (size, size)
    elif isinstance(size, Sequence) and not isinstance(size, str) and len(size) == 2:
        hw = tuple(size)
    else:
        raise ValueError(f"{name}={size!r} must be an int or [height, width]")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in hw):
        raise ValueError(f"{name}={size!r} must be positive ints")
    return hw  # type: ignore[return-value]


def _range(value: Sequence[float], name: str) -> tuple[float, float]:
    """A (low, high) pair of positive numbers with low <= high."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) != 2:
        raise ValueError(f"{name}={value!r} must be a pair [low, high]")
    lo, hi = float(value[0]), float(value[1])
    if not 0 < lo <= hi:
        raise ValueError(f"{name}={value!r} must satisfy 0 < low <= high")
    return lo, hi


def _draft_scale(crop_w: float, crop_h: float, out_w: int, out_h: int) -> int:
    """The largest DCT reduction keeping the crop at least the output size."""
    return px.scale_for(crop_w, crop_h, out_w, out_h)


def _crop_resize(
    pic: px.Picture, box: tuple[int, int, int, int], out_w: int, out_h: int,
    out: np.ndarray | None = None,
) -> tuple[np.ndarray, int]:
    """``box`` (full-resolution pixels) of the image resized to the output, as CHW uint8
    (written into ``out`` when the resize can: see ``_pixels.resize_box``).

    Decodes at the largest DCT reduction at which the box stays at least the output size.
    Returns the pixels and the reduction the decode used (1 when none).
    """
    x0, y0, x1, y1 = box
    arr, s = pic.decode(_draft_scale(x1 - x0, y1 - y0, out_w, out_h))
    return px.resize_box(arr, (x0 / s, y0 / s, x1 / s, y1 / s), out_w, out_h, out), s


def _resize_center_crop(pic: px.Picture, resize: int, out_h: int, out_w: int) -> np.ndarray:
    """``Resize(resize)`` then ``CenterCrop``: the whole image resized, then cut, as CHW.

    Decoded at the largest DCT reduction at which the kept box is still at least the
    output. When that reduction divides the image exactly, the whole reduced image is
    resized and cut on whole pixels (torch's kernel); otherwise the box, whose edges then
    fall between pixels, is resized directly (:func:`conveyor._pixels.resize_box`), as it is
    for an image so long and thin that all of it resized would be over ``_WHOLE_MAX`` times
    the output.
    """
    width, height = pic.width, pic.height
    new_w, new_h, top, left = _resize_geometry(width, height, resize, out_h, out_w)
    fx, fy = width / new_w, height / new_h
    box = (left * fx, top * fy, (left + out_w) * fx, (top + out_h) * fy)
    arr, s = pic.decode(_draft_scale(box[2] - box[0], box[3] - box[1], out_w, out_h))
    whole = arr.shape[1] * s == width and arr.shape[0] * s == height
    if whole and new_w * new_h <= _WHOLE_MAX * out_w * out_h:
        return px.resize_whole(arr, new_w, new_h)[:, top : top + out_h, left : left + out_w]
    return px.resize_box(arr, tuple(v / s for v in box), out_w, out_h)


# Resizing the whole image costs its resized area: for a strip (2x4000 pixels: 256x512000 after
# Resize(256), 393 MB) only the kept box is resized, as when the reduction leaves fractions.
_WHOLE_MAX = 16


def _resize_geometry(
    width: int, height: int, resize: int, out_h: int, out_w: int
) -> tuple[int, int, int, int]:
    """``(new_w, new_h, top, left)`` of torchvision's ``Resize(resize)`` + ``CenterCrop``."""
    if width <= height:
        new_w, new_h = resize, int(resize * height / width)
    else:
        new_h, new_w = resize, int(resize * width / height)
    top = int(round((new_h - out_h) / 2.0))
    left = int(round((new_w - out_w) / 2.0))
    return new_w, new_h, top, left


def _slot(into: Callable[..., torch.Tensor | None] | None, out_h: int, out_w: int) -> torch.Tensor | None:
    """The image's row of the batch from a map's ``into``, or None."""
    return None if into is None else into("image", (3, out_h, out_w), torch.uint8)


def _to_tensor(chw: np.ndarray, *, flip: bool, into: torch.Tensor | None = None) -> torch.Tensor:
    """A contiguous uint8 (C, H, W) tensor, mirrored left-right when ``flip``: ``into`` when
    given (``chw`` copied there; ``train_transform`` returns a row the resize wrote into
    without coming here), else a new one.

    One copy (numpy's, single-threaded) does the flip and the layout at once.
    """
    if into is not None:
        dst = into.numpy()
        if flip:
            px.mirror_into(dst, chw)
        else:
            np.copyto(dst, chw)
        return into
    if flip:
        out = np.empty(chw.shape, np.uint8)
        px.mirror_into(out, chw)
        return torch.from_numpy(out)
    out = np.ascontiguousarray(chw)
    if not out.flags.writeable:  # Pillow's arrays are read-only views of its buffer
        out = out.copy()
    return torch.from_numpy(out)


def _result(item: Mapping[str, Any], image: torch.Tensor) -> dict[str, Any]:
    label = item.get("label")
    if label is None and "cls" in item:
        label = item["cls"]
        if isinstance(label, (bytes, bytearray)):
            label = label.decode("utf-8")
        if isinstance(label, str):
            label = int(label.strip())
    return {"image": image, "label": label, "index": item.get("index")}


def _where(item: Mapping[str, Any]) -> str:
    path = item.get("path")
    if path is not None:
        return f"image {os.fspath(path)!r}"
    if item.get("__key__") is not None:  # a read_tar sample: its shard and key
        return f"image {item['__key__']!r} in shard {item.get('__url__')!r}"
    if item.get("lmdb") is not None and item.get("key") is not None:  # a read_lmdb record
        return f"image {item['key']!r} in LMDB {item['lmdb']!r}"
    return f"image at index {item.get('index')!r}"


def _read_bytes(item: Mapping[str, Any]) -> bytes:
    if ImageFile.LOAD_TRUNCATED_IMAGES:
        _warn_truncated_once()
    for key in _BYTES_KEYS:
        data = item.get(key)
        if data is not None:
            break
    else:
        path = item.get("path")
        if path is None:
            raise SampleError(f"{_where(item)}: item has neither 'path' nor any of {_BYTES_KEYS}")
        data = _read_path(os.fspath(path), item)
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise SampleError(f"{_where(item)}: expected bytes, got {type(data).__name__}")
    if len(data) == 0:
        raise SampleError(f"{_where(item)}: empty file (0 bytes)")
    return data


@functools.cache
def _warn_truncated_once() -> None:
    log.warning(
        "PIL.ImageFile.LOAD_TRUNCATED_IMAGES is set (by some other code): truncated images "
        "will decode partly instead of raising SampleError"
    )


_CHUNK = 1 << 20  # bytes asked of one os.read: an ImageNet JPEG in one call


def _read_local(path: str) -> bytes:
    """A local file's bytes in four system calls (open, read, the read that finds the end,
    close). Each call passes the GIL, which the decode threads and the loader's thread take in
    turn: ``open(path, "rb").read()`` makes about eight (fstat, an ioctl, an lseek, another
    fstat), and reading this way measured +5 % images/s on imagenet.yaml's threads."""
    fd = os.open(path, os.O_RDONLY)
    try:
        parts = [os.read(fd, _CHUNK)]
        while parts[-1]:
            parts.append(os.read(fd, _CHUNK))
        return parts[0] if len(parts) <= 2 else b"".join(parts)
    finally:
        os.close(fd)


def _read_path(path: str, item: Mapping[str, Any]) -> bytes:
    protocol, sep, rest = path.partition("://")
    if sep and protocol != "file":  # retried, its errors naming the URL (a denied bucket is no bad sample)
        from conveyor.storage import read_url

        return read_url(path)
    try:
        return _read_local(rest if sep else path)
    except OSError as e:
        raise _sample_error(_where(item), e) from e


_LFS_POINTER = b"version https://git-lfs"
_HEIF_BRANDS = (b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx", b"mif1", b"msf1")


def _sample_error(where: str, e: BaseException, data: bytes | None = None) -> SampleError:
    text = str(e).lower()
    if isinstance(e, FileNotFoundError):
        what = "file not found"
    elif isinstance(e, Image.UnidentifiedImageError) and data is not None:
        # Pillow's message names only a BytesIO's address; the first bytes say what it is
        # (an HTML error page, a text file, a Git LFS pointer checked out in place of the image)
        head = bytes(data[:32])
        if head.startswith(_LFS_POINTER):
            return SampleError(f"{where}: a Git LFS pointer ({len(data)} bytes), not the image "
                               f"(fetch the files with git lfs pull): {head!r}")
        if head[4:8] == b"ftyp" and head[8:12] in _HEIF_BRANDS:  # what phones take photos in
            return SampleError(f"{where}: an HEIC/HEIF image ({head[8:12].decode()}), which Pillow "
                               "reads only with the pillow-heif plug-in registered "
                               "(pillow_heif.register_heif_opener()); or convert it to JPEG")
        return SampleError(f"{where}: not a recognised image format ({len(data)} bytes starting "
                           f"{head!r})")
    elif isinstance(e, Image.UnidentifiedImageError):
        what = "not a recognised image format"
    elif "truncated" in text or "premature end of jpeg file" in text:
        what = "truncated image data"
    elif isinstance(e, px.JpegError):
        what = "corrupt or unsupported JPEG data"
    else:
        what = "cannot decode"
    return SampleError(f"{where}: {what} ({type(e).__name__}: {e})")

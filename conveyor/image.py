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

Where the time goes, and what is done about it (kernels in :mod:`conveyor._pixels`; the
crop and resize geometry in ``conveyor/_image_geometry.py``, reading an item's bytes and
naming it in errors in ``conveyor/_image_record.py``):

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

Each fn declares its rules as attributes (conveyor/graphs/fn_args.py): ``check_args`` (its
``size``, ``scale``, ``ratio``, ``resize`` or ``mode`` checked when the spec is),
``per_sample`` (one record in, one sample out) and ``heavy_output`` (decoded pixels: a big
shuffle buffer belongs before it).

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

import math
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

import conveyor._pixels as px
from conveyor.errors import check_message
from conveyor._image_geometry import (SIDE_MAX, _WHOLE_MAX, _crop_resize, _draft_scale, _range,  # noqa: F401
                                      _resize_center_crop, _resize_geometry, _size_hw, _slot, _to_tensor)
from conveyor._image_record import _read_bytes, _read_path, _result, _sample_error, _where  # noqa: F401

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
    if resize > SIDE_MAX:
        raise ValueError(f"{resize=} is larger than {SIDE_MAX} pixels a side")
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


_FLOAT_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                 "float64": torch.float64}


def _float_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, str):
        if dtype.removeprefix("torch.") not in _FLOAT_DTYPES:
            raise ValueError(f"dtype={dtype!r} must be one of {', '.join(_FLOAT_DTYPES)}")
        return _FLOAT_DTYPES[dtype.removeprefix("torch.")]
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype={dtype!r} must be a floating torch dtype")
    return dtype


def _mean_std(mean: Sequence[float], std: Sequence[float]) -> None:
    for name, values in (("mean", mean), ("std", std)):
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values):
            raise ValueError(f"{name}={values!r} must be a list of finite numbers, one per channel")
    if len(mean) != len(std):
        raise ValueError(f"mean={list(mean)!r} and std={list(std)!r} must have one value per channel each")
    if any(v <= 0 for v in std):
        raise ValueError(f"std={list(std)!r} must be > 0")


def normalize(
    images: torch.Tensor | Mapping[str, Any],
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
    dtype: torch.dtype | str = torch.float32,
    *,
    key: str | int = "image",
) -> torch.Tensor | dict[str, Any] | tuple:
    """Turn uint8 images into normalised floats, on whatever device they are on.

    Two places to call it:

    - on the GPU (the default, and the fast path): in the training step, after the uint8
      batch is on the device (``normalize(batch["image"].cuda(non_blocking=True))``). The
      loader then moves a quarter of the bytes, and the GPU does the arithmetic.
    - in the graph, for training on the CPU (no GPU to hand it to, or a script that expects
      float tensors from its loader): as a map after ``collate``, where it runs once per batch
      on the loader's thread, ``{op: map, fn: conveyor.image:normalize}`` (args ``mean``,
      ``std``, ``dtype``, ``key``). A record (a dict) comes back as a new dict with its
      ``key`` field normalised; a tuple batch (``collate``'s ``as_tuple``) as a new tuple
      with its first item (or item ``key``, an int) normalised.

    Args:
        images: uint8 tensor ``(N, C, H, W)`` or ``(C, H, W)``, values 0..255; or a dict
            (a sample or a collated batch) holding one under ``key``; or a tuple batch.
        mean: per-channel mean in [0, 1] units (ImageNet's by default).
        std: per-channel standard deviation in [0, 1] units.
        dtype: floating dtype of the result (a torch dtype, or its name: ``"float32"``).
        key: the field of a dict that holds the images (for a tuple: its position, default 0).

    Returns:
        ``(images / 255 - mean) / std`` as ``dtype`` (in a dict for a dict).

    Example:
        >>> x = normalize(batch["image"].cuda(non_blocking=True))   # doctest: +SKIP
    """
    dtype = _float_dtype(dtype)
    if isinstance(images, Mapping):
        if key not in images:
            raise ValueError(f"normalize: the record has no field {key!r} (it has {list(images)}); "
                             "set the arg key")
        return {**images, key: normalize(images[key], mean, std, dtype)}
    if isinstance(images, tuple):
        at = key if isinstance(key, int) and not isinstance(key, bool) else 0
        if not -len(images) <= at < len(images):
            raise ValueError(f"normalize: key={key!r} is no position of a tuple of {len(images)}")
        at %= len(images)
        return images[:at] + (normalize(images[at], mean, std, dtype),) + images[at + 1:]
    if not isinstance(images, torch.Tensor):
        raise ValueError(f"normalize takes a tensor of images or a dict holding one, got {type(images).__name__}")
    m = torch.tensor(mean, dtype=dtype, device=images.device).mul_(255).view(-1, 1, 1)
    s = torch.tensor(std, dtype=dtype, device=images.device).mul_(255).view(-1, 1, 1)
    return images.to(dtype).sub_(m).div_(s)


# --- what each fn declares (conveyor/graphs/fn_args.py): its args' rules, checked with the spec



def _crop_rules(args: Mapping[str, Any], *, resize: bool) -> list[tuple[str, str]]:
    """``size`` (and ``scale``/``ratio`` for a train crop, ``resize`` for an eval crop), checked
    by the helpers the fns use."""
    problems: list[tuple[str, str]] = []
    size = args.get("size", 224)
    message = check_message(lambda: _size_hw(size, "size"))
    if message:
        problems.append(("size", message))
    for name in ("scale", "ratio"):
        if name in args and not resize:
            message = check_message(lambda: _range(args[name], name))
            if message:
                problems.append((name, message))
    if resize and "resize" in args and not problems:
        r, (h, w) = args["resize"], _size_hw(size, "size")
        if isinstance(r, bool) or not isinstance(r, int) or r < max(h, w):
            problems.append(("resize", f"resize={r!r} must be an int >= the larger side of size={size!r}"))
        elif r > SIDE_MAX:
            problems.append(("resize", f"resize={r!r} is larger than {SIDE_MAX} pixels a side (the resized "
                                       "image would not fit in memory)"))
    return problems


def _train_rules(args: Mapping[str, Any]) -> list[tuple[str, str]]:
    return _crop_rules(args, resize=False)


def _eval_rules(args: Mapping[str, Any]) -> list[tuple[str, str]]:
    return _crop_rules(args, resize=True)


def _decode_rules(args: Mapping[str, Any]) -> list[tuple[str, str]]:
    mode = args.get("mode", "RGB")
    return [] if mode in ("RGB", "L", "RGBA") else [("mode", f"mode={mode!r} must be one of 'RGB', 'L', 'RGBA'")]


def _normalize_rules(args: Mapping[str, Any]) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    message = check_message(lambda: _mean_std(args.get("mean", IMAGENET_MEAN), args.get("std", IMAGENET_STD)))
    if message:
        problems.append(("std" if message.startswith("std") else "mean", message))
    message = check_message(lambda: _float_dtype(args.get("dtype", "float32")))
    if message:
        problems.append(("dtype", message))
    key = args.get("key", "image")
    if not isinstance(key, (str, int)) or isinstance(key, bool):
        problems.append(("key", f"key={key!r} must be a field name (or a tuple position)"))
    return problems


decode.check_args = _decode_rules  # type: ignore[attr-defined]
train_transform.check_args = _train_rules  # type: ignore[attr-defined]
eval_transform.check_args = _eval_rules  # type: ignore[attr-defined]
normalize.check_args = _normalize_rules  # type: ignore[attr-defined]
for _fn in (decode, train_transform, eval_transform):
    _fn.per_sample = True  # type: ignore[attr-defined]  # one image record in, one sample out
    _fn.heavy_output = True  # type: ignore[attr-defined]  # decoded pixels: shuffle before, not after
del _fn

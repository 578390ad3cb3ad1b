"""Where the pixels of an image fn go: sizes, the crop box's reduced decode, resizes, tensors.

The geometry helpers of :mod:`conveyor.image` (which names them in its docstring): the
``size``/``scale``/``ratio`` args read and checked (the same helpers the fns' ``check_args``
rules call, so the spec check and the fn cannot disagree), the DCT reduction a crop allows,
the crop-and-resize and the resize-and-centre-crop on a :class:`conveyor._pixels.Picture`,
and the uint8 CHW tensor a fn returns (written into a batch row when a map gives ``into``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

import conveyor._pixels as px


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
    if max(hw) > SIDE_MAX:
        raise ValueError(f"{name}={size!r} is larger than {SIDE_MAX} pixels a side (an output image that "
                         "size would not fit in memory)")
    return hw  # type: ignore[return-value]


# The largest output side (``size``, ``resize``) the image fns take, checked with the spec: past
# it one image is gigabytes (3 x 16384 x 16384 bytes is 768 MB) and torch's resize fails.
SIDE_MAX = 16384


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


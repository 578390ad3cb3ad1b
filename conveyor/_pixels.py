"""Pixel kernels behind :mod:`conveyor.image`: JPEG decode, Pillow fallback, antialiased resize.

* JPEG (anything that starts with the SOI marker ``FF D8 FF``) is decoded by libjpeg-turbo
  through ``simplejpeg`` with ``strict=True``: libjpeg's warnings (a corrupted scan, data
  cut short) are errors, where Pillow decodes them silently into wrong pixels. Grayscale,
  CMYK and YCCK JPEGs come out as RGB from the same decoder. A JPEG that simplejpeg refuses
  is never handed to Pillow: its error is the sample's error.
* Everything else (PNG, WebP, BMP, GIF, TIFF, 16-bit, palette, ...) is decoded by Pillow
  and converted to 8-bit RGB as before.
* A JPEG is decoded at 1/2, 1/4 or 1/8 scale in the DCT domain when the caller's box, so
  reduced, is still at least the output size (``scale_for``). Only these powers of two:
  libjpeg-turbo's other factors (3/8, 5/8, ...) have no SIMD path and cost more than a full
  decode.
* Resize is ``torch.nn.functional.interpolate(mode="bilinear", antialias=True)`` on uint8
  channels-last data (the kernel torchvision's v2 transforms use): the same triangle filter
  as Pillow's BILINEAR, at about half its cost. Its input must be a contiguous channels-last
  tensor: a strided view of a crop takes a generic path that is ~10x slower and starts
  OpenMP threads in the calling thread. torch's kernel starts on a whole pixel, so a box
  with fractional edges (after a DCT-reduced decode, or a non-divisible eval box) is
  resized to a few more leading outputs from a whole pixel before it, chosen so that the
  kept ones fall on the box to within 1/64 pixel (``_interpolate_shifted``: 0.4 ms where
  Pillow's ``resize(box=...)`` takes 1.1-1.7 ms on a camera-sized crop); Pillow still
  resizes the few boxes within a pixel or so of the top or left edge.

Nothing here calls a torch op that fans out to intra-op threads: the copies are numpy's and
the resize kernel runs on the calling thread, so N decode threads use N cores.
"""

from __future__ import annotations

import io
import math
import struct
import zlib
from typing import Any

import numpy as np
import simplejpeg
import torch
from PIL import Image

__all__ = ["DATA_ERRORS", "JpegError", "PillowError", "Picture", "mirror_into", "resize_box", "resize_whole", "scale_for"]

_JPEG_MAGIC = b"\xff\xd8\xff"
_SCALES = (8, 4, 2, 1)
_HIGH_DEPTH = ("I;16", "I;16L", "I;16B", "I;16N", "I", "F")
_SJ_MODES = {"RGB": "RGB", "L": "GRAY", "RGBA": "RGBA"}
_resize_aa = torch._C._nn._upsample_bilinear2d_aa  # what F.interpolate(bilinear, antialias=True) runs


# What Pillow raises for bad data: OSError covers missing files, UnidentifiedImageError
# and "image file is truncated"; the rest come from plugins and codecs (a broken PNG chunk is a
# SyntaxError). simplejpeg's refusals arrive as JpegError, a ValueError.
DATA_ERRORS = (
    OSError,
    ValueError,
    SyntaxError,
    EOFError,
    struct.error,
    zlib.error,
    Image.DecompressionBombError,
)


class PillowError(ValueError):
    """Pillow refused the data with a RuntimeError (its AVIF decoder does, for corrupt data)."""


class JpegError(ValueError):
    """libjpeg refused a JPEG: corrupt, truncated, or a kind it cannot decode (12-bit, lossless)."""


def scale_for(crop_w: float, crop_h: float, out_w: int, out_h: int) -> int:
    """The largest DCT reduction (8, 4, 2, 1) keeping the crop at least the output size."""
    for s in _SCALES:
        if crop_w >= s * out_w and crop_h >= s * out_h:
            return s
    return 1


class Picture:
    """An encoded image whose size is known from its header, decoded on request.

    Args:
        data: the encoded bytes.

    Raises:
        JpegError: a JPEG whose header libjpeg refuses.
        OSError, ValueError, ...: what Pillow raises for a file it cannot identify.

    Example:
        >>> with Picture(data) as pic:
        ...     arr, s = pic.decode(scale=2)      # HWC uint8 RGB at 1/s, s as decoded
    """

    def __init__(self, data: bytes):
        self.data = data
        self.is_jpeg = bytes(data[:3]) == _JPEG_MAGIC
        self._pil: Image.Image | None = None
        if self.is_jpeg:
            try:
                self.height, self.width, _, _ = simplejpeg.decode_jpeg_header(data, strict=True)
            except ValueError as e:
                raise JpegError(str(e)) from e
            _check_bomb(self.width, self.height)
        else:
            try:
                self._pil = Image.open(io.BytesIO(data))
            except RuntimeError as e:
                raise PillowError(str(e)) from e
            self.width, self.height = self._pil.size

    def __enter__(self) -> Picture:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._pil is not None:
            self._pil.close()
            self._pil = None

    def decode(self, scale: int = 1, mode: str = "RGB") -> tuple[np.ndarray, int]:
        """The image as a C-contiguous HWC uint8 array and the reduction it was decoded at.

        Args:
            scale: 1, 2, 4 or 8; a JPEG is decoded at ``ceil(size / scale)``, other formats
                always at full size (the returned reduction is then 1).
            mode: ``"RGB"``, ``"L"`` or ``"RGBA"``.
        """
        if self.is_jpeg:
            if self.width < 8 and self.height < 8:
                scale = 1  # below 8 pixels a smaller factor can give the same size
            # libjpeg-turbo takes the smallest factor n/8 whose size is at least this; for
            # a side of 8 pixels or more that is exactly 1/scale.
            w, h = -(-self.width // scale), -(-self.height // scale)
            try:
                arr = simplejpeg.decode_jpeg(
                    self.data, colorspace=_SJ_MODES[mode], min_width=w, min_height=h, strict=True
                )
            except ValueError as e:
                raise JpegError(str(e)) from e
            return arr, scale
        img = self._pil
        try:
            img.load()
            if mode == "RGB" or img.mode in _HIGH_DEPTH:
                img = to_rgb(img)
            if img.mode != mode:
                img = img.convert(mode)
        except RuntimeError as e:
            raise PillowError(str(e)) from e
        arr = np.array(img)  # writable: torch takes no read-only arrays
        return (arr[:, :, None] if arr.ndim == 2 else arr), 1


def resize_box(arr: np.ndarray, box: tuple[float, float, float, float], out_w: int,
               out_h: int, out: np.ndarray | None = None) -> np.ndarray:
    """``box`` (x0, y0, x1, y1 in ``arr``'s pixels) of an HWC uint8 array, resized to the
    output (bilinear, antialiased), as a CHW uint8 array (a view, maybe not contiguous).

    ``out``: a C-contiguous CHW uint8 array that the kernel writes into when the box's edges
    are whole pixels (then ``out`` is returned; else a new array, as without it).
    """
    x0, y0, x1, y1 = (float(v) for v in box)
    if x0.is_integer() and y0.is_integer() and x1.is_integer() and y1.is_integer():
        return _interpolate(arr[int(y0):int(y1), int(x0):int(x1)], out_w, out_h, out)
    shifted = _interpolate_shifted(arr, (x0, y0, x1, y1), out_w, out_h)
    if shifted is not None:
        return shifted
    img = Image.fromarray(arr).resize((out_w, out_h), Image.Resampling.BILINEAR,
                                      box=(x0, y0, x1, y1))
    return np.asarray(img).transpose(2, 0, 1)


def resize_whole(arr: np.ndarray, new_w: int, new_h: int) -> np.ndarray:
    """All of an HWC uint8 array resized to ``new_w`` x ``new_h``, as a CHW view."""
    return _interpolate(arr, new_w, new_h)


# a row of W uint8 values read backwards is the row read as W/k k-byte words backwards, each
# word's bytes swapped: numpy copies k-byte words, and does the swap as a cast from little- to
# big-endian, in one pass without the GIL (~10 us for 3x224x224, where a reversed uint8 copy
# takes ~42 us: numpy has no fast loop for a stride of -1 byte).
_WORDS = ((8, "<u8", ">u8"), (4, "<u4", ">u4"), (2, "<u2", ">u2"))


def mirror_into(dst: np.ndarray, src: np.ndarray) -> None:
    """Write ``src`` mirrored left-right (its last axis reversed) into ``dst``, both uint8 of the
    same shape, ``dst`` C-contiguous."""
    width = src.shape[-1]
    if src.strides[-1] == 1:
        for k, little, big in _WORDS:
            if width % k == 0:
                np.copyto(dst.view(big), src.view(little)[..., ::-1])
                return
    np.copyto(dst, src[..., ::-1])


def to_8bit(img: Image.Image) -> Image.Image:
    """A high-depth grayscale image (``I;16``, ``I``, ``F``) as 8-bit ``L``, keeping the top 8
    bits of 16-bit samples (Pillow's own ``convert`` clips them at 255: a white image); any
    other image as it is."""
    if img.mode not in _HIGH_DEPTH:
        return img
    arr = np.asarray(img)
    if img.mode == "F":
        arr8 = np.clip(arr, 0, 255).astype(np.uint8)
    else:  # 16-bit samples (PNG, TIFF): keep the top 8 bits
        arr8 = (np.clip(arr, 0, 65535) >> 8).astype(np.uint8)
    return Image.fromarray(arr8)


def to_rgb(img: Image.Image) -> Image.Image:
    """A Pillow image as 8-bit RGB, without a copy when it already is."""
    if img.mode == "RGB":
        return img
    return to_8bit(img).convert("RGB")


def _interpolate(hwc: np.ndarray, out_w: int, out_h: int, out: np.ndarray | None = None) -> np.ndarray:
    # channels-last contiguous input is what the uint8 AVX2 kernel takes; numpy makes the
    # copy (one thread), where torch's .contiguous() could fan out. The NCHW view is made by
    # numpy and the kernel called as interpolate() calls it: each torch call releases and
    # retakes the GIL, and with decode threads each such pass can wait for another thread's
    # Python (2 threads: 3.8 % more images/s than permute + unsqueeze + F.interpolate + [0]).
    # With ``out`` (contiguous CHW, e.g. a row of a batch) the kernel writes there directly.
    x = torch.from_numpy(np.ascontiguousarray(hwc)[None].transpose(0, 3, 1, 2))
    if out is not None and out.shape == (hwc.shape[2], out_h, out_w) and out.flags.c_contiguous:
        _resize_aa(x, (out_h, out_w), False, None, out=torch.from_numpy(out[None]))
        return out
    return _resize_aa(x, (out_h, out_w), False, None).numpy()[0]


def _interpolate_shifted(hwc: np.ndarray, box: tuple[float, float, float, float], out_w: int,
                         out_h: int) -> np.ndarray | None:
    """A box with fractional edges resized by torch's kernel, placed to within 1/64 pixel.

    torch's kernel puts output pixel ``i`` of an input that starts on a whole pixel at
    ``(i + 0.5) * scale``; it takes no offset. But output ``m + i`` of an input starting
    ``m * scale`` before the box falls on the box's pixel ``i``. So, per axis, the smallest
    ``m`` is taken that brings ``x0 - m * scale`` to within 1/64 of a whole pixel; the input
    is cut there (padded where that is before the image: only the dropped outputs read the
    padding), resized to ``m + out`` pixels at the box's own scale, and the first ``m``
    outputs are dropped. Filter, windows and clamping at the image's edges are Pillow's.
    ``None`` when no ``m`` fits (then Pillow resizes the box).
    """
    height, width = hwc.shape[:2]
    sx, sy = (box[2] - box[0]) / out_w, (box[3] - box[1]) / out_h
    lead_x, lead_y = _lead(box[0], sx), _lead(box[1], sy)
    if lead_x is None or lead_y is None:
        return None
    (mx, ax), (my, ay) = lead_x, lead_y
    # Pillow's window for the last output reaches _reach past x1 (and a pixel of rounding)
    bx = min(width, math.ceil(box[2] + _reach(sx)) + 1)
    by = min(height, math.ceil(box[3] + _reach(sy)) + 1)
    if ax >= 0 and ay >= 0:
        region = np.ascontiguousarray(hwc[ay:by, ax:bx])
    else:
        region = np.zeros((by - ay, bx - ax, hwc.shape[2]), np.uint8)
        region[max(-ay, 0):, max(-ax, 0):] = hwc[max(ay, 0):by, max(ax, 0):bx]
    x = torch.from_numpy(region[None].transpose(0, 3, 1, 2))  # as in _interpolate
    y = _resize_aa(x, (my + out_h, mx + out_w), False, 1 / sy, 1 / sx)  # scales: out per in
    return y.numpy()[0, :, my:, mx:]


_LEAD_MAX = 256
_LEAD_TOL = 1 / 64


def _reach(scale: float) -> float:
    """How far an edge output's window reaches past the box's edge, in input pixels: the
    filter's support (``scale``, at least one pixel: an upscale's) less the half output pixel
    from the edge to that output's centre."""
    return max(scale, 1.0) - scale / 2


def _lead(x0: float, scale: float) -> tuple[int, int] | None:
    """``(m, a)``: the fewest extra outputs ``m`` and the whole pixel ``a`` at which an input
    starting at ``a`` puts output ``m`` at ``x0`` to within ``_LEAD_TOL`` pixel (of the output's
    when it is the smaller: an upscale).

    The first kept output's window must not be cut by the input's start at ``a``: ``a`` is
    ``_reach`` or more before ``x0`` (a downscale: any ``m`` > 0), or the image's edge. ``a``
    may be before the image (``< 0``) only when that window ends inside it, so that no kept
    output reads the padding.
    """
    reach = _reach(scale)
    pad_ok = x0 - reach >= 0.5
    tol = _LEAD_TOL * min(1.0, scale)
    for m in range(_LEAD_MAX + 1):
        start = x0 - m * scale
        a = round(start)
        if a < 0 and not pad_ok:
            return None
        # elsewhere than at the image's edge, a cut inside the first outputs' windows would
        # clamp them where Pillow does not
        if abs(start - a) <= tol and (x0 - a >= reach - tol or a == 0):
            return m, a
    return None


def _check_bomb(width: int, height: int) -> None:
    """Pillow's decompression-bomb limit, applied to the JPEGs Pillow no longer opens."""
    limit = Image.MAX_IMAGE_PIXELS
    if limit and width * height > 2 * limit:
        raise Image.DecompressionBombError(
            f"Image size ({width * height} pixels) exceeds limit of {2 * limit} pixels, "
            "could be decompression bomb DOS attack."
        )

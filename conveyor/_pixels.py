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
  OpenMP threads in the calling thread. torch's kernel crops on whole pixels only, so a box
  with fractional edges (after a DCT-reduced decode, or a non-divisible eval box) is resized
  by Pillow's ``resize(box=...)``, which places it exactly; the kernel is the same filter.

Nothing here calls a torch op that fans out to intra-op threads: the copies are numpy's and
the resize kernel runs on the calling thread, so N decode threads use N cores.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import simplejpeg
import torch
import torch.nn.functional as F
from PIL import Image

__all__ = ["JpegError", "Picture", "resize_box", "resize_whole", "scale_for"]

_JPEG_MAGIC = b"\xff\xd8\xff"
_SCALES = (8, 4, 2, 1)
_HIGH_DEPTH = ("I;16", "I;16L", "I;16B", "I;16N", "I", "F")
_SJ_MODES = {"RGB": "RGB", "L": "GRAY", "RGBA": "RGBA"}


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
            self._pil = Image.open(io.BytesIO(data))
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
        img.load()
        if mode == "RGB" or img.mode in _HIGH_DEPTH:
            img = to_rgb(img)
        if img.mode != mode:
            img = img.convert(mode)
        arr = np.array(img)  # writable: torch takes no read-only arrays
        return (arr[:, :, None] if arr.ndim == 2 else arr), 1


def resize_box(arr: np.ndarray, box: tuple[float, float, float, float], out_w: int,
               out_h: int) -> np.ndarray:
    """``box`` (x0, y0, x1, y1 in ``arr``'s pixels) of an HWC uint8 array, resized to the
    output (bilinear, antialiased), as a CHW uint8 array (a view, maybe not contiguous)."""
    x0, y0, x1, y1 = (float(v) for v in box)
    if x0.is_integer() and y0.is_integer() and x1.is_integer() and y1.is_integer():
        return _interpolate(arr[int(y0):int(y1), int(x0):int(x1)], out_w, out_h)
    img = Image.fromarray(arr).resize((out_w, out_h), Image.Resampling.BILINEAR,
                                      box=(x0, y0, x1, y1))
    return np.asarray(img).transpose(2, 0, 1)


def resize_whole(arr: np.ndarray, new_w: int, new_h: int) -> np.ndarray:
    """All of an HWC uint8 array resized to ``new_w`` x ``new_h``, as a CHW view."""
    return _interpolate(arr, new_w, new_h)


def to_rgb(img: Image.Image) -> Image.Image:
    """A Pillow image as 8-bit RGB, without a copy when it already is."""
    if img.mode == "RGB":
        return img
    if img.mode in _HIGH_DEPTH:
        arr = np.asarray(img)
        if img.mode == "F":
            arr8 = np.clip(arr, 0, 255).astype(np.uint8)
        else:  # 16-bit samples (PNG, TIFF): keep the top 8 bits
            arr8 = (np.clip(arr, 0, 65535) >> 8).astype(np.uint8)
        return Image.fromarray(arr8).convert("RGB")
    return img.convert("RGB")


def _interpolate(hwc: np.ndarray, out_w: int, out_h: int) -> np.ndarray:
    # channels-last contiguous input is what the uint8 AVX2 kernel takes; numpy makes the
    # copy (one thread), where torch's .contiguous() could fan out.
    x = torch.from_numpy(np.ascontiguousarray(hwc)).permute(2, 0, 1).unsqueeze(0)
    y = F.interpolate(x, size=(out_h, out_w), mode="bilinear", antialias=True,
                      align_corners=False)
    return y[0].numpy()


def _check_bomb(width: int, height: int) -> None:
    """Pillow's decompression-bomb limit, applied to the JPEGs Pillow no longer opens."""
    limit = Image.MAX_IMAGE_PIXELS
    if limit and width * height > 2 * limit:
        raise Image.DecompressionBombError(
            f"Image size ({width * height} pixels) exceeds limit of {2 * limit} pixels, "
            "could be decompression bomb DOS attack."
        )

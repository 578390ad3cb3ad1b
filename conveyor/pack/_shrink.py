"""Pre-shrinking images for ``conveyor pack --resize N``: the shorter side at most ``N``.

Training at 224 px from camera-size photos (~3000x2000) spends most of each step decoding
pixels that the crop throws away. Stored once at a shorter side of 256-320, an image decodes
in a small fraction of the time and takes a fraction of the bytes, on every epoch after.

:func:`shrink` decodes with libjpeg's DCT-domain scaling to the smallest scale still at least
the target size (``Image.draft``), resizes to the target with Lanczos (antialiased), and
re-encodes as JPEG at ``quality`` without chroma subsampling (4:4:4: chroma at full
resolution, which Pillow's default 4:2:0 would halve again after the downscale). The aspect ratio is kept (each side rounded); an image
whose shorter side is already at most ``N`` is left as it is (its bytes unchanged). Pixels
are stored as decoded: EXIF orientation is not applied (the loaders do not apply it either),
an alpha channel is dropped, grayscale stays grayscale (16-bit samples keep their top 8 bits,
as the loaders decode them), anything else becomes RGB. What the
re-encode costs in quality is measured in ``benchmarks/RESULTS.md`` (``benchmarks/pack_resize.py``).
"""

from __future__ import annotations

import io

from PIL import Image

from conveyor._pixels import DATA_ERRORS, to_8bit
from conveyor.errors import SampleError

DEFAULT_QUALITY = 90


def target_size(width: int, height: int, shorter: int) -> tuple[int, int]:
    """``(w, h)`` with the shorter side ``shorter`` and the aspect ratio kept (rounded)."""
    scale = shorter / min(width, height)
    if width <= height:
        return shorter, max(1, round(height * scale))
    return max(1, round(width * scale)), shorter


def shrink(data: bytes, shorter: int, *, quality: int = DEFAULT_QUALITY, name: str = "image") -> bytes | None:
    """JPEG bytes of the image in ``data`` with its shorter side ``shorter``, or None when
    it is already at most that (keep the original bytes then).

    Args:
        data: the encoded image (any format Pillow reads).
        shorter: the largest shorter side to keep, in pixels.
        quality: JPEG quality of the re-encoded image, 1-100.
        name: what to call the image in errors.

    Raises:
        SampleError: the image cannot be decoded.

    Example:
        >>> shrink(open("big.jpg", "rb").read(), 320)  # doctest: +SKIP
        b'\\xff\\xd8...'
    """
    try:
        with Image.open(io.BytesIO(data)) as img:
            w, h = img.size
            if min(w, h) <= shorter:
                return None
            size = target_size(w, h, shorter)
            img.draft(img.mode if img.mode in ("RGB", "L") else "RGB", size)  # JPEG: DCT scaling
            img = to_8bit(img)  # 16-bit PNG/TIFF: the top 8 bits, as the loaders decode it
            if img.mode not in ("RGB", "L"):
                img = img.convert("RGB")
            out = img.resize(size, Image.Resampling.LANCZOS)
    except (*DATA_ERRORS, RuntimeError) as exc:  # RuntimeError: Pillow's AVIF decoder
        raise SampleError(f"{name}: cannot decode to resize it ({type(exc).__name__}: {exc})") from exc
    buf = io.BytesIO()
    out.save(buf, "JPEG", quality=quality, subsampling=0)  # 4:4:4: +1.3-3.4 dB for ~1.3x the bytes
    return buf.getvalue()

"""What an image fn reads and returns: an item's bytes, the errors that name it, its result.

The record helpers of :mod:`conveyor.image`: the encoded bytes of an item (under ``bytes`` or
a WebDataset key, else read from ``path``: a local file in few system calls, a URL through
``conveyor.storage`` with its retries), where an item is for an error (its path, its shard and
key, its LMDB key, or its index), the ``SampleError`` saying what is wrong with its data, and
the ``{"image", "label", "index"}`` record the fns return.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping
from typing import Any

import torch
from PIL import Image, ImageFile

import conveyor._pixels as px
from conveyor.errors import SampleError

log = logging.getLogger("conveyor.image")  # the warning is the image fns': logged under their name

# every extension the imagenet specs list (ImageFolder's), as conveyor pack names the members
_BYTES_KEYS = ("bytes", "jpg", "jpeg", "png", "webp", "bmp", "ppm", "pgm", "tif", "tiff")


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
    if not isinstance(item, Mapping):  # a batch (a list of records) where one record belongs
        raise SampleError(f"expected an image record (a dict with 'path' or the image's bytes), got a "
                          f"{type(item).__name__}")
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
        if not isinstance(path, (str, os.PathLike)):  # a collated batch's list of paths
            raise SampleError(f"image at index {item.get('index')!r}: expected a path, got "
                              f"{type(path).__name__} {path!r:.80}")
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


"""The MDS and LitData formats as conveyor reads them, with no dependency on either library.

Both are folders with an ``index.json`` and shards (MDS's ``shard.NNNNN.mds[.zstd]``, LitData's
``chunk-R-I[.zstd].bin``) laid out the same way: ``[n: u32][offsets: (n+1) u32][samples]``,
each sample ``[sizes: u32 each][fields]``. MDS gives the sizes of variable-size columns only
(``column_sizes`` in the index), LitData of every leaf of its pytree.

A shard has one of these layouts (``Shard.layout``):

- ``plain``: uncompressed, read a sample at a time (``[start, end)`` of its offsets). A LitData
  chunk whose samples are all empty and that ends in ``LDARW01\\0`` keeps its rows in an Arrow
  IPC footer instead (``[ipc][len: u32][magic]``; what ``optimize()`` writes for samples of
  strings and numbers only); its rows are read once with pyarrow and kept.
- ``chunk``: compressed whole (MDS ``compression``, LitData ``compression_level="chunk"``), so
  read whole and decompressed, a few kept in memory.
- ``batch``: LitData's framed zstd, ``optimize(compression="zstd")``'s default: ``LDFZ01\\0\\0``,
  ``version u16, flags u16, n u32, rows-per-frame u32, frames u32``, then ``n+1`` u32 offsets
  of the samples in the concatenated uncompressed bytes, then per frame ``first u32, count u32,
  file offset u64, compressed u32, uncompressed u32``, then the zstd frames. The header is read
  once, then a sample's frame (one ranged read) is decompressed and kept.
- ``sample``: LitData's ``compression_level="sample"``: the plain layout, each sample its own
  zstd frame.

Everything that does not fit is an error naming the file: an index that does not parse or names
an encoding this reader does not know (``SourceError``, at listing time), and a shard whose
header or size does not match its index, or that is cut short or corrupt (``SampleError``,
naming the sample).
"""

from __future__ import annotations

import bz2
import gzip
import json
import pickle
import struct
import threading
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Callable, Iterator

import numpy as np

from conveyor.errors import SampleError, SourceError
from conveyor.storage import Storage

INDEX = "index.json"
_U32 = struct.Struct("<I")

# MDS ndarray's dtype codes and scalar encodings (streaming.base.format.mds.encodings)
_MDS_DTYPES = {8: "uint8", 9: "int8", 16: "uint16", 17: "int16", 18: "float16", 32: "uint32", 33: "int32",
               34: "float32", 64: "uint64", 65: "int64", 66: "float64"}
_MDS_SCALARS = {"uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64", "float16", "float32",
                "float64"}
_MDS_KNOWN = {"bytes", "str", "int", "ndarray", "str_int", "str_float", "str_decimal", "pil", "jpeg", "png",
              "pkl", "json", "list[jpeg]", "list[png]", "list[pil]", "jpeg_array", "jpegarray"} | _MDS_SCALARS
# LitData's numpy dtype order (litdata.constants._NUMPY_SCTYPES) and torch's (_TORCH_DTYPES_MAPPING)
_LIT_NUMPY = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32",
              "float64", "complex64", "complex128", "bool"]
_LIT_TORCH = ["float32", "float32", "float64", "float64", "complex64", "complex64", "complex128", "complex128",
              "float16", "float16", "bfloat16", "uint8", "int8", "int16", "int16", "int32", "int32", "int64",
              "int64", "bool", "uint16"]
_LIT_KNOWN = {"int", "float", "str", "bytes", "bool", "pil", "jpeg", "numpy", "no_header_numpy", "tensor",
              "no_header_tensor", "pickle"}
_LIT_LEVELS = ("chunk", "batch", "sample")  # LitData's compression_level: how much one zstd frame wraps
_LIT_FRAME_ROWS = 256  # optimize()'s compression_batch_size when the index does not say
_FRAMED_MAGIC = b"LDFZ01\0\0"
_FRAMED_PREFIX = struct.Struct("<8sHHIII")
_FRAMED_FRAME = struct.Struct("<IIQII")
_ARROW_MAGIC = b"LDARW01\0"
_LIT_ARROW_LEAVES = {"str", "int", "float", "bool", "bytes", "json"}  # samples litdata writes as Arrow rows


def _decompressor(codec: str | None, where: str) -> Callable[[bytes], bytes] | None:
    if not codec:
        return None
    name = codec.split(":", 1)[0]
    if name == "zstd":
        try:
            import zstandard
        except ImportError:
            raise SourceError(f"{where}: zstd-compressed shards need the zstandard package: "
                              "pip install 'conveyor[formats]'") from None

        def zstd(data: bytes) -> bytes:
            stream = zstandard.ZstdDecompressor().decompressobj()
            out = stream.decompress(data)
            if not stream.eof:
                raise ValueError("the zstd frame is cut short")
            return out
        return zstd
    if name == "gz":
        return gzip.decompress
    if name == "bz2":
        return bz2.decompress
    raise SourceError(f"{where}: compression {codec!r} is not read by conveyor (zstd, gz and bz2 are)")


LAYOUTS = ("plain", "chunk", "batch", "sample")


@dataclass(frozen=True)
class Shard:
    """One shard: its file's URL, its sample count, the bytes the index says it has on disk (or
    None), how it is compressed and laid out (``LAYOUTS``, see the module's docstring)."""

    url: str
    samples: int
    size: int | None
    decompress: Callable[[bytes], bytes] | None
    raw_size: int | None = None  # a compressed shard's bytes once decompressed, when known
    layout: str = "plain"
    frame_rows: int = _LIT_FRAME_ROWS  # samples per zstd frame (layout "batch"), as the index says


def _array(a: np.ndarray) -> np.ndarray:
    return a.copy()  # writable, owns its memory


def _pil_pixels(data: bytes, where: str) -> np.ndarray:
    width, height, mode_len = struct.unpack_from("<III", data)
    mode = data[12:12 + mode_len].decode()
    channels = {"L": 0, "RGB": 3, "RGBA": 4, "LA": 2, "CMYK": 4}.get(mode)
    if channels is None:
        raise SampleError(f"{where}: a raw image of mode {mode!r} (conveyor reads L, LA, RGB, RGBA, CMYK)")
    shape = (height, width) + ((channels,) if channels else ())
    return _array(np.frombuffer(data, np.uint8, offset=12 + mode_len).reshape(shape))


def _byte_list(data: bytes, start: int) -> list[bytes]:
    """MDS's list[...] (after a 4-byte placeholder) and jpeg_array: [n][sizes][items]."""
    n, = _U32.unpack_from(data, start)
    sizes = struct.unpack_from(f"<{n}I", data, start + 4)
    pos, out = start + 4 + 4 * n, []
    for size in sizes:
        out.append(data[pos:pos + size])
        pos += size
    return out


def mds_decoder(encoding: str, where: str, allow_pickle: bool) -> Callable[[bytes], Any]:
    """The function turning one MDS column's bytes into its value; images stay encoded bytes
    (``jpeg``/``png``, for conveyor.image), a raw ``pil`` image becomes an HxW[xC] uint8 array."""
    base, _, rest = encoding.partition(":")
    if base not in _MDS_KNOWN:
        raise SourceError(f"{where}: column encoding {encoding!r} is not an MDS encoding "
                          f"(known: {', '.join(sorted(_MDS_KNOWN))})")
    if base == "pkl" and not allow_pickle:
        raise SourceError(f"{where}: column encoding 'pkl' runs code from the file when unpickled; "
                          "set allow_pickle: true if you trust the dataset")
    simple: dict[str, Callable[[bytes], Any]] = {
        "bytes": bytes, "jpeg": bytes, "png": bytes, "str": lambda d: d.decode("utf-8"),
        "int": lambda d: struct.unpack("<q", d)[0], "str_int": lambda d: int(d.decode()),
        "str_float": lambda d: float(d.decode()), "str_decimal": lambda d: Decimal(d.decode()),
        "json": lambda d: json.loads(d.decode("utf-8")), "pkl": pickle.loads,
        "pil": lambda d: _pil_pixels(d, where), "jpeg_array": lambda d: _byte_list(d, 0),
        "jpegarray": lambda d: _byte_list(d, 0), "list[jpeg]": lambda d: _byte_list(d, 4),
        "list[png]": lambda d: _byte_list(d, 4),
        "list[pil]": lambda d: [_pil_pixels(x, where) for x in _byte_list(d, 4)],
    }
    if base in simple:
        return simple[base]
    if base in _MDS_SCALARS:
        dtype = np.dtype(base)
        return lambda d: np.frombuffer(d, dtype)[0].item()
    args = rest.split(":") if rest else []
    dtype = args[0] if args else None
    shape = tuple(int(x) for x in args[1].split(",")) if len(args) > 1 else None
    if dtype is not None and dtype not in _MDS_DTYPES.values() or len(args) > 2:
        raise SourceError(f"{where}: column encoding {encoding!r}: not ndarray[:dtype[:shape]] with a dtype "
                          f"of {', '.join(_MDS_DTYPES.values())}")

    def ndarray(d: bytes) -> np.ndarray:
        pos, kind, dims = 0, dtype, shape
        if kind is None:
            kind, pos = _MDS_DTYPES[d[0]], 1
        if dims is None:
            ndim, code = d[pos] >> 2, d[pos] & 3
            width = 1 << code
            dims = tuple(np.frombuffer(d, f"<u{width}", ndim, pos + 1).tolist())
            pos += 1 + ndim * width
        return _array(np.frombuffer(d, kind, offset=pos).reshape(dims))

    return ndarray


def lit_decoder(fmt: str, where: str, allow_pickle: bool) -> Callable[[bytes], Any]:
    """The function turning one LitData leaf's bytes into its value (images as for MDS)."""
    base, _, arg = fmt.partition(":")
    if base == "json":  # litdata's own binary list/dict; its rows are in the chunk's Arrow footer
        def json_leaf(d: bytes) -> Any:
            raise ValueError("a 'json' leaf (litdata's binary list or dict) is read from the chunk's Arrow "
                             "footer, and this chunk has none")
        return json_leaf
    if base not in _LIT_KNOWN:
        raise SourceError(f"{where}: serializer {fmt!r} is not read by conveyor (it reads "
                          f"{', '.join(sorted(_LIT_KNOWN))}); re-write that field with one of them")
    if base == "pickle" and not allow_pickle:
        raise SourceError(f"{where}: serializer 'pickle' runs code from the file when unpickled; "
                          "set allow_pickle: true if you trust the dataset")
    if base == "numpy":
        def numpy(d: bytes) -> np.ndarray:
            code, ndim = struct.unpack_from("<II", d)
            dims = struct.unpack_from(f"<{ndim}I", d, 8)
            return _array(np.frombuffer(d, _LIT_NUMPY[code], offset=8 + 4 * ndim).reshape(dims))
        return numpy
    if base == "no_header_numpy":
        kind = _LIT_NUMPY[int(arg)]
        return lambda d: _array(np.frombuffer(d, kind))
    if base in ("tensor", "no_header_tensor"):
        import torch

        def tensor(d: bytes) -> Any:
            if base == "tensor":
                code, ndim = struct.unpack_from(">II", d)
                dims, start = struct.unpack_from(f">{ndim}I", d, 8), 8 + 4 * ndim
            else:
                code, dims, start = int(arg), None, 0
            dtype = getattr(torch, _LIT_TORCH[code])
            flat = torch.frombuffer(bytearray(d[start:]), dtype=dtype) if len(d) > start else torch.empty(0, dtype=dtype)
            return flat.reshape(dims) if dims is not None else flat
        return tensor
    return {"int": lambda d: struct.unpack("<q", d)[0], "float": lambda d: struct.unpack("<d", d)[0],
            "str": lambda d: d.decode("utf-8"), "bytes": bytes, "jpeg": bytes, "bool": lambda d: d != b"\x00",
            "pil": lambda d: _pil_pixels(d, where), "pickle": pickle.loads}[base]


def _tree(spec: Any, where: str) -> Any:
    """LitData's pytree spec as nested (kind, keys, children); leaves are None."""
    kind, context, children = spec.get("type"), spec.get("context"), spec.get("children_spec", [])
    if kind is None:
        return None
    if kind not in ("builtins.dict", "builtins.list", "builtins.tuple"):
        raise SourceError(f"{where}: a sample of type {kind!r} (conveyor reads dicts, lists and tuples)")
    keys = json.loads(context) if kind == "builtins.dict" else None
    return (kind, keys, [_tree(c, where) for c in children])


def _build(tree: Any, leaves: Any) -> Any:
    if tree is None:
        return next(leaves)
    kind, keys, children = tree
    values = [_build(c, leaves) for c in children]
    if kind == "builtins.dict":
        return dict(zip(keys, values))
    return values if kind == "builtins.list" else tuple(values)


class SampleSet:
    """A dataset's index: its shards and how to decode a sample. ``open_set`` makes one."""

    def __init__(self, root: str, kind: str, shards: list[Shard], decode: Callable[[bytes, str], dict]):
        self.root, self.kind, self.shards, self.decode = root, kind, shards, decode


def open_set(root: str, kind: str, storage: Storage, allow_pickle: bool = False) -> SampleSet:
    """Read ``root/index.json`` of an MDS (``kind="mds"``) or LitData (``"litdata"``) dataset.

    Raises:
        SourceError: no index, an index that does not parse, or an encoding not read here.
    """
    root = root.rstrip("/")
    url = f"{root}/{INDEX}"
    try:
        index = json.loads(storage.read(url))
    except (SampleError, SourceError) as exc:
        raise SourceError(f"{kind}: cannot read {url} ({exc})") from exc
    except ValueError as exc:
        raise SourceError(f"{kind}: {url} is not JSON ({exc})") from None
    try:
        return (_open_mds if kind == "mds" else _open_litdata)(root, url, index, allow_pickle)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise SourceError(f"{kind}: {url} is not a {kind} index ({type(exc).__name__}: {exc})") from None


def _open_mds(root: str, url: str, index: dict, allow_pickle: bool) -> SampleSet:
    shards, decoders = [], {}
    for i, s in enumerate(index["shards"]):
        if s.get("format") != "mds":
            raise SourceError(f"mds: {url}: shard {i} is in format {s.get('format')!r}, not mds")
        data = s["zip_data"] if s.get("compression") else s["raw_data"]
        name = data["basename"]
        where = f"mds: {root}/{name}"
        cols = [(n, mds_decoder(e, f"{where}: column {n!r}", allow_pickle), z)
                for n, e, z in zip(s["column_names"], s["column_encodings"], s["column_sizes"])]
        shard = Shard(f"{root}/{name}", int(s["samples"]), data.get("bytes"),
                      _decompressor(s.get("compression"), where), (s.get("raw_data") or {}).get("bytes"),
                      "chunk" if s.get("compression") else "plain")
        decoders[shard.url] = cols
        shards.append(shard)

    def decode(raw: bytes, shard_url: str) -> dict:
        cols = decoders[shard_url]
        n_var = sum(1 for _, _, z in cols if z is None)
        sizes = iter(struct.unpack_from(f"<{n_var}I", raw))
        pos, out = 4 * n_var, {}
        for name, fn, fixed in cols:
            size = fixed if fixed is not None else next(sizes)
            if pos + size > len(raw):
                raise ValueError(f"column {name!r} runs past the sample's {len(raw)} bytes")
            out[name] = fn(raw[pos:pos + size])
            pos += size
        return out

    return SampleSet(root, "mds", shards, decode)


def _open_litdata(root: str, url: str, index: dict, allow_pickle: bool) -> SampleSet:
    config = index["config"]
    if config.get("item_loader", "PyTreeLoader") != "PyTreeLoader":
        raise SourceError(f"litdata: {url}: item_loader {config['item_loader']!r}: conveyor reads "
                          "PyTreeLoader datasets (optimize()'s default)")
    if config.get("encryption"):
        raise SourceError(f"litdata: {url}: encrypted chunks are not read by conveyor")
    level = config.get("compression_level") or "chunk"  # None: whole-chunk (or no) compression
    if not isinstance(level, str) or level.strip().lower() not in _LIT_LEVELS:
        raise SourceError(f"litdata: {url}: compression_level {level!r} is not one of {', '.join(_LIT_LEVELS)}")
    level = level.strip().lower()
    codec = config.get("compression")
    if level != "chunk" and not str(codec or "").startswith("zstd"):
        raise SourceError(f"litdata: {url}: compression_level {level!r} with compression {codec!r}: "
                          "litdata frames zstd only")
    formats = config["data_format"]
    fns = [lit_decoder(f, f"litdata: {url}: leaf {i}", allow_pickle) for i, f in enumerate(formats)]
    other = [f for f in formats if f.partition(":")[0] not in _LIT_ARROW_LEAVES]
    if "json" in formats and other:
        raise SourceError(f"litdata: {url}: leaf {formats.index('json')}: serializer 'json' (litdata's binary list "
                          f"or dict) beside {other[0]!r}: litdata keeps such samples in that encoding only, which "
                          "conveyor does not read (it reads the Arrow rows litdata writes when every field is "
                          "text, numbers or lists)")
    spec = json.loads(config["data_spec"])
    tree = _tree(spec[1] if isinstance(spec, list) else spec, f"litdata: {url}")
    rows = int(config.get("compression_batch_size") or _LIT_FRAME_ROWS)
    shards = []
    for c in index["chunks"]:
        name = f"{root}/{c['filename']}"
        decompress = _decompressor(codec, f"litdata: {name}")
        if not codec:
            shards.append(Shard(name, int(c["chunk_size"]), c.get("chunk_bytes"), None))
        elif level == "chunk":  # chunk_bytes is the chunk's size before compression
            shards.append(Shard(name, int(c["chunk_size"]), None, decompress, c.get("chunk_bytes"), "chunk"))
        else:  # framed: chunk_bytes is the file's size
            shards.append(Shard(name, int(c["chunk_size"]), c.get("chunk_bytes"), decompress, None, level, rows))
    n = len(fns)

    def decode(raw: bytes, shard_url: str) -> dict:
        sizes = struct.unpack_from(f"<{n}I", raw)
        pos, leaves = 4 * n, []
        for fn, size in zip(fns, sizes):
            if pos + size > len(raw):
                raise ValueError(f"leaf {len(leaves)} runs past the sample's {len(raw)} bytes")
            leaves.append(fn(raw[pos:pos + size]))
            pos += size
        value = _build(tree, iter(leaves))
        return value if isinstance(value, dict) else {"value": value}

    return SampleSet(root, "litdata", shards, decode)


@contextmanager
def _reading(pos: int) -> Iterator[None]:
    """Name the sample being read in a shard-wide ``SampleError``."""
    try:
        yield
    except SampleError as exc:
        raise SampleError(f"{exc} (reading sample {pos})") from None


class ShardReader:
    """Reads samples out of a set's shards: offsets (or a framed chunk's header) read once per
    shard; a sample one ranged read (plain, ``sample``), a frame one ranged read and kept
    (``batch``), a compressed shard read whole and kept (``chunk``); ``keep`` frames, shards or
    Arrow tables at a time."""

    def __init__(self, storage: Storage, keep: int = 2):
        self.storage, self.keep = storage, keep
        self._offsets: dict[str, tuple[int, ...]] = {}
        self._sizes: dict[str, int] = {}
        self._framed: dict[str, tuple[tuple[int, ...], list[tuple[int, int, int, int, int]], int]] = {}
        self._kept: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    def _keep(self, key: str, load: Callable[[], Any]) -> Any:
        with self._lock:
            found = self._kept.get(key)
            if found is not None:
                self._kept.move_to_end(key)
                return found
        found = load()
        with self._lock:
            self._kept[key] = found
            while len(self._kept) > self.keep:
                self._kept.popitem(last=False)
        return found

    def _size(self, shard: Shard, data: bytes | None = None) -> int:
        size = len(data) if data is not None else self._sizes.get(shard.url)
        if size is None:
            size = self._sizes[shard.url] = self.storage.size(shard.url)
        if shard.size is not None and shard.layout != "chunk" and size != shard.size:
            raise SampleError(f"{shard.url}: {size} bytes, {INDEX} says {shard.size}: "
                              f"{'cut short' if size < shard.size else 'it does not match its index'}")
        return size

    def _count(self, shard: Shard, count: int) -> None:
        if count != shard.samples:
            raise SampleError(f"{shard.url}: its header holds {count} samples, {INDEX} lists {shard.samples}: the "
                              "index does not match its shards")

    def _header(self, shard: Shard, data: bytes | None) -> tuple[int, ...]:
        n = shard.samples
        head = data[:8 + 4 * n] if data is not None else self.storage.read(shard.url, 0, 8 + 4 * n)
        if head[:8] == _FRAMED_MAGIC:
            raise SampleError(f"{shard.url}: a framed zstd chunk (LDFZ01), though {INDEX} does not say "
                              "compression_level 'batch': the index does not match its shards")
        if len(head) < 8 + 4 * n:
            raise SampleError(f"{shard.url}: cut short: {len(head)} bytes, less than its header")
        self._count(shard, _U32.unpack_from(head)[0])
        offsets = struct.unpack_from(f"<{n + 1}I", head, 4)
        size = self._size(shard, data)
        if offsets[-1] > size or any(a > b for a, b in zip(offsets, offsets[1:])):
            raise SampleError(f"{shard.url}: cut short: {size} bytes, its samples end at byte {offsets[-1]}"
                              if offsets[-1] > size else f"{shard.url}: its sample offsets are out of order")
        return offsets

    def _whole(self, shard: Shard) -> bytes:
        packed = self.storage.read(shard.url)
        if shard.size is not None and len(packed) != shard.size:
            raise SampleError(f"{shard.url}: {len(packed)} bytes, {INDEX} says {shard.size}: "
                              f"{'cut short' if len(packed) < shard.size else 'not its index'}")
        try:
            data = shard.decompress(packed)
        except Exception as exc:
            raise SampleError(f"{shard.url}: does not decompress ({type(exc).__name__}: {exc})") from None
        if shard.raw_size is not None and len(data) != shard.raw_size:
            raise SampleError(f"{shard.url}: {len(data)} bytes decompressed, {INDEX} says "
                              f"{shard.raw_size}: it does not match its index")
        return data

    def _framed_header(self, shard: Shard) -> tuple[tuple[int, ...], list[tuple[int, int, int, int, int]], int]:
        """A framed chunk's sample offsets (in its uncompressed bytes), frame table and samples a
        frame (its own, whatever the index says), checked."""
        n, k, url = shard.samples, shard.frame_rows, shard.url
        end = _FRAMED_PREFIX.size + 4 * (n + 1) + _FRAMED_FRAME.size * (-(-n // k))
        head = self.storage.read(url, 0, end)
        if len(head) >= 8 and head[:8] != _FRAMED_MAGIC:
            raise SampleError(f"{url}: not a framed zstd chunk (no LDFZ01 at its start), though {INDEX} says "
                              "compression_level 'batch': the index does not match its shards")
        if len(head) < _FRAMED_PREFIX.size:
            raise SampleError(f"{url}: cut short: {len(head)} bytes, less than its framed zstd header")
        _, version, _, count, k, n_frames = _FRAMED_PREFIX.unpack_from(head)
        if version != 1:
            raise SampleError(f"{url}: framed zstd version {version} (conveyor reads version 1)")
        self._count(shard, count)
        table = _FRAMED_PREFIX.size + 4 * (n + 1)
        end = table + _FRAMED_FRAME.size * n_frames
        if k < 1 or n_frames != -(-n // k):
            raise SampleError(f"{url}: its framed zstd header says {n_frames} frames of {k} for {n} samples")
        if len(head) < end:
            head += self.storage.read(url, len(head), end)
        if len(head) < end:
            raise SampleError(f"{url}: cut short: {len(head)} bytes, less than its framed zstd header ({end})")
        offsets = struct.unpack_from(f"<{n + 1}I", head, _FRAMED_PREFIX.size)
        size = self._size(shard)
        if offsets[0] != 0 or any(a > b for a, b in zip(offsets, offsets[1:])):
            raise SampleError(f"{url}: its sample offsets are out of order")
        frames = [_FRAMED_FRAME.unpack_from(head, table + _FRAMED_FRAME.size * f) for f in range(n_frames)]
        for f, (first, items, start, packed, raw) in enumerate(frames):
            if (first, items) != (f * k, min(k, n - f * k)) or start < end \
                    or raw != offsets[first + items] - offsets[first]:
                raise SampleError(f"{url}: frame {f} of its framed zstd table does not match its offsets")
            if start + packed > size:
                raise SampleError(f"{url}: cut short: {size} bytes, frame {f} (samples {first}-{first + items - 1}) "
                                  f"ends at byte {start + packed}")
        return offsets, frames, k

    def _frame(self, shard: Shard, frame: tuple[int, int, int, int, int], f: int, pos: int) -> bytes:
        first, items, start, packed, raw = frame
        where = f"{shard.url}: sample {pos} (frame {f}, samples {first}-{first + items - 1})"
        body = self.storage.read(shard.url, start, start + packed)
        if len(body) != packed:
            raise SampleError(f"{where}: cut short: {len(body)} of its {packed} compressed bytes")
        try:
            data = shard.decompress(body)
        except Exception as exc:
            raise SampleError(f"{where}: does not decompress ({type(exc).__name__}: {exc})") from None
        if len(data) != raw:
            raise SampleError(f"{where}: {len(data)} bytes decompressed, its frame table says {raw}")
        return data

    def _arrow(self, shard: Shard, offsets: tuple[int, ...]) -> list[dict] | None:
        """The rows of a chunk's Arrow footer, or None when it has none."""
        size = self._size(shard)
        tail = self.storage.read(shard.url, size - 12, size) if size >= offsets[-1] + 12 else b""
        if tail[-8:] != _ARROW_MAGIC:
            return None
        length = _U32.unpack_from(tail)[0]
        if size - 12 - length < offsets[-1]:
            raise SampleError(f"{shard.url}: its Arrow footer says {length} bytes, more than the chunk holds")
        try:
            import pyarrow as pa
        except ImportError:
            raise SourceError(f"{shard.url}: LitData's Arrow rows need pyarrow: "
                              "pip install 'conveyor[parquet]'") from None
        blob = self.storage.read(shard.url, size - 12 - length, size - 12)
        try:  # an IPC file (litdata 0.2.76), or a stream (earlier)
            ipc = pa.py_buffer(blob)
            reader = pa.ipc.open_file(ipc) if blob[:6] == b"ARROW1" else pa.ipc.open_stream(ipc)
            rows = reader.read_all().to_pylist()
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise SampleError(f"{shard.url}: its Arrow footer does not read ({type(exc).__name__}: {exc})") from None
        self._count(shard, len(rows))
        return rows

    def sample(self, shard: Shard, pos: int) -> bytes | dict:
        """The bytes of sample ``pos`` of ``shard``, or its fields (a dict) where the chunk keeps
        its rows in an Arrow footer.

        Raises:
            SampleError: the shard does not match its index, is cut short or corrupt; the
                message names the shard and the sample.
        """
        if shard.layout == "batch":
            header = self._framed.get(shard.url)
            if header is None:
                with _reading(pos):
                    header = self._framed[shard.url] = self._framed_header(shard)
            offsets, frames, k = header
            f = pos // k
            data = self._keep(f"{shard.url}#{f}", lambda: self._frame(shard, frames[f], f, pos))
            base = offsets[frames[f][0]]
            return data[offsets[pos] - base:offsets[pos + 1] - base]
        with _reading(pos):
            data = self._keep(shard.url, lambda: self._whole(shard)) if shard.layout == "chunk" else None
            offsets = self._offsets.get(shard.url)
            if offsets is None:
                offsets = self._offsets[shard.url] = self._header(shard, data)
        start, end = offsets[pos], offsets[pos + 1]
        if data is not None:
            return data[start:end]
        if shard.layout == "plain" and offsets[0] == offsets[-1]:  # no sample bytes: rows in an Arrow footer?
            with _reading(pos):
                rows = self._keep(f"{shard.url}#arrow", lambda: self._arrow(shard, offsets) or [])
            if rows:
                return dict(rows[pos])
        raw = self.storage.read(shard.url, start, end)
        if shard.layout != "sample":
            return raw
        try:
            return shard.decompress(raw)
        except Exception as exc:
            raise SampleError(f"{shard.url}: sample {pos} does not decompress ({type(exc).__name__}: {exc})") from None

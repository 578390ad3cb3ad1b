"""Tar shards (WebDataset layout) for ``conveyor pack SRC DST``, with ``DST/index.json``.

Each image becomes two members, ``KEY.jpg`` (the file's bytes, as stored; other formats keep
their extension) and ``KEY.cls`` (the class number in ASCII). Samples go into
``shard-000000.tar``, ``shard-000001.tar``, ... in sorted order, a new shard starting before
one would pass ``shard_size``. ``DST/index.json`` lists the shards (name, samples, bytes,
sha256, index of the first sample), the total and the classes; ``read_tar`` checks each
shard's sample count against it.

With ``resize=N`` each image whose shorter side is above ``N`` is stored re-encoded as JPEG
(``quality``, default 90) with its shorter side ``N``, aspect kept (``_shrink``); smaller
images are stored as they are.

The output depends on the input bytes and the options only: sorted listing, fixed tar
headers (mtime 0, uid/gid 0, no user or group names, mode 0644), GNU tar format, a sorted
JSON index. Packing the same folder twice, or to a local folder and to S3, gives the same
bytes. Each shard is written to a local temporary file first and then moved (locally) or
uploaded whole (remote, retried as a whole on transient errors), so a half-written shard is
never left under its final name.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import hashlib
import io
import json
import logging
import os
import tarfile
import tempfile
import time
from typing import Any, Iterable, Iterator

from conveyor.errors import ConveyorError, SourceError
from conveyor.pack._samples import Sample, join_url, list_samples, ordered_reads
from conveyor.pack._shrink import DEFAULT_QUALITY, shrink
from conveyor.storage import RetryPolicy, Storage, is_local, parse_size, redact

log = logging.getLogger("conveyor.pack")  # the package's name: its modules are private

INDEX_NAME = "index.json"
INDEX_FORMAT = "conveyor-shards/1"


def _member(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    return info


def _tar_size(size: int) -> int:
    return 512 + -(-size // 512) * 512


def _readable(path: str) -> None:
    """Give a temporary file (made 0600) the permissions of a normal new file."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)



def _shrunk(reads: Iterable[tuple[Sample, bytes]], resize: int, quality: int,
            threads: int) -> Iterator[tuple[Sample, bytes]]:
    """``(sample, bytes)`` in order with each image shrunk (``threads`` at once; Pillow
    releases the GIL while decoding, resizing and encoding)."""
    def one(s: Sample, data: bytes) -> tuple[Sample, bytes]:
        small = shrink(data, resize, quality=quality, name=f"pack: {redact(s.url)}")
        return (s, data) if small is None else (Sample(s.url, s.key, "jpg", s.label), small)

    with cf.ThreadPoolExecutor(threads, thread_name_prefix="conveyor-pack") as pool:
        window: collections.deque = collections.deque()
        for s, data in reads:
            window.append(pool.submit(one, s, data))
            if len(window) > 2 * threads:
                yield window.popleft().result()
        while window:
            yield window.popleft().result()


class _ShardWriter:
    def __init__(self, storage: Storage, dst: str, prefix: str, tmpdir: str):
        self.storage, self.dst, self.prefix, self.tmpdir = storage, dst, prefix, tmpdir
        self.shards: list[dict[str, Any]] = []
        self._tar: tarfile.TarFile | None = None
        self._file: Any = None
        self._path = ""
        self.bytes = 0
        self.samples = 0
        self.first = 0

    def open(self, first: int) -> None:
        fd, self._path = tempfile.mkstemp(prefix=".pack-", suffix=".tar", dir=self.tmpdir)
        self._file = os.fdopen(fd, "wb")
        self._tar = tarfile.open(fileobj=self._file, mode="w", format=tarfile.GNU_FORMAT)
        self.bytes, self.samples, self.first = 0, 0, first

    def add(self, s: Sample, data: bytes) -> None:
        assert self._tar is not None
        label = str(s.label).encode()
        self._tar.addfile(_member(f"{s.key}.{s.ext}", len(data)), io.BytesIO(data))
        self._tar.addfile(_member(f"{s.key}.cls", len(label)), io.BytesIO(label))
        self.bytes += _tar_size(len(data)) + _tar_size(len(label))
        self.samples += 1

    def add_fields(self, key: str, fields: list[tuple[str, bytes]]) -> None:
        """One sample as members ``{key}.{field}`` (``conveyor pack --from``)."""
        assert self._tar is not None
        for field, data in fields:
            self._tar.addfile(_member(f"{key}.{field}", len(data)), io.BytesIO(data))
            self.bytes += _tar_size(len(data))
        self.samples += 1

    def close(self) -> None:
        if self._tar is None:
            return
        self._tar.close()
        self._file.close()
        self._tar = None
        name = f"{self.prefix}-{len(self.shards):06d}.tar"
        digest = hashlib.sha256()
        with open(self._path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        size = os.path.getsize(self._path)
        _readable(self._path)
        self.storage.put_file(self._path, join_url(self.dst, name))
        if os.path.exists(self._path):
            os.remove(self._path)
        self.shards.append({"name": name, "samples": self.samples, "bytes": size, "first": self.first,
                            "sha256": digest.hexdigest()})
        log.info("pack: wrote %s (%d samples, %d bytes)", name, self.samples, size)

    def abort(self) -> None:
        if self._tar is not None:
            self._file.close()
            self._tar = None
            os.remove(self._path)


def clear_destination(storage: Storage, dst: str, prefix: str, overwrite: bool,
                      storage_options: dict | None) -> None:
    """Make ``dst`` ready for new shards: refuse (or, with ``overwrite``, remove) the shards
    named ``prefix-*.tar`` already there, and make a local folder."""
    old = _existing(storage, dst, prefix)
    if old and not overwrite:
        raise ConveyorError(f"pack: {redact(dst, storage_options)} already holds {len(old)} "
                            f"shard(s) named {prefix}-*.tar; pass --overwrite to replace them")
    for url in old:
        fs, path = storage.resolve(url)
        fs.rm_file(path)
    if is_local(dst):
        try:
            os.makedirs(dst, exist_ok=True)
        except OSError as exc:  # a file where the folder should be, a read-only mount...
            raise ConveyorError(f"pack: cannot make the output folder {dst!r} "
                                f"({type(exc).__name__}: {exc})") from exc


def _existing(storage: Storage, dst: str, prefix: str) -> list[str]:
    try:
        return storage.glob(join_url(dst, f"{prefix}-*.tar"))
    except SourceError:
        return []


def pack(src: str, dst: str, *, shard_size: int | str = "256MB", prefix: str = "shard",
         concurrency: int = 16, overwrite: bool = False,
         storage_options: dict[str, Any] | None = None,
         policy: RetryPolicy | None = None, resize: int | None = None,
         quality: int = DEFAULT_QUALITY, threads: int | None = None,
         extensions: list[str] | None = None) -> dict[str, Any]:
    """Pack ``src`` (``<class>/<image>``) into tar shards under ``dst``; returns the index.

    Args:
        src: the ImageNet-layout folder, local or any fsspec URL.
        dst: the output folder, local or any fsspec URL.
        shard_size: the most bytes a shard holds (``"256MB"``; a single larger sample gets a
            shard of its own).
        prefix: shard names are ``{prefix}-000000.tar``...
        concurrency: source reads in flight.
        overwrite: replace shards already under ``dst`` (refused otherwise).
        storage_options: fsspec options for both ``src`` and ``dst``; never logged.
        policy: the retry policy of every read and upload.
        resize: store images with a shorter side above this re-encoded as JPEG with that
            shorter side (aspect kept); None stores every file's bytes as they are.
        quality: JPEG quality (1-100) of the re-encoded images.
        threads: images re-encoded at once (default: the CPU count).
        extensions: pack only files whose name ends in one of these, in any case
            (``[".jpg", ".png"]``); None: every visible file with an extension.

    Raises:
        SourceError: nothing to pack, or ``src`` cannot be read.
        ConveyorError: ``dst`` already holds shards and ``overwrite`` is false.

    Example:
        >>> pack("examples/data/imagenet-sample/train", "/tmp/shards", shard_size="2MB")  # doctest: +SKIP
        {'format': 'conveyor-shards/1', 'samples': 240, ...}
    """
    limit = parse_size(shard_size)
    if limit < 1024:
        raise ValueError(f"shard_size={shard_size!r} is below 1kB")
    if resize is not None and (not isinstance(resize, int) or resize < 1):
        raise ValueError(f"{resize=} must be a positive int (pixels of the shorter side)")
    if not isinstance(quality, int) or not 1 <= quality <= 100:
        raise ValueError(f"{quality=} must be an int in 1..100")
    storage = Storage(storage_options=storage_options, policy=policy, threads=concurrency)
    try:
        samples, classes = list_samples(storage, src, extensions)
        if not samples:
            raise SourceError(f"pack: no image files under {redact(src, storage_options)}/<class>/")
        clear_destination(storage, dst, prefix, overwrite, storage_options)
        tmpdir = dst if is_local(dst) else None
        writer = _ShardWriter(storage, dst, prefix, tmpdir or tempfile.gettempdir())
        t0 = time.perf_counter()
        try:
            reads = ordered_reads(storage, samples, concurrency)
            if resize is not None:
                reads = _shrunk(reads, resize, quality, threads or os.cpu_count() or 1)
            fields = {"cls"}
            for i, (s, data) in enumerate(reads):
                fields.add(s.ext)
                need = _tar_size(len(data)) + _tar_size(len(str(s.label)))
                if writer.samples and writer.bytes + need > limit:
                    writer.close()
                if writer._tar is None:
                    writer.open(i)
                writer.add(s, data)
            writer.close()
        except BaseException:
            writer.abort()
            raise
        index = {"format": INDEX_FORMAT, "layout": "webdataset", "fields": sorted(fields),
                 "shard_size": limit, "samples": len(samples), "classes": classes,
                 "shards": writer.shards}
        if resize is not None:
            index["resize"] = {"shorter_side": resize, "quality": quality}
        text = json.dumps(index, indent=1, sort_keys=True) + "\n"
        fd, tmp = tempfile.mkstemp(prefix=".index-", suffix=".json", dir=tmpdir)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        _readable(tmp)
        storage.put_file(tmp, join_url(dst, INDEX_NAME))
        if os.path.exists(tmp):
            os.remove(tmp)
        log.info("pack: %d samples in %d shards in %.1f s (%d retries)", len(samples),
                 len(writer.shards), time.perf_counter() - t0, storage.stats.as_dict()["retries"])
        return index
    finally:
        storage.close()


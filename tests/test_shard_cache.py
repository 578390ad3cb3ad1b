"""The bounded local cache of remote shards (``read_tar``/``fetch`` ``cache:``), against moto's
S3 server on 127.0.0.1 (issue 31 item 5): a limit smaller than the epoch's shards, shards
re-packed under their names, two processes sharing one folder, a disk that fills up (the
oldest entries evicted for new ones, else an error naming the folder), a folder that cannot be written."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from torchdata.nodes import IterableWrapper

from conveyor import SourceError
from conveyor.nodes.read_tar import ReadTar
from conveyor.pack import pack
from conveyor.storage import LocalCache, _cache
from s3_server import moto_server, s3  # noqa: F401  (fixtures)

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "examples/data/imagenet-sample/train"
BLOCK = 256 << 10


@pytest.fixture(scope="module")
def local_shards(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("shards") / "train"
    pack(str(SAMPLE), str(out), shard_size="1MB")
    return out


def _shards(s3, local: Path, prefix: str = "train") -> list[str]:
    names = sorted(p.name for p in local.glob("*.tar"))
    for name in names:
        s3.client.put_object(Bucket=s3.bucket, Key=f"{prefix}/{name}", Body=(local / name).read_bytes())
    return [s3.url(f"{prefix}/{n}") for n in names]


def _read(urls: list[str], cache: Path, limit: int) -> tuple[str, ReadTar]:
    node = ReadTar(IterableWrapper([{"path": u, "index": i} for i, u in enumerate(urls)]), cache=str(cache),
                   cache_size=limit, block_size=BLOCK, read_ahead=2)
    h = hashlib.sha256()
    for sample in node:
        h.update(sample["__key__"].encode())
        for k in sorted(k for k, v in sample.items() if isinstance(v, bytes)):
            h.update(k.encode() + sample[k])
    return h.hexdigest(), node


def _entries(cache: Path) -> list[Path]:
    return [p for p in cache.iterdir() if not p.name.startswith(".")]


def test_a_limit_smaller_than_the_epochs_shards_keeps_the_cache_bounded(s3, local_shards, tmp_path) -> None:
    urls = _shards(s3, local_shards)
    total = sum((local_shards / u.rsplit("/", 1)[1]).stat().st_size for u in urls)
    limit = 2 << 20
    assert total > 2 * limit  # the epoch does not fit
    cache = tmp_path / "cache"
    first, node = _read(urls, cache, limit)
    node.close()
    assert sum(p.stat().st_size for p in _entries(cache)) <= limit and node.storage.cache.evicted > 0
    _, last = _read(urls[-1:], cache, limit)  # the most recently used blocks are those kept
    assert last.stats()["cache_hits"] > 0 and last.stats()["bytes"] < (local_shards / urls[-1].rsplit("/", 1)[1]).stat().st_size
    last.close()
    again, node = _read(urls, cache, limit)
    assert again == first  # an epoch that does not fit: read again (LRU keeps no scan), and right
    node.close()
    assert sum(p.stat().st_size for p in _entries(cache)) <= limit
    assert int((cache / ".size").read_bytes()) == sum(p.stat().st_size for p in _entries(cache))


def test_a_shard_re_packed_under_its_name_is_never_served_stale(s3, local_shards, tmp_path) -> None:
    urls = _shards(s3, local_shards)
    cache = tmp_path / "cache"
    first, node = _read(urls[:1], cache, 64 << 20)
    node.close()
    again, node = _read(urls[:1], cache, 64 << 20)
    assert again == first and node.stats()["bytes"] == 0  # all from the cache (the HEAD aside)
    node.close()
    other = sorted(local_shards.glob("*.tar"))[1]  # re-packed: other samples under the same name
    s3.client.put_object(Bucket=s3.bucket, Key="train/" + urls[0].rsplit("/", 1)[1], Body=other.read_bytes())
    expected, node = _read([s3.url("train/" + other.name)], tmp_path / "fresh", 64 << 20)
    node.close()
    now, node = _read(urls[:1], cache, 64 << 20)
    assert now == expected != first and node.stats()["bytes"] > 0
    node.close()


def test_two_processes_share_one_cache_folder(s3, local_shards, tmp_path) -> None:
    urls = _shards(s3, local_shards)
    expected, node = _read(urls, tmp_path / "alone", 64 << 20)
    node.close()
    cache = tmp_path / "shared"
    limit = 1 << 20  # four blocks: the two processes evict under each other all along
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}
    cmd = [sys.executable, str(ROOT / "tests/shard_cache_job.py"), str(cache), str(limit), str(BLOCK), *urls]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    try:
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
        got = json.loads(out.strip().splitlines()[-1])
        assert got["digests"] == [expected, expected], (got, err[-2000:])
    assert sum(p.stat().st_size for p in _entries(cache)) <= limit
    assert not [p for p in cache.iterdir() if p.name not in (".lock", ".size") and p.name.startswith(".")]


def test_eviction_never_removes_an_entry_being_read(tmp_path) -> None:
    cache = LocalCache(str(tmp_path / "c"), 1000)
    cache.put("read", b"r" * 400)
    os.utime(cache._path("read"), (1, 1))  # the least recently used
    with open(cache._path("read"), "rb") as reading:
        fcntl.flock(reading.fileno(), fcntl.LOCK_SH)  # as get() holds it while it reads
        for i in range(5):
            cache.put(f"k{i}", bytes([i]) * 300)
        # the oldest entry is held by a reader: the newer ones went instead
        assert os.path.exists(cache._path("read")) and cache.evicted >= 3 and cache.total() <= 1000
        assert cache.get("read") == b"r" * 400  # shared: readers do not exclude each other
    with open(cache._path("read"), "rb") as evicting:
        fcntl.flock(evicting.fileno(), fcntl.LOCK_EX)  # as an eviction holds it to remove it
        assert cache.get("read") is None  # a miss at once: a reader never waits on an eviction
    os.utime(cache._path("read"), (1, 1))
    cache.put("k9", b"9" * 400)
    assert not os.path.exists(cache._path("read")) and cache.total() <= 1000


def test_a_disk_smaller_than_the_limit_evicts_the_oldest_entries_to_keep_new_ones(s3, local_shards, tmp_path,
                                                                                monkeypatch, caplog) -> None:
    urls = _shards(s3, local_shards)
    expected, node = _read(urls, tmp_path / "ok", 64 << 20)
    node.close()
    cache, disk = tmp_path / "small", 3 << 20  # a disk of 3 MiB under a cache_size of 64 MiB
    write = _cache._write_file

    def small_disk(path: str, data: bytes) -> None:
        if not os.path.basename(path).startswith(_cache._SIZE):
            if sum(p.stat().st_size for p in _entries(cache)) + len(data) > disk:
                raise OSError(errno.ENOSPC, "No space left on device")
        write(path, data)

    monkeypatch.setattr(_cache, "_write_file", small_disk)
    with caplog.at_level(logging.WARNING, logger="conveyor.storage"):
        got, node = _read(urls, cache, 64 << 20)
    node.close()
    assert got == expected  # every block read, the cache going on within its disk
    kept = sum(p.stat().st_size for p in _entries(cache))
    assert 0 < kept <= disk and node.storage.cache.evicted > 0
    warned = [r.getMessage() for r in caplog.records if "disk filled up" in r.getMessage()]
    assert len(warned) == 1 and str(cache) in warned[0] and "67108864 bytes" in warned[0], warned
    _, last = _read(urls[-1:], cache, 64 << 20)  # the newest blocks are the ones kept
    assert last.stats()["cache_hits"] > 0
    last.close()


def test_a_full_disk_with_nothing_to_evict_is_an_error_naming_the_folder_and_the_bytes(s3, local_shards, tmp_path,
                                                                                       monkeypatch) -> None:
    urls = _shards(s3, local_shards)

    def full(path: str, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_cache, "_write_file", full)
    cache = tmp_path / "full"
    with pytest.raises(SourceError, match=rf"cache folder {re.escape(str(cache))}: the disk is full \(No space left "
                                          rf"on device\): an entry of {BLOCK} bytes does not fit, \d+ bytes are free "
                                          r"there and the cache holds 0 bytes \(of its limit 67108864\)"):
        _read(urls, cache, 64 << 20)
    assert not _entries(cache) and not [p for p in cache.iterdir() if p.name.startswith(".") and p.name != ".lock"]


def test_a_cache_folder_that_cannot_be_written_reads_on_with_one_warning(s3, local_shards, tmp_path, monkeypatch,
                                                                         caplog) -> None:
    urls = _shards(s3, local_shards)
    expected, node = _read(urls, tmp_path / "ok", 64 << 20)
    node.close()

    def read_only(path: str, data: bytes) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(_cache, "_write_file", read_only)
    cache = tmp_path / "ro"
    with caplog.at_level(logging.WARNING, logger="conveyor.storage"):
        got, node = _read(urls, cache, 64 << 20)
    node.close()
    assert got == expected and not _entries(cache)
    warned = [r.getMessage() for r in caplog.records if "cannot be written" in r.getMessage()]
    assert len(warned) == 1 and str(cache) in warned[0] and "Read-only" in warned[0], warned


def test_a_cache_that_cannot_hold_one_block_is_an_error_naming_it(tmp_path) -> None:
    with pytest.raises(SourceError, match=r"cache folder .*/tiny: its limit, cache_size '100kB', cannot hold "
                                          r"one block of a shard \(block_size, 262144 bytes\)"):
        ReadTar(IterableWrapper([]), cache=str(tmp_path / "tiny"), cache_size="100kB", block_size=BLOCK)

"""Listings made once: a manifest (``conveyor index``) read with one request, and rank 0's listing
shared through torch.distributed's store, against moto's S3 server on 127.0.0.1 (issue 31 item 4)."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

from conveyor import SourceError
from conveyor.graphs.listings import listing_sharer, shares
from conveyor.graphs.ops import LIST_FILES, BuildContext, ListFilesParams, ShareListing
from conveyor.nodes.fetch import Fetch
from conveyor.nodes.list_files import ListFiles, read_manifest
from conveyor.tools.cli import main as cli_main
from s3_server import free_port, moto_server, s3  # noqa: F401  (fixtures)


def _put_tree(s3, n: int = 30, prefix: str = "data") -> None:
    from concurrent.futures import ThreadPoolExecutor

    def put(i: int) -> None:
        s3.client.put_object(Bucket=s3.bucket, Key=f"{prefix}/c{i % 3}/{i:04d}.bin", Body=b"x" * (i + 1))

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(put, range(n)))


def _index(s3, url: str, tmp_path: Path, *extra: str) -> Path:
    out = tmp_path / "manifest.json"
    assert cli_main(["index", url, "-o", str(out), *extra]) == 0
    return out


def test_index_writes_a_manifest_that_list_files_reads_in_one_get(s3, tmp_path: Path) -> None:
    _put_tree(s3)
    url = s3.url("data/*/*.bin")
    out = _index(s3, url, tmp_path, "--label", "parent_dir", "--extensions", ".BIN")
    manifest = json.loads(out.read_text())
    listed = ListFiles(url=url, label="parent_dir", extensions=[".bin"])
    records = listed.records()
    assert manifest["count"] == 30 and manifest["paths"] == [r["path"] for r in records]
    assert manifest["labels"] == [r["label"] for r in records] and manifest["classes"] == ["c0", "c1", "c2"]
    assert manifest["sizes"][:3] == [1, 4, 7] and all(len(e) == 32 for e in manifest["etags"])  # S3's MD5s
    s3.client.put_object(Bucket=s3.bucket, Key="manifests/train.json", Body=out.read_bytes())
    proxy = s3.proxy()
    node = ListFiles(manifest=s3.url("manifests/train.json"))
    got = node.records()
    assert proxy.kinds == {"get": 1}, proxy.kinds  # no LIST at all
    assert [{k: r[k] for k in ("path", "label", "index")} for r in got] == records
    assert all(r["size"] == int(r["path"][-8:-4]) + 1 for r in got) and got[5]["etag"] == manifest["etags"][5]
    assert node.classes == ["c0", "c1", "c2"]
    # the state's digest is the listing's: a state taken over the glob resumes over the manifest
    listed.reset()
    for _ in range(7):
        next(listed)
    node.reset(listed.get_state())
    assert next(node)["path"] == records[7]["path"]


def test_a_manifest_whose_objects_changed_is_an_error_naming_it_and_the_object(s3, tmp_path: Path) -> None:
    _put_tree(s3, 6)
    out = _index(s3, s3.url("data/*/*.bin"), tmp_path)
    s3.client.delete_object(Bucket=s3.bucket, Key="data/c1/0001.bin")
    with pytest.raises(SourceError) as gone:
        list(Fetch(ListFiles(manifest=str(out)), on_error="skip"))  # not a skip: the manifest is stale
    text = str(gone.value)
    assert "data/c1/0001.bin" in text and str(out) in text and "is gone" in text and "conveyor index" in text
    out = _index(s3, s3.url("data/*/*.bin"), tmp_path)
    s3.client.put_object(Bucket=s3.bucket, Key="data/c2/0002.bin", Body=b"re-packed, longer")
    with pytest.raises(SourceError, match=r"data/c2/0002.bin, listed in the manifest .* is 17 bytes, the "
                                          r"manifest says 3.*re-run conveyor index"):
        list(Fetch(ListFiles(manifest=str(out))))


def test_bad_manifests_are_source_errors_naming_them(s3, tmp_path: Path) -> None:
    _put_tree(s3, 4)
    good = json.loads(_index(s3, s3.url("data/*/*.bin"), tmp_path).read_text())
    cases = {"not JSON": "{\"format\": 1, \"paths\": [", "not a conveyor manifest": "[1, 2]",
             "cut short or edited": json.dumps({**good, "paths": good["paths"][:3]}),
             "digest": json.dumps({**good, "digest": "0" * 16})}
    for i, (said, text) in enumerate(cases.items()):
        bad = tmp_path / f"bad{i}.json"
        bad.write_text(text)
        with pytest.raises(SourceError, match=said) as info:
            ListFiles(manifest=str(bad), where="node 'files'").records()
        assert str(bad) in str(info.value) and "in node 'files'" in info.value.__notes__
    with pytest.raises(SourceError, match=r"manifest s3://.*/nothing.json: cannot read it .*conveyor index"):
        ListFiles(manifest=s3.url("nothing.json")).records()


class Stores:
    """A TCPStore server on 127.0.0.1 and a client of it for each rank (as each rank has its own)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.server = dist.TCPStore("127.0.0.1", self.port, None, True, timeout=timedelta(seconds=30))
        self._clients: dict[int, dist.TCPStore] = {}
        self._lock = threading.Lock()

    def of(self, rank: int):
        with self._lock:
            if rank not in self._clients:
                self._clients[rank] = dist.TCPStore("127.0.0.1", self.port, None, False,
                                                    timeout=timedelta(seconds=30))
            return self._clients[rank]


@pytest.fixture
def store():
    yield Stores()


def _ranks(world: int, make_node, timeout: float = 30.0) -> list:
    """Each rank's outcome (its records or its error), the ranks as threads."""
    out: list = [None] * world

    def rank(r: int) -> None:
        try:
            out[r] = make_node(r).records()
        except Exception as exc:  # the test looks at it
            out[r] = exc

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    return out


def test_rank_0_lists_and_the_others_read_its_listing_from_the_store(s3, store) -> None:
    _put_tree(s3, 1200)  # two pages of a flat listing
    url = s3.url("data/*/*.bin")
    proxy = s3.proxy()
    alone = ListFiles(url=url, label="parent_dir").records()
    assert proxy.kinds == {"list": 2}, proxy.kinds  # 1200 keys: two LIST requests
    out = _ranks(4, lambda r: ListFiles(url=url, label="parent_dir", share=listing_sharer(
        url, rank=r, world=4, timeout=30, store=lambda: store.of(r))))
    assert all(x == alone for x in out), [type(x) for x in out]
    assert proxy.kinds == {"list": 4}, proxy.kinds  # rank 0's two; ranks 1-3 none
    each = _ranks(4, lambda r: ListFiles(url=url, label="parent_dir"))
    assert all(x == alone for x in each) and proxy.kinds == {"list": 12}  # today: every rank lists


def test_rank_0_failing_to_list_fails_every_rank_at_once_with_its_message(s3, store) -> None:
    url = s3.url("nothing/*.tar")
    start = time.monotonic()
    out = _ranks(3, lambda r: ListFiles(url=url, share=listing_sharer(url, rank=r, world=3, timeout=60,
                                                                     store=lambda: store.of(r))))
    assert all(isinstance(x, SourceError) for x in out), out
    assert "no file matches" in str(out[0]) and all("rank 0 could not list it: " in str(x) for x in out[1:])
    assert time.monotonic() - start < 30  # not the 60 s wait


def test_a_rank_0_that_never_lists_is_an_error_naming_it_and_the_url(s3, store) -> None:
    url = s3.url("data/*.tar")
    out = _ranks(1, lambda r: ListFiles(url=url, share=listing_sharer(url, rank=1, world=2, timeout=0.5,
                                                                     store=lambda: store.of(1))))
    assert isinstance(out[0], SourceError) and "rank 1 waited 0.5s for rank 0's listing" in str(out[0])
    assert url in str(out[0]) and "share_timeout" in str(out[0])


def test_sharing_is_on_by_default_for_remote_urls_only() -> None:
    assert shares("auto", "s3://b/x/*.tar") and not shares("auto", "/data/x/*.tar")
    assert shares("rank0", "/data/x/*.tar") and not shares("each", "s3://b/x/*.tar")

    def built(url: str, world: int, share: ShareListing = ShareListing.auto) -> ListFiles:
        ctx = BuildContext(name="files", op="list_files", where="node 'files'", seed=0, rank=1, world=world)
        return LIST_FILES.build(ListFilesParams(url=url, share=share), [], ctx)

    assert built("s3://b/x/*.tar", 4).share is not None and built("/data/*.tar", 4).share is None
    assert built("s3://b/x/*.tar", 1).share is None and built("s3://b/*.tar", 4, ShareListing.each).share is None
    assert built("/data/*.tar", 4, ShareListing.rank0).share is not None


def test_read_manifest_keeps_what_the_listing_needs(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[1] / "examples/data/numbers"
    out = tmp_path / "m.json"
    assert cli_main(["index", f"{root}/*/*.txt", "--label", "parent_dir", "-o", str(out)]) == 0
    listing = read_manifest(str(out))
    assert listing["sizes"] and listing["etags"] is None  # local files: sizes, no ETags
    assert ListFiles(manifest=str(out)).count() == ListFiles(url=f"{root}/*/*.txt").count() == 40


def _copies_spec(tmp_path: Path, url: str, method: str) -> Path:
    spec = tmp_path / f"copies-{method}.yaml"
    spec.write_text(f"nodes:\n  files: {{op: list_files, url: \"{url}\"}}\n"
                    "  shard: {op: shard, by: [rank, worker]}\n  batch: {op: batch, size: 10}\n"
                    f"output: batch\nworkers: {{copies: 3, method: {method}}}\n")
    return spec


def test_worker_copies_take_the_listing_their_parent_made(s3, tmp_path: Path) -> None:
    """Each copy built its own list_files and listed (and the parent once more to count)."""
    from conveyor import load_graph

    _put_tree(s3, 1200)
    url = s3.url("data/*/*.bin")
    proxy = s3.proxy()
    loader = load_graph(str(_copies_spec(tmp_path, url, "thread")))
    for _ in range(2):
        assert sum(len(b) for b in loader) == 1200
    assert proxy.kinds == {"list": 2}, proxy.kinds  # one listing (two pages), not 1 + 3 copies


def test_a_process_copy_gets_the_listing_with_its_factory(s3, tmp_path: Path) -> None:
    import pickle

    from conveyor.graphs.api import check_spec
    from conveyor.graphs.compile import compile_plan
    from conveyor.nodes import WorkerCopies

    _put_tree(s3, 40)
    url = s3.url("data/*/*.bin")
    proxy = s3.proxy()
    compiled = compile_plan(check_spec(str(_copies_spec(tmp_path, url, "process"))))
    factory = next(c.inner for c in compiled.nodes.values() if isinstance(c.inner, WorkerCopies)).factory
    sent = pickle.loads(pickle.dumps(factory))  # what a spawned worker process receives
    assert proxy.kinds == {"list": 1} and len(sent.listings["files"]["paths"]) == 40
    node, _ = sent(1)
    assert sum(1 for _ in node) == len(range(1, 40, 3)) and proxy.kinds == {"list": 1}  # the copy lists nothing


def _tar(body: bytes) -> bytes:
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo("s0.txt")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    return buf.getvalue()


def test_read_tar_tells_a_shard_re_packed_since_the_manifest_by_its_etag(s3, tmp_path: Path) -> None:
    from conveyor.nodes.read_tar import ReadTar

    for i in range(2):
        s3.client.put_object(Bucket=s3.bucket, Key=f"shards/shard-{i}.tar", Body=_tar(b"a" * 100))
    out = _index(s3, s3.url("shards/*.tar"), tmp_path)
    assert [s["txt"] for s in ReadTar(ListFiles(manifest=str(out)))] == [b"a" * 100] * 2
    s3.client.put_object(Bucket=s3.bucket, Key="shards/shard-1.tar", Body=_tar(b"b" * 100))  # same size
    with pytest.raises(SourceError, match=r"shard-1.tar, listed in the manifest .* has ETag \w+, the manifest "
                                          r"says \w+: .*re-run conveyor index"):
        list(ReadTar(ListFiles(manifest=str(out)), on_error="skip"))
    s3.client.delete_object(Bucket=s3.bucket, Key="shards/shard-0.tar")
    with pytest.raises(SourceError, match=r"shard-0.tar, listed in the manifest .* is gone"):
        list(ReadTar(ListFiles(manifest=str(out)), on_error="skip"))


@pytest.mark.timeout(240)
def test_under_torchrun_rank_0_lists_once_for_4_ranks_and_2_epochs(s3, tmp_path: Path) -> None:
    """The whole path: the spec's list_files on 4 ranks of a gloo process group, the listing
    shared through the group's store, counted at a proxy in front of moto."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    _put_tree(s3, 1200)
    proxy = s3.proxy()  # the AWS_* variables now point at it; the ranks inherit them
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=4", "--master_addr=127.0.0.1",
           f"--master_port={free_port()}", str(root / "tests/shared_listing_job.py"), s3.url("data/*/*.bin"),
           str(tmp_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=200, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    for epoch in range(2):
        paths = [p for r in range(4) for p in seen[r][epoch]]
        assert len(paths) == len(set(paths)) == 1200  # disjoint shares of one listing
    assert proxy.kinds.get("list") == 2, proxy.kinds  # rank 0's two pages; before: 4 ranks x 2

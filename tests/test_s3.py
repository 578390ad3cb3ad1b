"""Object storage against a real S3 server (moto, on loopback): the same batches as local disk,
exact mid-shard resume, pack to and from S3, the local cache, and secrets kept secret."""

from __future__ import annotations

import json
import logging
import shutil
import traceback
from pathlib import Path

import pytest
import torch

from torchdata.nodes import IterableWrapper

from conveyor import SampleError, SourceError, load_graph
from conveyor.tools.cli import main as cli_main
from conveyor.nodes.fetch import Fetch
from conveyor.nodes.list_files import ListFiles
from conveyor.nodes.read_tar import ReadTar
from conveyor.pack import pack
from resume_check import check_resume, fingerprint, run_with_states
from s3_server import moto_server, s3  # noqa: F401  (fixtures)

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "examples/data/imagenet-sample/train"
SMALL = {"batch_size": 16, "image_size": 32}
SECRET = "SeCrEt-9f27c1d4-do-not-leak"

FETCH_SPEC = """\
params:
  root: {root}
  batch_size: 16
  image_size: 32
  seed: 0
nodes:
  files:   {{op: list_files, url: "${{root}}/*/*.JPEG", label: parent_dir, shuffle: true{options}}}
  shard:   {{op: shard, by: [rank, worker]}}
  shuffle: {{op: shuffle_buffer, size: 10000}}   # as specs/imagenet.yaml
  fetch:   {{op: fetch, concurrency: 8{options}}}
  decode:  {{op: map, fn: "conveyor.image:train_transform", args: {{size: "${{image_size}}"}}, workers: 2}}
  batch:   {{op: batch, size: "${{batch_size}}", drop_last: true}}
  collate: {{op: collate}}
output: collate
"""


def fetch_spec(tmp_path: Path, root: str, options: dict | None = None) -> Path:
    extra = f", storage_options: {json.dumps(options)}" if options else ""
    path = tmp_path / "fetch.yaml"
    path.write_text(FETCH_SPEC.format(root=root, options=extra))
    return path


def batches(spec: Path | str, epochs: int = 1, **overrides) -> list:
    out = []
    with load_graph(spec, **overrides) as loader:
        for _ in range(epochs):
            out += [fingerprint(b) for b in loader]
    return out


def read_tar_state(state: dict) -> dict:
    """The read_tar node's own state inside a loader state."""
    stack = [state]
    while stack:
        obj = stack.pop()
        if isinstance(obj, str) and obj.startswith("{"):  # a rank's state is kept as JSON text
            obj = json.loads(obj)
        if isinstance(obj, dict):
            if {"source", "offset", "pos", "shards"} <= set(obj):
                return obj
            stack.extend(obj.values())
    raise AssertionError("no read_tar state found")


@pytest.fixture(scope="module")
def local_shards(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("shards") / "train"
    pack(str(SAMPLE), str(out), shard_size="1MB")
    return out


def test_loose_files_on_s3_give_the_same_batches_as_local_disk(s3, tmp_path: Path) -> None:
    root = s3.upload(SAMPLE, "imagenet/train")
    local = batches(ROOT / "specs/imagenet.yaml", root=str(SAMPLE), **SMALL)
    assert len(local) == 12
    # the bundled spec as it is: decode reads s3:// paths itself
    assert batches(ROOT / "specs/imagenet.yaml", root=root, **SMALL) == local
    slash = ListFiles(url=f"{root}//*/**", label="top_dir").records()  # a root given as .../train/
    assert [(r["path"], r["label"]) for r in slash] == \
        [(r["path"], r["label"]) for r in ListFiles(url=f"{root}/*/*.JPEG", label="parent_dir").records()]
    # with a fetch node in front of decode: concurrent reads, same batches
    assert batches(fetch_spec(tmp_path, str(SAMPLE))) == local
    spec = fetch_spec(tmp_path, root)
    with load_graph(spec) as loader:
        assert [fingerprint(b) for b in loader] == local
        stats = loader.stats()["nodes"]["fetch"]
    assert stats["items"] == 200 and stats["requests"] == 200 and stats["retries"] == 0
    assert stats["bytes"] == sum(p.stat().st_size for p in SAMPLE.glob("*/*.JPEG"))


def test_shards_on_s3_give_the_same_batches_as_local_disk(s3, local_shards: Path) -> None:
    root = s3.upload(local_shards, "shards/train")
    spec = ROOT / "specs/imagenet-shards.yaml"
    local = batches(spec, epochs=2, root=str(local_shards), **SMALL)
    assert len(local) == 24
    with load_graph(spec, root=root, **SMALL) as loader:
        remote = [fingerprint(b) for _ in range(2) for b in loader]
        stats = loader.stats()["nodes"]["samples"]
    assert remote == local
    # six shards of ~1 MB: one size request and one block each, not one request per image
    assert stats["requests"] == 12 and stats["retries"] == 0


def test_exact_mid_shard_resume_from_s3(s3, local_shards: Path) -> None:
    root = s3.upload(local_shards, "shards/train")

    def make():
        return load_graph(ROOT / "specs/imagenet-shards.yaml", root=root, shuffle_window=8, **SMALL)

    with make() as loader:
        _, states = run_with_states(loader, 2)
    steps = [1, 6, 12, 13, 23]
    assert all(read_tar_state(states[k])["offset"] > 0 for k in steps), "steps must be mid-shard"
    assert check_resume(make, epochs=2, steps=steps) == 24


def test_pack_to_and_from_s3_gives_the_same_bytes(s3, local_shards: Path, tmp_path: Path) -> None:
    dst = s3.url("packed/train")
    index = pack(str(SAMPLE), dst, shard_size="1MB")
    keys = sorted(o["Key"] for o in s3.client.list_objects_v2(Bucket=s3.bucket, Prefix="packed/")["Contents"])
    assert keys == sorted(f"packed/train/{p.name}" for p in local_shards.iterdir())
    for p in local_shards.iterdir():
        body = s3.client.get_object(Bucket=s3.bucket, Key=f"packed/train/{p.name}")["Body"].read()
        assert body == p.read_bytes(), p.name
    src = s3.upload(SAMPLE, "loose/train")
    back = tmp_path / "back"
    assert pack(src, str(back), shard_size="1MB") == index
    for p in local_shards.iterdir():
        assert (back / p.name).read_bytes() == p.read_bytes(), p.name


def test_local_cache_serves_the_second_epoch_and_stays_bounded(s3, tmp_path: Path) -> None:
    root = s3.upload(SAMPLE / "n01440764", "cls0")
    cache = tmp_path / "cache"
    node = Fetch(ListFiles(url=f"{root}/*.JPEG"), concurrency=4, cache=str(cache), cache_size="10MB")
    first = list(node)
    assert len(first) == 20 and node.stats()["requests"] == 2 * 20  # a HEAD (size, ETag: the key), a GET
    read = node.stats()["bytes"]
    node.reset()
    assert [x["bytes"] for x in node] == [x["bytes"] for x in first]
    stats = node.stats()
    assert stats["cache_hits"] == 20 and stats["requests"] == 20 and stats["bytes"] == 0 < read  # HEADs
    node.close()
    small = Fetch(ListFiles(url=f"{root}/*.JPEG"), concurrency=4, cache=str(tmp_path / "small"),
                  cache_size="100kB")
    assert len(list(small)) == 20
    small.close()
    assert sum(p.stat().st_size for p in (tmp_path / "small").iterdir()) <= 100_000


def test_secrets_stay_out_of_logs_errors_show_output_and_state(s3, tmp_path: Path, caplog, capsys,
                                                               monkeypatch) -> None:
    root = s3.upload(SAMPLE / "n01440764", "secret/train/n01440764")
    monkeypatch.delenv("AWS_ENDPOINT_URL")  # the endpoint and keys come from the spec alone
    options = {"endpoint_url": s3.server.endpoint, "key": "AKIATESTKEY", "secret": SECRET,
               "client_kwargs": {"aws_secret_access_key": SECRET}}
    spec = fetch_spec(tmp_path, s3.url("secret/train"), options)
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []
    with load_graph(spec, batch_size=4) as loader:
        for _ in loader:
            pass
        seen.append(json.dumps(loader.state_dict()))
        seen.append(json.dumps(loader.stats()))
        seen.append(repr(loader.nodes))
    assert cli_main(["show", str(spec)]) == 0
    assert cli_main(["show", str(spec), "--format", "dot"]) == 0
    # a failing read carries the options: its message, notes and traceback must not
    missing = fetch_spec(tmp_path, root.replace("/secret/", "/nothing-here/"), options)
    missing.write_text(missing.read_text().replace("*/*.JPEG", "*.JPEG"))
    with pytest.raises(Exception) as info:
        batches(missing)
    seen.append("".join(traceback.format_exception(info.value)))
    bad = Fetch(IterableWrapper([{"path": root + "/absent.JPEG"}]), storage_options=options)
    with pytest.raises(SampleError, match="absent.JPEG: no such object") as info2:
        next(bad)
    bad.close()
    seen.append("".join(traceback.format_exception(info2.value)) + repr(bad) + repr(bad.storage))
    out = capsys.readouterr()
    seen += [out.out, out.err, caplog.text]
    assert "fetch: fetch" in out.out  # show printed the graph
    leaks = [i for i, text in enumerate(seen) if SECRET in text]
    assert leaks == [], f"the secret appears in {leaks}"
    assert caplog.records, "expected some debug logging to check"


def test_read_tar_on_s3_resumes_from_every_sample_while_opening_the_next_shard(s3, local_shards) -> None:
    root = s3.upload(local_shards, "shards/train")

    def make() -> ReadTar:  # 1 MB shards in 256 kB blocks: mid-shard, mid-block, next shard opening
        return ReadTar(ListFiles(url=f"{root}/*.tar", shuffle=True), block_size=256 << 10, read_ahead=1)

    node = make()
    node.reset()
    reference, states = [], [json.loads(json.dumps(node.state_dict()))]
    for item in node:
        reference.append((item["index"], item["jpg"]))
        states.append(json.loads(json.dumps(node.state_dict())))
    node.close()
    assert len(reference) == 200 and len({i for i, _ in reference}) == 200
    for k in range(0, len(states), 9):
        fresh = make()
        fresh.reset(states[k])
        assert [(x["index"], x["jpg"]) for x in fresh] == reference[k:], k
        fresh.close()


def test_a_secret_given_through_a_spec_param_is_not_shown(tmp_path: Path, capsys) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"""params:
  root: {SAMPLE}
  s3_secret: {SECRET}
nodes:
  files: {{op: list_files, url: "${{root}}/*/*.JPEG", storage_options: {{secret: "${{s3_secret}}"}}}}
  fetch: {{op: fetch, storage_options: {{secret: "${{s3_secret}}"}}}}
output: fetch
""")
    assert cli_main(["show", str(spec)]) == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(f'nodes:\n  f: {{op: list_files, url: "x/*", storage_options: "{SECRET}"}}\n')
    assert cli_main(["validate", str(bad)]) == 1
    out = capsys.readouterr()
    assert SECRET not in out.out + out.err


def test_folder_markers_are_folders_not_files(s3, tmp_path: Path, caplog) -> None:
    """Keys ending in / (the AWS console's "Create folder", many sync tools) are folders: never
    samples, an empty class folder with one numbered as on local disk, in list_files and pack."""
    keys = ["train/", "train/a cat/", "train/a cat/1.txt", "train/a cat/sub/", "train/a cat/sub/2.txt",
            "train/b/", "train/b/3.txt", "train/c empty/", "train/d/4.txt"]
    for key in keys:
        s3.client.put_object(Bucket=s3.bucket, Key=key, Body=b"" if key.endswith("/") else key.encode())
    root = s3.url("train")
    expected = [(f"{root}/a cat/1.txt", 0), (f"{root}/a cat/sub/2.txt", 0), (f"{root}/b/3.txt", 1),
                (f"{root}/d/4.txt", 3)]
    node = ListFiles(url=f"{root}/*/**", label="top_dir")
    assert [(r["path"], r["label"]) for r in node.records()] == expected
    assert node.classes == ["a cat", "b", "c empty", "d"]
    assert "c empty" in caplog.text and "left out" not in caplog.text
    for url in (root, f"{root}/**"):  # a folder, or every file below it: no marker among them
        assert [r["path"] for r in ListFiles(url=url).records()] == [p for p, _ in expected]
    with pytest.raises(SourceError, match="no file matches"):
        ListFiles(url=f"{root}/c empty/*").records()
    index = pack(root, str(tmp_path / "packed"))
    assert index["classes"] == node.classes
    got = [(s["__key__"], s["cls"]) for s in ReadTar(ListFiles(url=f"{tmp_path}/packed/*.tar"))]
    assert got == [("a cat/1", 0), ("a cat/sub/2", 0), ("b/3", 1), ("d/4", 3)]


def test_a_cache_that_cannot_be_written_is_a_warning_and_one_that_cannot_be_made_names_the_node(
        s3, tmp_path: Path, caplog, capsys) -> None:
    root = s3.upload(SAMPLE / "n01440764", "cls0")
    cache = tmp_path / "cache"
    node = Fetch(ListFiles(url=f"{root}/*.JPEG"), concurrency=4, cache=str(cache), cache_size="10MB")
    first = [x["bytes"] for x in node]
    shutil.rmtree(cache)  # a tmp cleaner took it (or the disk filled up): the reads go on
    node.reset()
    assert [x["bytes"] for x in node] == first
    assert node.stats()["requests"] == 2 * 20 and node.stats()["cache_hits"] == 0
    warned = [r.getMessage() for r in caplog.records if "cannot be written" in r.getMessage()]
    assert len(warned) == 1 and str(cache) in warned[0], warned
    node.close()
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    spec = tmp_path / "cached.yaml"
    spec.write_text(f'nodes:\n  files: {{op: list_files, url: "{root}/*.JPEG"}}\n'
                    f'  fetch: {{op: fetch, cache: "{blocker}/sub"}}\noutput: fetch\n')
    with pytest.raises(SourceError, match=r"cache folder .*a-file/sub: cannot make it") as info:
        load_graph(spec)
    assert any("node 'fetch' (fetch)" in note for note in info.value.__notes__)
    assert cli_main(["run", str(spec)]) == 1
    err = capsys.readouterr().err
    assert "cannot make it" in err and "in node 'fetch' (fetch)" in err, err


def test_read_jsonl_on_s3_resumes_mid_file_and_a_failing_server_is_an_error_naming_the_file(
        s3, tmp_path: Path) -> None:
    import gzip
    import zipfile

    from conveyor.nodes.read_jsonl import ReadJsonl
    from conveyor.storage import RetryPolicy

    local = tmp_path / "text"
    local.mkdir()
    lines = [json.dumps({"text": f"line {i} " + "x" * (i % 300)}) + "\n" for i in range(3000)]
    (local / "a.jsonl").write_text("".join(lines[:2000]))
    (local / "b.jsonl.gz").write_bytes(gzip.compress("".join(lines[2000:2600]).encode()))
    with zipfile.ZipFile(local / "c.jsonl.zip", "w", zipfile.ZIP_DEFLATED) as z:  # read from its end
        z.writestr("c.jsonl", "".join(lines[2600:]))
    root = s3.upload(local, "text")
    quick = RetryPolicy(attempts=3, timeout=2.0, backoff=0.01, backoff_max=0.02)

    def make(where: str = root) -> ReadJsonl:
        return ReadJsonl(ListFiles(url=f"{where}/*"), policy=quick)

    def rows(node) -> list:
        return [(r["text"], r["line"], r["index"], r["file"].rsplit("/", 1)[1]) for r in node]

    node = make()
    node.reset()
    states, reference = [], []
    for r in node:
        states.append(json.loads(json.dumps(node.state_dict())))
        reference.append((r["text"], r["line"], r["index"], r["file"].rsplit("/", 1)[1]))
    node.close()
    assert reference == rows(make(str(local))) and len(reference) == 3000
    for k in (0, 1, 777, 1999, 2000, 2500, 2700, 2999):  # mid-file, at the boundary, mid-.gz, mid-.zip
        fresh = make()
        fresh.reset(states[k])
        assert rows(fresh) == reference[k + 1:], k
        fresh.close()
    s3.proxy(fail_rate=1.0, max_failures=1000, faults=("reset",), only="a.jsonl")
    with pytest.raises(SampleError, match=r"text/a\.jsonl: failed after 3 attempt\(s\)") as info:
        rows(make())
    assert any("in read_jsonl" in note for note in info.value.__notes__), info.value.__notes__
    s3.proxy(deny="b.jsonl")
    node = make()
    with pytest.raises(SourceError, match=r"text/b\.jsonl\.gz: access denied") as info:
        node.reset(states[2000])  # reopens b.jsonl.gz
    assert any("in read_jsonl" in note for note in info.value.__notes__)


def test_no_credentials_on_a_reading_node_is_a_source_error_not_every_sample_skipped(
        s3, tmp_path: Path, monkeypatch) -> None:
    """The listing has keys in its storage_options, the fetch has none (they are per node):
    with on_error: skip every image was skipped as one bad sample after another."""
    root = s3.upload(SAMPLE / "n01440764", "creds/train/n01440764")
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(var)
    keys = json.dumps({"key": "testing", "secret": "testing"})
    spec = tmp_path / "creds.yaml"
    spec.write_text(f'nodes:\n  files: {{op: list_files, url: "{root}/*.JPEG", storage_options: {keys}}}\n'
                    '  fetch: {op: fetch, on_error: skip, attempts: 2, backoff: 0.01}\noutput: fetch\n')
    with load_graph(spec) as loader, pytest.raises(SourceError, match=r"n01440764_\w+\.JPEG: no credentials "
                                                                      r"to sign the request with .*anon: true") as info:
        list(loader)
    assert "NoCredentialsError" in str(info.value)
    assert any("node 'fetch' (fetch)" in note for note in info.value.__notes__)


def test_the_eval_spec_on_s3_reads_through_fetch_with_retries_and_named_errors(s3) -> None:
    """imagenet-eval.yaml had no fetch: on S3 each decode thread read its images one by one
    through fsspec.open, and a server resetting a read was a bare botocore error from decode."""
    val = SAMPLE.parent / "val"
    root = s3.upload(val, "val")
    spec, small = ROOT / "specs/imagenet-eval.yaml", {"batch_size": 16, "image_size": 32, "resize": 40}
    local = batches(spec, root=str(val), **small)
    with load_graph(spec, root=root, **small) as loader:
        assert [fingerprint(b) for b in loader] == local
        assert loader.stats()["nodes"]["fetch"]["requests"] == len(list(val.rglob("*.JPEG")))
    victim = sorted(val.rglob("*.JPEG"))[3].name
    s3.proxy(fail_rate=1.0, max_failures=1000, faults=("reset",), only=victim)
    with pytest.raises(SampleError, match=rf"{victim}: failed after 2 attempt\(s\)") as info:
        batches(spec, root=root, **small, **{"fetch.attempts": 2, "fetch.backoff": 0.01})
    assert any("node 'fetch' (fetch)" in note for note in info.value.__notes__)


def test_a_shard_replaced_between_epochs_is_read_whole_not_at_its_old_size(s3, tmp_path: Path) -> None:
    """The listing filled s3fs's listings cache, and read_tar's size request for the next
    epoch was answered from it: a shard packed again under the same name was read to its old
    length, cut short."""
    small, big = tmp_path / "small", tmp_path / "big"
    for out, classes in ((small, 1), (big, 2)):
        src = tmp_path / f"src{classes}"
        for cls in sorted(p.name for p in SAMPLE.iterdir())[:classes]:
            shutil.copytree(SAMPLE / cls, src / cls)
        pack(str(src), str(out), shard_size="100MB")
    s3.client.put_object(Bucket=s3.bucket, Key="swap/shard-000000.tar",
                         Body=(small / "shard-000000.tar").read_bytes())
    node = ReadTar(ListFiles(url=s3.url("swap/*.tar")))
    assert len(list(node)) == 20
    s3.client.put_object(Bucket=s3.bucket, Key="swap/shard-000000.tar",
                         Body=(big / "shard-000000.tar").read_bytes())
    node.reset()  # the next epoch, same listing
    assert [s["__key__"] for s in node] == [s["__key__"] for s in ReadTar(ListFiles(url=f"{big}/*.tar"))]
    node.close()


def test_map_functions_read_remote_paths_with_the_retry_policy_and_its_errors(s3) -> None:
    """conveyor.files and conveyor.image read s3:// paths themselves when no fetch is in front:
    through fsspec.open a denied object was one more bad sample (skipped with on_error: skip)
    and a server out of reach a bare botocore error."""
    from conveyor.image import eval_transform

    numbers = ROOT / "examples/data/numbers"
    root = s3.upload(numbers, "numbers")
    spec = ROOT / "specs/numbers.yaml"
    assert batches(spec, root=root) == batches(spec, root=str(numbers))
    s3.proxy(deny="/numbers/odd/003.txt")
    with pytest.raises(SourceError, match=r"numbers/odd/003\.txt: access denied"):
        batches(spec, root=root, **{"parse.on_error": "skip"})
    image = sorted((SAMPLE / "n01440764").iterdir())[0]
    url = s3.upload(SAMPLE / "n01440764", "images") + "/" + image.name
    want = eval_transform({"path": str(image), "label": 0, "index": 0}, size=32, resize=40)
    assert torch.equal(eval_transform({"path": url, "label": 0, "index": 0}, size=32, resize=40)["image"],
                       want["image"])
    s3.proxy(deny=image.name)
    with pytest.raises(SourceError, match=rf"{image.name}: access denied"):
        eval_transform({"path": url, "label": 0, "index": 0}, size=32, resize=40)


def test_a_cache_that_can_be_read_but_not_marked_used_still_serves(s3, tmp_path: Path, monkeypatch) -> None:
    """A warmed cache shared read-only: marking a file used (its mtime) fails, and every hit
    was thrown away as a miss."""
    root = s3.upload(SAMPLE / "n01440764", "ro")
    cache = tmp_path / "cache"
    warm = Fetch(ListFiles(url=f"{root}/*.JPEG"), cache=str(cache))
    first = [x["bytes"] for x in warm]
    warm.close()

    def refuse(*args, **kwargs):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr("conveyor.storage._cache.os.utime", refuse)
    node = Fetch(ListFiles(url=f"{root}/*.JPEG"), cache=str(cache))
    assert [x["bytes"] for x in node] == first
    assert node.stats()["cache_hits"] == 20 and node.stats()["requests"] == 20  # the HEADs
    assert node.stats()["bytes"] == 0
    node.close()


def test_an_endpoint_without_its_scheme_or_a_missing_profile_is_a_source_error_saying_so(
        s3, monkeypatch) -> None:
    """AWS_ENDPOINT_URL=127.0.0.1:9000 (as MinIO's docs write host:port) was a bare botocore
    'ValueError: Invalid endpoint' naming no URL, and AWS_PROFILE naming no profile a bare
    ProfileNotFound."""
    root = s3.upload(SAMPLE / "n01440764", "scheme")
    bare = s3.server.endpoint.removeprefix("http://")
    monkeypatch.setenv("AWS_ENDPOINT_URL", bare)
    with pytest.raises(SourceError, match=rf"{root}/\*\.JPEG: cannot make a client .*Invalid endpoint.*"
                                          r"needs its scheme"):
        ListFiles(url=f"{root}/*.JPEG").records()
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    node = Fetch(IterableWrapper([{"path": f"{root}/x.JPEG"}]), storage_options={"endpoint_url": bare})
    with pytest.raises(SourceError, match=r"x\.JPEG: cannot make a client .*needs its scheme"):
        next(node)
    node.close()
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.server.endpoint)
    monkeypatch.setenv("AWS_PROFILE", "no-such-profile")  # a bare botocore ProfileNotFound too
    with pytest.raises(SourceError, match=rf"{root}/\*\.JPEG: cannot make a client .*ProfileNotFound.*"
                                          r"no-such-profile"):
        ListFiles(url=f"{root}/*.JPEG").records()


def test_shards_beside_a_big_tree_are_listed_without_listing_the_tree(s3, tmp_path: Path) -> None:
    """url: root/*.tar listed every key below root (a request per 1000 keys) to keep the few
    at its top: shards packed beside 1.28M loose images took minutes to list on every rank."""
    from concurrent.futures import ThreadPoolExecutor

    def put(i: int) -> None:
        s3.client.put_object(Bucket=s3.bucket, Key=f"data/loose/c{i % 7}/{i:05d}.jpg", Body=b"x")

    with ThreadPoolExecutor(16) as pool:  # 1200 keys below: two pages of a flat listing
        list(pool.map(put, range(1200)))
    for name in ("shard-000001.tar", "shard-000000.tar", "index.json"):
        s3.client.put_object(Bucket=s3.bucket, Key=f"data/{name}", Body=b"x")
    proxy = s3.proxy()
    records = ListFiles(url=s3.url("data/*.tar")).records()
    assert [r["path"] for r in records] == [s3.url("data/shard-000000.tar"), s3.url("data/shard-000001.tar")]
    assert proxy.requests == 1, proxy.requests
    assert len(ListFiles(url=s3.url("data/loose/*/*.jpg")).records()) == 1200  # deeper: as before


def test_the_pretrain_spec_on_s3_packs_the_batches_of_local_disk_and_resumes_mid_epoch(s3) -> None:
    """specs/pretrain.yaml as bundled, its root an s3:// URL: list, read_jsonl, tokenize and
    pack_tokens give local disk's batches, and a state taken mid-epoch (mid-file, mid-pool)
    resumes at the very next batch."""
    text = ROOT / "examples/data/text-sample"
    root = s3.upload(text, "corpus")
    assert root.startswith("s3://")
    spec = ROOT / "specs/pretrain.yaml"
    small = {"seq_len": 256, "pool": 200}  # several pools an epoch, rows of several documents
    local = batches(spec, root=str(text), **small)
    assert len(local) > 20
    assert batches(spec, root=root, **small) == local

    def make():
        return load_graph(spec, root=root, **small)

    n = len(local)
    assert check_resume(make, epochs=1, steps=[0, 3, n // 2, n - 2], reuse=True) == n

"""read_parquet, list_lmdb and read_lmdb: what goes in comes out, exact resume, clear errors,
Parquet from S3 (moto on loopback) and from Hugging Face ``datasets``, LMDB packed from an
ImageNet folder and read by several worker processes at once."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from conveyor import SampleError, SpecErrors, load_graph
from conveyor.errors import ConveyorError, SourceError, StateError
from conveyor.nodes.list_files import ListFiles
from conveyor.nodes.list_lmdb import ListLmdb
from conveyor.nodes.read_lmdb import ReadLmdb
from conveyor.nodes.read_parquet import ReadParquet
from conveyor.pack import pack_lmdb
from s3_server import moto_server, s3  # noqa: F401  (fixtures)

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "examples/data/imagenet-sample/train"
PROVENANCE = ("file", "row", "index")


def _table(n: int, offset: int = 0) -> pa.Table:
    return pa.table({"id": list(range(offset, offset + n)),
                     "text": [f"row {i} " + "x" * (i % 7) for i in range(offset, offset + n)],
                     "score": [i / 3 for i in range(offset, offset + n)],
                     "tags": [[i, i + 1] if i % 2 else None for i in range(offset, offset + n)]})


@pytest.fixture(scope="module")
def parquet_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("parquet")
    pq.write_table(_table(25), d / "a.parquet", row_group_size=7)      # row groups of 7,7,7,4
    pq.write_table(_table(0), d / "b.parquet")                         # an empty file
    pq.write_table(_table(10, 100), d / "c.parquet", row_group_size=4)
    return d


def _strip(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in PROVENANCE}


def test_rows_read_back_equal_to_read_table(parquet_dir: Path) -> None:
    node = ReadParquet(ListFiles(url=str(parquet_dir / "*.parquet")), batch_rows=3)
    rows = list(node)
    want = [r for f in ("a", "b", "c") for r in pq.read_table(parquet_dir / f"{f}.parquet").to_pylist()]
    assert [_strip(r) for r in rows] == want and len(rows) == 35
    assert [(Path(r["file"]).name, r["row"]) for r in rows[:2]] == [("a.parquet", 0), ("a.parquet", 1)]
    assert rows[25]["file"].endswith("c.parquet") and rows[25]["row"] == 0
    assert rows[25]["index"] == (2 << 32) and len({r["index"] for r in rows}) == 35
    assert node.stats() == {"files": 3, "skipped": 0, "skipped_files": 0}
    some = list(ReadParquet(ListFiles(url=str(parquet_dir / "c.parquet")), columns=["text"]))
    assert [_strip(r) for r in some] == pq.read_table(parquet_dir / "c.parquet", columns=["text"]).to_pylist()


def test_a_parquet_file_written_by_datasets_reads_back_equal(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets", reason="Hugging Face datasets is in the test extras")
    ds = datasets.Dataset.from_dict({"text": [f"doc {i}" for i in range(40)], "label": [i % 3 for i in range(40)]})
    path = tmp_path / "hf.parquet"
    ds.to_parquet(str(path), batch_size=16)
    rows = [_strip(r) for r in ReadParquet(ListFiles(url=str(path)))]
    assert rows == pq.read_table(path).to_pylist() == ds.to_list()


def test_every_step_resumes_exactly_in_a_spec(parquet_dir: Path, write_spec) -> None:
    spec = write_spec(f"""
params: {{root: "{parquet_dir.as_posix()}"}}
nodes:
  files:   {{op: list_files, url: "${{root}}/*.parquet", shuffle: true}}
  rows:    {{op: read_parquet, columns: [id, text], batch_rows: 2}}
  shuffle: {{op: shuffle_buffer, size: 6}}
  batch:   {{op: batch, size: 4}}
output: batch
""")
    with load_graph(spec) as loader:
        full, states = [], []
        for _ in range(2):
            states.append([])
            for b in loader:
                states[-1].append(json.loads(json.dumps(loader.state_dict())))
                full.append([r["id"] for r in b])
    assert sorted(i for b in full[:len(states[0])] for i in b) == list(range(25)) + list(range(100, 110))
    flat = [s for ep in states for s in ep][:-1]  # (the last state resumes at a third epoch)
    for k, state in enumerate(flat):
        with load_graph(spec) as again:
            again.load_state_dict(state)
            rest = [[r["id"] for r in b] for b in again]
            if k < len(states[0]) - 1:  # mid-epoch 0: its rest, then epoch 1
                rest += [[r["id"] for r in b] for b in again]  # and the whole next epoch
            assert rest == full[k + 1:], f"resumed after batch {k}"


def test_bad_parquet_files_are_named_or_counted(tmp_path: Path, parquet_dir: Path) -> None:
    (tmp_path / "0-good.parquet").write_bytes((parquet_dir / "c.parquet").read_bytes())
    (tmp_path / "1-bad.parquet").write_bytes(b"PAR1 but not really a parquet file")
    with pytest.raises(SampleError, match=r"read_parquet: .*1-bad\.parquet: cannot read it as Parquet"):
        list(ReadParquet(ListFiles(url=str(tmp_path / "*.parquet"))))
    node = ReadParquet(ListFiles(url=str(tmp_path / "*.parquet")), on_error="skip")
    assert len(list(node)) == 10 and node.stats()["skipped_files"] == 1
    with pytest.raises(SampleError, match=r"0-good\.parquet: no column 'nope' \(it has: id, text, score, tags\)"):
        list(ReadParquet(ListFiles(url=str(tmp_path / "0-*.parquet")), columns=["text", "nope"]))


def test_a_null_text_in_parquet_names_the_file_and_row(tmp_path: Path, write_spec) -> None:
    pq.write_table(pa.table({"content": ["Größe", "مرحبا", None, "ok"]}), tmp_path / "t.parquet", row_group_size=2)
    spec = write_spec(f"""
nodes:
  files: {{op: list_files, url: "{tmp_path}/*.parquet"}}
  read:  {{op: read_parquet, columns: [content]}}
  tok:   {{op: map, fn: "conveyor.text:byte_tokenize", args: {{field: content}}}}
""")
    # it was "item 2: field 'content' is NoneType": the file's index shifted 32 bits, plus the row
    with load_graph(spec) as loader, \
            pytest.raises(SampleError, match=r"t\.parquet row 2: field 'content' is null, expected a string"):
        list(loader)


@pytest.mark.parametrize("batch", [None, 4])
def test_a_tokenized_parquet_row_is_still_named_by_file_and_row(tmp_path: Path, write_spec, batch) -> None:
    import inspect

    docs = [inspect.getdoc(f) for f in (len, print, sorted, open)]
    pq.write_table(pa.table({"text": ["short", "ok"]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"text": docs}), tmp_path / "b.parquet", row_group_size=2)
    spec = write_spec(f"""
nodes:
  files: {{op: list_files, url: "{tmp_path}/*.parquet"}}
  read:  {{op: read_parquet}}
  tok:   {{op: map, fn: "conveyor.text:byte_tokenize"{", batch: " + str(batch) if batch else ""}}}
  batch: {{op: bucket_batch, boundaries: [64, 1024], batch_sizes: [4, 4]}}
  pad:   {{op: pad_collate}}
""")
    longest = max(range(len(docs)), key=lambda i: len(docs[i]))
    assert len(docs[longest].encode()) > 1024
    # was "item 4294967299": the tokenizer dropped the row, and the index is file << 32 + row
    with load_graph(spec) as loader, \
            pytest.raises(SampleError, match=rf"b\.parquet row {longest} has length \d+, over the last boundary"):
        list(loader)


def test_parquet_from_s3_reads_the_same_rows(s3, parquet_dir: Path) -> None:
    root = s3.upload(parquet_dir, "tables")
    remote = list(ReadParquet(ListFiles(url=root + "/*.parquet"), batch_rows=5))
    local = list(ReadParquet(ListFiles(url=str(parquet_dir / "*.parquet")), batch_rows=5))
    assert [_strip(r) for r in remote] == [_strip(r) for r in local] and len(remote) == 35
    assert remote[0]["file"].startswith("s3://")


def test_parquet_from_s3_resumes_mid_file_and_a_failing_server_is_named_not_skipped(s3, parquet_dir) -> None:
    from conveyor.storage import RetryPolicy

    root = s3.upload(parquet_dir, "tables")
    quick = RetryPolicy(attempts=3, timeout=2.0, backoff=0.01, backoff_max=0.02)

    def make(on_error: str = "raise") -> ReadParquet:
        return ReadParquet(ListFiles(url=root + "/*.parquet"), batch_rows=3, on_error=on_error, policy=quick)

    node = make()
    node.reset()
    states, rows = [], []
    for r in node:
        states.append(json.loads(json.dumps(node.state_dict())))
        rows.append(r)
    node.close()
    assert len(rows) == 35 and node.storage.stats.as_dict()["retries"] == 0
    for k in (0, 8, 24, 30):  # mid-row-group, at a group's edge, the last file
        fresh = make()
        fresh.reset(states[k])
        assert list(fresh) == rows[k + 1:], k
        fresh.close()
    # through a server that resets every read of c.parquet: its attempts, then the file named
    s3.proxy(fail_rate=1.0, max_failures=1000, faults=("reset",), only="c.parquet")
    with pytest.raises(SampleError, match=r"tables/c\.parquet.*failed after 3 attempt\(s\)") as info:
        list(make())
    assert any("in read_parquet" in note for note in info.value.__notes__)
    # denied access is never one bad file to skip
    s3.proxy(deny="c.parquet")
    node = make(on_error="skip")
    with pytest.raises(SourceError, match=r"tables/c\.parquet: access denied"):
        list(node)
    assert node.stats()["skipped_files"] == 0


def test_table_op_spec_errors(write_spec, tmp_path: Path) -> None:
    spec = write_spec(f"""
nodes:
  files: {{op: list_files, url: "{tmp_path.as_posix()}/*.parquet"}}
  rows:  {{op: read_parquet, columns: [a, a]}}
  keys:  {{op: list_lmdb, path: "s3://bucket/env", start: b, stop: a}}
  vals:  {{op: read_lmdb, input: keys}}
  both:  {{op: mix, input: [rows, vals]}}
output: both
""")
    with pytest.raises(SpecErrors) as info:
        load_graph(spec)
    got = {(e.node, e.param): str(e) for e in info.value.errors}
    assert "expected distinct, non-empty column names, got ['a', 'a']" in got[("rows", "columns")]
    assert "LMDB is read from local disk only, got 's3://bucket/env'" in got[("keys", "path")]
    assert "expected a key after start 'b', got 'a'" in got[("keys", "stop")]
    assert all(e.line > 0 for e in info.value.errors)


# ----- LMDB -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def lmdb_env(tmp_path_factory) -> Path:
    dst = tmp_path_factory.mktemp("lmdb") / "train.lmdb"
    out = pack_lmdb(str(SAMPLE), str(dst))
    assert out["samples"] == 200 and len(out["classes"]) == 10 and dst.is_dir()
    return dst


def test_pack_lmdb_holds_every_image_with_its_class(lmdb_env: Path) -> None:
    files = {Path(r["path"]).relative_to(SAMPLE).as_posix(): r["label"]
             for r in ListFiles(url=str(SAMPLE / "*/*.JPEG"), label="parent_dir").records()}
    node = ReadLmdb(ListLmdb(path=str(lmdb_env), label="parent_dir"))
    got = list(node)
    assert {r["key"]: r["label"] for r in got} == files  # same keys, same class numbers
    assert [r["key"] for r in got] == sorted(files)       # key order
    first = got[0]
    assert first["bytes"] == (SAMPLE / first["key"]).read_bytes() and first["lmdb"] == str(lmdb_env)
    # a range and a prefix list only their keys
    some = ListLmdb(path=str(lmdb_env), prefix="n02102040/").records()
    assert len(some) == 20 and all(r["key"].startswith("n02102040/") for r in some)
    rng = ListLmdb(path=str(lmdb_env), start="n02102040", stop="n02979186").records()
    assert [r["key"] for r in rng] == [r["key"] for r in some]


def test_pack_lmdb_takes_subfolders_of_a_class_folder_and_never_overwrites(tmp_path: Path) -> None:
    for rel in ("a/1.jpg", "a/sub/1.jpg", "b/1.jpg"):  # ImageFolder: two a's, one b
        (tmp_path / "src" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / rel).write_bytes(rel.encode())
    pack_lmdb(str(tmp_path / "src"), str(tmp_path / "one.lmdb"))
    got = [(r["key"], r["label"], r["bytes"]) for r in ReadLmdb(ListLmdb(path=str(tmp_path / "one.lmdb"),
                                                                         label="parent_dir"))]
    assert got == [("a/1.jpg", 0, b"a/1.jpg"), ("a/sub_1.jpg", 0, b"a/sub/1.jpg"), ("b/1.jpg", 1, b"b/1.jpg")]
    (tmp_path / "src/a/sub_1.jpg").write_bytes(b"its key is taken")
    with pytest.raises(ConveyorError, match="would be stored under the key 'a/sub_1.jpg' of another image"):
        pack_lmdb(str(tmp_path / "src"), str(tmp_path / "two.lmdb"))


def test_an_imagenet_graph_over_lmdb_decodes_and_resumes(lmdb_env: Path, write_spec) -> None:
    spec = write_spec(f"""
params: {{root: "{lmdb_env.as_posix()}"}}
nodes:
  keys:    {{op: list_lmdb, path: "${{root}}", label: parent_dir, shuffle: true}}
  shard:   {{op: shard}}
  shuffle: {{op: shuffle_buffer, size: 32}}
  read:    {{op: read_lmdb}}
  decode:  {{op: map, fn: conveyor.image:eval_transform, args: {{size: 32, resize: 36}}, workers: 2}}
  batch:   {{op: batch, size: 16, drop_last: true}}
  collate: {{op: collate}}
output: collate
""")
    with load_graph(spec) as loader:
        it = iter(loader)
        head = [next(it) for _ in range(3)]
        state = loader.state_dict()
        rest = [b["index"].tolist() for b in it]
    assert head[0]["image"].shape == (16, 3, 32, 32) and head[0]["image"].dtype == torch.uint8
    assert len(rest) == 200 // 16 - 3
    with load_graph(spec) as again:
        again.load_state_dict(json.loads(json.dumps(state)))
        assert [b["index"].tolist() for b in again] == rest


def test_several_worker_processes_read_one_environment(lmdb_env: Path, write_spec) -> None:
    def spec(copies: int) -> Path:
        workers = f"workers: {{copies: {copies}, method: process, until: read}}\n" if copies > 1 else ""
        return write_spec(f"""{workers}nodes:
  keys:  {{op: list_lmdb, path: "{lmdb_env.as_posix()}", label: parent_dir}}
  shard: {{op: shard, by: [rank, worker]}}
  read:  {{op: read_lmdb}}
  size:  {{op: map, fn: planted_fns:ident}}
output: size
""", name=f"lmdb{copies}.yaml")

    def keys(path: Path) -> list:
        with load_graph(path) as loader:
            return sorted((r["key"], len(r["bytes"])) for r in loader)

    one = keys(spec(1))
    assert len(one) == 200 and keys(spec(2)) == one


def test_lmdb_errors_name_the_environment_and_key(lmdb_env: Path, tmp_path: Path) -> None:
    from torchdata.nodes import IterableWrapper

    from conveyor.image import eval_transform

    with pytest.raises(SampleError, match=r"image 'c/k' in LMDB '/d/x.lmdb': not a recognised image format"):
        eval_transform({"lmdb": "/d/x.lmdb", "key": "c/k", "bytes": b"not an image", "index": 0})

    missing = [{"lmdb": str(lmdb_env), "key": "n01440764/none.JPEG", "index": 0}]
    with pytest.raises(SampleError, match=r"read_lmdb: .*train\.lmdb: no key 'n01440764/none\.JPEG'"):
        list(ReadLmdb(IterableWrapper(missing)))
    node = ReadLmdb(IterableWrapper(missing + [{"lmdb": str(lmdb_env), "key": "n01440764/n01440764_10250.JPEG",
                                                "index": 1}]), on_error="skip")
    assert [r["index"] for r in node] == [1] and node.stats() == {"skipped": 1}
    with pytest.raises(SourceError, match="no LMDB environment at"):
        ListLmdb(path=str(tmp_path / "nothing")).records()
    with pytest.raises(SourceError, match="has no key matching prefix 'zzz'"):
        ListLmdb(path=str(lmdb_env), prefix="zzz").records()
    # a state taken on a listing of another length is refused
    node2 = ListLmdb(path=str(lmdb_env), prefix="n02102040/")
    node2.reset()
    next(node2)
    with pytest.raises(StateError, match=r"list_lmdb .*: the state was taken over 20 keys, the listing now has 200"):
        ListLmdb(path=str(lmdb_env)).reset(node2.state_dict())
    with pytest.raises(StateError, match=r"same count, 20, but other keys: a key was renamed or replaced"):
        ListLmdb(path=str(lmdb_env), prefix="n02979186/").reset(node2.state_dict())


@pytest.mark.timeout(120)
def test_a_truncated_lmdb_is_a_source_error_naming_the_file_and_sizes_not_a_sigbus(lmdb_env: Path,
                                                                                    tmp_path: Path) -> None:
    import shutil
    import subprocess
    import sys

    short = tmp_path / "short.lmdb"
    shutil.copytree(lmdb_env, short)
    data = short / "data.mdb"
    whole = data.stat().st_size
    with open(data, "r+b") as f:  # copied short: half of it
        f.truncate(whole // 2)
    code = (f"from conveyor.nodes.list_lmdb import ListLmdb\n"
            f"from conveyor.nodes.read_lmdb import ReadLmdb\n"
            f"from conveyor.errors import SourceError\n"
            f"try:\n"
            f"    print(len(list(ReadLmdb(ListLmdb(path={str(short)!r})))))\n"
            f"except SourceError as exc:\n"
            f"    print('SourceError:', exc)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])  # -7: killed by SIGBUS
    said = done.stdout
    assert said.startswith("SourceError: "), said
    assert str(data) in said and f"it has {whole // 2} bytes" in said and f"says {whole} " in said, said


def test_an_lmdb_epoch_left_by_2_ranks_goes_on_on_3(lmdb_env: Path, write_spec, monkeypatch) -> None:
    spec = write_spec(f"""
nodes:
  keys:    {{op: list_lmdb, path: "{lmdb_env.as_posix()}", shuffle: true}}
  shard:   {{op: shard}}
  shuffle: {{op: shuffle_buffer, size: 16}}
  read:    {{op: read_lmdb}}
  batch:   {{op: batch, size: 8}}
output: batch
""")

    def opened(rank: int, world: int):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(world))
        return load_graph(spec)

    taken, states = [], []
    for rank in range(2):
        with opened(rank, 2) as loader:
            it = iter(loader)
            for _ in range(3):
                taken += [r["key"] for r in next(it)]
            states.append(json.loads(json.dumps(loader.state_dict())))
    rest = []
    for rank in range(3):
        with opened(rank, 3) as loader:
            loader.load_state_dict(states)
            rest.append([r["key"] for b in loader for r in b])
    new = [k for r in rest for k in r]
    left = 200 - len(taken)
    assert len(set(taken)) == len(taken) == 48 and not set(new) & set(taken)
    assert len(set(new)) == left and len(set(new) | set(taken)) == 200
    assert [len(r) for r in rest] == [-(-left // 3)] * 3  # equal shares (equalize pads the last)


def test_a_large_parquet_read_from_s3_is_split_into_requests_that_each_fit_the_timeout(
        s3, tmp_path: Path, monkeypatch) -> None:
    """A column chunk is one read; read as one request, a chunk of hundreds of MB on a slow
    link outlasted the per-request timeout on every attempt."""
    from conveyor.storage._readers import _RangeReader

    monkeypatch.setattr(_RangeReader, "CHUNK", 64 << 10)
    path = tmp_path / "wide.parquet"
    pq.write_table(pa.table({"blob": [bytes([i % 251]) * 50_000 for i in range(20)]}), path,
                   row_group_size=20, compression="none")
    s3.client.put_object(Bucket=s3.bucket, Key="wide/wide.parquet", Body=path.read_bytes())
    node = ReadParquet(ListFiles(url=s3.url("wide/*.parquet")))
    rows = list(node)
    assert [r["blob"] for r in rows] == pq.read_table(path).column("blob").to_pylist()
    requests = node.storage.stats.as_dict()["requests"]
    assert requests >= path.stat().st_size // (64 << 10), requests  # ~1 MB in 64 kB requests

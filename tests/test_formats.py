"""MDS and LitData datasets, written by mosaicml-streaming and litdata themselves
(tests/fixtures/formats/make_fixtures.py), read by list_mds / list_litdata + read_samples."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conveyor import SampleError, SourceError, load_graph
from conveyor.nodes import ListLitdata, ListMds, ReadSamples
from resume_check import check_resume
from s3_server import moto_server, s3  # noqa: F401  (fixtures)

pytestmark = pytest.mark.timeout(60)

FIX = Path(__file__).resolve().parent / "fixtures/formats"
TRUTH = json.loads((FIX / "truth.json").read_text())


def pixels(data) -> str:
    a = data if isinstance(data, np.ndarray) else np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    return hashlib.sha256(a.tobytes()).hexdigest() + f":{list(a.shape)}"


def same_array(got: np.ndarray, want: dict) -> bool:
    return (got.dtype.name == want["dtype"] and list(got.shape) == want["shape"]
            and got.tobytes() == base64.b64decode(want["b64"]))


def read(cls, url: str, **kw) -> list[dict]:
    node = ReadSamples(cls(url=url), **kw)
    try:
        return list(node)
    finally:
        node.close()


@pytest.mark.parametrize("kind", ["plain", "zstd"])
def test_mds_every_encoding_equals_the_writers_truth(kind):
    got = read(ListMds, str(FIX / "mds" / kind), allow_pickle=True)
    want = TRUTH["mds"]["samples"]
    assert len(got) == len(want) == 12
    for g, w in zip(got, want):
        for col in ("label", "name", "meta", "score", "small", "big", "count", "ratio"):
            assert g[col] == w[col], col
        assert g["blob"] == base64.b64decode(w["blob"])
        assert repr(g["obj"]) == w["obj"]
        for col in ("arr", "mask", "vec"):
            assert same_array(g[col], w[col]), col
        for col in ("jpg", "png", "raw"):  # pixels as streaming's own reader decodes them
            assert pixels(g[col]) == w[col], col
        assert isinstance(g["jpg"], bytes) and g["jpg"][:2] == b"\xff\xd8" and g["png"][:4] == b"\x89PNG"


@pytest.mark.parametrize("kind", ["plain", "zstd"])
def test_litdata_every_field_equals_the_writers_truth(kind):
    got = sorted(read(ListLitdata, str(FIX / "litdata" / kind)), key=lambda r: r["index"])
    want = TRUTH["litdata"]["samples"]
    assert len(got) == len(want) == 12
    for g, w in zip(got, want):
        assert (g["index"], g["label"], g["name"], g["score"]) == (w["index"], w["label"], w["name"], w["score"])
        assert g["blob"] == base64.b64decode(w["blob"])
        assert same_array(g["arr"], w["arr"]) and same_array(g["vec"], w["vec"])
        assert pixels(g["image"]) == w["image"] and pixels(g["jpg"]) == w["jpg"]


def test_pickle_needs_allow_pickle():
    with pytest.raises(SourceError, match=r"shard\.00000\.mds: column 'obj'.*allow_pickle"):
        read(ListMds, str(FIX / "mds/plain"))


SPEC = """\
params: {{root: "{root}", seed: 0}}
nodes:
  samples: {{op: {op}, url: "${{root}}", shuffle: true}}
  shard:   {{op: shard, by: [rank]}}
  decoded: {{op: read_samples, allow_pickle: true}}
  pick:    {{op: map, fn: "test_formats:pick"}}
  batch:   {{op: batch, size: 3}}
  collate: {{op: collate}}
output: collate
"""


def pick(sample: dict) -> dict:
    return {"index": sample["index"], "label": sample["label"]}


def spec(tmp_path: Path, op: str, root: str) -> Path:
    path = tmp_path / f"{op}.yaml"
    path.write_text(SPEC.format(op=op, root=root))
    return path


@pytest.mark.parametrize("op,kind", [("list_mds", "mds/zstd"), ("list_litdata", "litdata/plain")])
def test_len_from_index_and_exact_resume(tmp_path, op, kind):
    path = spec(tmp_path, op, str(FIX / kind))
    with load_graph(path) as loader:
        assert len(loader) == 4  # 12 samples from index.json, batches of 3
    assert check_resume(lambda: load_graph(path), epochs=2) == 8


def test_len_per_rank(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    path = spec(tmp_path, "list_mds", str(FIX / "mds/plain"))
    with load_graph(path) as loader:
        assert len(loader) == 2
        assert sum(len(b["index"]) for b in loader) == 6


def copy(tmp_path: Path, kind: str) -> Path:
    out = tmp_path / kind.replace("/", "-")
    shutil.copytree(FIX / kind, out)
    return out


def test_bad_column_encoding_names_shard_and_column(tmp_path):
    root = copy(tmp_path, "mds/plain")
    index = json.loads((root / "index.json").read_text())
    index["shards"][1]["column_encodings"][0] = "ndarry"
    (root / "index.json").write_text(json.dumps(index))
    with pytest.raises(SourceError, match=r"shard\.00001\.mds: column 'arr'.*'ndarry' is not an MDS encoding"):
        read(ListMds, str(root), allow_pickle=True)


def test_litdata_chunk_cut_short(tmp_path):
    root = copy(tmp_path, "litdata/plain")
    chunk = root / "chunk-0-1.bin"
    chunk.write_bytes(chunk.read_bytes()[:-50])
    with pytest.raises(SampleError, match=r"chunk-0-1\.bin: .*cut short"):
        read(ListLitdata, str(root))
    node = ReadSamples(ListLitdata(url=str(root)), on_error="skip")
    assert len(list(node)) == 8 and node.stats()["skipped"] == 4
    node.close()


@pytest.mark.parametrize("kind,name", [("mds/plain", "shard.00002.mds"), ("litdata/zstd", "chunk-0-2.zstd.bin")])
def test_index_not_matching_its_shards(tmp_path, kind, name):
    root = copy(tmp_path, kind)
    index = json.loads((root / "index.json").read_text())
    entries = index["shards"] if "shards" in index else index["chunks"]
    entries[2]["samples" if "shards" in index else "chunk_size"] += 1
    (root / "index.json").write_text(json.dumps(index))
    with pytest.raises(SampleError, match=rf"{name.replace('.', '[.]')}: its header holds \d+ samples, index.json lists"):
        read(ListMds if "shards" in index else ListLitdata, str(root), allow_pickle=True)


def test_no_index_is_a_source_error(tmp_path):
    with pytest.raises(SourceError, match="index.json"):
        ListMds(url=str(tmp_path)).count()


@pytest.mark.parametrize("kind", ["mds/plain", "litdata/zstd"])
def test_on_s3(s3, tmp_path, kind):
    url = s3.upload(FIX / kind, kind)
    cls = ListMds if kind.startswith("mds") else ListLitdata
    remote = read(cls, url, allow_pickle=True)
    local = read(cls, str(FIX / kind), allow_pickle=True)
    assert [r["index"] for r in remote] == [r["index"] for r in local]
    assert [r["name"] for r in remote] == [r["name"] for r in local]
    path = spec(tmp_path, cls.OP, url)
    with load_graph(path) as loader:
        assert len(loader) == 4
    assert check_resume(lambda: load_graph(path), epochs=1, steps=[1, 3]) == 4


@pytest.mark.parametrize("kind", ["mds/zstd", "litdata/plain"])
def test_pack_from_round_trip(tmp_path, kind):
    from conveyor.nodes import ListFiles, ReadTar
    from conveyor.tools.cli import main as cli_main

    fmt = kind.split("/")[0]
    dst = tmp_path / "shards"
    assert cli_main(["pack", "--from", fmt, str(FIX / kind), str(dst), "--shard-size", "8kB",
                     "--label", "label", "--allow-pickle"]) == 0
    index = json.loads((dst / "index.json").read_text())
    assert index["samples"] == 12 and len(index["shards"]) > 1
    got = list(ReadTar(ListFiles(url=str(dst / "*.tar"))))
    want = read(ListMds if fmt == "mds" else ListLitdata, str(FIX / kind), allow_pickle=True)
    assert len(got) == len(want) == 12
    for g, w in zip(got, want):
        assert g["cls"] == w["label"]
        assert g["name"].decode() == w["name"]
        assert g["jpg"] == w["jpg"]
        assert np.array_equal(np.load(io.BytesIO(g["arr"])), w["arr"])


def test_images_decode_through_conveyor_image(tmp_path):
    path = tmp_path / "images.yaml"
    path.write_text(f"""\
nodes:
  samples: {{op: list_litdata, url: "{FIX / 'litdata/zstd'}"}}
  decoded: {{op: read_samples}}
  images:  {{op: map, fn: "conveyor.image:eval_transform", args: {{size: 16, resize: 16}}}}
  batch:   {{op: batch, size: 4}}
  collate: {{op: collate}}
output: collate
""")
    with load_graph(path) as loader:
        batches = list(loader)
    assert len(batches) == 3
    assert tuple(batches[0]["image"].shape) == (4, 3, 16, 16)
    assert batches[0]["label"].tolist() == [0, 1, 2, 3]

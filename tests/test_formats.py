"""MDS and LitData datasets, written by mosaicml-streaming and litdata themselves
(tests/fixtures/formats/make_fixtures.py), read by list_mds / list_litdata + read_samples."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
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


@pytest.mark.parametrize("kind", ["plain", "zstd", "framed"])
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


@pytest.mark.parametrize("op,kind", [("list_mds", "mds/zstd"), ("list_litdata", "litdata/plain"),
                                     ("list_litdata", "litdata/framed")])
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


@pytest.mark.parametrize("kind", ["plain", "framed", "options/sample", "options/text"])
def test_litdata_chunk_cut_short(tmp_path, kind):
    root = copy(tmp_path, f"litdata/{kind}")
    chunk = root / "chunk-0-1.bin"
    chunk.write_bytes(chunk.read_bytes()[:-50])
    with pytest.raises(SampleError, match=r"chunk-0-1\.bin: .*cut short.*sample 0"):
        read(ListLitdata, str(root))
    node = ReadSamples(ListLitdata(url=str(root)), on_error="skip")
    total = 10 if kind.startswith("options") else 12
    assert len(list(node)) == total - 4 and node.stats()["skipped"] == 4  # chunk 1's samples, counted
    node.close()


@pytest.mark.parametrize("kind,name", [("mds/plain", "shard.00002.mds"), ("litdata/zstd", "chunk-0-2.zstd.bin"),
                                       ("litdata/framed", "chunk-0-2.bin"), ("litdata/options/text", "chunk-0-2.bin")])
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


@pytest.mark.parametrize("kind", ["mds/plain", "litdata/zstd", "litdata/framed"])
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


def plain(value):
    """A value read by conveyor as make_fixtures.py writes litdata's own reading to truth.json."""
    if isinstance(value, torch.Tensor):
        value = value.numpy()
    if isinstance(value, np.ndarray):
        return {"dtype": value.dtype.name, "shape": list(value.shape),
                "b64": base64.b64encode(value.tobytes()).decode()}
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return [plain(v) for v in value] if isinstance(value, list) else value


@pytest.mark.parametrize("name", sorted(TRUTH["litdata"]["options"]))
def test_litdata_options_equal_litdatas_own_reader(name):
    # framed zstd with optimize()'s defaults, zstd:9 a sample at a time, chunk_bytes, torch
    # tensors, and the samples litdata keeps as Arrow rows (text and numbers; lists and dicts)
    got = read(ListLitdata, str(FIX / "litdata/options" / name))
    want = TRUTH["litdata"]["options"][name]
    assert [r.pop("index") for r in got] == list(range(len(want))) == list(range(10))
    assert [plain({k: v for k, v in r.items() if k != "__url__"}) for r in got] == want


def test_framed_chunks_hold_several_frames_read_one_at_a_time():
    # compression_batch_size 3 over chunks of 4: two frames a chunk, each read and decompressed
    # once (a ranged read of its own bytes), the chunk's header once
    index = json.loads((FIX / "litdata/framed/index.json").read_text())["config"]
    assert (index["compression"], index["compression_level"], index["compression_batch_size"]) == ("zstd", "batch", 3)
    node = ReadSamples(ListLitdata(url=str(FIX / "litdata/framed")), keep=1)
    try:
        got = list(node)
        assert [r["index"] for r in got] == list(range(12))
        stats = node.storage.stats.as_dict()
        assert stats["requests"] == 1 + 3 * 2 + 6  # the index; per chunk its header and size; 6 frames
        assert stats["bytes"] == sum(p.stat().st_size for p in (FIX / "litdata/framed").iterdir())  # each once
    finally:
        node.close()


def test_framed_rows_a_frame_come_from_the_chunk(tmp_path):
    # an index without compression_batch_size (256 assumed): the header's own 3 decide
    root = copy(tmp_path, "litdata/framed")
    index = json.loads((root / "index.json").read_text())
    del index["config"]["compression_batch_size"]
    (root / "index.json").write_text(json.dumps(index))
    got = read(ListLitdata, str(root))
    assert [r["name"] for r in got] == [w["name"] for w in TRUTH["litdata"]["samples"]]
    assert [r["blob"] for r in got] == [base64.b64decode(w["blob"]) for w in TRUTH["litdata"]["samples"]]


def framed_frame(root: Path, chunk: str, frame: int) -> tuple[int, int]:
    """The file offset and compressed length of ``frame`` of a framed chunk (litdata's layout)."""
    data = (root / chunk).read_bytes()
    n, n_frames = struct.unpack_from("<I", data, 12)[0], struct.unpack_from("<I", data, 20)[0]
    assert data[:8] == b"LDFZ01\0\0" and n_frames == 2
    _, _, start, packed, _ = struct.unpack_from("<IIQII", data, 24 + 4 * (n + 1) + 24 * frame)
    return start, packed


def test_a_corrupt_frame_names_chunk_and_sample_or_is_skipped(tmp_path):
    root = copy(tmp_path, "litdata/framed")
    start, packed = framed_frame(root, "chunk-0-1.bin", 1)  # samples 3 of chunk 1: index 7
    data = bytearray((root / "chunk-0-1.bin").read_bytes())
    data[start + 4:start + packed] = bytes(packed - 4)  # the zstd magic kept, its body zeroed
    (root / "chunk-0-1.bin").write_bytes(bytes(data))
    with pytest.raises(SampleError, match=r"chunk-0-1\.bin: sample 3 \(frame 1, samples 3-3\): does not decompress"):
        read(ListLitdata, str(root))
    node = ReadSamples(ListLitdata(url=str(root)), on_error="skip")
    assert [r["index"] for r in node] == [i for i in range(12) if i != 7] and node.stats()["skipped"] == 1
    node.close()


def test_a_framed_chunk_the_index_does_not_name_is_a_sample_error(tmp_path):
    # the index lost its compression_level: the chunk is read as plain and its magic found
    root = copy(tmp_path, "litdata/framed")
    index = json.loads((root / "index.json").read_text())
    index["config"]["compression"] = index["config"]["compression_level"] = None
    (root / "index.json").write_text(json.dumps(index))
    with pytest.raises(SampleError, match=r"chunk-0-0\.bin: a framed zstd chunk \(LDFZ01\)"):
        read(ListLitdata, str(root))
    # and the other way: the index says batch, the chunk is not framed
    root = copy(tmp_path, "litdata/plain")
    index = json.loads((root / "index.json").read_text())
    index["config"].update(compression="zstd", compression_level="batch")
    (root / "index.json").write_text(json.dumps(index))
    with pytest.raises(SampleError, match=r"chunk-0-0\.bin: not a framed zstd chunk"):
        read(ListLitdata, str(root))


@pytest.mark.parametrize("config,message", [
    ({"compression_level": "frame"}, "compression_level 'frame' is not one of chunk, batch, sample"),
    ({"compression": "gz", "compression_level": "batch"}, "compression_level 'batch' with compression 'gz'"),
    ({"data_format": ["json", "no_header_numpy:2", "int", "str"]},
     r"leaf 0: serializer 'json'.*beside 'no_header_numpy:2'"),
])
def test_litdata_index_options_not_read_are_source_errors(tmp_path, config, message):
    root = copy(tmp_path, "litdata/options/default")
    index = json.loads((root / "index.json").read_text())
    index["config"].update(config)
    (root / "index.json").write_text(json.dumps(index))
    with pytest.raises(SourceError, match=rf"litdata: .*index\.json: {message}"):
        ListLitdata(url=str(root)).count()


def test_a_corrupt_sample_frame_or_arrow_footer_names_chunk_and_sample(tmp_path):
    # compression_level "sample": the plain layout, each sample its own zstd frame
    root = copy(tmp_path, "litdata/options/sample")
    data = bytearray((root / "chunk-0-1.bin").read_bytes())
    offsets = struct.unpack_from("<5I", data, 4)
    data[offsets[2] + 4:offsets[3]] = bytes(offsets[3] - offsets[2] - 4)
    (root / "chunk-0-1.bin").write_bytes(bytes(data))
    with pytest.raises(SampleError, match=r"chunk-0-1\.bin: sample 2 does not decompress"):
        read(ListLitdata, str(root))
    # Arrow rows: the IPC bytes before [length][LDARW01\0] zeroed
    root = copy(tmp_path, "litdata/options/text")
    data = bytearray((root / "chunk-0-2.bin").read_bytes())
    assert data[-8:] == b"LDARW01\0"
    length = struct.unpack_from("<I", data, len(data) - 12)[0]
    data[len(data) - 12 - length:len(data) - 12] = bytes(length)
    (root / "chunk-0-2.bin").write_bytes(bytes(data))
    with pytest.raises(SampleError, match=r"chunk-0-2\.bin: its Arrow footer does not read.*\(reading sample 0\)"):
        read(ListLitdata, str(root))


def test_arrow_rows_on_s3(s3):
    url = s3.upload(FIX / "litdata/options/text", "text")
    got = read(ListLitdata, url)
    assert [r["text"] for r in got] == [w["text"] for w in TRUTH["litdata"]["options"]["text"]]


@pytest.mark.parametrize("old,new", [(2, 3), (3, 2)])
def test_framed_resumes_on_another_world_size(monkeypatch, tmp_path, old, new):
    from test_elastic import _all_ids, _exactly_once, _interrupt, _resume

    spec = tmp_path / "framed.yaml"
    spec.write_text(f"""nodes:
  samples: {{op: list_litdata, url: "{FIX / 'litdata/framed'}"}}
  shard: {{op: shard, by: [rank, worker]}}
  read: {{op: read_samples}}
  batch: {{op: batch, size: 2}}
output: batch
""")
    assert _all_ids(monkeypatch, spec) == list(range(12))
    taken, states = _interrupt(monkeypatch, spec, old, 1)
    rest, _ = _resume(monkeypatch, spec, new, states)
    _exactly_once(12, taken, rest)


def test_index_is_the_samples_place_in_the_dataset():
    # the MDS fixture has no index column: the listing's ids are 0..n-1 across its 4 shards
    records = list(ListMds(url=str(FIX / "mds/plain")))
    assert [r["index"] for r in records] == list(range(12))
    assert [(r["shard"], r["pos"]) for r in records][:4] == [(0, 0), (0, 1), (0, 2), (1, 0)]

"""The ledger of skipped samples: which samples ``on_error: skip`` left out, by node, with the
error; it survives a resume and comes back from worker copies; ``conveyor run --skipped`` and
the ``conveyor check`` pre-flight write it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from conveyor import load_graph
from conveyor.tools import cli
from conveyor.nodes._skips import SkipLedger, gather, sample_id

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "examples/data/imagenet-sample/train"
BAD = {"n01440764/zz_truncated.JPEG", "n02102040/zz_empty.JPEG", "n02979186/zz_text.JPEG"}


@pytest.fixture(scope="module")
def dirty(tmp_path_factory) -> Path:
    """Three classes of the sample (60 images) and three broken files among them."""
    root = tmp_path_factory.mktemp("dirty") / "train"
    for cls in ("n01440764", "n02102040", "n02979186"):
        shutil.copytree(SAMPLE / cls, root / cls)
    good = (SAMPLE / "n01440764" / "n01440764_10250.JPEG").read_bytes()
    (root / "n01440764/zz_truncated.JPEG").write_bytes(good[: len(good) // 3])
    (root / "n02102040/zz_empty.JPEG").write_bytes(b"")
    (root / "n02979186/zz_text.JPEG").write_text("not an image at all\n")
    return root


def _spec(write_spec, root: Path, *, copies: str = "", on_error: str = "skip", name: str = "spec.yaml") -> Path:
    return write_spec(f"""{copies}params: {{root: "{root.as_posix()}"}}
nodes:
  files:   {{op: list_files, url: "${{root}}/*/*.JPEG", label: parent_dir, shuffle: true}}
  shard:   {{op: shard, by: [rank, worker]}}
  decode:  {{op: map, fn: conveyor.image:eval_transform, args: {{size: 32, resize: 36}}, workers: 2,
             on_error: {on_error}}}
  batch:   {{op: batch, size: 8}}
  collate: {{op: collate}}
output: collate
""", name=name)


def _names(entries: list[dict]) -> set[str]:
    return {str(Path(e["sample"]).relative_to(e["sample"].rsplit("/", 2)[0])) for e in entries}


def test_skipped_names_each_bad_sample_with_its_node_and_error(dirty: Path, write_spec) -> None:
    with load_graph(_spec(write_spec, dirty)) as loader:
        assert loader.skipped() == {"count": 0, "entries": []}
        n = sum(len(b["label"]) for b in loader)
        ledger = loader.skipped()
        assert n == 60 and ledger["count"] == 3 and loader.stats()["nodes"]["decode"]["skipped"] == 3
        assert _names(ledger["entries"]) == BAD
        assert {e["node"] for e in ledger["entries"]} == {"decode"}
        assert {e["error"] for e in ledger["entries"]} == {"SampleError"}
        assert all(e["times"] == 1 and Path(e["sample"]).name in e["message"] for e in ledger["entries"])
        assert not any(e["message"].startswith("SampleError") for e in ledger["entries"])  # said once, in error
        for _ in loader:  # a second epoch meets them again: counted, not listed twice
            pass
        again = loader.skipped()
        assert again["count"] == 6 and len(again["entries"]) == 3 and {e["times"] for e in again["entries"]} == {2}


def test_the_ledger_survives_a_resume_in_a_new_loader(dirty: Path, write_spec) -> None:
    spec = _spec(write_spec, dirty)
    with load_graph(spec) as loader:
        seen, state = 0, None
        for batch in loader:
            seen += len(batch["label"])
            if loader.skipped()["count"] >= 2 and state is None:
                state = loader.state_dict()
                before = loader.skipped()
        total = loader.skipped()
    assert state is not None and before["count"] == 2
    path = Path(spec).with_suffix(".pt")
    torch.save(json.loads(json.dumps(state)), path)
    with load_graph(spec) as resumed:
        resumed.load_state_dict(torch.load(path))
        assert resumed.skipped() == before  # known before the first batch after the restore
        for _ in resumed:
            pass
        assert resumed.skipped() == total


@pytest.mark.parametrize("method", ["thread", "process"])
def test_worker_copies_report_their_skips(dirty: Path, write_spec, method: str) -> None:
    fork = ", mp_context: forkserver" if method == "process" else ""  # how they start is not the point (conftest.py)
    copies = f"workers: {{copies: 2, method: {method}{fork}, until: decode}}\n"
    with load_graph(_spec(write_spec, dirty, copies=copies, name=f"{method}.yaml")) as loader:
        assert sum(len(b["label"]) for b in loader) == 60
        ledger = loader.skipped()
    assert ledger["count"] == 3 and _names(ledger["entries"]) == BAD


def test_worker_processes_report_their_skips_as_they_meet_them(dirty: Path, tmp_path: Path) -> None:
    """imagenet-procs.yaml's copies cut whole batches and send a chunk's state with its start:
    the ledger read from that state was a chunk behind, so after a whole epoch it lacked that
    epoch's skips (and `conveyor run --skipped` wrote one of 3)."""
    kw = dict(root=str(dirty), on_error="skip", batch_size=4, image_size=16, shuffle_window=5, workers=2)
    text = (ROOT / "specs/imagenet-procs.yaml").read_text()
    assert text.count("method: process,") == 1  # its copies from the fork server: spawn is not the point
    spec = tmp_path / "imagenet-procs.yaml"
    spec.write_text(text.replace("method: process,", "method: process, mp_context: forkserver,"))
    with load_graph(spec, **kw) as loader:
        for epoch in (1, 2):
            assert sum(len(b["label"]) for b in loader) >= 52  # each copy drops its last partial batch
            ledger = loader.skipped()
            assert ledger["count"] >= 3 * epoch and _names(ledger["entries"]) == BAD, epoch
            assert min(e["times"] for e in ledger["entries"]) >= epoch


def test_the_ledger_keeps_its_first_samples_and_counts_the_rest() -> None:
    ledger = SkipLedger("decode", limit=3)
    for i in range(5):
        ledger.add(f"s{i}", ValueError("bad " + "x" * 400))
    ledger.add("s0", "SampleError", "again")
    state = json.loads(json.dumps(ledger.state()))
    assert state["count"] == 6 and [e[0] for e in state["entries"]] == ["s0", "s1", "s2"]
    assert state["entries"][0][1:] == ["ValueError", "bad " + "x" * 296, 2]  # messages are cut
    copy = SkipLedger()
    copy.load(state)
    entries, count = gather({"a": {"ledger": copy.state()}, "b": [{"ledger": state}]})
    assert count == 12 and [e["times"] for e in entries] == [4, 2, 2]
    assert sample_id({"__url__": "s3://b/shard-0.tar", "__key__": "k1", "index": 9}) == "s3://b/shard-0.tar#k1"
    assert sample_id({"file": "a.parquet", "row": 4}) == "a.parquet row 4"
    assert sample_id({"lmdb": "/d/x.lmdb", "key": "c/k"}) == "/d/x.lmdb#c/k"
    assert sample_id({"index": 3}) == "index 3" and sample_id(17) == "17"


@pytest.mark.timeout(120)
def test_run_writes_the_ledger_and_check_finds_every_bad_sample(dirty: Path, write_spec, tmp_path: Path,
                                                                capsys) -> None:
    spec = _spec(write_spec, dirty)
    out = tmp_path / "run.jsonl"
    assert cli.main(["run", str(spec), "-q", "--skipped", str(out)]) == 0
    assert f"skipped: 3 skip(s), 3 sample(s) named in {out}" in capsys.readouterr().err
    assert _names([json.loads(line) for line in out.read_text().splitlines()]) == BAD
    # the pre-flight, on a spec that would raise at the first bad image
    strict = _spec(write_spec, dirty, on_error="raise", name="strict.yaml")
    ledger = tmp_path / "check.jsonl"
    assert cli.main(["check", str(strict), "--out", str(ledger)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"check {strict}: 63 samples through the readers and maps up to 'decode' in ")
    assert lines[0].endswith(": 60 ok, 3 failed") and lines[1] == "  decode: SampleError x3"
    assert lines[-1] == f"ledger: 3 sample(s) written to {ledger}"
    assert _names([json.loads(line) for line in ledger.read_text().splitlines()]) == BAD
    # a clean dataset passes, and the bundled spec is checked whole (no batch left over)
    assert cli.main(["check", str(ROOT / "specs/imagenet.yaml"), "--out", str(tmp_path / "clean.jsonl")]) == 0
    assert ": 200 ok, 0 failed" in capsys.readouterr().out.splitlines()[0]


def test_readers_name_bad_lines_and_shard_members(tmp_path: Path, write_spec) -> None:
    import io
    import tarfile

    (tmp_path / "a.jsonl").write_text('{"text": "ok"}\nnot json\n{"text": "fine"}\n{"nope": 1}\n')
    shard = tmp_path / "s-0.tar"
    with tarfile.open(shard, "w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in (("k1.jpg", b"x"), ("k1.cls", b"1"), ("k2.jpg", b"y")):  # k2 has no .cls
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    spec = write_spec(f"""
nodes:
  files: {{op: list_files, url: "{tmp_path.as_posix()}/*.jsonl"}}
  read:  {{op: read_jsonl, on_error: skip}}
  shards: {{op: list_files, url: "{tmp_path.as_posix()}/*.tar"}}
  tar:   {{op: read_tar, fields: [jpg, cls], on_error: skip}}
  both:  {{op: mix, input: [read, tar], weights: [1, 1], stop: all}}
output: both
""")
    with load_graph(spec) as loader:
        assert len(list(loader)) == 3
        ledger = loader.skipped()
    got = {(e["node"], e["sample"].replace(tmp_path.as_posix() + "/", "")) for e in ledger["entries"]}
    assert got == {("read", "a.jsonl:2"), ("read", "a.jsonl:4"), ("tar", "s-0.tar#k2")}
    assert ledger["count"] == 3


def test_skipped_is_current_for_nodes_upstream_of_a_shuffle(tmp_path: Path, write_spec) -> None:
    # read_jsonl's ledger in a state is as of the shuffle window's start; skipped() is live
    (tmp_path / "a.jsonl").write_text("".join('{"text": "t%d"}\n' % i if i % 10 else "bad\n" for i in range(60)))
    spec = write_spec(f"""
nodes:
  files:   {{op: list_files, url: "{tmp_path.as_posix()}/*.jsonl"}}
  read:    {{op: read_jsonl, on_error: skip}}
  shuffle: {{op: shuffle_buffer, size: 30}}
output: shuffle
""")
    with load_graph(spec) as loader:
        it = iter(loader)
        next(it)  # the first window (30 records: 33 lines, 3 or 4 of them bad) is read
        assert loader.skipped()["count"] >= 3  # (the state's ledger of read is from before them)
        state = loader.state_dict()
        rest = list(it)
        assert len(rest) == 53 and loader.skipped()["count"] == 6
    with load_graph(spec) as again:
        again.load_state_dict(state)
        assert list(again) == rest and again.skipped()["count"] == 6  # the replay counts no skip twice


def _fail_lists_holding_three(items: list) -> list:
    if any(i["index"] == 3 for i in items):
        raise ValueError("three is bad")
    return items


def test_a_batch_map_records_only_its_bad_items() -> None:
    from torchdata.nodes import IterableWrapper

    from conveyor.nodes.map_batches import MapBatches

    def make() -> MapBatches:
        src = IterableWrapper([{"index": i} for i in range(10)])
        return MapBatches(src, fn=_fail_lists_holding_three, size=4, on_error="skip")

    node = make()
    node.reset()
    first = [next(node)["index"] for _ in range(2)]
    state = json.loads(json.dumps(node.state_dict()))
    rest = [r["index"] for r in node]
    assert first + rest == [0, 1, 2, 4, 5, 6, 7, 8, 9] and node.stats() == {"skipped": 1}
    assert node.ledger.state()["entries"] == [["index 3", "ValueError", "three is bad", 1]]
    again = make()
    again.reset(state)  # the list holding the bad item is mapped again: it is not recorded twice
    assert [r["index"] for r in again] == rest and again.ledger.state()["count"] == 1

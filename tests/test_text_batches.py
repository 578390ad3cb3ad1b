"""Tests for the fast text path (issue 18) and its bad inputs (issue 13, item 15): map with
``batch`` (MapBatches), the list forms of the tokenizers, Hugging Face ``tokenizers``
(a tokenizer trained here on the bundled sample), read_jsonl's orjson path and the records
that used to escape as RecursionError / UnicodeEncodeError."""

from __future__ import annotations

import json
import logging
from typing import Any
from pathlib import Path

import numpy as np
import pytest
import torch
from torchdata.nodes import IterableWrapper

from conveyor import SampleError, SpecErrors, check_spec, load_graph
from conveyor.nodes import read_jsonl as read_jsonl_mod
from conveyor.nodes.list_files import ListFiles
from conveyor.nodes.map_batches import MapBatches
from conveyor.nodes.pad_collate import pad_collate
from conveyor.nodes.read_jsonl import ReadJsonl
from conveyor.text import byte_tokenize, hf_tokenize, train_tokenizer

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "specs" / "text.yaml"
SAMPLE = ROOT / "examples" / "data" / "text-sample"


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory) -> str:
    """A small byte-level BPE trained on one file of the bundled sample (well under a second)."""
    out = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    return train_tokenizer([str(SAMPLE / "part-0000.jsonl")], str(out), vocab_size=400)


def _records(n: int = 40) -> list[dict]:
    node = ReadJsonl(ListFiles(url=str(SAMPLE / "part-0002.jsonl")))
    node.reset()
    return [r for _, r in zip(range(n), node)]


# ----- map with batch -----------------------------------------------------------------------

def _halve_or_fail(items: list) -> list:
    out = []
    for x in items:
        if x % 5 == 3:
            raise ValueError(f"bad item {x}")
        out.append(x // 2)
    return out


def test_map_batches_skips_only_the_bad_items_and_raises_naming_the_node(caplog):
    node = MapBatches(IterableWrapper(range(20)), fn=_halve_or_fail, size=6, on_error="skip")
    with caplog.at_level(logging.WARNING):
        assert list(node) == [x // 2 for x in range(20) if x % 5 != 3]
    assert node.stats() == {"skipped": 4} and "bad item 3" in caplog.text
    node = MapBatches(IterableWrapper(range(20)), fn=_halve_or_fail, size=6, where="node 'tok' (map)")
    with pytest.raises(ValueError, match="bad item 3") as info:
        list(node)
    assert "in node 'tok' (map)" in info.value.__notes__


def test_map_batches_state_after_the_end_resumes_at_the_end():
    node = MapBatches(IterableWrapper(range(7)), fn=lambda xs: [x * 10 for x in xs], size=3)
    assert list(node) == [0, 10, 20, 30, 40, 50, 60]
    state = node.state_dict()
    again = MapBatches(IterableWrapper(range(7)), fn=lambda xs: [x * 10 for x in xs], size=3)
    again.reset(state)
    assert list(again) == [] and again.state_dict() == state


def test_map_batches_needs_one_result_per_item_and_no_rng():
    with pytest.raises(TypeError, match="returned 1 results"):
        list(MapBatches(IterableWrapper(range(5)), fn=lambda xs: xs[:1], size=2, on_error="skip"))

    def with_rng(items, rng=None):
        return items

    with pytest.raises(ValueError, match="takes an rng"):
        MapBatches(IterableWrapper(range(5)), fn=with_rng, size=2)


@pytest.mark.parametrize("workers", [0, 2])
def test_map_batches_says_how_many_input_items_a_state_consumed(workers):
    from conveyor.nodes._elastic import Cursor

    node = MapBatches(IterableWrapper(range(20)), fn=_halve_or_fail, size=6, on_error="skip", workers=workers)
    node.reset()
    for k in range(1, 17):
        next(node)
        cursor = MapBatches.elastic_input(Cursor(node.state_dict(), more=1), size=6)
        consumed = (cursor.state or {}).get("_num_yielded", 0) + cursor.more
        # the k-th output came from input item x (bad items in between were consumed too), + 1 more
        assert consumed == [x for x in range(20) if x % 5 != 3][k - 1] + 1 + 1, (k, cursor)
    node.close()


def test_map_batch_in_a_spec_and_its_errors(write_spec):
    head = 'nodes:\n  files: {op: list_files, url: "x/*.jsonl"}\n  read: {op: read_jsonl}\n'
    ok = write_spec(head + '  tok: {op: map, fn: "conveyor.text:byte_tokenize", batch: 64}\n')
    assert check_spec(ok).nodes["tok"].params.batch == 64
    bad = write_spec(head + '  tok: {op: map, fn: "conveyor.image:train_transform", batch: 0}\n'
                     '  tok2: {op: map, input: read, fn: "conveyor.image:train_transform", batch: 8}\n')
    with pytest.raises(SpecErrors) as info:
        check_spec(bad)
    by_node = {e.node: e for e in info.value.errors}
    assert by_node["tok"].param == "batch"
    assert by_node["tok2"].param == "batch" and "takes an rng" in by_node["tok2"].message


# ----- the tokenizers' list form --------------------------------------------------------------

def _mixed(records: list[dict]) -> list[list]:
    """Lists whose records carry different keys: with and without labels, some missing
    read_jsonl's keys, a bare string among dicts."""
    labelled = [dict(r, label=i % 3) for i, r in enumerate(records)]
    some = [dict(r, label=1) if i % 4 == 1 else r for i, r in enumerate(records)]
    no_line = [{k: v for k, v in r.items() if not (k == "line" and i == 5)} for i, r in enumerate(records)]
    return [records, labelled, some, no_line, records[:3] + ["hé"] + records[3:]]


@pytest.mark.parametrize("kw", [{}, {"max_length": 16}, {"max_length": 9, "add_bos": True, "add_eos": True}])
def test_byte_tokenize_of_a_list_is_the_same_as_one_by_one(kw):
    for records in _mixed(_records()):
        _same_as_one_by_one(records, kw)
    _same_as_one_by_one(_records() + ["", "hé"], kw)


def _same_as_one_by_one(records: list, kw: dict) -> None:
    batch = byte_tokenize(records, **kw)
    assert len(batch) == len(records)
    for rec, out in zip(records, batch):
        one = byte_tokenize(rec, **kw)
        assert isinstance(out["input_ids"], np.ndarray) and out["input_ids"].dtype == np.int64
        assert out["input_ids"].tolist() == one["input_ids"].tolist()
        assert list(out.items())[1:] == list(one.items())[1:] and list(out)[0] == "input_ids"


@pytest.mark.parametrize("dtype", ["uint8", "int16", "int32"])
@pytest.mark.parametrize("kw", [{}, {"max_length": 9, "add_bos": True, "add_eos": True, "bos_id": 1, "eos_id": 2}])
def test_narrow_byte_ids_hold_the_same_values_and_pad_collate_widens_them(dtype, kw):
    records = _records() + ["", "hé"]
    wide = byte_tokenize(records, **kw)
    narrow = byte_tokenize(records, dtype=dtype, **kw)
    for w, n in zip(wide, narrow):
        assert n["input_ids"].dtype == np.dtype(dtype) and n["input_ids"].tolist() == w["input_ids"].tolist()
    n["input_ids"][:1] = 7  # writable, like the int64 ones (not a view of an immutable bytes)
    one = byte_tokenize(records[0], dtype=dtype, **kw)["input_ids"]
    assert one.dtype == getattr(torch, dtype) and one.tolist() == wide[0]["input_ids"].tolist()
    dicts = records[:-2]  # pad_collate wants samples alike
    expected, _, _ = pad_collate(wide[:-2], pad_to_multiple_of=8)
    got, _, _ = pad_collate(byte_tokenize(dicts, dtype=dtype, **kw), pad_to_multiple_of=8, dtype=torch.int64)
    assert got["input_ids"].dtype == torch.int64
    for key in expected:
        assert torch.equal(got[key], expected[key]) if isinstance(expected[key], torch.Tensor) \
            else got[key] == expected[key]


def test_ids_dtype_must_hold_every_id(tokenizer_json, write_spec):
    with pytest.raises(ValueError, match="cannot hold id 257 .eos_id"):
        byte_tokenize(["a"], dtype="uint8", add_eos=True)
    with pytest.raises(ValueError, match="must be one of int64, int32, int16, uint8"):
        byte_tokenize("a", dtype="float32")
    with pytest.raises(ValueError, match=r"cannot hold id \d+ .the tokenizer's largest id"):
        hf_tokenize(["a"], tokenizer=tokenizer_json, dtype="uint8")
    head = 'nodes:\n  files: {op: list_files, url: "x/*.jsonl"}\n  read: {op: read_jsonl}\n'
    spec = write_spec(head + '  tok: {op: map, fn: "conveyor.text:byte_tokenize", batch: 8, '
                             'args: {add_bos: true, dtype: uint8}}\n'
                             f'  hf: {{op: map, input: read, fn: "conveyor.text:hf_tokenize", batch: 8, '
                             f'args: {{tokenizer: "{tokenizer_json}", dtype: uint8}}}}\n')
    with pytest.raises(SpecErrors) as info:
        check_spec(spec)
    by_node = {e.node: e for e in info.value.errors}
    assert "arg 'dtype'" in by_node["tok"].message and "256 (bos_id)" in by_node["tok"].message
    assert "arg 'dtype'" in by_node["hf"].message and "largest id" in by_node["hf"].message


def test_hf_tokenize_one_by_one_and_in_lists(tokenizer_json):
    records = _records()
    batch = hf_tokenize(records, tokenizer=tokenizer_json, max_length=32)
    assert len(batch) == len(records)
    for rec, out in zip(records, batch):
        one = hf_tokenize(rec, tokenizer=tokenizer_json, max_length=32)
        assert one["input_ids"].dtype == torch.long and 0 < len(one["input_ids"]) <= 32
        assert out["input_ids"].tolist() == one["input_ids"].tolist()
        assert out["file"] == rec["file"] and out["line"] == rec["line"] and out["index"] == rec["index"]
    # BPE merges: fewer ids than bytes
    assert sum(len(o["input_ids"]) for o in hf_tokenize(records, tokenizer=tokenizer_json)) < \
        sum(len(r["text"].encode()) for r in records)


@pytest.mark.parametrize("which, kw", [("byte", {}), ("byte", {"max_length": 9, "add_bos": True, "add_eos": True,
                                                                  "dtype": "int16"}),
                                        ("hf", {"max_length": 32}), ("hf", {"dtype": "int32"})])
def test_a_tokenizer_s_block_holds_the_ids_and_makes_the_records_of_its_list(tokenizer_json, which, kw):
    """``fn.columns`` (what map hands pack_tokens through next_ids): the list's ids in one
    buffer, with their lengths, and the records ``fn`` gives for the list, made when asked."""
    fn = byte_tokenize if which == "byte" else hf_tokenize
    if which == "hf":
        kw = dict(kw, tokenizer=tokenizer_json)
    for records in _mixed(_records()):
        want = fn(records, **kw)
        block = fn.columns(records, **kw)
        assert len(block) == len(records) and block.lengths.dtype == np.int64
        assert block.lengths.tolist() == [len(o["input_ids"]) for o in want]
        assert block.ids.tolist() == [i for o in want for i in o["input_ids"].tolist()]
        got = block.records()
        assert [list(o) for o in got] == [list(o) for o in want]
        assert all(g["input_ids"].dtype == w["input_ids"].dtype and g["input_ids"].tolist() == w["input_ids"].tolist()
                   and list(g.items())[1:] == list(w.items())[1:] for g, w in zip(got, want))
        head, rest = block.split(3)
        assert [o["input_ids"].tolist() for o in head.records() + rest.records()] == \
            [o["input_ids"].tolist() for o in want]
    with pytest.raises(SampleError):  # a record the fn refuses: map then takes the list by records
        fn.columns([{"text": 5, "file": "a", "line": 1}], **kw)


def _docstrings() -> list[str]:
    """Real prose: the docstrings of a few standard-library modules and their members."""
    import argparse
    import collections
    import inspect
    import pathlib
    import re

    docs = [inspect.getdoc(obj) for m in (argparse, collections, pathlib, re)
            for obj in [m] + [o for _, o in inspect.getmembers(m)]]
    return [d for d in dict.fromkeys(docs) if d]


def _bert_like(docs: list[str]) -> Any:
    """A WordPiece tokenizer trained on ``docs`` that adds [CLS] and [SEP], as BERT's does."""
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = tokenizers.normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = tokenizers.pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(docs, tokenizers.trainers.WordPieceTrainer(
        vocab_size=2000, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]"], show_progress=False))
    tok.post_processor = tokenizers.processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return tok


def test_hf_tokenize_keeps_every_id_of_a_tokenizer_saved_with_truncation_unless_asked(tmp_path):
    docs = _docstrings()
    tok = _bert_like(docs)
    tok.enable_truncation(64)  # as a tokenizer.json saved after a fine-tuning run often is
    tok.enable_padding(length=64)
    path = str(tmp_path / "bert.json")
    tok.save(path)
    tok.no_truncation()
    tok.no_padding()
    long = max(docs, key=len)
    full = tok.encode(long).ids
    assert len(full) > 200
    for item in ({"text": long}, [{"text": long}, {"text": "short"}]):
        out = hf_tokenize(item, tokenizer=path)
        ids = (out if isinstance(out, dict) else out[0])["input_ids"]
        assert list(ids) == full  # was cut to the file's 64, unasked, and not counted anywhere
        cut = hf_tokenize(item, tokenizer=path, max_length=16)
        ids = (cut if isinstance(cut, dict) else cut[0])["input_ids"]
        assert list(ids) == full[:15] + [3]  # [CLS] ... [SEP]: the specials kept
    assert list(hf_tokenize([{"text": "short"}], tokenizer=path)[0]["input_ids"]) == tok.encode("short").ids  # unpadded


def test_a_max_length_without_room_past_the_special_tokens_is_refused(tmp_path, write_spec):
    docs = _docstrings()
    path = str(tmp_path / "bert.json")
    _bert_like(docs).save(path)
    for m in (1, 2):  # 1 kept every id of the text (tokenizers did not truncate), 2 kept [CLS] [SEP] only
        with pytest.raises(ValueError, match=rf"max_length={m} must be an int > 2 \(the special tokens"):
            hf_tokenize({"text": docs[0]}, tokenizer=path, max_length=m)
    assert len(hf_tokenize({"text": docs[0]}, tokenizer=path, max_length=1, add_special_tokens=False)["input_ids"]) == 1
    assert len(hf_tokenize({"text": docs[0]}, tokenizer=path, max_length=3)["input_ids"]) == 3
    spec = write_spec(f"""
nodes:
  files: {{op: list_files, url: "{SAMPLE}/*.jsonl"}}
  read: {{op: read_jsonl}}
  tok: {{op: map, fn: "conveyor.text:hf_tokenize", args: {{tokenizer: "{path}", max_length: 1}}}}
""")
    with pytest.raises(SpecErrors) as info:
        check_spec(spec)
    (err,) = info.value.errors
    assert (err.node, err.param) == ("tok", "args") and "max_length=1 must be an int > 2" in err.message


def test_train_tokenizer_reads_a_corpus_as_read_jsonl_does(tmp_path):
    import gzip

    pytest.importorskip("tokenizers")
    docs = _docstrings()
    lines = [json.dumps({"text": t}) for t in docs[:200]]
    # Windows-written: a byte order mark and CRLF; a blank line; a record without text; gzipped
    (tmp_path / "a.jsonl").write_bytes(b"\xef\xbb\xbf" + "\r\n".join(lines[:100] + ["", '{"id": 3}']).encode() + b"\r\n")
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress("\n".join(lines[100:]).encode()))
    path = train_tokenizer([str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl.gz")], str(tmp_path / "tok.json"),
                           vocab_size=600)  # was "Unexpected UTF-8 BOM", naming no file
    assert len(hf_tokenize({"text": docs[0]}, tokenizer=path)["input_ids"]) < len(docs[0].encode())
    (tmp_path / "c.jsonl").write_text('{"text": "fine"}\n{"text": "cut sho\n')
    with pytest.raises(SampleError, match=r"c\.jsonl:2: not JSON"):
        train_tokenizer([str(tmp_path / "c.jsonl")], str(tmp_path / "tok2.json"))


@pytest.mark.parametrize("name, data", [
    ("crlf.jsonl", b"\xef\xbb\xbf" + b'{"text": "a"}\r\n\r\n  \r\n{"id": 3}\r\n{"text": "b"}'),
    ("b.jsonl.gz", __import__("gzip").compress(b'{"text": "a"}\n{"text": "b"}\n')),
    ("hidden.jsonl", __import__("gzip").compress(b'{"text": "a"}\n')),
    ("utf16.jsonl", '{"text": "a"}\n'.encode("utf-16")),
    ("bad.jsonl", b'{"text": "a"}\n[1, 2]\n'),
    ("latin.jsonl", b'{"text": "\xff"}\n'),
])
def test_train_tokenizers_reader_reads_a_file_as_read_jsonl_does(tmp_path, monkeypatch, name, data):
    """conveyor._line_files.iter_records (below the nodes, for conveyor.text) and read_jsonl give
    the same records and the same errors, also when lines cross blocks."""
    import conveyor._line_files as line_files

    path = tmp_path / name
    path.write_bytes(data)

    def outcome(read):
        try:
            return [{k: v for k, v in r.items() if k not in ("file", "line", "index")} for r in read()]
        except SampleError as exc:
            return str(exc)

    for block in (1 << 20, 5):
        monkeypatch.setattr(read_jsonl_mod, "BLOCK", block)
        monkeypatch.setattr(line_files, "BLOCK", block)
        node = ReadJsonl(IterableWrapper([{"path": str(path), "index": 0}]), field=None)
        try:
            expected = outcome(lambda: list(node))
        finally:
            node.close()
        assert outcome(lambda: list(line_files.iter_records([str(path)]))) == expected


def test_text_spec_with_hf_tokenize_runs_and_resumes(tmp_path, tokenizer_json):
    shipped = SPEC.read_text(encoding="utf-8")
    byte_node = 'fn: "conveyor.text:byte_tokenize"\n    args: {max_length: "${max_length}", dtype: uint8}'
    assert byte_node in shipped
    text = shipped.replace(byte_node, f'fn: "conveyor.text:hf_tokenize"\n    args: {{tokenizer: "{tokenizer_json}", '
                                      'max_length: "${max_length}", dtype: int32}')  # what the spec's comment says
    spec = tmp_path / "text-hf.yaml"
    spec.write_text(text, encoding="utf-8")
    root = tmp_path / "data"
    root.mkdir()
    (root / "part-0003.jsonl").write_bytes((SAMPLE / "part-0003.jsonl").read_bytes())
    params = {"root": str(root), "max_length": 256, "max_tokens": 2048}
    with load_graph(spec, **params) as loader:
        batches = []
        for i, batch in enumerate(loader):
            batches.append(batch)
            if i == 4:
                state = loader.state_dict()
        rest = [b["index"].tolist() for b in batches[5:]]
    n_records = len((root / "part-0003.jsonl").read_bytes().splitlines())
    assert sum(b["input_ids"].shape[0] for b in batches) == n_records and len(batches) > 6
    assert all(b["input_ids"].dtype == torch.long and b["input_ids"].shape[1] <= 256 for b in batches)
    with load_graph(spec, **params) as loader:
        loader.load_state_dict(state)
        assert [b["index"].tolist() for b in loader] == rest


@pytest.mark.parametrize("make, why", [
    (lambda tmp: str(tmp / "missing" / "tokenizer.json"), "cannot read the tokenizer file"),
    (lambda tmp: str(tmp), "cannot read the tokenizer file"),  # a directory
    (lambda tmp: (tmp / "junk.json").write_text("{not json") and str(tmp / "junk.json"), "is not a tokenizer.json"),
])
def test_a_missing_or_unreadable_tokenizer_is_a_spec_error_naming_the_path(write_spec, tmp_path, make, why):
    path = make(tmp_path)
    spec = write_spec('nodes:\n  files: {op: list_files, url: "x/*.jsonl"}\n  read: {op: read_jsonl}\n'
                      f'  tok: {{op: map, fn: "conveyor.text:hf_tokenize", batch: 8, args: {{tokenizer: "{path}"}}}}\n')
    with pytest.raises(SpecErrors) as info:
        check_spec(spec)
    (err,) = info.value.errors
    assert err.node == "tok" and err.param == "args" and err.line == 4
    assert "arg 'tokenizer'" in err.message and why in err.message and repr(path) in err.message


# ----- bad records: a clean error naming file:line, or a counted skip ---------------------------

def _bad_file(tmp_path: Path, line: str) -> Path:
    path = tmp_path / "bad.jsonl"
    path.write_text(f'{{"text": "ok"}}\n{line}\n{{"text": "fine"}}\n', encoding="utf-8")
    return path


@pytest.mark.parametrize("fast", [True, False], ids=["orjson", "stdlib"])
@pytest.mark.parametrize("line, why", [
    ("[" * 100_000 + "]" * 100_000, "not JSON"),
    ('{"text": "' + "[" * 50 + '", "deep": ' + "[" * 100_000 + "]" * 100_000 + "}", "not JSON"),
    ('{"text": "a\\ud800b"}', "field 'text' is not valid Unicode"),
], ids=["deep-array", "deep-field", "lone-surrogate"])
def test_deep_nesting_and_lone_surrogates_are_bad_lines(tmp_path, monkeypatch, fast, line, why):
    if not fast:
        monkeypatch.setattr(read_jsonl_mod, "_fast_loads", None)
    path = _bad_file(tmp_path, line)
    with pytest.raises(SampleError, match=rf"bad\.jsonl:2: {why}"):
        list(ReadJsonl(ListFiles(url=str(path))))
    node = ReadJsonl(ListFiles(url=str(path)), on_error="skip")
    assert [r["text"] for r in node] == ["ok", "fine"] and node.stats()["skipped"] == 1


def test_tokenizers_name_file_and_line_of_a_lone_surrogate(tokenizer_json):
    rec = {"text": "a\ud800b", "file": "data/x.jsonl", "line": 7}
    for call in (lambda r: byte_tokenize(r), lambda r: byte_tokenize([{"text": "fine"}, r]),
                 lambda r: hf_tokenize(r, tokenizer=tokenizer_json),
                 lambda r: hf_tokenize([{"text": "fine"}, r], tokenizer=tokenizer_json)):
        with pytest.raises(SampleError, match=r"data/x\.jsonl:7: field 'text' is not valid Unicode"):
            call(rec)


def test_orjson_and_stdlib_read_the_same_records(tmp_path, monkeypatch):
    lines = [json.dumps({"text": "caf\u00e9 \u2603", "n": 1.5, "k": [1, {"a": None}]}), '{"text": "x", "label": 3}',
             json.dumps({"text": "\ud83d\ude00 emoji"}, ensure_ascii=True), '{"text": "nan", "v": NaN}',
             '\ufeff{"text": "bom"}', "   ", '{"text": "end"}']
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(lines), encoding="utf-8")  # no newline at the end
    fast = list(ReadJsonl(ListFiles(url=str(path)), on_error="skip"))
    monkeypatch.setattr(read_jsonl_mod, "_fast_loads", None)
    slow_node = ReadJsonl(ListFiles(url=str(path)), on_error="skip")
    slow = list(slow_node)
    assert repr(fast) == repr(slow)  # NaN too
    assert [r["line"] for r in fast] == [1, 2, 3, 4, 7]
    assert slow_node.stats()["skipped"] == 1  # the BOM inside the file; the blank line is no record


def test_a_batch_map_resumes_on_another_world_size(monkeypatch, tmp_path):
    """Elastic resume through map with batch (whole lists counted, the current one in part)."""
    from test_elastic import TEXT, _all_ids, _exactly_once, _interrupt, _resume

    text = TEXT.read_text(encoding="utf-8")
    spec = tmp_path / "elastic_batch.yaml"
    spec.write_text(text.replace('args: {max_length: 64}}', 'args: {max_length: 64}, batch: 5}'), encoding="utf-8")
    assert "batch: 5" in spec.read_text(encoding="utf-8")
    root = tmp_path / "data"
    root.mkdir()
    for f in range(3):
        lines = [json.dumps({"text": f"record {f}-{i} " + "x" * (i % 7)}) for i in range(40)]
        (root / f"part-{f}.jsonl").write_text("\n".join(lines) + "\n")
    params = {"root": str(root), "window": 16}
    ids = {i: k for k, i in enumerate(_all_ids(monkeypatch, spec, **params))}
    assert len(ids) == 120
    taken, states = _interrupt(monkeypatch, spec, 2, 3, **params)
    rest, _ = _resume(monkeypatch, spec, 3, states, **params)
    _exactly_once(120, [ids[i] for i in taken], [[ids[i] for i in r] for r in rest])


def _general(samples, **kw):
    """pad_collate with its lean dict path switched off: the path every other batch takes."""
    from conveyor.nodes import pad_collate as module

    lean, module._lean_dict = module._lean_dict, lambda *a: None
    try:
        return module.pad_collate(samples, **kw)
    except Exception as exc:
        return exc
    finally:
        module._lean_dict = lean


def _same(a, b):
    if isinstance(a, Exception):
        return type(a) is type(b) and str(a) == str(b)
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    return type(a) is type(b) and a == b


def _ids(n, dtype=np.uint8, seed=0):
    return np.random.default_rng(seed + n).integers(0, 100, n).astype(dtype)


@pytest.mark.parametrize("case", [
    "plain", "two fields", "left", "pad value", "mapping pad", "no dtype", "2-d", "mixed dtypes", "a list among",
    "a float field", "a tensor field", "a lacking sample", "a bigger sample", "a non-dict sample", "clash",
    "missing field", "pad value too big", "a str among ints", "a bool among ints", "a bool after ints",
    "a float after ints", "a huge int", "a numpy int among ints", "empty row"])
def test_pad_collates_lean_dict_path_gives_what_the_general_one_gives(case):
    samples = [{"input_ids": _ids(n), "index": i, "file": "f.jsonl", "line": i + 1}
               for i, n in enumerate([5, 17, 9, 1, 12])]
    kw = {"fields": ["input_ids"], "pad_to_multiple_of": 8, "dtype": torch.int64}
    if case == "two fields":
        samples = [dict(s, labels=_ids(len(s["input_ids"]), np.int32)) for s in samples]
        kw["fields"] = ["input_ids", "labels"]
    elif case == "left":
        kw["side"] = "left"
    elif case == "pad value":
        kw["pad_value"] = -100
    elif case == "mapping pad":
        kw["pad_value"] = {"input_ids": 7}
    elif case == "no dtype":
        del kw["dtype"]
    elif case == "2-d":
        samples = [dict(s, input_ids=np.stack([s["input_ids"]] * 3, 1)) for s in samples]
    elif case == "mixed dtypes":
        samples[2]["input_ids"] = samples[2]["input_ids"].astype(np.int32)
    elif case == "a list among":
        samples[1]["input_ids"] = [1, 2, 3]
    elif case == "a float field":
        samples = [dict(s, weight=0.5) for s in samples]
    elif case == "a tensor field":
        samples = [dict(s, label=torch.tensor([i, i])) for i, s in enumerate(samples)]
    elif case == "a lacking sample":
        del samples[3]["line"]
    elif case == "a bigger sample":
        samples[3]["extra"] = 1
    elif case == "a non-dict sample":
        samples[2] = list(samples[2].values())
    elif case == "clash":
        samples = [dict(s, lengths=1) for s in samples]
    elif case == "missing field":
        kw["fields"] = ["ids"]
    elif case == "pad value too big":
        kw["pad_value"], kw["dtype"] = 300, torch.uint8
    elif case == "a str among ints":
        samples[4]["index"] = "4"
    elif case == "a bool among ints":
        samples[0]["index"] = True
    elif case == "a bool after ints":
        samples[2]["line"] = False
    elif case == "a float after ints":
        samples[2]["index"] = 2.5
    elif case == "a huge int":
        samples[3]["index"] = 2 ** 70
    elif case == "a numpy int among ints":
        samples[1]["line"] = np.int32(2)
    elif case == "empty row":
        samples[2]["input_ids"] = samples[2]["input_ids"][:0]
    try:
        got = pad_collate(samples, **kw)
    except Exception as exc:
        got = exc
    want = _general(samples, **kw)
    assert _same(got, want), (got, want)
    if case == "plain":  # (the cases agree with the general path; this one also with the numbers)
        from conveyor.nodes import pad_collate as module

        assert module._lean_dict(samples, samples[0], kw["fields"], 0, "right", 8, torch.int64) is not None
        batch, real, padded = got
        assert batch["input_ids"].shape == (5, 24) and batch["input_ids"].dtype == torch.int64
        assert batch["lengths"].tolist() == [5, 17, 9, 1, 12] and (real, padded) == (44, 120)
        assert batch["index"].tolist() == [0, 1, 2, 3, 4] and batch["file"] == ["f.jsonl"] * 5


@pytest.mark.parametrize("side", ["right", "left"])
def test_pad_masks_from_the_row_table_are_the_position_comparison(side, monkeypatch):
    from conveyor.nodes import _padding

    monkeypatch.setattr(_padding, "_mask_rows", np.zeros((1, 0), bool))  # grown from empty here
    monkeypatch.setattr(_padding, "_MASK_ROWS_MOST", 256)
    rng = np.random.default_rng(0)
    for longest in [0, 1, 7, 64, 65, 200, 256, 257, 1000, 8]:  # grows, past the cap, then small again
        sizes = rng.integers(0, longest + 1, 9)
        sizes[:2] = 0, longest
        positions = np.arange(longest)
        want = positions < sizes[:, None] if side == "right" else positions >= (longest - sizes)[:, None]
        got = _padding._masks(sizes, longest, side)
        assert got.dtype == bool and got.shape == want.shape and (got == want).all(), longest
        assert got.flags.writeable  # the caller's own array, not a view of the table
    assert _padding._mask_rows.shape == (257, 256) and not _padding._mask_rows.flags.writeable

"""Tests for the text path without a record per document: a batch tokenizer's blocks pooled by
bucket_batch as rows and padded by pad_collate from their buffers (``IdsRows``,
conveyor/_id_blocks.py). Every case runs the same documents twice, through the tokenizer with
its block (``columns``) and through the same fn without one (the records path, as before the
rows), and asks for the same batches, stats and states."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from torchdata.nodes import BaseNode

from conveyor import load_graph
from conveyor._id_blocks import IdsRows
from conveyor.nodes import pad_collate as pad_collate_mod
from conveyor.nodes.bucket_batch import BucketBatch
from conveyor.nodes.map_batches import MapBatches
from conveyor.nodes.pad_collate import PadCollate
from conveyor.text import byte_tokenize
from conveyor.errors import SampleError
from pathlib import Path

from test_pack_tokens import _Counted as _Docs  # a list as a node with a state (its position)

ROOT = Path(__file__).resolve().parents[1]


def _docs(n: int, seed: int = 0, longest: int = 300, empty_every: int = 0, label: str = "none") -> list[dict]:
    """read_jsonl-like records of texts 1 to ``longest`` bytes (a multi-byte character in some),
    every ``empty_every``-th empty; ``label``: "none", "all" (every record has one) or "some"."""
    rng = np.random.default_rng(seed)
    docs = []
    for i, k in enumerate(rng.integers(1, longest, n)):
        text = "" if empty_every and i % empty_every == 3 else "y" * int(k) + ("é" if i % 3 else "")
        doc: dict[str, Any] = {"text": text, "index": i, "file": f"part-{i % 3}.jsonl", "line": i + 1}
        if label == "all" or (label == "some" and i % 17 == 5):
            doc["label"] = i % 4
        docs.append(doc)
    return docs


def _records_only(items, **args):  # byte_tokenize without the block it offers
    return byte_tokenize(items, **args)


def _graph(docs: list, columns: bool, *, tok_batch: int = 64, tok_args: dict | None = None,
           bucket: dict | None = None, collate: dict | None = None, collate_node: bool = True) -> BaseNode:
    fn = byte_tokenize if columns else _records_only
    node: BaseNode = MapBatches(_Docs(docs), fn=fn, size=tok_batch, args=tok_args or {"dtype": "uint8"})
    node = BucketBatch(node, **{"length": "input_ids", "boundaries": [16, 32, 64, 96, 128, 192, 256, 320],
                                "max_tokens": 1024, "pool": 4, "pad_to_multiple_of": 8, "seed": 1, **(bucket or {})})
    if collate_node:
        node = PadCollate(node, **{"fields": ["input_ids"], "pad_to_multiple_of": 8, "dtype": "int64",
                                   **(collate or {})})
    return node


def _plain(batch: Any) -> Any:
    if isinstance(batch, dict):
        return {k: _plain(v) for k, v in batch.items()}
    if isinstance(batch, list):
        return [_plain(v) for v in batch]
    if hasattr(batch, "tolist"):
        return (str(batch.dtype), batch.tolist())
    return batch


def _run(node: BaseNode, state: dict | None = None, epoch: int = 0) -> list:
    node.set_epoch(epoch) if hasattr(node, "set_epoch") else None
    node.reset(state)
    return [_plain(b) for b in node]


def _stats(node: BaseNode) -> dict:
    out = {"pad": node.stats()} if isinstance(node, PadCollate) else {}
    bucket = node.source if isinstance(node, PadCollate) else node
    return {**out, "bucket": bucket.stats()}


@pytest.fixture
def rows_padded(monkeypatch):
    """How many batches pad_collate padded from rows, and how many it sent back to records."""
    got = {"rows": 0, "records": 0}
    pad_rows = pad_collate_mod.pad_rows

    def counting(*args, **kwargs):
        out = pad_rows(*args, **kwargs)
        got["rows" if out is not None else "records"] += 1
        return out

    monkeypatch.setattr(pad_collate_mod, "pad_rows", counting)
    return got


CASES = {
    "text.yaml-like": dict(docs=dict(n=700)),
    "int16 ids, bos and eos": dict(docs=dict(n=500), tok_args={"dtype": "int16", "add_bos": True, "add_eos": True}),
    "overflow truncate": dict(docs=dict(n=500, longest=420), bucket={"overflow": "truncate"}),
    "overflow skip": dict(docs=dict(n=500, longest=420), bucket={"overflow": "skip"}),
    "overflow own bucket": dict(docs=dict(n=500, longest=420), bucket={"overflow": "own_bucket"}),
    "empty skip": dict(docs=dict(n=500, empty_every=11), bucket={"empty": "skip"}),
    "batch sizes, drop remainder": dict(docs=dict(n=500), bucket={"max_tokens": None, "drop_remainder": True,
                                                                 "batch_sizes": [8, 8, 8, 6, 6, 4, 4, 4]}),
    "labels in all": dict(docs=dict(n=400, label="all")),
    "pad left, a value per field, no dtype": dict(docs=dict(n=400), tok_args={"dtype": "int32"},
                                                  collate={"side": "left", "pad_value": {"input_ids": 7}, "dtype": None}),
    "small chunks, blocks split": dict(docs=dict(n=400), tok_batch=20, bucket={"max_pending": 64}),
    "small chunks, short blocks": dict(docs=dict(n=300), tok_batch=7, bucket={"max_pending": 64}),
    "forced flushes": dict(docs=dict(n=600), bucket={"max_pending": 200}),
}


def _case(name: str) -> tuple[list, dict]:
    case = dict(CASES[name])
    return _docs(**case.pop("docs")), case


@pytest.mark.parametrize("name", list(CASES))
def test_rows_give_the_batches_stats_and_states_records_give(name, rows_padded):
    docs, kw = _case(name)
    records = _graph(docs, False, **kw)
    by_records = _run(records) + _run(records, epoch=1)
    assert rows_padded["rows"] == 0  # the fn without a block: every batch is records
    rows = _graph(docs, True, **kw)
    assert _run(rows) + _run(rows, epoch=1) == by_records
    assert _stats(rows) == _stats(records)
    if name == "overflow truncate":  # a truncated record makes the last bucket's pool records
        assert rows_padded["rows"] > len(by_records) // 4, rows_padded
    else:
        assert rows_padded["rows"] > len(by_records) * 3 // 4, rows_padded


def test_records_with_a_label_in_some_are_refused_by_both_paths_naming_the_sample(rows_padded):
    docs = _docs(400, label="some")  # their records have other fields than the others'
    assert byte_tokenize.columns(docs[:64], dtype="uint8").carried is None
    errors = []
    for columns in (True, False):
        with pytest.raises(ValueError, match=r"of the batch has fields \['label'\] that the first does not") as exc:
            _run(_graph(docs, columns))
        errors.append(str(exc.value))
    assert errors[0] == errors[1] and rows_padded["rows"] == 0 and rows_padded["records"] > 0


@pytest.mark.parametrize("name", ["text.yaml-like", "small chunks, blocks split", "overflow truncate", "empty skip"])
def test_a_state_of_either_path_resumes_exactly_on_both(name):
    docs, kw = _case(name)
    whole = _run(_graph(docs, False, **kw))
    for k in range(0, len(whole) + 1, 5):
        for columns in (True, False):
            first = _graph(docs, columns, **kw)
            first.reset()
            for _ in range(k):
                next(first)
            state = json.loads(json.dumps(first.state_dict()))
            for again in (True, False):
                assert _run(_graph(docs, again, **kw), state) == whole[k:], (k, columns, again)


def test_a_consumer_that_is_not_pad_collate_gets_the_records(rows_padded):
    docs, _ = _case("text.yaml-like")
    by_rows = _run(_graph(docs, True, collate_node=False))
    assert by_rows == _run(_graph(docs, False, collate_node=False))
    assert set(by_rows[0][0]) == {"input_ids", "index", "file", "line"} and rows_padded["rows"] == 0


def test_a_bad_record_in_a_block_is_named_as_before():
    docs = _docs(200, empty_every=50)  # empty documents, and empty: raise
    for columns in (True, False):
        with pytest.raises(SampleError, match=r"part-0\.jsonl:4 has length 0 \(an empty document\)"):
            _run(_graph(docs, columns))


def test_pad_rows_sends_back_what_it_cannot_pad_as_the_records_say():
    block = byte_tokenize.columns(_docs(6), dtype="uint8")
    rows = IdsRows(block.items, block.row_ids(), block.lengths.tolist(), block.kind())
    assert pad_collate_mod.pad_rows(rows, field="ids") is None  # not the block's field
    clash = byte_tokenize.columns([{**d, "lengths": 1} for d in _docs(6)], dtype="uint8")
    assert clash.carried == ("index", "file", "line")  # (lengths is not carried: no clash)
    odd = [{**d, "line": float(d["line"])} for d in _docs(6)]  # not an int: the general path decides
    block = byte_tokenize.columns(odd, dtype="uint8")
    assert pad_collate_mod.pad_rows(IdsRows(block.items, block.row_ids(), block.lengths.tolist(), block.kind()),
                                    field="input_ids") is None
    some = byte_tokenize.columns(_docs(40, label="some"), dtype="uint8")
    assert some.carried is None and byte_tokenize.columns(["a", "b"]).carried is None


def test_text_yaml_pads_from_rows_and_gives_the_batches_and_states_of_records(monkeypatch, rows_padded):
    def run() -> tuple[list, dict]:
        with load_graph(ROOT / "specs/text.yaml") as loader:
            got = [_plain(b) for b in loader]
            it = iter(loader)
            for _ in range(9):
                next(it)
            return got, loader.state_dict()

    by_rows, state = run()
    assert rows_padded["rows"] >= len(by_rows) and rows_padded["records"] == 0
    monkeypatch.delattr(byte_tokenize, "columns")
    assert run() == (by_rows, state)


def test_hf_tokenize_s_rows_give_the_batches_its_records_give(tmp_path, rows_padded):
    from conveyor.text import hf_tokenize, train_tokenizer

    tok = train_tokenizer([str(ROOT / "examples/data/text-sample/part-0000.jsonl")], str(tmp_path / "tok.json"),
                          vocab_size=400)
    docs = [{**d, "text": f"def f{i}(x):\n    return x + {i}  # " + d["text"][:90]} for i, d in enumerate(_docs(300))]

    def records_only(items, **args):
        return hf_tokenize(items, **args)

    def graph(fn):
        node = MapBatches(_Docs(docs), fn=fn, size=64, args={"tokenizer": tok, "dtype": "int32"})
        node = BucketBatch(node, length="input_ids", boundaries=[8, 16, 32, 64, 128], max_tokens=512, pool=4, seed=2)
        return PadCollate(node, fields=["input_ids"], dtype="int64")

    by_rows = _run(graph(hf_tokenize))
    assert rows_padded["rows"] > len(by_rows) * 3 // 4
    assert by_rows == _run(graph(records_only))


def test_a_pad_value_the_ids_cannot_hold_is_the_same_error_on_both_paths():
    docs = _docs(200)
    errors = []
    for columns in (True, False):  # uint8 ids, no dtype to widen them: -100 does not fit
        with pytest.raises(ValueError, match=r"field 'input_ids': pad value -100 does not fit its dtype uint8") as exc:
            _run(_graph(docs, columns, collate={"pad_value": -100, "dtype": None}))
        errors.append((str(exc.value), exc.value.__notes__))
    assert errors[0] == errors[1]


def test_the_graph_s_counter_passes_rows_on_but_not_while_a_watcher_wants_every_batch():
    from conveyor.graphs import instrument
    from conveyor.graphs.instrument import Counted

    docs = _docs(300)
    counted = Counted(_graph(docs, True, collate_node=False))
    counted.reset()
    assert counted.rows_ready() and type(counted.next_rows()) is IdsRows and counted.items == 1
    seen = []
    watcher = lambda node, item, t0, t1: seen.append(item)  # noqa: E731
    counted.watch(watcher)
    try:  # (a watcher left on makes every node of the process time every call: unwatch it)
        assert not counted.rows_ready()
        assert type(next(counted)) is list and len(seen) == 1
    finally:
        counted.unwatch(watcher)
    assert instrument._exact[0] == 0
    padded = PadCollate(counted, fields=["input_ids"])
    padded.reset()
    assert [_plain(b) for b in padded] == _run(_graph(docs, False, collate={"pad_to_multiple_of": None,
                                                                           "dtype": None}))

"""pack_tokens: rows of exactly seq_len tokens from whole documents, with their boundaries.

Property tests (nothing lost, nothing duplicated, every row seq_len, padding only at the tail,
cu_seqlens and segment ids agreeing), the overflow and bad-input rules, the state (no tokens,
small, one pool re-read), and the op in a spec.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torchdata.nodes import BaseNode, IterableWrapper

from conveyor.errors import SampleError, StateError
from conveyor.nodes import PackTokens

ROOT = Path(__file__).resolve().parent.parent


def _docs(lengths: list[int]) -> list[dict]:
    """Document d is the ids d * 10_000 + 1, + 2, ...: every token says whose it is and where."""
    return [{"index": d, "input_ids": torch.arange(d * 10_000 + 1, d * 10_000 + 1 + n)}
            for d, n in enumerate(lengths)]


class _Counted(BaseNode):
    """A list as a node that counts the items it hands out (to see how much a restore reads)."""

    def __init__(self, items: list):
        super().__init__()
        self.items, self.reads = items, 0

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self._i = 0 if initial_state is None else initial_state["i"]

    def next(self):
        if self._i >= len(self.items):
            raise StopIteration
        self._i += 1
        self.reads += 1
        return self.items[self._i - 1]

    def get_state(self) -> dict:
        return {"i": self._i}


def _rows(node: BaseNode, epoch: int = 0, state: dict | None = None) -> list[dict]:
    node.set_epoch(epoch)
    node.reset(state)
    return list(node)


def _check_row(row: dict, seq_len: int, ignore: int = -100, mask_first: bool = True) -> list[np.ndarray]:
    """Every invariant of one row; its documents' ids."""
    ids, seg, pos = row["input_ids"].numpy(), row["segment_ids"].numpy(), row["position_ids"].numpy()
    labels, cu = row["labels"].numpy(), row["cu_seqlens"].numpy()
    n, real = row["num_docs"], row["num_tokens"]
    assert ids.shape == seg.shape == pos.shape == labels.shape == (seq_len,)
    assert cu.dtype == np.int32 and seg.dtype == np.int32
    assert (seg[:real] > 0).all() and (seg[real:] == 0).all(), "padding only at the tail"
    assert (np.diff(seg[:real]) >= 0).all() and (seg[:real].max(initial=0) == n)
    assert cu[0] == 0 and (cu[n + 1:] == seq_len).all() and cu[n] == real
    assert np.diff(cu[:n + 1]).tolist() == np.bincount(seg[:real], minlength=n + 1)[1:].tolist()
    assert (labels[real:] == ignore).all() and (ids[real:] == 0).all()
    docs = []
    for k in range(n):
        s, e = cu[k], cu[k + 1]
        assert pos[s:e].tolist() == list(range(e - s)), "positions restart at each document"
        assert (labels[s + mask_first:e] == ids[s + mask_first:e]).all()
        assert not mask_first or labels[s] == ignore
        docs.append(ids[s:e])
    assert pos[real:].tolist() == list(range(seq_len - real))
    return docs


@settings(max_examples=150, deadline=None)
@given(lengths=st.lists(st.integers(1, 60), min_size=1, max_size=80), seq_len=st.integers(2, 48),
       pool=st.integers(1, 30), algorithm=st.sampled_from(["first_fit", "best_fit"]),
       max_docs=st.one_of(st.none(), st.integers(1, 6)), seed=st.integers(0, 3))
def test_nothing_lost_nothing_repeated_every_row_exactly_seq_len(lengths, seq_len, pool, algorithm, max_docs, seed):
    node = PackTokens(IterableWrapper(_docs(lengths)), seq_len=seq_len, pool=pool, algorithm=algorithm,
                      max_docs=max_docs, seed=seed)
    rows = _rows(node, epoch=seed)
    pieces = [p for row in rows for p in _check_row(row, seq_len)]
    assert all(r["num_docs"] <= (max_docs or seq_len) for r in rows)
    assert all(len(p) <= seq_len for p in pieces)
    # every document comes back whole, or (longer than seq_len) as its pieces in order
    by_doc: dict[int, list[np.ndarray]] = {}
    for p in pieces:
        by_doc.setdefault(int(p[0]) // 10_000, []).append(p)
    assert sorted(by_doc) == list(range(len(lengths)))
    for d, parts in by_doc.items():
        whole = np.concatenate(sorted(parts, key=lambda p: int(p[0])))
        assert whole.tolist() == list(range(d * 10_000 + 1, d * 10_000 + 1 + lengths[d]))
        assert len(parts) == -(-lengths[d] // seq_len)
    st_ = node.stats()
    assert st_["real_tokens"] == sum(lengths) and st_["padded_tokens"] == len(rows) * seq_len
    # a document that fits is never cut: each row holds whole documents where they fit
    assert st_["split"] == sum(n > seq_len for n in lengths)


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 50), min_size=1, max_size=60), seq_len=st.integers(2, 24),
       pool=st.integers(1, 20), overflow=st.sampled_from(["split", "truncate"]),
       algorithm=st.sampled_from(["first_fit", "best_fit"]), dtype=st.sampled_from(["int16", "int64"]))
def test_a_pool_cut_at_once_gives_the_rows_of_one_cut_document_by_document(lengths, seq_len, pool, overflow,
                                                                            algorithm, dtype):
    """The pool's documents are checked and cut in a few numpy calls; document by document (the
    path that names a bad record and counts skips) gives the same rows and counts."""
    docs = [{"index": d, "input_ids": np.arange(1, n + 1, dtype=np.int16) + d} for d, n in enumerate(lengths)]

    def run(cls: type = PackTokens) -> tuple[list, dict]:
        node = cls(IterableWrapper(docs), seq_len=seq_len, pool=pool, overflow=overflow,
                          algorithm=algorithm, dtype=dtype)
        rows = _rows(node)
        return [{k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in r.items()} for r in rows], node.stats()

    assert run(_DocByDoc) == run()


class _DocByDoc(PackTokens):
    def _fast_ids(self, items: list) -> None:
        return None


def _batched(node: BaseNode, size: int, drop_last: bool) -> list[dict]:
    from conveyor.nodes import Batch, Collate

    collate = Collate(Batch(node, size=size, drop_last=drop_last))
    collate.reset()
    return list(collate)


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=70), pool=st.integers(1, 25),
       size=st.integers(1, 5), drop_last=st.booleans())
def test_batch_size_makes_the_batches_batch_and_collate_make(lengths, pool, size, drop_last):
    """Batches inside a pool are slices of its arrays, batches across pools are joined, the last
    one short or dropped: field for field what ``batch`` + ``collate`` make of the rows."""
    def node(**kw):
        return PackTokens(IterableWrapper(_docs(lengths)), seq_len=16, pool=pool, **kw)

    want = _batched(node(), size, drop_last)
    got = _rows(direct := node(batch_size=size, drop_last=drop_last))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        for k in w:
            assert g[k].dtype == w[k].dtype and torch.equal(g[k], w[k]), k
    rows = node()
    _rows(rows)
    assert direct.stats() == rows.stats()


def test_batches_resume_from_every_step_with_a_small_state():
    lengths = [int(x) for x in np.random.default_rng(2).integers(1, 200, 300)]

    def node(src=None):
        return PackTokens(src or _Counted(_docs(lengths)), seq_len=256, pool=40, batch_size=3)

    whole = [b["input_ids"].tolist() for b in _rows(node())]
    for k in range(len(whole)):
        first = node()
        first.reset()
        for _ in range(k):
            next(first)
        state = json.loads(json.dumps(first.state_dict()))
        assert len(json.dumps(state)) <= 4096
        fresh = node(src := _Counted(_docs(lengths)))
        fresh.reset(state)
        assert src.reads <= 40, "a restore re-reads at most the pool it stopped in"
        assert [b["input_ids"].tolist() for b in fresh] == whole[k:], k


def test_arrays_are_written_again_only_when_no_batch_of_theirs_is_held():
    lengths = [int(x) for x in np.random.default_rng(3).integers(1, 100, 600)]
    node = PackTokens(IterableWrapper(_docs(lengths)), seq_len=128, pool=50, batch_size=4)
    node.reset()
    held = [(b, {k: v.clone() for k, v in b.items()}) for b in node]  # every batch kept
    for batch, copy in held:
        assert all(torch.equal(batch[k], copy[k]) for k in copy)
    made = {id(a) for a in node._buffers["input_ids"].arrays}
    assert len(made) >= 12  # one a pool: all of them held
    del held, batch, copy
    node.reset()
    for _ in node:  # none kept: the pool's arrays come round again, none is made
        pass
    assert {id(a) for a in node._buffers["input_ids"].arrays} <= made


def test_a_consumer_that_holds_only_its_batch_gets_every_pool_in_one_set_of_arrays():
    """The batch a pool ends with (held by the loop while the next pool is laid out) is a copy,
    and the gather's scratch lives in the outputs: a fresh node makes one array per field and
    shape, not a second set for the second pool (fresh memory is page faults)."""
    lengths = [int(x) for x in np.random.default_rng(4).integers(1, 100, 600)]
    node = PackTokens(IterableWrapper(_docs(lengths)), seq_len=128, pool=50, batch_size=4)
    node.reset()
    want = [{k: v.clone() for k, v in b.items()} for b in node]
    node.reset()
    got = []
    for batch in node:  # the loop holds one batch at a time
        got.append({k: v.clone() for k, v in batch.items()})
    assert len(got) == len(want) and all(torch.equal(g[k], w[k]) for g, w in zip(got, want) for k in w)
    fresh = PackTokens(IterableWrapper(_docs(lengths)), seq_len=128, pool=50, batch_size=4)
    fresh.reset()
    for batch in fresh:
        pass
    assert set(fresh._buffers) == {"input_ids", "labels", "position_ids", "segment_ids", "cu_seqlens"}
    for field, buffers in fresh._buffers.items():
        shapes = [a.shape for a in buffers.arrays]
        assert len(shapes) == len(set(shapes)), (field, shapes)


def test_best_fit_pads_no_more_than_first_fit_on_the_text_sample():
    from conveyor.text import byte_tokenize

    records = [json.loads(line) for f in sorted((ROOT / "examples/data/text-sample").glob("*.jsonl"))
               for line in f.read_text().splitlines()]
    docs = byte_tokenize(records[:1500], dtype="uint8")
    waste = {}
    for algorithm in ("first_fit", "best_fit"):
        node = PackTokens(IterableWrapper(docs), seq_len=1024, pool=1000, algorithm=algorithm)
        _rows(node)
        s = node.stats()
        assert s["real_tokens"] == sum(len(d["input_ids"]) for d in docs)
        waste[algorithm] = 1 - s["padding_efficiency"]
    assert waste["best_fit"] <= waste["first_fit"] and waste["best_fit"] < 0.02, waste


def test_overflow_split_truncate_or_a_counted_skip(caplog):
    docs = _docs([3, 25, 4])
    rows = _rows(PackTokens(IterableWrapper(docs), seq_len=10, shuffle=False, overflow="truncate"))
    kept = sorted(len(p) for r in rows for p in _check_row(r, 10))
    assert kept == [3, 4, 10]
    node = PackTokens(IterableWrapper(docs), seq_len=10, overflow="skip")
    with caplog.at_level(logging.WARNING):
        rows = _rows(node)
    assert sorted(len(p) for r in rows for p in _check_row(r, 10)) == [3, 4]
    assert node.stats()["overflow"] == 1 and node.ledger.count == 1
    assert "index 1" in node.ledger.state()["entries"][0][0] and "over seq_len 10" in caplog.text
    node = PackTokens(IterableWrapper(docs), seq_len=10)
    assert sorted(len(p) for r in _rows(node) for p in _check_row(r, 10)) == [3, 4, 5, 10, 10]
    assert node.stats()["split"] == 1 and node.stats()["pieces"] == 5


def test_mask_first_off_keeps_every_real_label():
    rows = _rows(PackTokens(IterableWrapper(_docs([3, 2])), seq_len=6, mask_first=False, ignore_index=-1))
    _check_row(rows[0], 6, ignore=-1, mask_first=False)
    assert rows[0]["labels"].tolist()[:5] == rows[0]["input_ids"].tolist()[:5]


@pytest.mark.parametrize("items, message", [
    ([{"index": 4, "text": "no ids"}], r"pack_tokens: item 4 has no token field 'input_ids' \(it has fields"),
    ([{"file": "a.jsonl", "line": 7, "input_ids": []}], r"a\.jsonl:7 has no tokens \(an empty document\)"),
    ([{"index": 2, "input_ids": [1, 300]}], r"item 2 has token id 300, which dtype=uint8 cannot hold"),
    ([{"index": 2, "input_ids": [1, -5]}], r"item 2 has token id -5"),
    ([{"index": 3, "input_ids": [[1, 2]]}], r"item 3: field 'input_ids' must be a 1-D sequence"),
    (["just text"], r"an item has no token field 'input_ids' \(it has a str\)"),
])
def test_bad_input_is_an_error_naming_the_node_and_the_record(items, message):
    node = PackTokens(IterableWrapper(items), seq_len=8, dtype="uint8")
    with pytest.raises(SampleError, match=message):
        _rows(node)


@pytest.mark.parametrize("ids, dtype, bad", [
    (np.array([1, -5], np.int16), "int16", -5),      # an int16 row: no id over its top, but below 0
    (np.array([1, 40000], np.uint16), "int16", 40000),
    (np.array([7, 300], np.int16), "uint8", 300),
    (torch.tensor([2, -1], dtype=torch.int32), "int64", -1),
    (np.array([1, 255], np.uint8), "uint8", None),    # a uint8 into a uint8 row: nothing to check
    (np.array([1, 32767], np.int16), "int16", None),
    (np.array([True, False]), "uint8", None),
])
def test_the_range_check_follows_the_ids_dtype(ids, dtype, bad):
    """Ids of each integer dtype are checked against the row's dtype (the check skips only
    what the ids' dtype cannot hold), the same for a dtype seen the first time or again."""
    for _ in range(2):
        node = PackTokens(IterableWrapper([{"index": 1, "input_ids": ids}]), seq_len=4, dtype=dtype)
        if bad is None:
            rows = _rows(node)
            assert rows[0]["input_ids"].tolist()[:2] == [int(x) for x in ids]
        else:
            with pytest.raises(SampleError, match=rf"item 1 has token id {bad}, which dtype={dtype} cannot hold"):
                _rows(node)


def test_empty_documents_can_be_counted_skips():
    items = [{"index": 0, "input_ids": [1, 2]}, {"index": 1, "input_ids": []}]
    node = PackTokens(IterableWrapper(items), seq_len=4, empty="skip")
    rows = _rows(node)
    assert len(rows) == 1 and node.stats()["empty"] == 1 and node.ledger.count == 1


@pytest.mark.parametrize("kw, message", [
    ({"seq_len": 0}, "seq_len=0 must be a positive int"),
    ({"seq_len": 1}, "with mask_first: every label would be the ignore index"),
    ({"seq_len": 8, "pool": 0}, "pool=0 must be a positive int"),
    ({"seq_len": 8, "algorithm": "next_fit"}, "must be one of first_fit, best_fit"),
    ({"seq_len": 8, "pad_id": 256, "dtype": "uint8"}, "pad_id=256 does not fit dtype='uint8'"),
])
def test_bad_arguments_say_which_and_why(kw, message):
    with pytest.raises(ValueError, match=message):
        PackTokens(IterableWrapper([]), **kw)


def test_the_state_holds_no_tokens_and_a_restore_reads_one_pool():
    lengths = [int(x) for x in np.random.default_rng(0).integers(1, 300, 500)]
    src = _Counted(_docs(lengths))
    node = PackTokens(src, seq_len=512, pool=100)
    node.reset()
    rows = list(node)
    for k in (1, 17, 30, len(rows) - 1):
        node = PackTokens(src2 := _Counted(_docs(lengths)), seq_len=512, pool=100)
        node.reset()
        for _ in range(k):
            next(node)
        state = json.loads(json.dumps(node.state_dict()))
        assert len(json.dumps(state)) <= 4096 and "input_ids" not in json.dumps(state)
        fresh = PackTokens(src2 := _Counted(_docs(lengths)), seq_len=512, pool=100)
        fresh.reset(state)
        assert src2.reads <= 100, "a restore re-reads at most the pool it stopped in"
        rest = list(fresh)
        assert [r["input_ids"].tolist() for r in rest] == [r["input_ids"].tolist() for r in rows[k:]]
        assert fresh.stats() == _stats_after(lengths)


def _stats_after(lengths: list[int]) -> dict:
    node = PackTokens(IterableWrapper(_docs(lengths)), seq_len=512, pool=100)
    _rows(node)
    return node.stats()


def test_a_state_from_other_settings_is_refused():
    node = PackTokens(IterableWrapper(_docs([5] * 20)), seq_len=8, pool=4)
    node.reset()
    next(node)
    state = node.state_dict()
    with pytest.raises(StateError, match=r"pool, overflow, max_docs\] = \[8, 'best_fit', 4, 'split'"):
        PackTokens(IterableWrapper(_docs([5] * 20)), seq_len=8, pool=5).reset(state)


def test_rows_are_reshuffled_each_epoch_from_the_seed():
    docs = _docs([int(x) for x in np.random.default_rng(1).integers(1, 30, 200)])
    node = PackTokens(IterableWrapper(docs), seq_len=32, pool=200)
    first, again, second = (_fp(_rows(node, e)) for e in (0, 0, 1))
    assert first == again and first != second and sorted(first) == sorted(second)


def _fp(rows: list[dict]) -> list[tuple]:
    return [tuple(r["input_ids"].tolist()) for r in rows]


SPEC = """\
nodes:
  files: {op: list_files, url: "examples/data/text-sample/part-0001.jsonl"}
  read: {op: read_jsonl}
  tok: {op: map, fn: "conveyor.text:byte_tokenize", args: {dtype: uint8}}
  pack: {op: pack_tokens, seq_len: %s}
  batch: {op: batch, size: 4}
  collate: {op: collate}
"""


def test_in_a_spec_rows_batch_and_collate_and_bad_params_name_their_line(write_spec, monkeypatch):
    from conveyor import SpecErrors, check_spec, load_graph

    monkeypatch.chdir(ROOT)
    with load_graph(write_spec(SPEC % "256")) as loader:
        batch = next(iter(loader))
        assert batch["input_ids"].shape == (4, 256) and batch["cu_seqlens"].shape == (4, 257)
        assert batch["cu_seqlens"].dtype == torch.int32 and batch["num_tokens"].shape == (4,)
        assert loader.stats()["nodes"]["pack"]["padding_efficiency"] > 0.9
    for bad, param, message in (("0", "seq_len", "expected a positive int, got 0"), ("8, max_docs: 9", "max_docs", "over seq_len=8"),
                                ("8, algorithm: worst_fit", "algorithm", "first_fit|best_fit")):
        with pytest.raises(SpecErrors) as info:
            check_spec(write_spec(SPEC % bad))
        (err,) = [e for e in info.value.errors if e.node == "pack"]
        assert err.param == param and message in err.message and err.line == 5, err


def test_pretrain_on_another_world_size_is_a_state_error_naming_pack(monkeypatch):
    """Which documents a pool's rows hold is known only by packing it again: not elastic."""
    from conveyor import load_graph

    states = []
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        with load_graph(ROOT / "specs/pretrain.yaml", seq_len=256) as loader:
            next(iter(loader))
            states.append(json.loads(json.dumps(loader.state_dict())))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with load_graph(ROOT / "specs/pretrain.yaml", seq_len=256) as loader:
        with pytest.raises(StateError, match=r"node 'pack' \(pack_tokens\) from .*pretrain.yaml:\d+ cannot be "
                                             r"resumed on another world size.*packing the pool again"):
            loader.load_state_dict(states)


# ----- ids in one block from a batch tokenizer (conveyor/_id_blocks.py) ------------------------

def _texts(n: int, bad: int | None = None) -> list[dict]:
    rng = np.random.default_rng(5)
    docs = [{"text": "x" * int(k) + "é", "index": i, "file": "f.jsonl", "line": i + 1}
            for i, k in enumerate(rng.integers(1, 300, n))]
    if bad is not None:
        docs[bad]["text"] = 7  # not a string: byte_tokenize refuses it, naming it
    return docs


def _tokenized(docs: list, batch: int, columns: bool, on_error: str = "raise") -> BaseNode:
    from conveyor.nodes import MapBatches
    from conveyor.text import byte_tokenize

    def records_only(items, **args):  # the same fn, without the block it offers
        return byte_tokenize(items, **args)

    fn = byte_tokenize if columns else records_only
    return MapBatches(_Counted(docs), fn=fn, size=batch, args={"add_eos": True, "dtype": "int16"}, on_error=on_error)


def _packed(docs: list, batch: int, pool: int, columns: bool, on_error: str = "raise") -> PackTokens:
    return PackTokens(_tokenized(docs, batch, columns, on_error), seq_len=128, pool=pool, batch_size=2,
                      dtype="int16", seed=3)


def _fingerprints(node: BaseNode, state: dict | None = None) -> list:
    node.reset(state)
    return [{k: v.tolist() for k, v in b.items()} for b in node]


@pytest.mark.parametrize("batch, pool", [(50, 50), (64, 50), (32, 50), (50, 120), (7, 30), (200, 1000)])
def test_ids_taken_in_blocks_give_the_batches_and_states_records_give(monkeypatch, batch, pool):
    from conveyor.nodes import MapBatches

    blocks = []
    next_ids = MapBatches.next_ids
    monkeypatch.setattr(MapBatches, "next_ids", lambda self, n: blocks.append(n) or next_ids(self, n))
    docs = _texts(300)
    by_records = _fingerprints(_packed(docs, batch, pool, columns=False))
    assert blocks == []
    by_blocks = _fingerprints(node := _packed(docs, batch, pool, columns=True))
    assert blocks, "the pool was taken in blocks of ids"
    assert by_blocks == by_records
    assert node.stats()["documents"] == 300
    for k in range(0, len(by_records), 7):  # a state taken on the block path resumes on either
        first = _packed(docs, batch, pool, columns=True)
        first.reset()
        for _ in range(k):
            next(first)
        state = json.loads(json.dumps(first.state_dict()))
        for columns in (True, False):
            assert _fingerprints(_packed(docs, batch, pool, columns), state) == by_records[k:], (k, columns)


def test_a_list_with_a_bad_record_goes_by_records_and_its_record_is_named_or_skipped():
    docs = _texts(120, bad=57)
    with pytest.raises(SampleError, match=r"f\.jsonl:58: field 'text' is int, expected a string"):
        _fingerprints(_packed(docs, 32, 50, columns=True))
    skipping = _packed(docs, 32, 50, columns=True, on_error="skip")
    got = _fingerprints(skipping)
    assert got == _fingerprints(_packed(docs, 32, 50, columns=False, on_error="skip"))
    assert skipping.source.stats()["skipped"] == 1 and skipping.stats()["documents"] == 119


class _Blocks(_Counted):
    """``_Counted`` that also gives its records as ``IdsBlock``s (``next_ids``), as a batch
    tokenizer's map does."""

    def ids_ready(self) -> bool:
        return True

    def next_ids(self, n: int):
        from conveyor._id_blocks import IdsBlock

        if self._i >= len(self.items):
            raise StopIteration
        part = self.items[self._i:self._i + n]
        self._i += len(part)
        self.reads += len(part)
        return IdsBlock.of_records(part, "input_ids")


@pytest.mark.parametrize("items, message", [
    ([{"file": "a.jsonl", "line": 1, "input_ids": [5, 6]}, {"file": "a.jsonl", "line": 2, "input_ids": []}],
     r"a\.jsonl:2 has no tokens \(an empty document\)"),
    ([{"file": "a.jsonl", "line": 1, "input_ids": [5, 6]}, {"file": "a.jsonl", "line": 2, "input_ids": [1, 300]}],
     r"a\.jsonl:2 has token id 300, which dtype=uint8 cannot hold"),
])
def test_a_bad_document_in_a_block_is_named_by_its_record(items, message):
    with pytest.raises(SampleError, match=message):
        _rows(PackTokens(_Blocks(items), seq_len=8, pool=10, dtype="uint8"))


def test_blocks_and_records_of_the_same_documents_pack_the_same():
    docs = _docs([int(x) for x in np.random.default_rng(4).integers(1, 90, 200)])
    by_blocks = [b["input_ids"].tolist() for b in _rows(PackTokens(_Blocks(docs), seq_len=100, pool=30))]
    assert by_blocks == [b["input_ids"].tolist() for b in _rows(PackTokens(_Counted(docs), seq_len=100, pool=30))]


def test_pretrain_yaml_takes_its_pools_as_blocks_and_counts_every_document(monkeypatch):
    from conveyor import load_graph
    from conveyor.nodes import MapBatches

    asked = []
    next_ids = MapBatches.next_ids
    monkeypatch.setattr(MapBatches, "next_ids", lambda self, n: asked.append(n) or next_ids(self, n))
    with load_graph(ROOT / "specs/pretrain.yaml") as loader:
        batches = sum(1 for _ in loader)
        nodes = loader.stats()["nodes"]
    assert batches and len(asked) >= 5  # a pool of 1,000 documents a block or two (batch 1,024)
    assert nodes["tokenize"]["items"] == nodes["read"]["items"] == nodes["pack"]["documents"] == 4016


def test_a_block_of_another_field_than_pack_s_is_not_taken_for_it():
    # the tokenizer's block holds input_ids; a pack reading another field names the record
    node = PackTokens(_tokenized(_texts(40), 16, columns=True), seq_len=128, pool=20, field="ids", dtype="int16")
    with pytest.raises(SampleError, match=r"f\.jsonl:1 has no token field 'ids' \(it has fields"):
        _fingerprints(node)


def test_a_block_that_does_not_add_up_is_not_taken(monkeypatch):
    # a fn's columns whose lengths do not sum to its ids (a plug-in's mistake): the list goes by records
    from conveyor.text import byte_tokenize

    good = byte_tokenize.columns

    def short(items, **args):
        block = good(items, **args)
        block.ids = block.ids[:-1]
        return block

    monkeypatch.setattr(byte_tokenize, "columns", short)
    docs = _texts(90)
    assert _fingerprints(_packed(docs, 30, 30, columns=True)) == _fingerprints(_packed(docs, 30, 30, columns=False))

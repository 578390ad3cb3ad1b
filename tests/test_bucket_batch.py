"""Tests for bucket_batch: nothing lost or duplicated, budgets held, buckets respected, and an
exact resume from every step of two epochs with a state that holds no items."""

from __future__ import annotations

import json
import logging
import random
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torchdata.nodes import BaseNode

from conveyor.errors import SampleError
from conveyor.nodes._rng import derive_seed
from conveyor.nodes.bucket_batch import BucketBatch, auto_boundaries, cut_sorted


class Items(BaseNode):
    """A list of ``{"input_ids", "index"}`` items, permuted per epoch; state: a position."""

    POS_KEY = "pos"

    def __init__(self, lengths: list[int], *, seed: int = 0):
        super().__init__()
        self.lengths = lengths
        self.seed = seed
        self.epoch = 0
        self.pos = 0
        self.order: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self.order = list(range(len(self.lengths)))
        random.Random(derive_seed(self.seed, self.epoch)).shuffle(self.order)
        self.pos = 0 if initial_state is None else initial_state[self.POS_KEY]

    def next(self) -> dict:
        if self.pos >= len(self.order):
            raise StopIteration
        i = self.order[self.pos]
        self.pos += 1
        return {"input_ids": [7] * self.lengths[i], "index": i}

    def get_state(self) -> dict:
        return {self.POS_KEY: self.pos}


def _make(lengths: list[int], **kw: Any) -> tuple[BucketBatch, Items]:
    src = Items(lengths)
    return BucketBatch(src, length="input_ids", **kw), src


def _epoch(node: BucketBatch, src: Items, epoch: int, state: dict | None = None) -> list[list[dict]]:
    src.set_epoch(epoch)
    node.set_epoch(epoch)
    node.reset(state)
    return list(node)


def _ids(batches: list[list[dict]]) -> list[list[tuple[int, int]]]:
    return [[(x["index"], len(x["input_ids"])) for x in b] for b in batches]


def _padded(n: int, m: int | None) -> int:
    return -(-n // m) * m if m else n


def _bucket(n: int, bounds: list[int]) -> int:
    return next((i for i, b in enumerate(bounds) if n <= b), len(bounds))


# ----- properties -------------------------------------------------------------------------

lengths_st = st.lists(st.integers(0, 300), min_size=0, max_size=250)


@st.composite
def configs(draw: Any) -> tuple[list[int], dict[str, Any]]:
    lengths = draw(lengths_st)
    bounds = sorted(draw(st.sets(st.integers(1, 320), min_size=1, max_size=6)))
    overflow = draw(st.sampled_from(["own_bucket", "skip", "truncate"]))
    multiple = draw(st.sampled_from([None, 1, 8]))
    kw: dict[str, Any] = {"boundaries": bounds, "overflow": overflow, "pool": draw(st.integers(1, 4)),
                          "pad_to_multiple_of": multiple, "seed": draw(st.integers(0, 3)),
                          "shuffle": draw(st.booleans()), "empty": "skip"}  # lengths of 0 too
    if draw(st.booleans()):
        kw["max_tokens"] = draw(st.integers(_padded(bounds[-1], multiple), 1200))
    else:
        kw["batch_sizes"] = draw(st.lists(st.integers(1, 9), min_size=len(bounds) + (overflow == "own_bucket"),
                                          max_size=len(bounds) + (overflow == "own_bucket")))
    if draw(st.booleans()):
        kw["max_pending"] = draw(st.integers(1, 60))
    return lengths, kw


@settings(max_examples=120, deadline=None)
@given(configs())
def test_every_item_once_in_its_bucket_within_budget(config):
    lengths, kw = config
    node, src = _make(lengths, **kw)
    bounds, m = kw["boundaries"], kw["pad_to_multiple_of"]
    for epoch in range(2):
        batches = _epoch(node, src, epoch)
        seen = [x["index"] for b in batches for x in b]
        assert len(seen) == len(set(seen)), "an item came twice"
        over = {i for i, n in enumerate(lengths) if n > bounds[-1]}
        empty = {i for i, n in enumerate(lengths) if n == 0}
        expected = set(range(len(lengths))) - (over if kw["overflow"] == "skip" else set()) - empty
        assert set(seen) == expected
        assert node.stats()["overflow"] == len(over) and node.stats()["empty"] == len(empty)
        for b in batches:
            assert b, "an empty batch"
            lens = [len(x["input_ids"]) for x in b]
            if kw["overflow"] == "truncate":
                assert max(lens) <= bounds[-1]
            buckets = {_bucket(n, bounds) for n in lens}
            assert len(buckets) == 1, f"batch spans buckets {buckets}: {lens}"
            if "max_tokens" in kw:
                assert len(b) == 1 or len(b) * max(_padded(max(lens), m), 1) <= kw["max_tokens"]
            else:
                assert len(b) <= kw["batch_sizes"][buckets.pop()]
        st_ = node.stats()
        assert sum(st_["batches_per_bucket"]) == len(batches)
        real = sum(len(x["input_ids"]) for b in batches for x in b)
        assert st_["real_tokens"] == real


@settings(max_examples=60, deadline=None)
@given(configs())
def test_drop_remainder_counts_what_it_drops(config):
    lengths, kw = config
    kw["overflow"] = "own_bucket" if kw["overflow"] == "skip" else kw["overflow"]
    if "batch_sizes" in kw:
        kw["batch_sizes"] = (kw["batch_sizes"] + [2])[: len(kw["boundaries"]) + (kw["overflow"] == "own_bucket")]
    node, src = _make(lengths, drop_remainder=True, **kw)
    batches = _epoch(node, src, 0)
    seen = [x["index"] for b in batches for x in b]
    assert len(seen) == len(set(seen))
    assert len(seen) + node.stats()["dropped"] + node.stats()["empty"] == len(lengths)
    if "batch_sizes" in kw and not kw.get("max_pending"):
        for b in batches:  # only forced flushes may leave a batch short
            assert len(b) == kw["batch_sizes"][_bucket(len(b[0]["input_ids"]), kw["boundaries"])]


def _check_resume(lengths: list[int], kw: dict[str, Any], epochs: int = 2) -> None:
    node, src = _make(lengths, **kw)
    full: list[tuple[int, list]] = []  # (epoch, batch ids)
    states: list[dict] = []
    for epoch in range(epochs):
        src.set_epoch(epoch)
        node.set_epoch(epoch)
        node.reset()
        states.append(json.loads(json.dumps(node.state_dict())))  # before the first batch
        for batch in node:
            full.append((epoch, _ids([batch])[0]))
            states.append(json.loads(json.dumps(node.state_dict())))
        states.pop()  # after the last batch: the loader starts the next epoch instead
    # states come per epoch: before its first batch, then after each batch but the last
    k = 0
    for epoch in range(epochs):
        n_epoch = sum(1 for e, _ in full if e == epoch)
        for j in range(n_epoch):
            state = states[k]
            k += 1
            fresh, fsrc = _make(lengths, **kw)
            rest = _ids(_epoch(fresh, fsrc, epoch, state))
            for later in range(epoch + 1, epochs):
                rest += _ids(_epoch(fresh, fsrc, later))
            before = sum(1 for e, _ in full if e < epoch) + j
            assert rest == [b for _, b in full[before:]], f"resume at epoch {epoch} step {j} differs"
            assert "input_ids" not in json.dumps(state)


@settings(max_examples=40, deadline=None)
@given(configs())
def test_resume_from_every_step_of_two_epochs(config):
    lengths, kw = config
    _check_resume(lengths[:80], kw)


def _run_states(lengths: list[int], kw: dict[str, Any]) -> list[tuple[Any, dict, dict]]:
    node, src = _make(lengths, **kw)
    src.set_epoch(1)
    node.set_epoch(1)
    node.reset()
    return [(_ids([batch]), node.state_dict(), node.stats()) for batch in node]


def _by_each_path(lengths: list[int], kw: dict[str, Any]) -> None:
    """Every batch, state and stat after each batch are the same whether a chunk's items go in
    one numpy pass per bucket (_bulk), one Python loop over C-found lengths, or one by one (_add)."""
    bulk = _run_states(lengths, kw)
    saved_bulk, saved_sized = BucketBatch._bulk, BucketBatch._sized
    BucketBatch._bulk = lambda self, pending, pi: None  # type: ignore[method-assign]  # the item loop
    try:
        loop = _run_states(lengths, kw)
        BucketBatch._sized = lambda self, chunk: (None, None, None)  # type: ignore[method-assign]  # all by _add
        slow = _run_states(lengths, kw)
    finally:
        BucketBatch._bulk, BucketBatch._sized = saved_bulk, saved_sized  # type: ignore[method-assign]
    assert bulk == slow
    assert loop == slow


@settings(max_examples=60, deadline=None)
@given(configs())
def test_a_chunk_added_at_once_is_the_items_added_one_by_one(config):
    """Empty and overflowing items, forced flushes and budgets included."""
    _by_each_path(*config)


@settings(max_examples=60, deadline=None)
@given(configs(), st.lists(st.integers(1, 300), min_size=20, max_size=700), st.booleans())
def test_a_chunk_added_in_bulk_is_the_items_added_one_by_one(config, lengths, no_overflow):
    """Longer inputs (chunks of 256 and a short last one), without empty items (which send
    _bulk to _add) and maybe none over the last boundary, so most chunks go in bulk, cut inside
    by full pools and forced flushes (max_pending from 1)."""
    _, kw = config
    if no_overflow:
        lengths = [min(n, kw["boundaries"][-1]) for n in lengths]
    _by_each_path(lengths, kw)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 400), min_size=1, max_size=80), st.integers(1, 600), st.sampled_from([None, 1, 8]))
@example([4, 4, 4], 8, None)  # a batch exactly the budget wide
@example([0, 0, 3, 9], 9, 8)  # empty items count 1 wide; one alone over the budget
def test_a_budget_cut_is_the_greedy_one(lens, budget, multiple):
    """cut_sorted finds each batch's end by bisection; the cuts are the greedy item-by-item
    ones: a batch grows while its size x padded longest fits the budget (a lone item over it
    is a batch of one), and the last is partial when one more of its longest would fit."""
    lens = sorted(lens)
    padded = [max(_padded(n, multiple), 1) for n in lens]
    cuts, start = [], 0
    for i in range(1, len(lens)):
        if (i + 1 - start) * padded[i] > budget:
            cuts.append((start, i))
            start = i
    cuts.append((start, len(lens)))
    partial = (len(lens) - start + 1) * padded[-1] <= budget
    assert cut_sorted(lens, size=None, budget=budget, multiple=multiple) == (cuts, partial)


def test_resume_with_forced_flushes_and_auto_boundaries():
    rng = random.Random(5)
    lengths = [int(rng.paretovariate(1.2) * 10) for _ in range(300)]
    _check_resume(lengths, {"boundaries": [8, 16, 32, 64], "max_tokens": 256, "pool": 3,
                            "overflow": "own_bucket", "max_pending": 40, "pad_to_multiple_of": 8})
    _check_resume(lengths, {"boundaries": "auto", "max_tokens": 2048, "auto_buckets": 5, "auto_sample": 50})


def test_state_is_small_and_same_shape_every_step():
    lengths = [(i * 37) % 200 for i in range(500)]
    node, src = _make(lengths, boundaries=[50, 100, 150, 200], max_tokens=1000, max_pending=100, empty="skip")
    node.reset()
    shapes = set()
    for _ in node:
        s = node.state_dict()
        shapes.add(json.dumps({k: type(v).__name__ if not isinstance(v, list) else len(v) for k, v in s.items()}))
        assert len(json.dumps(s)) < 600
        assert s["replay"] <= 100 + 200 + 1000  # max_pending + one pool of the largest bucket
    assert len(shapes) == 1


# ----- examples and errors ----------------------------------------------------------------


def test_sorted_pools_pad_little():
    rng = random.Random(0)
    lengths = [min(int(rng.lognormvariate(4, 1)), 1000) for _ in range(3000)]
    eff = {}
    for pool in (1, 8):
        node, src = _make(lengths, boundaries=[64, 128, 256, 512, 1024], max_tokens=4096, pool=pool)
        _epoch(node, src, 0)
        eff[pool] = node.stats()["padding_efficiency"]
    assert eff[8] > 0.93 and eff[8] > eff[1] + 0.1  # fixed buckets alone (pool 1) waste ~20 %



@pytest.mark.parametrize("length", ["input_ids", "fn"])
def test_pooled_items_are_held_by_no_tuple_the_collector_tracks(length):
    """A pool is two lists side by side (items, lengths), not a (length, position, item) tuple
    an item: a tuple holding a dict stays tracked, went to the oldest generation with
    the pool and set off a full collection (~80 ms with torch loaded) every ~60 epochs of
    text.yaml. Both ways in: the chunk at once (a field) and item by item (a length fn)."""
    import gc

    class Kept(Items):  # keeps what it gave: those not out in a batch yet are in the pools
        def next(self) -> dict:
            item = super().next()
            given.append(item)
            return item

    given: list[dict] = []
    src = Kept([(i * 37) % 300 + 1 for i in range(2000)])
    node = BucketBatch(src, length="input_ids" if length == "input_ids" else (lambda x: len(x["input_ids"])),
                       boundaries=[64, 128, 256, 512], max_tokens=4096, pool=8)
    node.reset()
    out = {id(x) for x in next(node)}
    pooled = [x for x in given if id(x) not in out]
    assert len(pooled) > 100
    del out
    gc.collect()
    holders = [type(r).__name__ for x in pooled[::20] for r in gc.get_referrers(x)
               if r is not given and r is not pooled]
    assert "tuple" not in holders and set(holders) == {"list"}


def test_overflow_raise_names_the_item():
    src = Items([3, 50])
    node = BucketBatch(src, length=lambda x: len(x["input_ids"]), boundaries=[10], batch_sizes=[4])
    node.reset()
    with pytest.raises(SampleError, match=r"item 1 has length 50, over the last boundary 10"):
        list(node)


def test_oversize_item_is_a_batch_of_one():
    node, src = _make([5, 400, 6], boundaries=[10], max_tokens=100, overflow="own_bucket", shuffle=False)
    batches = _epoch(node, src, 0)
    assert sorted(len(b) for b in batches) == [1, 2]
    assert node.stats()["oversize"] == 1


def test_auto_boundaries_are_quantiles_and_kept_in_state():
    assert auto_boundaries([5] * 10, 4) == [5]
    assert auto_boundaries(list(range(1, 101)), 4, 8) == [32, 56, 80, 104]
    node, src = _make(list(range(1, 200)), boundaries="auto", max_tokens=4096, auto_buckets=4, auto_sample=99)
    _epoch(node, src, 0)
    bounds = node.stats()["boundaries"]
    assert len(bounds) == 4 and node.state_dict()["boundaries"] == bounds


@pytest.mark.parametrize("kw, message", [
    ({"boundaries": [4, 4], "max_tokens": 10}, "increasing"),
    ({"boundaries": [4], "max_tokens": 10, "batch_sizes": [1]}, "exactly one"),
    ({"boundaries": [4], "batch_sizes": [1, 2]}, "must be 1 positive ints"),
    ({"boundaries": "auto", "batch_sizes": [1]}, "needs max_tokens"),
    ({"boundaries": [4], "max_tokens": 10, "overflow": "wrap"}, "overflow='wrap'"),
    ({"boundaries": [4], "max_tokens": 10, "pool": 0}, "pool=0"),
])
def test_bad_arguments(kw, message):
    with pytest.raises(ValueError, match=message):
        BucketBatch(Items([1]), **kw)


def test_length_fn_and_truncate_rule():
    with pytest.raises(ValueError, match="truncate"):
        BucketBatch(Items([1]), length=len, boundaries=[4], max_tokens=10, overflow="truncate")


def test_truncate_cuts_every_field_as_long_as_the_length_field():
    import numpy as np
    import torch
    from torchdata.nodes import IterableWrapper

    from conveyor.nodes.pad_collate import PadCollate

    text = "A long document, far past the last boundary. " * 4
    items = []
    for i, t in enumerate(["short", text, "a bit longer"]):
        ids = torch.tensor(list(t.encode()))
        items.append({"input_ids": ids, "labels": ids.clone(), "loss_mask": np.ones(len(ids), np.int64),
                      "token_type_ids": [0] * len(ids), "text": t, "index": i})
    node = PadCollate(BucketBatch(IterableWrapper(items), boundaries=[16, 32], batch_sizes=[4, 4],
                                  overflow="truncate"), fields=["input_ids", "labels", "token_type_ids", "loss_mask"])
    (batch,) = [b for b in node if len(b["index"]) == 1 and b["index"][0] == 1]
    for key in ("input_ids", "labels", "token_type_ids", "loss_mask"):  # labels stayed 180 long: misaligned
        assert batch[key].shape == (1, 32), key
    assert batch["labels"].tolist() == batch["input_ids"].tolist() == [list(text.encode()[:32])]
    assert batch["text"] == [text]  # a string is not a sequence of positions
    assert len(items[1]["labels"]) == len(text)  # the input's item is left as it was


# ----- the op in a spec: cross-param rules are spec errors, found before anything runs ------

SPEC_HEAD = """\
nodes:
  files: {op: list_files, url: "examples/data/text-sample/*.jsonl"}
  read: {op: read_jsonl}
  tok: {op: map, fn: "conveyor.text:byte_tokenize"}
"""


@pytest.mark.parametrize("body, param, message", [
    ("{op: bucket_batch, boundaries: [8, 16], max_tokens: 64, batch_sizes: [2, 2]}", "batch_sizes",
     "exactly one of batch_sizes"),
    ("{op: bucket_batch, boundaries: [8, 16]}", "max_tokens", "exactly one of batch_sizes"),
    ("{op: bucket_batch, boundaries: [8, 16], batch_sizes: [2]}", "batch_sizes", "expected 2 sizes"),
    ("{op: bucket_batch, boundaries: [8, 16], batch_sizes: [2, 2], overflow: own_bucket}", "batch_sizes",
     "expected 3 sizes"),
    ("{op: bucket_batch, boundaries: [16, 8], max_tokens: 64}", "boundaries", "increasing"),
    ("{op: bucket_batch, boundaries: automatic, max_tokens: 64}", "boundaries", "or 'auto'"),
    ("{op: bucket_batch, boundaries: auto, batch_sizes: [4]}", "batch_sizes", "use max_tokens"),
    ("{op: bucket_batch, boundaries: [8, 100], max_tokens: 64}", "max_tokens", "over the budget"),
    ("{op: bucket_batch, boundaries: [8], max_tokens: 64, overflow: wrap}", "overflow", "one of raise|skip"),
    ("{op: bucket_batch, boundaries: [8], max_tokens: 64, length: input_ids, length_fn: 'builtins:len'}",
     "length_fn", "not both"),
    ("{op: bucket_batch, boundaries: [8], max_tokens: 64, pool: 0}", "pool", "positive int"),
])
def test_spec_errors_name_the_param(write_spec, body, param, message):
    from conveyor import SpecErrors, check_spec

    path = write_spec(SPEC_HEAD + f"  batch: {body}\n")
    with pytest.raises(SpecErrors) as info:
        check_spec(path)
    errors = [e for e in info.value.errors if e.node == "batch"]
    assert errors and errors[0].param == param and message in errors[0].message, info.value
    assert errors[0].line == 5


@pytest.mark.parametrize("bucket_multiple, between, ok", [
    (None, "", False),     # the budget assumes the longest, pad_collate pads past it
    (4, "", False),
    (8, "", True),
    (16, "", True),        # a multiple of 8 is padded no further by pad_collate
    (None, "  out: {op: prefetch, depth: 2}\n", False),
])
def test_a_budget_that_assumes_less_padding_than_pad_collate_adds_is_a_spec_error(
        write_spec, bucket_multiple, between, ok):
    from conveyor import SpecErrors, check_spec, load_graph

    multiple = "" if bucket_multiple is None else f", pad_to_multiple_of: {bucket_multiple}"
    spec = write_spec(SPEC_HEAD + "  batch: {op: bucket_batch, boundaries: [64, 256, 1024], max_tokens: 2048, "
                      f"overflow: truncate{multiple}}}\n" + between + "  pad: {op: pad_collate, pad_to_multiple_of: 8}\n")
    if ok:
        check_spec(spec)
        with load_graph(spec) as loader:
            for batch in loader:
                assert batch["input_ids"].numel() <= 2048
        return
    with pytest.raises(SpecErrors) as info:
        check_spec(spec)
    (err,) = info.value.errors  # batches over max_tokens, without a word, was what ran
    assert (err.node, err.param, err.line) == ("batch", "pad_to_multiple_of", 5)
    assert "'pad' (pad_collate) pads to a multiple of 8" in err.message and "set pad_to_multiple_of: 8" in err.message


def test_an_empty_document_is_an_error_naming_it_or_a_counted_skip(caplog):
    """Empty rows (wikitext's Parquet has many) tokenize to no ids: sorted together, they were
    batches 0 tokens wide, such as (1056, 0), that no model can take."""
    lengths = [0 if i % 3 else 5 for i in range(300)]
    node, src = _make(lengths, boundaries=[32, 64], max_tokens=2048, pad_to_multiple_of=8)
    with pytest.raises(SampleError, match=r"item \d+ has length 0 \(an empty document\).*empty: skip"):
        _epoch(node, src, 0)
    node, src = _make(lengths, boundaries=[32, 64], max_tokens=2048, pad_to_multiple_of=8, empty="skip")
    with caplog.at_level(logging.WARNING):
        batches = _epoch(node, src, 0)
    assert sorted(x["index"] for b in batches for x in b) == [i for i in range(300) if i % 3 == 0]
    assert all(len(x["input_ids"]) for b in batches for x in b)
    assert node.stats()["empty"] == 200 and node.ledger.count == 200
    assert "length 0, an empty document (empty: skip)" in caplog.text
    state = json.loads(json.dumps(node.state_dict()))
    assert state["stats"]["empty"] == 200

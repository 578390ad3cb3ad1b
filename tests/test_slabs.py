"""map → batch → collate with slabs: the map's fn writes each image into its batch row.

The batches must be exactly those of the copying path (values, order, labels), whatever is
skipped, resumed, kept by the trainer or dropped at the end; only the copy goes away.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from torchdata.nodes import BaseNode, IterableWrapper

from conveyor import load_graph
from conveyor.graphs.api import check_spec
from conveyor.graphs.compile import slabbed_maps
from conveyor.image import eval_transform, train_transform
from conveyor.nodes._workers.batch_slabs import SLAB_MARK
from conveyor.nodes.batch import Batch
from conveyor.nodes.collate import Collate
from conveyor.nodes.map import Map

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = sorted((ROOT / "examples/data/imagenet-sample/train").glob("*/*.JPEG"))


FAIL = {13, 14, 30}


def pixels(item: int, *, into=None) -> dict:
    """A (2, 3) int16 'image' made of the item's number, written into ``into``'s row when
    given; the items in ``FAIL`` write garbage there first and then fail."""
    dst = None if into is None else into("x", (2, 3), torch.int16)
    if item in FAIL:
        if dst is not None:
            dst.fill_(-1)
        raise ValueError(f"bad item {item}")
    x = dst if dst is not None else torch.empty((2, 3), dtype=torch.int16)
    x.fill_(item)
    return {"x": x, "i": item}


def graph(n: int, *, slab: int, size: int = 4, drop_last: bool = False, on_error: str = "skip") -> BaseNode:
    m = Map(IterableWrapper(range(n)), fn=pixels, workers=2, on_error=on_error, slab=slab,
            max_concurrent=6)
    return Collate(Batch(m, size=size, drop_last=drop_last))


def take(node: BaseNode, k: int | None = None) -> list[dict]:
    out = []
    while k is None or len(out) < k:
        try:
            out.append(next(node))
        except StopIteration:
            break
    return out


def close(node: BaseNode) -> None:
    node.source.source.close()


def same(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(torch.equal(x["x"], y["x"]) and torch.equal(x["i"], y["i"])
                                    for x, y in zip(a, b))


def is_slab(t: torch.Tensor) -> bool:
    return t._base is not None and getattr(t._base, SLAB_MARK, False)


@pytest.mark.parametrize("drop_last", [False, True])
def test_slab_batches_equal_copied_ones_through_skips(drop_last, no_new_threads):
    n = 47  # 3 of them fail (after writing garbage into their rows): counted, never seen
    expected_i = [i for i in range(n) if i not in FAIL]
    ref, node = graph(n, slab=0, drop_last=drop_last), graph(n, slab=4, drop_last=drop_last)
    try:
        ref.reset()
        node.reset()
        want, got = take(ref), take(node)
        assert same(got, want)
        flat = [int(i) for b in got for i in b["i"]]
        full = len(expected_i) // 4 * 4
        assert flat == (expected_i[:full] if drop_last else expected_i)
        for b in got:  # every image holds its own number: no garbage row, no shifted label
            assert all(bool((x == i).all()) for x, i in zip(b["x"], b["i"]))
        assert node.source.source.stats() == {"skipped": 3}
        assert all(is_slab(b["x"]) for b in got[:3])  # before the first skip: no copy
        assert any(is_slab(b["x"]) for b in got[5:])  # after the skips: realigned
    finally:
        close(ref)
        close(node)


def test_slab_batches_kept_by_the_trainer_are_never_overwritten(no_new_threads):
    node = graph(12, slab=4, on_error="raise")  # (none of them fails)
    try:
        kept = []
        for _ in range(3):  # epochs: each reset starts new slabs, reusing only free arrays
            node.reset()
            kept.append(take(node))
        assert all(is_slab(b["x"]) for epoch in kept for b in epoch)
        for epoch in kept:
            assert [int(i) for b in epoch for i in b["i"]] == list(range(12))
            for b in epoch:
                assert all(bool((x == i).all()) for x, i in zip(b["x"], b["i"]))
        del kept
        node.reset()  # the arrays are free again: a new epoch reuses them
        assert len(take(node)) == 3
    finally:
        close(node)


def test_slab_graph_resumes_from_every_step(no_new_threads):
    full_node = graph(23, slab=4)
    full_node.reset()
    full = take(full_node)
    close(full_node)
    for k in range(len(full) + 1):
        node = graph(23, slab=4)
        node.reset()
        head = take(node, k)
        state = node.state_dict()
        again = graph(23, slab=4)
        again.reset(state)
        assert same(head + take(again), full), f"resume after {k} batches"
        close(node)
        close(again)


def test_compiler_gives_slabs_to_a_threaded_map_feeding_batch_then_collate(tmp_path):
    plan = check_spec(str(ROOT / "specs/imagenet.yaml"), {"batch_size": 8})
    assert slabbed_maps(plan, list(plan.nodes)) == {"decode": 8}
    spec = tmp_path / "nocollate.yaml"
    spec.write_text("nodes:\n  src: {op: list_files, url: 'x/*'}\n"
                    "  m: {op: map, fn: helpers_fns:ident, workers: 2}\n  b: {op: batch, size: 4}\n"
                    "output: b\n")
    plan = check_spec(str(spec), {})
    assert slabbed_maps(plan, list(plan.nodes)) == {}
    with load_graph(str(ROOT / "specs/imagenet.yaml"), batch_size=8) as loader:
        batches = list(loader)
    assert batches and all(is_slab(b["image"]) for b in batches)


@pytest.mark.parametrize("seed", range(6))  # flipped and not, whole-pixel and shifted boxes
def test_transforms_write_into_the_row_the_same_pixels(seed):
    row = torch.full((3, 224, 224), 7, dtype=torch.uint8)
    item = {"path": str(SAMPLE[seed]), "label": 1, "index": seed}
    into = lambda key, shape, dtype: row if (key, tuple(shape), dtype) == ("image", (3, 224, 224), torch.uint8) else None  # noqa: E731
    out = train_transform(item, rng=random.Random(seed), into=into)
    assert out["image"] is row
    assert torch.equal(row, train_transform(item, rng=random.Random(seed))["image"])
    out = eval_transform(item, into=into)
    assert out["image"] is row and torch.equal(row, eval_transform(item)["image"])
    refused = train_transform(item, rng=random.Random(seed), into=lambda *a: None)
    assert torch.equal(refused["image"], train_transform(item, rng=random.Random(seed))["image"])


def test_into_is_the_maps_to_give_not_an_arg(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("nodes:\n  files: {op: list_files, url: 'x/*/*.JPEG', label: parent_dir}\n"
                    "  decode: {op: map, fn: conveyor.image:train_transform, args: {into: 3}, workers: 2}\n"
                    "output: decode\n")
    with pytest.raises(Exception, match="'into' is given by the map itself"):
        check_spec(str(spec), {})

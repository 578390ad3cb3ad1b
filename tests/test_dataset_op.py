"""op: dataset: a map-style Dataset (torch or Hugging Face) whose indexes are sampled per epoch,
sharded, read by ``conveyor.dataset:getitem`` in map workers, and resumed exactly."""

from __future__ import annotations

import json
import threading
from collections import Counter

import pytest

from conveyor import SpecErrors, check_spec, load_graph
from conveyor.graphs.yaml_loader import load_yaml
from conveyor.nodes.dataset import DatasetSampler, epoch_order
from resume_check import check_resume

SPEC = """\
params: {{seed: 3}}
nodes:
  samples: {{op: dataset, dataset: "{ds}", args: {args}, sampler: {sampler}{extra}}}
  shard:   {{op: shard, rank: {rank}, world: {world}}}
  load:    {{op: map, fn: conveyor.dataset:getitem, workers: 2{map_extra}}}
  batch:   {{op: batch, size: {bs}}}
  collate: {{op: collate}}
"""


def spec(write_spec, name="ds.yaml", *, ds="byo_fns:Squares", args="{n: 22}", sampler="shuffle", extra="",
         rank=0, world=1, bs=4, map_extra=""):
    return write_spec(SPEC.format(ds=ds, args=args, sampler=sampler, extra=extra, rank=rank, world=world,
                                  bs=bs, map_extra=map_extra), name)


def items(loader, key="i"):
    return [[v for b in loader for v in b[key].tolist()]]


def test_shuffled_per_epoch_read_in_worker_threads_and_resumed_exactly(write_spec):
    import byo_fns

    path = spec(write_spec, ds="byo_fns:ThreadLog")
    byo_fns.ThreadLog.threads.clear()
    with load_graph(path) as loader:
        epochs = [[v for b in loader for v in b["i"].tolist()] for _ in range(2)]
    assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(22))
    assert epochs[0] != epochs[1] and epochs[0] != list(range(22))
    with load_graph(path) as again:  # the same from (seed, epoch)
        assert len(again) == 6  # 22 items in batches of 4, known before iterating
        assert [v for b in again for v in b["i"].tolist()] == epochs[0]
    assert byo_fns.ThreadLog.threads and threading.main_thread().name not in byo_fns.ThreadLog.threads
    assert check_resume(lambda: load_graph(path), epochs=2) > 10


def test_ranks_get_disjoint_shares(write_spec):
    shares = []
    for rank in range(2):
        with load_graph(spec(write_spec, f"r{rank}.yaml", rank=rank, world=2)) as loader:
            shares.append([v for b in loader for v in b["i"].tolist()])
    assert [len(s) for s in shares] == [11, 11]
    assert set(shares[0]) | set(shares[1]) == set(range(22)) and not set(shares[0]) & set(shares[1])


def test_getitem_in_a_worker_process_opens_the_dataset_there(write_spec):
    path = spec(write_spec, args="{n: 12}", bs=12, map_extra=", method: process, mp_context: spawn")
    with load_graph(path, **{"load.workers": 1}) as loader:  # one process: each costs a torch import
        (batch,) = list(loader)
    assert sorted(batch["i"].tolist()) == list(range(12))
    assert batch["x"].tolist() == [i * i for i in batch["i"].tolist()]


def test_a_hugging_face_dataset_resumes_exactly(write_spec):
    path = spec(write_spec, ds="byo_fns:hf_dataset", args="{n: 10}", bs=3)
    with load_graph(path) as loader:
        (first, *_) = list(loader)
    assert first["label"].tolist() == [x % 3 for x in first["x"].tolist()]  # rows of the HF table
    assert check_resume(lambda: load_graph(path), epochs=2) == 8  # 4 batches of 3 (the last of 1) a epoch


def test_weighted_sampling_balances_a_10_to_1_dataset(write_spec):
    path = write_spec("""\
nodes:
  samples: {op: dataset, dataset: byo_fns:imbalanced, sampler: weighted, weights: byo_fns:balance,
            num_samples: 2000}
  load:    {op: map, fn: conveyor.dataset:getitem}
  batch:   {op: batch, size: 100}
  collate: {op: collate}
""")
    with load_graph(path) as loader:
        labels = [v for b in loader for v in b[1].tolist()]
        again = [v for b in loader for v in b[1].tolist()]
    counts = Counter(labels)
    assert sum(counts.values()) == 2000
    assert 900 <= counts[1] <= 1100, counts  # 10:1 in the data, balanced in the batches
    assert labels != again and 900 <= Counter(again)[1] <= 1100  # redrawn each epoch
    assert check_resume(lambda: load_graph(path), epochs=2, steps=[0, 7, 19, 20, 33]) == 40


def test_weighted_without_replacement_is_disjoint_across_ranks():
    order = epoch_order(10, sampler="weighted", seed=1, epoch=0, weights=[1.0] * 5 + [3.0] * 5,
                        num_samples=10, replacement=False).tolist()
    assert sorted(order) == list(range(10))
    node = DatasetSampler(list(range(10)), sampler="weighted", weights=[1.0] * 10, replacement=False, seed=1)
    assert sorted(r["index"] for r in node) == list(range(10))
    assert epoch_order(10, sampler="weighted", seed=1, epoch=1, weights=[1.0] * 10).tolist() != \
        epoch_order(10, sampler="weighted", seed=1, epoch=0, weights=[1.0] * 10).tolist()


def test_getitem_errors_follow_on_error(write_spec):
    path = spec(write_spec, args="{n: 12, bad: [4, 9]}", sampler="sequential", bs=12)
    with load_graph(path) as loader, pytest.raises(ValueError, match="item 4 is broken") as info:
        list(loader)
    assert any("reading item 4 of byo_fns:Squares" in n for n in info.value.__notes__)
    assert any("in node 'load' (map)" in n for n in info.value.__notes__)
    skip = spec(write_spec, "skip.yaml", args="{n: 12, bad: [4, 9]}", sampler="sequential", bs=12,
                map_extra=", on_error: skip")
    with load_graph(skip) as loader:
        (batch,) = list(loader)
        assert loader.stats()["nodes"]["load"]["skipped"] == 2
    assert batch["i"].tolist() == [0, 1, 2, 3, 5, 6, 7, 8, 10, 11]


BAD = """\
nodes:
  a: {op: dataset, dataset: byo_fns:Squares, args: {n: 3}, sampler: weighted, weights: [1, 2]}
  b: {op: dataset, dataset: byo_fns:Squares, args: {n: 3}, sampler: weighted, weights: [1, -2, 1]}
  c: {op: dataset, dataset: byo_fns:Squares, args: {n: 3}, sampler: weighted, weights: [1, .nan, 1]}
  d: {op: dataset, dataset: byo_fns:Squares, args: {n: 3}, sampler: weighted, weights: [0, 0, 0]}
  e: {op: dataset, dataset: byo_fns:Squares, args: {m: 3}}
  f: {op: dataset, dataset: byo_fns:NOT_A_DATASET}
  g: {op: dataset, dataset: byo_fns:Squares, args: {n: 3}, weights: [1, 1, 1]}
  h: {op: mix, input: [a, b, c, d, e, f, g], weights: [1, 1, 1, 1, 1, 1, 1]}
"""


def test_bad_datasets_and_weights_are_spec_errors_with_lines():
    with pytest.raises(SpecErrors) as info:
        check_spec(load_yaml(BAD, "bad.yaml"))
    got = [(e.line, e.node, e.param, e.message) for e in info.value.errors]
    assert got == [
        (2, "a", "weights", "expected one weight per item (3), got 2"),
        (3, "b", "weights", "weights must be finite numbers >= 0; weight 1 is -2.0"),
        (4, "c", "weights", "weights must be finite numbers >= 0; weight 1 is nan"),
        (5, "d", "weights", "weights are all 0: nothing could be drawn"),
        (6, "e", "args", "byo_fns:Squares has no argument 'm'; it takes: n, classes, bad"),
        (7, "f", "dataset", "byo_fns:NOT_A_DATASET gave an object of type int, which has no __len__ or "
                            "__getitem__: op: dataset reads map-style datasets (for a stream, use op: iterable)"),
        (8, "g", "weights", "weights go with sampler: weighted, and it needs them"),
    ], got
    assert str(info.value.errors[0]).startswith("bad.yaml:2:")
    assert [e.col for e in info.value.errors[1:3]] == [92, 92]  # at the bad weight itself


def test_a_dataset_epoch_resumes_on_another_world_size(write_spec, monkeypatch):
    path = spec(write_spec, args="{n: 30}", bs=3).read_text().replace("rank: 0, world: 1", "by: [rank]")
    path = write_spec(path, "elastic.yaml")

    def open_(rank: int, world: int):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(world))
        return load_graph(path)

    taken, states = [], []
    for rank in range(2):  # two ranks take a batch each and save
        with open_(rank, 2) as loader:
            taken += next(iter(loader))["i"].tolist()
            states.append(json.loads(json.dumps(loader.state_dict())))
    rest = []
    for rank in range(3):  # three ranks go on with what is left of the epoch
        with open_(rank, 3) as loader:
            loader.load_state_dict(states)
            rest.append([i for b in loader for i in b["i"].tolist()])
    new = [i for r in rest for i in r]
    assert sorted(new) == sorted(set(range(30)) - set(taken)) and [len(r) for r in rest] == [8, 8, 8]


def test_getitem_keeps_the_index_and_collate_names_the_field_that_is_none(write_spec):
    # the index was dropped, and a None field surfaced as "samples of one batch must have the
    # same shapes and fields", naming neither the field nor the sample
    path = spec(write_spec, args="{n: 12}", sampler="sequential", bs=4)
    with load_graph(path) as loader:
        batches = list(loader)
    assert [v for b in batches for v in b["index"].tolist()] == list(range(12))
    assert [v for b in batches for v in b["i"].tolist()] == list(range(12))
    bad = spec(write_spec, "none.yaml", ds="byo_fns:Unlabelled", args="{n: 12, unlabelled: [6]}",
               sampler="sequential", bs=4)
    with load_graph(bad) as loader, pytest.raises(Exception) as info:
        list(loader)
    notes = " ".join(getattr(info.value, "__notes__", []))
    assert "field 'label' is None in sample 2 (index 6)" in notes, notes
    assert "same shapes and fields" not in notes, notes

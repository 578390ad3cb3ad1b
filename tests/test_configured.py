"""Configured callables: ``fn`` naming a class is made once per worker with ``init`` and called
per item with ``args``; a ``generator`` parameter gets a per-sample torch.Generator; and a
map's ``args`` (and ``init``) are bound to the signature when the spec is checked."""

from __future__ import annotations

import pickle

import pytest
import torch

import byo_fns
from conveyor import SpecErrors, check_spec, load_graph
from conveyor.graphs.yaml_loader import load_yaml
from conveyor.nodes._configured import PerWorker
from resume_check import check_resume

SPEC = """\
nodes:
  files:   {{op: list_files, url: "{root}/examples/data/numbers/*/*.txt", shuffle: true}}
  jitter:  {{op: map, fn: byo_fns:Jitter, init: {{scale: 2.0, offset: 10}}, args: {{bias: 1}}, workers: {w}}}
  batch:   {{op: batch, size: 8}}
  collate: {{op: collate}}
"""


def _spec(write_spec, workers: int, name: str):
    from pathlib import Path

    return write_spec(SPEC.format(root=Path(__file__).resolve().parent.parent, w=workers), name)


def test_a_class_is_made_once_per_worker_and_its_torch_randomness_resumes_exactly(write_spec):
    byo_fns.Jitter.made.clear()
    runs = {}
    for workers in (0, 2):
        with load_graph(_spec(write_spec, workers, f"w{workers}.yaml")) as loader:
            runs[workers] = [(b["index"].tolist(), b["noise"], b["coin"].tolist()) for b in loader]
    assert 1 <= len(byo_fns.Jitter.made) <= 3  # inline: 1; two threads: at most 2
    first = runs[0][0]
    assert first[1].shape == (8, 3) and bool(((first[1] >= 11) & (first[1] < 13)).all())  # collated
    for a, b in zip(runs[0], runs[2]):  # per-sample seeds: the same whatever the workers
        assert a[0] == b[0] and torch.equal(a[1], b[1]) and a[2] == b[2]
    assert check_resume(lambda: load_graph(_spec(write_spec, 2, "w2.yaml")), epochs=2,
                        steps=[0, 1, 4, 7, 9]) == 10


def test_a_per_worker_transform_travels_without_its_instances():
    fn = PerWorker(byo_fns.Jitter, {"scale": 1.0})
    fn.instance()
    copy = pickle.loads(pickle.dumps(fn))
    assert copy.made == 0 and copy.init == {"scale": 1.0}
    assert list(__import__("inspect").signature(copy).parameters) == ["item", "generator", "rng", "bias"]


BAD = """\
nodes:
  files: {op: list_files, url: "x/*"}
  a: {op: map, fn: byo_fns:scale, args: {kk: 2}}
  b: {op: map, fn: byo_fns:scale}
  c: {op: map, fn: byo_fns:scale, args: {k: 2}, init: {k: 1}}
  d: {op: map, fn: byo_fns:Jitter, init: {scal: 2}, args: {bias: 1, rng: 3}}
  e: {op: map, fn: byo_fns:NotCallable}
  f: {op: filter, fn: byo_fns:scale, args: {k: 1, j: 2}}
"""


def test_args_and_init_are_bound_to_the_signature_when_the_spec_is_checked():
    with pytest.raises(SpecErrors) as info:
        check_spec(load_yaml(BAD, "bad.yaml"))
    got = [(e.line, e.col, e.node, e.param, e.message) for e in info.value.errors]  # at the bad key
    assert got == [
        (3, 42, "a", "args", "byo_fns:scale has no argument 'kk' (did you mean 'k'?)"),
        (4, 6, "b", "args", "byo_fns:scale: missing a required argument: 'k'"),
        (5, 55, "c", "init", "init goes to a class's constructor, but byo_fns:scale is a function, not a class"),
        (6, 43, "d", "init", "byo_fns:Jitter() has no argument 'scal' (did you mean 'scale'?)"),
        (6, 69, "d", "args", "'rng' is given by the map itself (per sample); remove it from args"),
        (7, 20, "e", "fn", "byo_fns:NotCallable is a class whose instances are not callable (no __call__)"),
        (8, 51, "f", "args", "byo_fns:scale has no argument 'j'; it takes: k"),
    ], got
    assert str(info.value.errors[0]).startswith("bad.yaml:3:42: node 'a' (map): param 'args': ")


def test_a_filter_takes_a_configured_class_too():
    from pathlib import Path

    from conveyor import Graph

    root = Path(__file__).resolve().parent.parent / "examples/data/numbers/even"
    graph = (Graph().node("files", "list_files", url=f"{root}/*.txt")
             .node("keep", "filter", fn=byo_fns.KeepAbove, init={"limit": 16}))
    with graph.load() as loader:
        assert [r["index"] for r in loader] == [17, 18, 19]
        assert loader.stats()["nodes"]["keep"]["filtered"] == 17

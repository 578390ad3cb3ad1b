"""op: iterable: a torch IterableDataset, a Hugging Face IterableDataset or any iterable from
a factory; resumed through its own state where it has one, else by re-reading and skipping."""

from __future__ import annotations

import json
import logging

import pytest

from conveyor import SpecErrors, check_spec, load_graph
from conveyor.graphs.yaml_loader import load_yaml
from resume_check import check_resume

SPEC = """\
nodes:
  stream:  {{op: iterable, iterable: "{ref}", args: {args}}}
  batch:   {{op: batch, size: 3}}
  collate: {{op: collate}}
"""


@pytest.mark.parametrize("ref, args, first", [
    ("byo_fns:Counting", "{n: 10}", [0, 1, 2]),
    ("byo_fns:generate", "{n: 10}", [0, 2, 4]),
    ("byo_fns:hf_stream", "{n: 10}", [0, 1, 2]),
])
def test_iterables_run_epochs_and_resume_exactly(write_spec, ref, args, first):
    path = write_spec(SPEC.format(ref=ref, args=args))
    with load_graph(path) as loader:
        epochs = [[v for b in loader for v in b["v"].tolist()] for _ in range(2)]
    assert len(epochs[0]) == len(epochs[1]) == 10
    assert epochs[0][:3] == epochs[1][:3] == first
    assert check_resume(lambda: load_graph(path), epochs=2) == 8


def test_resume_without_state_dict_says_once_that_it_skips(write_spec, caplog):
    path = write_spec(SPEC.format(ref="byo_fns:Counting", args="{n: 10}"))
    with load_graph(path) as loader:
        it = iter(loader)
        next(it), next(it)
        state = loader.state_dict()
    with caplog.at_level(logging.WARNING), load_graph(path) as fresh:
        fresh.load_state_dict(state)
        assert [b["v"].tolist() for b in fresh] == [[6, 7, 8], [9]]
    said = [m for m in caplog.messages if "re-reads it from the start of the epoch and skips the 6 items" in m]
    assert len(said) == 1
    hf = write_spec(SPEC.format(ref="byo_fns:hf_stream", args="{n: 10}"), "hf.yaml")
    caplog.clear()
    with load_graph(hf) as loader:
        it = iter(loader)
        next(it)
        state = loader.state_dict()
    assert "shard_example_idx" in json.dumps(state)  # Hugging Face's own state, as plain data
    with caplog.at_level(logging.WARNING), load_graph(hf) as fresh:
        fresh.load_state_dict(state)
        list(fresh)
    assert not [m for m in caplog.messages if "skips" in m]


def test_bad_iterables_are_spec_errors():
    bad = """\
nodes:
  a: {op: iterable, iterable: byo_fns:Counting, args: {m: 3}}
  b: {op: iterable, iterable: byo_fns:NOT_A_DATASET}
  c: {op: mix, input: [a, b], weights: [1, 1]}
"""
    with pytest.raises(SpecErrors) as info:
        check_spec(load_yaml(bad, "bad.yaml"))
    got = [(e.line, e.node, e.param, e.message) for e in info.value.errors]
    assert got == [
        (2, "a", "args", "byo_fns:Counting has no argument 'm'; it takes: n"),
        (3, "b", "iterable", "byo_fns:NOT_A_DATASET is an object of type int: neither iterable nor a class "
                             "or factory"),
    ]


def test_a_streaming_dataset_state_dict_with_required_args_resumes_through_its_own_protocol(write_spec, caplog):
    # mosaicml-streaming's StreamingDataset.state_dict(num_samples, from_beginning): called
    # without them it died with a raw TypeError; it is told the samples consumed in its pass
    import byo_fns

    path = write_spec(SPEC.format(ref="byo_fns:StreamingLike", args="{n: 10}"))
    byo_fns.StreamingLike.calls.clear()
    with load_graph(path) as loader:
        epochs = [[(v, e) for b in loader for v, e in zip(b["v"].tolist(), b["epoch"].tolist())]
                  for _ in range(2)]
        it = iter(loader)
        next(it)
        state = loader.state_dict()
    assert [e for _, e in epochs[0]] == [0] * 10 and [e for _, e in epochs[1]] == [1] * 10
    assert sorted(v for v, _ in epochs[0]) == list(range(10)) and epochs[0] != epochs[1]
    assert byo_fns.StreamingLike.calls and all(fb is False for _, fb in byo_fns.StreamingLike.calls)
    assert '"inner":{"epoch":2,"sample_in_epoch":3,' in state["rank0"]  # the 3rd pass, 3 taken
    with caplog.at_level(logging.WARNING):
        assert check_resume(lambda: load_graph(path), epochs=3) == 12
    assert not [m for m in caplog.messages if "skips" in m]


def test_a_state_dict_whose_required_args_mean_nothing_falls_back_to_skipping_and_says_why(write_spec, caplog):
    path = write_spec(SPEC.format(ref="byo_fns:NeedsStep", args="{n: 10}"))
    with caplog.at_level(logging.WARNING):
        with load_graph(path) as loader:
            it = iter(loader)
            next(it), next(it)
            state = loader.state_dict()
        with load_graph(path) as fresh:
            fresh.load_state_dict(state)
            assert [b["v"].tolist() for b in fresh] == [[6, 7, 8], [9]]
    said = " ".join(caplog.messages)
    assert "state_dict(step) takes required arguments conveyor cannot give (step" in said, said
    assert "skips the 6 items already yielded" in said

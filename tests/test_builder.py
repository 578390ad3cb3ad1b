"""conveyor.Graph: the same plan built in Python, checked with the same messages, loaded, and
written as YAML that loads into the identical graph."""

from __future__ import annotations

from pathlib import Path

import pytest

from conveyor import Graph, SpecErrors, check_spec, load_graph
from conveyor.files import read_numbers
from conveyor.graphs.state import digest, summary
from resume_check import fingerprint

ROOT = Path(__file__).resolve().parent.parent
NUMBERS = ROOT / "examples/data/numbers"


def numbers_graph() -> Graph:
    return (Graph(params={"root": str(NUMBERS), "batch_size": 8, "seed": 0, "workers": 2})
            .node("files", "list_files", url="${root}/*/*.txt", label="parent_dir", shuffle=True)
            .node("shard", "shard", by=["rank"])
            .node("shuffle", "shuffle_buffer", size=16)
            .node("parse", "map", fn=read_numbers, workers="${workers}")
            .node("batch", "batch", size="${batch_size}", drop_last=False)
            .node("collate", "collate")
            .node("out", "prefetch", depth=2))


def test_a_graph_is_the_same_plan_as_the_bundled_spec():
    built = numbers_graph().check(batch_size=4)
    from_file = check_spec(ROOT / "specs/numbers.yaml", {"batch_size": 4, "root": str(NUMBERS)})
    assert digest(summary(built)) == digest(summary(from_file))
    with numbers_graph().load(batch_size=4) as a, load_graph(ROOT / "specs/numbers.yaml", batch_size=4,
                                                             root=str(NUMBERS)) as b:
        assert [fingerprint(x) for x in a] == [fingerprint(x) for x in b]
        assert len(a) == 10


def test_paths_are_taken_as_strings_in_node_params_and_overrides():
    graph = (Graph(params={"root": "elsewhere", "batch_size": 8})
             .node("files", "list_files", url=NUMBERS / "*" / "*.txt", label="parent_dir")
             .node("parse", "map", fn=read_numbers)
             .node("batch", "batch", size="${batch_size}", drop_last=False)
             .node("collate", "collate"))
    assert graph.check().nodes["files"].params.url == f"{NUMBERS}/*/*.txt"
    with graph.load(root=NUMBERS.parent) as loader:
        assert sum(len(b["label"]) for b in loader) == 40


def test_to_yaml_round_trips_to_the_identical_graph(tmp_path):
    graph = numbers_graph()
    path = tmp_path / "numbers.yaml"
    text = graph.to_yaml(path)
    assert "  parse: {op: map, fn: 'conveyor.files:read_numbers', workers: '${workers}'}" in text
    assert digest(summary(check_spec(path))) == digest(summary(graph.check()))
    with graph.load() as a:
        first = [fingerprint(x) for x in a]
        state = a.state_dict()
    with load_graph(path) as b:  # a state moves between the two: same digest
        assert [fingerprint(x) for x in b] == first
        b.load_state_dict(state)


def test_a_graph_is_checked_with_the_same_messages_naming_the_call():
    graph = (Graph(params={"n": 4})
             .node("files", "list_files", url="x/*.txt")
             .node("batch", "bach", size="${n}")
             .node("pad", "batch", input="batchh", size=0))
    with pytest.raises(SpecErrors) as info:
        graph.check()
    errors = info.value.errors
    assert [(e.path, e.node, e.param) for e in errors] == [
        (__file__, "batch", "op"), (__file__, "pad", "size"), (__file__, "pad", "input")]
    source = Path(__file__).read_text().splitlines()
    assert '.node("batch", "bach"' in source[errors[0].line - 1]  # the line of the .node(...) call
    assert '.node("pad", "batch"' in source[errors[1].line - 1] and errors[2].line == errors[1].line
    assert str(errors[0]).startswith(f"{__file__}:{errors[0].line}:15: node 'batch': param 'op': ")
    assert errors[0].message == "unknown op 'bach' (did you mean 'batch'?)"
    assert errors[1].message == "expected a positive int, got 0"
    assert errors[2].message == "input 'batchh' is not defined (did you mean 'batch'?)"
    with pytest.raises(SpecErrors, match="duplicate node 'files'"):
        Graph().node("files", "list_files", url="a").node("files", "list_files", url="b")
    with pytest.raises(ValueError, match="define it at module level"):
        Graph().node("m", "map", fn=lambda x: x)

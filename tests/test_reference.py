"""The ops reference: ``conveyor ops``, ``conveyor ops OP`` and docs/ops.md, all from the registry."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from conveyor.tools import cli, reference
from conveyor.graphs.registry import builtin_op_names, get_op

ROOT = Path(__file__).resolve().parent.parent


def test_docs_ops_md_is_generated_from_the_registry():
    written = (ROOT / "docs/ops.md").read_text(encoding="utf-8")
    assert written == reference.markdown(), \
        "docs/ops.md is stale: regenerate it with `python -m conveyor.tools.reference docs/ops.md`"


@pytest.mark.parametrize("name", builtin_op_names())
def test_every_builtin_op_is_documented_with_a_valid_example(name):
    op = get_op(name)
    assert op.doc and op.items_out and op.example, f"{name}: give its OpSpec doc, items_out and example"
    assert op.items_in or op.inputs == "none"
    undocumented = [f.name for f in dataclasses.fields(op.params) if not f.metadata.get("doc")]
    assert not undocumented, f"{name}: params without doc=: {undocumented}"
    (node_name, body), = yaml.safe_load(op.example).items()
    assert body["op"] == name
    params = {f.name for f in dataclasses.fields(op.params)}
    assert set(body) - {"op", "input"} <= params, f"{name}: the example uses params it does not have"


def test_conveyor_ops_lists_every_op_one_line_each(capsys):
    assert cli.main(["ops"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[0] for ln in lines] == sorted(ln.split()[0] for ln in lines)
    assert set(builtin_op_names()) <= {ln.split()[0] for ln in lines}
    assert any(ln.startswith("dataset ") and "map-style Dataset" in ln for ln in lines)


def test_conveyor_ops_op_prints_params_items_and_an_example(capsys):
    assert cli.main(["ops", "shuffle_buffer"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("shuffle_buffer: shuffle within windows of `size` items; elastic")
    assert "reads:  any items (small records: shuffle before decoding)" in text
    assert "  size  an int (>= 1), required\n        items per shuffle window" in text
    assert "  seed  an int or null, default null" in text
    assert text.rstrip().endswith("example:\n  shuffle: {op: shuffle_buffer, size: 10000}")
    assert cli.main(["ops", "shufle_buffer"]) == 1
    assert "no op 'shufle_buffer' (did you mean 'shuffle_buffer'?)" in capsys.readouterr().err

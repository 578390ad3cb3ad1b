"""Spec params: ``${}`` interpolation, typed overrides (keyword arguments and ``--set``), and
the YAML reader's positions and duplicate keys."""

from __future__ import annotations

import pytest

import conveyor
from conveyor import SpecErrors
from conveyor.graphs.params import apply_overrides, interpolate, parse_set
from conveyor.graphs.yaml_loader import load_yaml

PARAMS = {"root": "data/train", "batch_size": 8, "lr": 0.5, "flip": True, "sizes": [1, 2], "none": None}

SPEC = """\
params:
  root: data
  batch_size: 8
  lr: 0.5
  flip: false
  tag: v1
  sizes: [16, 32]
nodes:
  files: {op: list_files, url: "${root}/*.txt", shuffle: "${flip}"}
  parse:
    op: map
    fn: "helpers_fns:takes_any"
    args: {k: "${batch_size}", name: "run-${tag}-${batch_size}", deep: [{lr: "${lr}"}, "${sizes}"]}
  batch: {op: batch, size: "${batch_size}"}
output: batch
"""


# ----- interpolation ----------------------------------------------------------------------

@pytest.mark.parametrize("ref, value", [
    ("${batch_size}", 8), ("${lr}", 0.5), ("${flip}", True), ("${sizes}", [1, 2]), ("${none}", None),
    ("${root}", "data/train"), ("  ${ batch_size }  ", 8)])
def test_a_whole_string_reference_keeps_the_type(ref, value):
    out = interpolate(ref, PARAMS)
    assert out == value and type(out) is type(value)


def test_a_reference_inside_a_string_substitutes_its_text():
    assert interpolate("${root}/*/*.JPEG", PARAMS) == "data/train/*/*.JPEG"
    assert interpolate("bs${batch_size}-lr${lr}-${flip}", PARAMS) == "bs8-lr0.5-True"
    assert interpolate("no reference here", PARAMS) == "no reference here"


def test_references_nested_in_lists_and_dicts():
    value = {"a": ["${batch_size}", {"b": "${root}/x", "c": ["${flip}"]}], "d": 3, "e": None}
    assert interpolate(value, PARAMS) == {"a": [8, {"b": "data/train/x", "c": [True]}], "d": 3, "e": None}
    assert interpolate([1, "${lr}"], PARAMS) == [1, 0.5]


@pytest.mark.parametrize("value", ["${nope}", "x/${nope}/y", ["${batch_size}", {"k": "${nope}"}]])
def test_an_undefined_reference_names_the_param(value):
    with pytest.raises(KeyError) as info:
        interpolate(value, PARAMS)
    assert info.value.args == ("nope",)


def test_the_plan_holds_interpolated_typed_params(write_spec):
    plan = conveyor.check_spec(write_spec(SPEC))
    assert plan.params == {"root": "data", "batch_size": 8, "lr": 0.5, "flip": False, "tag": "v1",
                           "sizes": [16, 32]}
    assert plan.nodes["files"].params.url == "data/*.txt"
    assert plan.nodes["files"].params.shuffle is False
    assert plan.nodes["batch"].params.size == 8
    assert plan.nodes["parse"].params.args == {"k": 8, "name": "run-v1-8", "deep": [{"lr": 0.5}, [16, 32]]}


# ----- overrides --------------------------------------------------------------------------

def test_keyword_overrides_are_typed_and_reach_every_reference(write_spec):
    plan = conveyor.check_spec(write_spec(SPEC), {"root": "s3://b/x", "batch_size": 4, "flip": True})
    assert plan.nodes["files"].params.url == "s3://b/x/*.txt"
    assert plan.nodes["files"].params.shuffle is True
    assert plan.nodes["batch"].params.size == 4
    assert plan.nodes["parse"].params.args["name"] == "run-v1-4"
    assert plan.params["lr"] == 0.5  # untouched


def test_an_int_is_accepted_for_a_float_param(write_spec):
    plan = conveyor.check_spec(write_spec(SPEC), {"lr": 2})
    assert plan.params["lr"] == 2.0 and isinstance(plan.params["lr"], float)
    assert plan.nodes["parse"].params.args["deep"][0]["lr"] == 2.0


def test_a_path_object_is_taken_as_its_string(write_spec, tmp_path):
    from pathlib import Path
    plan = conveyor.check_spec(write_spec(SPEC), {"root": tmp_path / "train", "files.url": Path("x/*.txt"),
                                                  "tag": Path("v2")})
    assert plan.params["root"] == str(tmp_path / "train") and plan.params["tag"] == "v2"
    assert plan.nodes["files"].params.url == "x/*.txt"
    with pytest.raises(SpecErrors, match="override expects an int"):
        conveyor.check_spec(write_spec(SPEC), {"batch_size": Path("8")})


def test_set_overrides_reach_the_plan(write_spec):
    path = write_spec(SPEC)
    overrides = parse_set(["batch_size=16", "lr=1e-3", "flip=true", "sizes=[8, 9]", "tag=007"],
                          declared=load_yaml(path.read_text()).data["params"])
    plan = conveyor.check_spec(path, overrides)
    assert plan.params == {"root": "data", "batch_size": 16, "lr": 0.001, "flip": True, "tag": "007",
                           "sizes": [8, 9]}


def test_an_unknown_override_is_an_error_at_the_params_block(write_spec):
    with pytest.raises(SpecErrors) as info:
        conveyor.check_spec(write_spec(SPEC), {"batch_sise": 4, "workers": 2})
    errs = info.value.errors
    assert [(e.line, e.col, e.node, e.param) for e in errs] == [(1, 1, None, "batch_sise"), (1, 1, None, "workers")]
    declared = "; declared: batch_size, flip, lr, root, sizes, tag"
    assert errs[0].message == ("unknown override: the spec declares no such param "
                               "(did you mean 'batch_size'?)" + declared)
    assert errs[1].message == "unknown override: the spec declares no such param" + declared


def test_an_override_for_a_spec_without_params(write_spec):
    path = write_spec("nodes:\n  files: {op: list_files, url: x}\n")
    with pytest.raises(SpecErrors) as info:
        conveyor.check_spec(path, {"root": "y"})
    (err,) = info.value.errors
    assert (err.line, err.col, err.param) == (1, 1, "root")
    assert err.message == "unknown override: the spec declares no such param; declared: none"


@pytest.mark.parametrize("key, value, message", [
    ("batch_size", "big", "override expects an int (like the default 8), got string 'big'"),
    ("batch_size", 2.5, "override expects an int (like the default 8), got float 2.5"),
    ("batch_size", True, "override expects an int (like the default 8), got bool True"),
    ("flip", 1, "override expects a bool (like the default False), got int 1"),
    ("lr", "fast", "override expects a float (like the default 0.5), got string 'fast'"),
    ("sizes", 16, "override expects a list (like the default [16, 32]), got int 16"),
    ("root", 5, "override expects a string (like the default 'data'), got int 5"),
])
def test_a_wrong_type_override_is_an_error(write_spec, key, value, message):
    path = write_spec("# a comment line first\n" + SPEC)
    with pytest.raises(SpecErrors) as info:
        conveyor.check_spec(path, {key: value})
    (err,) = info.value.errors
    assert (err.path, err.line, err.col, err.node, err.param, err.message) == (str(path), 2, 1, None, key, message)
    assert str(err) == f"{path}:2:1: param '{key}': {message}"


def test_override_errors_and_spec_errors_come_out_together(write_spec):
    path = write_spec(SPEC.replace('size: "${batch_size}"', "size: 0"))
    with pytest.raises(SpecErrors) as info:
        conveyor.check_spec(path, {"batch_size": "x"})
    assert [(e.line, e.node, e.param) for e in info.value.errors] == [(1, None, "batch_size"), (14, "batch", "size")]


def test_apply_overrides_merges_without_touching_the_declared():
    declared = {"a": 1, "b": None, "c": 0.5}
    merged, errors = apply_overrides(declared, {"a": 2, "b": [1], "c": 3}, where=("s.yaml", 4, 1))
    assert errors == []
    assert merged == {"a": 2, "b": [1], "c": 3.0} and isinstance(merged["c"], float)
    assert declared == {"a": 1, "b": None, "c": 0.5}


# ----- --set parsing ----------------------------------------------------------------------

def test_parse_set_types_values_like_yaml():
    assert parse_set(["batch_size=64", "neg=-3", "lr=0.25", "tiny=1e-3", "big=-2.5E+2", "flag=true",
                      "off=false", "sizes=[1, 2.5, x]", "opts={a: 1}", "nothing=null", "name=resnet"]) == {
        "batch_size": 64, "neg": -3, "lr": 0.25, "tiny": 0.001, "big": -250.0, "flag": True,
        "off": False, "sizes": [1, 2.5, "x"], "opts": {"a": 1}, "nothing": None, "name": "resnet"}
    typed = parse_set(["a=64", "b=0.25", "c=true"])
    assert [type(v) for v in typed.values()] == [int, float, bool]


def test_parse_set_keeps_text_that_is_only_text():
    assert parse_set(["root=s3://bucket/a=b/c", "query=x=1", "url=http://h:9000/p", "kv=a: b",
                      "day=2024-01-02", "empty=", " spaced = v ", "quoted='007'"]) == {
        "root": "s3://bucket/a=b/c", "query": "x=1", "url": "http://h:9000/p", "kv": "a: b",
        "day": "2024-01-02", "empty": "", "spaced": "v", "quoted": "007"}


def test_parse_set_keeps_the_text_for_string_params():
    declared = {"tag": "v1", "n": 3, "flag": "yes"}
    assert parse_set(["tag=007", "n=007", "flag=true"], declared) == {"tag": "007", "n": 7, "flag": "true"}


@pytest.mark.parametrize("bad", ["batch_size", "=3", " =3"])
def test_parse_set_refuses_an_item_without_key_and_value(bad):
    with pytest.raises(ValueError, match="--set expects key=value"):
        parse_set([bad])


# ----- YAML positions and duplicate keys --------------------------------------------------

def test_load_yaml_records_the_position_of_every_key_and_value():
    doc = load_yaml("params:\n  bs: 8\nnodes:\n  b: {op: batch, size: [1, 2]}\n  c:\n    - x\n    - y: 3\n", "s.yaml")
    assert doc.data == {"params": {"bs": 8}, "nodes": {"b": {"op": "batch", "size": [1, 2]}, "c": ["x", {"y": 3}]}}
    assert doc.path == "s.yaml"
    assert doc.where(("params", "bs")) == (2, 7)
    assert doc.where(("params", "bs"), key=True) == (2, 3)
    assert doc.where(("nodes", "b")) == (4, 6)
    assert doc.where(("nodes", "b"), key=True) == (4, 3)
    assert doc.where(("nodes", "b", "size")) == (4, 24)
    assert doc.where(("nodes", "b", "size", 1)) == (4, 28)
    assert doc.where(("nodes", "c", 0)) == (6, 7)
    assert doc.where(("nodes", "c", 1, "y")) == (7, 10)
    assert doc.where(("nodes", "c", 1, "y"), key=True) == (7, 7)


def test_where_falls_back_to_the_nearest_parent():
    doc = load_yaml("a:\n  b: {c: 1}\n")
    assert doc.where(("a", "b", "missing")) == (2, 6)
    assert doc.where(("a", "b", "missing"), key=True) == (2, 3)  # the key of "b"
    assert doc.where(("zzz",)) == (1, 1)


def test_load_yaml_reports_every_duplicate_key():
    text = "params:\n  a: 1\n  a: 2\nnodes:\n  x: {op: batch, size: 1, size: 2}\n  x: {}\n"
    with pytest.raises(SpecErrors) as info:
        load_yaml(text, "dup.yaml")
    assert [(e.line, e.col, e.message) for e in info.value.errors] == [
        (3, 3, "duplicate key 'a' (first defined at line 2)"),
        (5, 27, "duplicate key 'size' (first defined at line 5)"),
        (6, 3, "duplicate key 'x' (first defined at line 5)")]
    assert all(e.path == "dup.yaml" for e in info.value.errors)


def test_merge_keys_work_and_an_explicit_key_overrides_a_merged_one():
    doc = load_yaml("defaults: &d {size: 4, drop_last: true}\nb:\n  <<: *d\n  size: 8\n")
    assert doc.data["b"] == {"size": 8, "drop_last": True}
    assert doc.where(("b", "drop_last")) == (1, 35)  # where the anchor wrote it
    assert doc.where(("b",)) == (3, 3)


def test_load_yaml_syntax_error_position():
    with pytest.raises(SpecErrors) as info:
        load_yaml("a: [1, 2\nb: 3\n", "s.yaml")
    (err,) = info.value.errors
    assert (err.line, err.col) == (2, 2)
    assert err.message == ("YAML syntax error: expected ',' or ']', but got ':' "
                           "(while parsing a flow sequence that starts at line 1, column 4)")


@pytest.mark.parametrize("text, col, what", [
    ("a: !!python/name:os.system\n", 4, "could not determine a constructor for the tag "
                                        "'tag:yaml.org,2002:python/name:os.system'"),
    ("a: !!python/object/apply:os.system [echo hi]\n", 4,
     "the tag 'tag:yaml.org,2002:python/object/apply:os.system' is not supported"),
    ("a: !!set {x, y}\n", 4, "the tag 'tag:yaml.org,2002:set' is not supported"),
])
def test_the_loader_is_safe(text, col, what):
    with pytest.raises(SpecErrors) as info:
        load_yaml(text)
    (err,) = info.value.errors
    assert (err.line, err.col) == (1, col)
    assert err.message == (f"YAML error: {what} (specs are read with the safe loader, "
                           "which builds plain data only)")

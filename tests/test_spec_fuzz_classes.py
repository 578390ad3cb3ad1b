"""Regression cases for the classes the command-line fuzz (benchmarks/fuzz_specs.py, issue 32
items 6 and 7) found: each is a clear SpecError at check time, never a traceback or a walk of
the whole filesystem."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from conveyor import SpecErrors
from conveyor.graphs.api import check_spec
from conveyor.graphs.ops import root_only
from conveyor.graphs.params import parse_set

REPO = Path(__file__).resolve().parent.parent


def _errors(spec, overrides=None):
    with pytest.raises(SpecErrors) as info:
        check_spec(spec, overrides)
    return info.value.errors


@pytest.mark.parametrize("value", ["&a [*a]", "&a [{k: *a}]", "[" * 300 + "]" * 300])
def test_a_recursive_or_deep_set_value_is_a_spec_error(value):
    try:
        overrides = parse_set([f"weights={value}"])
    except ValueError as exc:  # too deep for PyYAML itself: refused while reading --set
        assert "deeper than" in str(exc)
        return
    (err,) = _errors(str(REPO / "specs/balanced.yaml"), overrides)
    assert err.param == "weights" and ("contains itself" in err.message or "deeper than" in err.message)


def test_an_infinite_pad_value_is_a_spec_error():
    text = (REPO / "specs/text.yaml").read_text().replace("pad_value: 0,", "pad_value: .inf,")
    spec = REPO / "specs" / "_fuzz_inf.yaml"
    doc = text.replace("${spec_dir}", str(REPO / "specs"))
    from conveyor.graphs.yaml_loader import load_yaml
    errs = _errors(load_yaml(doc, str(spec)))
    assert any("pad value inf does not fit" in e.message for e in errs)


@pytest.mark.parametrize("url", ["", " ", "/", "file:///", "s3://", "s3://*", "/*/**", "/**/*.txt", "memory://"])
def test_an_empty_or_root_only_url_is_a_spec_error(url):
    from conveyor.graphs.yaml_loader import load_yaml
    spec = {"nodes": {"files": {"op": "list_files", "url": url}}, "output": "files"}
    (err,) = _errors(load_yaml(yaml.safe_dump(spec), "root.yaml"))
    assert err.node == "files" and err.param == "url" and "root-only" in err.message
    assert root_only(url)


@pytest.mark.parametrize("url", ["*.txt", "**", "x/*.txt", "/data/*.txt", "s3://b", "s3://b/*", "file:///tmp/x/*"])
def test_a_url_below_the_root_is_not_root_only(url):
    assert not root_only(url)


@pytest.mark.parametrize("key, value, param", [("workers", 2 ** 31, "workers"), ("out.depth", 99999999999, "depth")])
def test_huge_workers_and_prefetch_depth_are_spec_errors_naming_the_limit(key, value, param):
    (err,) = _errors(str(REPO / "specs/numbers.yaml"), {key: value})
    assert err.param == param and "expected at most" in err.message

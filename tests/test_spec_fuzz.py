"""Fuzzing the spec checker (issue 13, item 18): the bundled specs, mutated at random (aliases,
tags, nesting, type changes, deleted keys and lines, odd unicode), must each end as a checked
``Plan`` or as ``SpecErrors``; never another exception, never a long wait.

The run is derandomized, so the suite sees the same cases every time; set
``CONVEYOR_FUZZ_EXAMPLES=5000`` (and ``CONVEYOR_FUZZ_RANDOM=1`` for new cases) to fuzz for longer by hand.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conveyor import SpecErrors
from conveyor.graphs.validate import Plan, validate
from conveyor.graphs.yaml_loader import load_yaml

REPO = Path(__file__).resolve().parent.parent
SPECS = {p.name: p.read_text(encoding="utf-8") for p in sorted((REPO / "specs").glob("*.yaml"))}
EXAMPLES = int(os.environ.get("CONVEYOR_FUZZ_EXAMPLES", "120"))
CASE_BOUND_S = 10.0  # generous: a bounded check takes well under a second; this catches blow-ups

TOKENS = [
    "&a ", "*a", "&b [*a, *a, *a, *a] ", "<<: *a\n", "!!int ", "!!bool ", "!!float ", "!!timestamp ",
    "!!binary ", "!!set ", "!!omap ", "!!str ", "!!null ", "!!python/name:os.system ", "!custom ", "[", "]",
    "{", "}", ": ", "- ", ", ", "\n", "\n  ", "\t", "'", '"', "#", "?", "|", ">", "~", "null", "-5", "0",
    "1e999", "99999999999999999999", "${", "}", "${seed}", "${nope}", "${env:HOME}", "${spec_dir}",
    "\x07", "\x00", "\x85", "\u2028", "\ufeff", "\U0001F600", "é", "\\", "%YAML 1.1\n", "---\n", "...\n",
    "[" * 120, "{a: " * 60,
]


def _mutate_data(data, draw_path: list[int], change: int):
    """A structural change at the place ``draw_path`` leads to: delete a key, swap a value's type."""
    node = data
    for step in draw_path:
        if isinstance(node, dict) and node:
            key = list(node)[step % len(node)]
            child = node[key]
            if not isinstance(child, (dict, list)) or not child:
                replacements = [None, 5, -1, "x", [child], {"k": child}, True, 1.5, "${seed}", [], {}]
                if change % 3 == 0:
                    del node[key]
                else:
                    node[key] = replacements[change % len(replacements)]
                return data
            node = child
        elif isinstance(node, list) and node:
            i = step % len(node)
            if not isinstance(node[i], (dict, list)) or not node[i]:
                node[i] = [None, 7, "y", {"op": "batch"}][change % 4]
                return data
            node = node[i]
    if isinstance(node, dict) and node:
        del node[list(node)[change % len(node)]]
    return data


@st.composite
def mutated_specs(draw) -> str:
    text = SPECS[draw(st.sampled_from(sorted(SPECS)))]
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["insert", "insert", "delete", "line", "structure"]))
        if kind == "insert":
            at = draw(st.integers(0, len(text)))
            text = text[:at] + draw(st.sampled_from(TOKENS)) + text[at:]
        elif kind == "delete":
            at = draw(st.integers(0, len(text)))
            text = text[:at] + text[at + draw(st.integers(1, 40)):]
        elif kind == "line":
            lines = text.splitlines(keepends=True)
            i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
            lines.insert(j, lines[i]) if draw(st.booleans()) else lines.pop(i)
            text = "".join(lines)
        else:
            path = draw(st.lists(st.integers(0, 50), min_size=1, max_size=6))
            change = draw(st.integers(0, 100))
            try:  # PyYAML itself fails on some mutated texts (!!bool on a key, ...): keep the text
                text = yaml.safe_dump(_mutate_data(yaml.safe_load(text), path, change), sort_keys=False)
            except Exception:  # noqa: BLE001 - any failure of PyYAML's own load/dump
                continue
    return text


def check(text: str) -> Plan | SpecErrors:
    try:
        return validate(load_yaml(text, "fuzz.yaml"))
    except SpecErrors as exc:
        return exc


@settings(max_examples=EXAMPLES, deadline=None, derandomize="CONVEYOR_FUZZ_RANDOM" not in os.environ,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(mutated_specs())
def test_a_mutated_spec_is_a_plan_or_spec_errors_quickly(text):
    t0 = time.monotonic()
    outcome = check(text)  # any other exception fails the test, with the text that caused it
    took = time.monotonic() - t0
    assert took < CASE_BOUND_S, f"checking took {took:.1f} s:\n{text!r}"
    if isinstance(outcome, SpecErrors):
        assert outcome.errors and all(e.path == "fuzz.yaml" and e.line >= 0 for e in outcome.errors)
        assert all(e.message for e in outcome.errors)


def test_the_bundled_specs_pass_unmutated():
    for name, text in SPECS.items():
        assert isinstance(check(text), Plan), name


SET_VALUES = ["&a [*a]", "&a [{k: *a}]", "[" * 300 + "]" * 300, ".inf", "-.inf", ".nan", "1e999",
              str(2 ** 63), "", "~", "[]", "{}", "a: b"]
ROOT_URLS = ["", " ", "/", "file:///", "s3://", "s3://*", "/*/**", "memory://"]


@settings(max_examples=min(EXAMPLES, 40), deadline=None, derandomize="CONVEYOR_FUZZ_RANDOM" not in os.environ,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(SPECS)), st.sampled_from(SET_VALUES), st.sampled_from(ROOT_URLS), st.booleans())
def test_set_aliases_infinities_and_root_urls_are_spec_errors(name, value, url, with_url):
    """The mutation kinds of issue 32: ``--set`` aliases and infinities on every declared param,
    and empty or root-only listing URLs: a Plan or SpecErrors, never another exception."""
    from conveyor.graphs.params import parse_set

    text = SPECS[name].replace("${spec_dir}", str(REPO / "specs"))
    data = yaml.safe_load(text)
    if with_url:
        for spec in data["nodes"].values():
            if isinstance(spec, dict) and "url" in spec:
                spec["url"] = url
    declared = list(data.get("params") or {})
    for key in declared:
        try:
            overrides = parse_set([f"{key}={value}"], data.get("params"))
        except ValueError as exc:
            assert "deeper than" in str(exc)
            continue
        outcome = (lambda: validate(load_yaml(yaml.safe_dump(data), "fuzz.yaml"), overrides))
        try:
            outcome()
        except SpecErrors as exc:
            assert all(e.message for e in exc.errors)

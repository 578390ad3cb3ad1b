"""Every file in tests/bad_specs/ is a broken spec that must give exactly the errors its
leading ``# expect:`` comments list: position, node, op, param and message, in file order."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import conveyor
from conveyor import SpecError, SpecErrors

BAD = Path(__file__).resolve().parent / "bad_specs"
SPECS = sorted(BAD.glob("*.yaml"))
# "7:12: node 'batch' (batch): param 'size': message" -- node, op and param are optional
EXPECT = re.compile(r"(\d+):(\d+): (?:node '([^']*)'(?: \(([^)]*)\))?: )?(?:param '([^']*)': )?(.*)")


def expectations(path: Path) -> list[tuple]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        if line.startswith("# expect: "):
            m = EXPECT.fullmatch(line[len("# expect: "):])
            assert m, f"{path.name}: malformed expectation {line!r}"
            ln, col, node, op, param, message = m.groups()
            out.append((int(ln), int(col), node, op, param, message))
    return out


def fields(err: SpecError) -> tuple:
    return (err.line, err.col, err.node, err.op, err.param, err.message)


def test_the_folder_covers_enough_cases():
    assert len(SPECS) >= 18
    names = [p.name for p in SPECS]
    assert all(re.fullmatch(r"\d\d_[a-z0-9_]+\.yaml", n) for n in names), names
    assert len({n[:2] for n in names}) == len(names), "numbers must be distinct"


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_bad_spec_gives_exactly_its_errors(path: Path):
    expected = expectations(path)
    assert expected, f"{path.name} has no '# expect:' line"
    with pytest.raises(SpecErrors) as info:
        conveyor.check_spec(path)
    errors = info.value.errors
    assert [fields(e) for e in errors] == expected
    assert all(e.path == str(path) for e in errors)
    # the text form is exactly the expectation with the file in front
    assert [str(e) for e in errors] == [
        f"{path}:" + line[len("# expect: "):]
        for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("# expect: ")]
    assert str(info.value) == "\n".join(str(e) for e in errors)


def test_three_mistakes_come_out_together_in_line_order():
    path = BAD / "23_three_mistakes.yaml"
    with pytest.raises(SpecErrors) as info:
        conveyor.check_spec(path)
    errors = info.value.errors
    assert [(e.line, e.node, e.param) for e in errors] == [
        (8, "files", "lable"), (9, "shuffle", "size"), (10, "batch", "op")]
    assert [e.line for e in errors] == sorted(e.line for e in errors)


def test_load_graph_raises_the_same_errors_before_building_anything():
    path = BAD / "08_bad_values.yaml"
    with pytest.raises(SpecErrors) as info:
        conveyor.load_graph(path)
    assert [(e.node, e.param) for e in info.value.errors] == [
        ("shuffle", "size"), ("parse", "workers"), ("batch", "size")]


def test_a_spec_error_is_a_conveyor_error_with_fields():
    with pytest.raises(conveyor.ConveyorError) as info:
        conveyor.check_spec(BAD / "13_output_not_node.yaml")
    (err,) = info.value.errors
    assert isinstance(err, conveyor.SpecError) and isinstance(err, conveyor.ConveyorError)
    assert (err.node, err.param) == (None, "output")
    assert hash(err) == hash(err)  # exceptions must stay hashable (logging, tracebacks)


def test_a_registered_op_that_cannot_be_loaded_is_a_spec_error(write_spec, monkeypatch):
    from conveyor.graphs import registry

    monkeypatch.setitem(registry._BUILTIN, "broken_op", "conveyor.no_such_module_for_test:OP")
    path = write_spec("nodes:\n  files: {op: list_files, url: x}\n  b: {op: broken_op}\n")
    with pytest.raises(SpecErrors) as info:
        conveyor.check_spec(path)
    (err,) = info.value.errors
    assert (err.line, err.col, err.node, err.param) == (3, 11, "b", "op")
    assert err.message.startswith("op 'broken_op' is registered as conveyor.no_such_module_for_test:OP "
                                  "but cannot be loaded: No module named 'conveyor.no_such_module_for_test'")


def test_process_method_without_workers_does_not_pickle(write_spec):
    # workers: 0 runs fn inline, so an unpicklable fn is fine there
    path = write_spec("nodes:\n  files: {op: list_files, url: x}\n"
                      "  m: {op: map, fn: 'helpers_fns:unpicklable', method: process}\n")
    plan = conveyor.check_spec(path)
    assert plan.nodes["m"].params.workers == 0


def test_fn_whose_module_fails_to_import(write_spec, tmp_path, monkeypatch):
    (tmp_path / "broken_mod_for_test.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    path = write_spec("nodes:\n  files: {op: list_files, url: x}\n"
                      "  m: {op: map, fn: 'broken_mod_for_test:f'}\n")
    with pytest.raises(SpecErrors) as info:
        conveyor.check_spec(path)
    (err,) = info.value.errors
    assert (err.line, err.col, err.node, err.param) == (3, 20, "m", "fn")
    assert err.message == ("importing module 'broken_mod_for_test' for 'broken_mod_for_test:f' failed: "
                           "RuntimeError: boom at import")


def test_an_unknown_key_without_a_close_match_lists_what_a_spec_has(write_spec):
    from conveyor.graphs.validate import TOP_KEYS

    path = write_spec("nodes:\n  files: {op: list_files, url: x}\nzzz: 1\n")
    with pytest.raises(SpecErrors) as info:
        conveyor.check_spec(path)
    (err,) = info.value.errors
    assert (err.line, err.col, err.node, err.param) == (3, 1, None, None)
    assert err.message == f"unknown top-level key 'zzz'; a spec has: {', '.join(TOP_KEYS)}"
    assert {"params", "nodes", "output"} <= set(TOP_KEYS)


@pytest.mark.parametrize("name, fix", [
    ("19_unordered_map.yaml", lambda t: "resumable: false\n" + t),
    ("21_shuffle_after_decode.yaml", lambda t: t.replace("size: 10000", "size: 64")),
    ("21_shuffle_after_decode.yaml",  # the shuffle moved above the decode, as the message says
     lambda t: t.replace("  shuffle: {op: shuffle_buffer, size: 10000}\n", "").replace(
         "  decode:", "  shuffle: {op: shuffle_buffer, size: 10000}\n  decode:")),
    ("18_process_unpicklable.yaml", lambda t: t.replace("helpers_fns:unpicklable", "helpers_fns:ident")),
    ("10_dangling_input.yaml", lambda t: t.replace("input: shufle", "input: shuffle")),
])
def test_the_fix_the_message_suggests_passes(name, fix, write_spec):
    plan = conveyor.check_spec(write_spec(fix((BAD / name).read_text(encoding="utf-8"))))
    assert plan.nodes  # checked without error

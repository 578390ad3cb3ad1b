"""Specs built to hurt the checker (issue 13, items 11, 13, 14, 16): each is refused with a
``SpecError`` that says where, quickly, never with a traceback or a long wait. The broken specs
that can live as files are in tests/bad_specs/; these are the ones a test has to build (bytes
that are not UTF-8, a directory, a file over the size bound)."""

from __future__ import annotations

import pytest

import conveyor
from conveyor import SpecErrors
from conveyor.tools import cli
from conveyor.graphs.validate import MAX_NODES
from conveyor.graphs.yaml_loader import MAX_SPEC_BYTES, load_yaml

GOOD = 'nodes:\n  files: {op: list_files, url: "data/*.txt"}\n'


def only_error(spec) -> conveyor.SpecError:
    with pytest.raises(SpecErrors) as info:
        conveyor.check_spec(spec)
    (err,) = info.value.errors
    return err


def test_a_byte_that_is_not_utf8_is_named_with_its_line_and_column(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(GOOD.encode() + b"output: fil\xe9s\n")
    err = only_error(path)
    assert (err.path, err.line, err.col) == (str(path), 3, 12)
    assert err.message == "the spec is not UTF-8 text (byte 0xe9 cannot be decoded); save the file as UTF-8"


def test_a_utf16_spec_is_told_to_be_saved_as_utf8(tmp_path):
    path = tmp_path / "utf16.yaml"
    path.write_bytes(GOOD.encode("utf-16"))
    err = only_error(path)
    assert (err.line, err.col) == (1, 1)
    assert err.message == ("the spec is not UTF-8 text (byte 0xff cannot be decoded); it looks like UTF-16: "
                           "save it as UTF-8")
    path.write_bytes(GOOD.encode("utf-16-le"))  # no BOM: valid UTF-8 full of NUL bytes
    err = only_error(path)
    assert (err.line, err.col) == (1, 2)
    assert err.message.endswith("a NUL byte: if the file is UTF-16, save it as UTF-8")


def test_a_utf8_bom_is_allowed(tmp_path):
    path = tmp_path / "bom.yaml"
    path.write_bytes(GOOD.encode("utf-8-sig"))
    assert list(conveyor.check_spec(path).nodes) == ["files"]


def test_a_directory_is_not_a_spec(tmp_path, capsys):
    err = only_error(tmp_path)
    assert err.message == f"{tmp_path} is a directory, not a spec file"
    assert cli.main(["validate", str(tmp_path)]) == 1
    assert capsys.readouterr().err == (f"{tmp_path}:0:0: {tmp_path} is a directory, not a spec file\n"
                                       f"1 error(s) in {tmp_path}\n")


def test_a_spec_over_the_size_bound_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text(GOOD + "".join(f"# {'x' * 70}\n" for _ in range(MAX_SPEC_BYTES // 70)))
    size = path.stat().st_size
    err = only_error(path)
    assert (err.line, err.col) == (1, 1)
    assert err.message == (f"the spec is {size:,} bytes; a spec is refused past {MAX_SPEC_BYTES:,} bytes "
                           "(keep data in files, not in the spec)")
    with pytest.raises(SpecErrors, match="a spec is refused past"):
        load_yaml(path.read_text(), "big.yaml")


def test_too_many_nodes_are_refused(write_spec):
    body = "".join(f"  n{i}: {{op: prefetch}}\n" for i in range(MAX_NODES + 1))
    err = only_error(write_spec('nodes:\n  files: {op: list_files, url: "x"}\n' + body))
    assert (err.line, err.col) == (1, 1)
    assert err.message == f"the spec has {MAX_NODES + 2} nodes; a spec is refused past {MAX_NODES}"


def test_an_alias_bomb_of_eight_levels_is_refused_without_expanding_it():
    # 9**8 = 43 million values (~30 GB as Python objects): refused after reading ~600 bytes
    text, prev = "a0: &a0 [x, x, x, x, x, x, x, x, x]\n", "a0"
    for level in range(1, 9):
        text += f"a{level}: &a{level} [" + ", ".join([f"*{prev}"] * 9) + "]\n"
        prev = f"a{level}"
    with pytest.raises(SpecErrors) as info:
        load_yaml(text, "bomb.yaml")
    (err,) = info.value.errors
    assert (err.line, err.col) == (5, 5)  # a4 (its anchor): the first value past 20,000 (9**5 leaves)
    assert "expands, through its aliases, to more than 20000 values" in err.message


@pytest.mark.parametrize("opening, closing", [("[", "]"), ("{a: ", "}")])
def test_six_hundred_levels_of_flow_nesting_are_refused_not_a_recursion_error(opening, closing):
    text = "params:\n  deep: " + opening * 600 + "1" + closing * 600 + "\n"
    with pytest.raises(SpecErrors) as info:
        load_yaml(text, "deep.yaml")
    (err,) = info.value.errors
    assert err.line == 2
    assert err.message == "YAML error: values nested more than 100 levels deep; a spec is refused past that"


def test_an_alias_that_nests_past_the_depth_bound_is_refused():
    # each alias adds the depth of its anchor: 3 x 40 levels, no more than 41 in the text
    text = "a: &a " + "[" * 40 + "]" * 40 + "\nb: &b " + "[" * 40 + "*a" + "]" * 40
    text += "\nc: " + "[" * 40 + "*b" + "]" * 40 + "\n"
    with pytest.raises(SpecErrors, match="nested more than 100 levels deep"):
        load_yaml(text, "deep.yaml")


def test_a_merge_of_a_tagged_mapping_is_one_error_not_a_crash():
    with pytest.raises(SpecErrors) as info:
        load_yaml("a: &s !!set {x}\nb: {<<: *s}\n", "merge.yaml")
    assert [(e.line, e.col) for e in info.value.errors] == [(1, 4)]


def test_cli_validate_prints_yaml_refusals_without_a_traceback(write_spec, capsys):
    path = write_spec("params: &r {x: *r}\nnodes: {}\n")
    assert cli.main(["validate", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{path}:1:16: YAML error: the alias '*r' is inside the value its anchor names")
    assert "Traceback" not in err


# ----- item 12: values that reach storage_options are never echoed ---------------------------

SECRET_SPEC = """params:
  s3secret: "abcdefgh"
  other: 1
nodes:
  files: {op: list_files, url: "s3://bucket/*.jpg", storage_options: {key: AKIA, secret: "${s3secret}"}}
  batch: {op: batch, size: "${s3secret}"}
"""


def test_an_override_that_reaches_storage_options_is_never_echoed(write_spec, capsys):
    path = write_spec(SECRET_SPEC)
    assert cli.main(["validate", str(path), "--set", "s3secret=[TOPSECRET1, TOPSECRET2]"]) == 1
    err = capsys.readouterr().err
    assert "TOPSECRET" not in err
    assert err.splitlines()[0] == (f"{path}:1:1: param 's3secret': override expects a string, got list "
                                   "(value hidden: it reaches storage_options)")
    with pytest.raises(SpecErrors) as info:
        conveyor.load_graph(path, s3secret=98765432123)
    assert "98765432123" not in str(info.value)
    assert info.value.errors[0].message == ("override expects a string, got int (value hidden: it reaches "
                                            "storage_options)")


def test_a_secret_param_used_elsewhere_too_is_hidden_in_that_error(write_spec, capsys):
    path = write_spec(SECRET_SPEC)
    assert cli.main(["validate", str(path), "--set", "s3secret=TOPSECRET3"]) == 1
    err = capsys.readouterr().err
    assert "TOPSECRET3" not in err
    assert f"{path}:6:28: node 'batch' (batch): param 'size': expected an int, got string ***\n" in err


def test_show_hides_a_secret_param(write_spec, capsys):
    path = write_spec(SECRET_SPEC.replace('size: "${s3secret}"', "size: 2"))
    assert cli.main(["show", str(path), "--set", "s3secret=TOPSECRET4"]) == 0
    out = capsys.readouterr().out
    assert "TOPSECRET4" not in out
    assert 'params: s3secret="***", other=1' in out
    plan = conveyor.check_spec(path, {"s3secret": "TOPSECRET5"})
    assert plan.secret_params == {"s3secret"}


def test_a_misspelt_s3_option_is_a_clear_error_at_run_time_too():
    from conveyor.errors import SourceError
    from conveyor.storage import filesystem

    with pytest.raises(SourceError) as info:
        filesystem("s3://bucket/x.jpg", {"key": "AKIAEXAMPLE", "secret_key": "do-not-print"})
    assert str(info.value) == ("storage_options: s3 has no option 'secret_key' (did you mean 'secret'?) "
                               "(reading s3://bucket/x.jpg)")


def test_a_failed_read_nobody_waits_for_is_not_logged_by_asyncio(caplog):
    # after a SourceError, Fetch cancels the reads in flight; a read that failed meanwhile has an
    # exception nobody retrieves (run_coroutine_threadsafe skips a cancelled future), which asyncio
    # printed at exit as ~100 lines of "Task exception was never retrieved"
    import asyncio
    import gc

    from conveyor.storage import Storage

    async def failing_read() -> bytes:
        raise ValueError("permanent failure")

    storage, loop = Storage(), asyncio.new_event_loop()
    try:
        with caplog.at_level("ERROR", logger="asyncio"):
            task = loop.create_task(storage._run_async("s3://b/x", failing_read))
            loop.run_until_complete(asyncio.wait([task]))
            assert isinstance(task.exception(), conveyor.SampleError)  # it did fail, and says so
            task = loop.create_task(storage._run_async("s3://b/y", failing_read))
            loop.run_until_complete(asyncio.wait([task]))
            del task  # nobody looks at this one
            gc.collect()
        assert [r.getMessage() for r in caplog.records] == []
    finally:
        storage.close()
        loop.close()


def test_collate_after_a_users_fn_may_be_fed_batches_by_it(write_spec):
    # a user's fn (or iterable, or dataset) may hand on lists: only conveyor's own per-sample
    # fns and per-record ops are known not to
    spec = ('nodes:\n  files: {op: list_files, url: "x/*"}\n  m: {op: map, fn: "helpers_fns:ident"}\n'
            "  collate: {op: collate}\n")
    assert list(conveyor.check_spec(write_spec(spec)).nodes) == ["files", "m", "collate"]
    err = only_error(write_spec(spec.replace("helpers_fns:ident", "conveyor.files:read_numbers")))
    assert (err.line, err.col, err.node) == (4, 3, "collate")
    assert err.message.startswith("collate stacks the samples of a batch, but nothing before it makes batches")

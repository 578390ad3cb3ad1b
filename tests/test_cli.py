"""The ``conveyor`` command, run as a real process (``python -m conveyor``).

The commands are independent, so a module fixture runs them all and each test reads its result;
they are forked from one process that imported torch already (tests/forked_python.py): each is
a process of its own, without paying torch's start-up each time.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from conveyor.tools import cli

REPO = Path(__file__).resolve().parent.parent
NUMBERS = "specs/numbers.yaml"
THREE = "tests/bad_specs/23_three_mistakes.yaml"
CHAIN = [("files", "shard"), ("shard", "shuffle"), ("shuffle", "parse"), ("parse", "batch"),
         ("batch", "collate"), ("collate", "out")]
OPS = {"files": "list_files", "shard": "shard", "shuffle": "shuffle_buffer", "parse": "map",
       "batch": "batch", "collate": "collate", "out": "prefetch"}

COMMANDS = {
    "validate_ok": ["validate", NUMBERS],
    "validate_bad": ["validate", THREE],
    "show_text": ["show", NUMBERS],
    "show_dot": ["show", NUMBERS, "--format", "dot"],
    "show_mermaid": ["show", NUMBERS, "--format", "mermaid", "--set", "batch_size=5"],
    "run_steps": ["run", NUMBERS, "--epochs", "2", "--steps", "7"],
    "run_two_epochs": ["run", NUMBERS, "--epochs", "2", "-q"],
    "run_bs3": ["run", NUMBERS, "--set", "batch_size=3", "-q"],
    "run_bad_set": ["run", NUMBERS, "--set", "batch_sise=4", "--set", "workers=two", "-q"],
}


@dataclass
class Result:
    rc: int
    out: str
    err: str


def _run(forker, args: list[str]) -> Result:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO / "tests")] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    proc = forker.run([sys.executable, "-m", "conveyor", *args], cwd=REPO, env=env, timeout=90)
    return Result(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture(scope="module")
def results(forker) -> dict[str, Result]:
    return {name: _run(forker, args) for name, args in COMMANDS.items()}


def _done_line(res: Result) -> re.Match:
    assert res.rc == 0, res.err
    last = res.out.strip().splitlines()[-1]
    m = re.fullmatch(r"done: (\d+) batches, (\d+) samples, (\d+) epoch\(s\) in [\d.]+ s "
                     r"\([\d,.]+ batches/s, [\d,.]+ samples/s\)", last)
    assert m, last
    return m


def test_validate_ok_lists_the_nodes(results):
    res = results["validate_ok"]
    assert res.rc == 0, res.err
    lines = res.out.splitlines()
    assert lines[0] == f"ok: {NUMBERS}: 7 nodes, output 'out'"
    assert lines[1:] == ["  files (list_files)"] + [f"  {b} ({OPS[b]}) <- {a}" for a, b in CHAIN]


def test_validate_bad_prints_every_error_with_its_position(results):
    res = results["validate_bad"]
    assert res.rc == 1
    assert res.out == ""
    assert res.err.splitlines() == [
        f"{THREE}:8:46: node 'files' (list_files): param 'lable': unknown param 'lable' (did you mean 'label'?)",
        f"{THREE}:9:39: node 'shuffle' (shuffle_buffer): param 'size': undefined param '${{batch_sise}}' "
        "(did you mean 'batch_size'?); declare it under params: (batch_size)",
        f"{THREE}:10:15: node 'batch': param 'op': unknown op 'batchh' (did you mean 'batch'?)",
        f"3 error(s) in {THREE}",
    ]


def test_show_text(results):
    res = results["show_text"]
    assert res.rc == 0, res.err
    lines = res.out.splitlines()
    assert lines[0] == f"graph {NUMBERS} -> output 'out'"
    data = f"{REPO}/specs/../examples/data/numbers"  # the spec's root is "${spec_dir}/../examples/..."
    assert lines[1] == f'params: root="{data}", batch_size=8, seed=0, workers=2'
    assert "  files: list_files" in lines
    for a, b in CHAIN:
        assert f"  {b}: {OPS[b]} <- {a}" in lines
    assert "      size=8, drop_last=false" in lines
    assert (f'      url="{data}/*/*.txt", manifest=null, extensions=null, label="parent_dir", shuffle=true, '
            'seed=null, share="auto", share_timeout=1800.0') in lines


def parse_dot(text: str) -> tuple[str, dict[str, str], list[tuple[str, str]]]:
    """A small reader for the subset of DOT that ``show --format dot`` writes: every line must
    be a statement it knows. Returns the graph name, the labels by node and the edges."""
    m = re.fullmatch(r"digraph (\w+) \{\n(.*)\n\}\n?", text, re.S)
    assert m, "not a digraph"
    quoted = r'"((?:[^"\\]|\\.)*)"'
    labels: dict[str, str] = {}
    edges: list[tuple[str, str]] = []
    for line in m.group(2).splitlines():
        line = line.strip()
        if (e := re.fullmatch(rf"{quoted} -> {quoted};", line)):
            edges.append((e.group(1), e.group(2)))
        elif (n := re.fullmatch(rf'{quoted} \[label={quoted}(?:, style=bold)?\];', line)):
            labels[n.group(1)] = n.group(2)
        else:
            assert re.fullmatch(r"rankdir=\w+;|node \[.*\];", line), f"unexpected DOT line {line!r}"
    return m.group(1), labels, edges


def test_show_dot_is_a_digraph_with_the_edges(results):
    res = results["show_dot"]
    assert res.rc == 0, res.err
    name, labels, edges = parse_dot(res.out)
    assert name == "conveyor"
    assert edges == CHAIN
    assert list(labels) == list(OPS)
    for node, op in OPS.items():
        assert labels[node].split("\\n")[0] == f"{node} ({op})"
    assert '\\nsize: 8\\n' in labels["batch"]
    bold = [ln for ln in res.out.splitlines() if "style=bold" in ln]
    assert len(bold) == 1 and bold[0].startswith('  "out" [label="out (prefetch)')  # the output


def test_show_mermaid(results):
    res = results["show_mermaid"]
    assert res.rc == 0, res.err
    lines = res.out.splitlines()
    assert lines[0] == "flowchart TD"
    assert [ln.strip() for ln in lines if "-->" in ln] == [f"{a} --> {b}" for a, b in CHAIN]
    for node, op in OPS.items():
        assert any(ln.startswith(f'  {node}["{node} ({op})') for ln in lines), node
    assert any("size: 5<br/>" in ln for ln in lines if ln.startswith("  batch["))  # --set applied


def test_run_stops_after_steps_across_epochs(results):
    m = _done_line(results["run_steps"])
    # 40 files, batches of 8: 5 in the first epoch, then 2 of the second
    assert (int(m[1]), int(m[2]), int(m[3])) == (7, 56, 2)


def test_run_two_whole_epochs(results):
    res = results["run_two_epochs"]
    m = _done_line(res)
    assert (int(m[1]), int(m[2]), int(m[3])) == (10, 80, 2)
    # one table, every count over both epochs (issue 29, item 7: it was two tables, one with
    # the last epoch's counts and one with the run's)
    lines = res.out.splitlines()
    assert lines[0].split() == ["node", "op", "runs", "items", "items/s", "busy", "wait", "queue", "counts"]
    stats = {ln.split()[0]: ln.split() for ln in lines[1:1 + len(OPS)]}
    assert list(stats) == list(OPS)
    assert stats["batch"][1:3] == ["batch", "10"]
    assert stats["files"][1:3] == ["list_files", "80"]
    assert stats["parse"][-2:] == ["skipped", "0"]
    assert lines[1 + len(OPS)].startswith("done: 10 batches")
    assert len([ln for ln in lines if ln.startswith("files ")]) == 1


def test_set_batch_size_changes_the_counts(results):
    m = _done_line(results["run_bs3"])
    assert (int(m[1]), int(m[2]), int(m[3])) == (14, 40, 1)  # 13 batches of 3 and one of 1


def test_run_with_a_bad_set_exits_1_with_the_errors(results):
    res = results["run_bad_set"]
    assert res.rc == 1
    assert res.out == ""
    assert res.err.splitlines() == [
        f"{NUMBERS}:6:1: param 'batch_sise': unknown override: the spec declares no such param "
        "(did you mean 'batch_size'?); declared: batch_size, root, seed, workers",
        f"{NUMBERS}:6:1: param 'workers': override expects an int (like the default 2), got string 'two'",
        f"2 error(s) in {NUMBERS}",
    ]


def test_a_reader_that_leaves_early_gets_no_traceback():
    # `conveyor show spec.yaml | head -1`: the pipe closes before conveyor writes
    proc = subprocess.Popen([sys.executable, "-m", "conveyor", "show", NUMBERS], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    try:
        err = proc.stderr.read()
        rc = proc.wait(timeout=90)
    finally:
        proc.kill()
        proc.stderr.close()
    assert (rc, err) == (1, "")


def test_fns_are_imported_from_the_current_folder_and_beside_the_spec(tmp_path):
    # a console script's import path holds neither folder (unlike `python -m` or a script);
    # `python -P` runs the CLI the same way: nothing of the current folder on the path
    (tmp_path / "here").mkdir()
    (tmp_path / "beside").mkdir()
    (tmp_path / "here" / "fns_here.py").write_text("def double(item):\n    return item * 2\n")
    (tmp_path / "beside" / "fns_beside.py").write_text("def nums():\n    return range(6)\n")
    spec = tmp_path / "beside" / "s.yaml"
    spec.write_text("nodes:\n  src: {op: iterable, iterable: 'fns_beside:nums'}\n"
                    "  m: {op: map, fn: 'fns_here:double'}\n  b: {op: batch, size: 3}\noutput: b\n")
    code = "import sys; from conveyor.tools.cli import main; sys.exit(main())"
    run = subprocess.run([sys.executable, "-P", "-c", code, "run", str(spec), "--epochs", "1"],
                         cwd=tmp_path / "here", capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "done: 2 batches, 6 samples" in run.stdout, run.stdout
    (tmp_path / "here" / "fns_here.py").unlink()  # and a module found nowhere is named
    run = subprocess.run([sys.executable, "-P", "-c", code, "validate", str(spec)],
                         cwd=tmp_path / "here", capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and "cannot import module 'fns_here'" in run.stderr, run.stderr


# ----- in-process: the pieces the processes above rely on ----------------------------------

def test_validate_a_missing_file(capsys):
    assert cli.main(["validate", "tests/bad_specs/no_such_spec.yaml"]) == 1
    err = capsys.readouterr().err
    assert "No such file or directory" in err and "no_such_spec.yaml" in err


@pytest.mark.parametrize("flags, message", [
    (["--epochs", "0"], "--epochs must be >= 1, got 0"),    # ran no epoch and said only "no batch came out"
    (["--epochs", "-1"], "--epochs must be >= 1, got -1"),
    (["--steps", "0"], "--steps must be >= 1 (batches to stop after), got 0"),  # ran the whole epoch
    (["--steps", "-5"], "--steps must be >= 1 (batches to stop after), got -5"),  # stopped after one batch
])
def test_run_refuses_epochs_or_steps_below_one(capsys, flags, message):
    assert cli.main(["run", NUMBERS, "-q", *flags]) == 2
    assert message in capsys.readouterr().err


def test_set_without_a_value_is_a_usage_error(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert cli.main(["run", NUMBERS, "--set", "batch_size", "-q"]) == 2
    assert capsys.readouterr().err == "conveyor: error: --set expects key=value, got 'batch_size'\n"


def test_mermaid_ids_that_mermaid_cannot_read_are_replaced(write_spec, capsys):
    path = write_spec("nodes:\n  files: {op: list_files, url: x}\n  end: {op: batch, size: 2}\n"
                      "  my-batch: {op: collate}\noutput: my-batch\n")
    assert cli.main(["show", str(path), "--format", "mermaid"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith('  files["files (list_files)')
    assert lines[2].startswith('  n1["end (batch)')
    assert lines[3].startswith('  n2["my-batch (collate)')
    assert lines[4:] == ["  files --> n1", "  n1 --> n2"]


def test_dot_quotes_awkward_names(write_spec, capsys):
    path = write_spec('nodes:\n  files: {op: list_files, url: x}\n  "a \\"b\\"": {op: batch, size: 2}\n')
    assert cli.main(["show", str(path), "--format", "dot"]) == 0
    _, labels, edges = parse_dot(capsys.readouterr().out)
    assert edges == [("files", 'a \\"b\\"')]


@pytest.mark.parametrize("batch, n", [
    ([1, 2, 3], 3), ({"x": __import__("torch").zeros(5, 2), "y": [1]}, 5),
    ((__import__("torch").zeros(4), [0] * 4), 4), ([{"a": 1}, {"a": 2}], 2), ({}, 0)])
def test_batch_len(batch, n):
    assert cli.batch_len(batch) == n


def test_the_progress_bar_has_a_total_where_the_length_is_known():
    # issue 29, item 7: the bar showed no total although len() was known
    import argparse

    from conveyor import load_graph
    from conveyor.tools.run import _total_batches

    with load_graph(str(REPO / NUMBERS), batch_size=8) as loader:  # 40 files: 5 batches an epoch
        assert _total_batches(loader, argparse.Namespace(epochs=2, steps=None)) == 10
        assert _total_batches(loader, argparse.Namespace(epochs=2, steps=7)) == 7
        assert _total_batches(loader, argparse.Namespace(epochs=1, steps=70)) == 5
    with load_graph(str(REPO / "specs" / "text.yaml")) as loader:  # length buckets: the data decide
        assert _total_batches(loader, argparse.Namespace(epochs=2, steps=None)) is None
        assert _total_batches(loader, argparse.Namespace(epochs=2, steps=3)) == 3


def test_validate_warns_when_a_local_root_does_not_exist(capsys, tmp_path):
    # issue 29, item 7: validate said ok and the error came only at the first batch
    missing = tmp_path / "imagenet" / "train"
    assert cli.main(["validate", str(REPO / "specs" / "imagenet.yaml"), "--set", f"root={missing}"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"conveyor: warning: node 'files' (list_files) reads from {missing}/*/**, but {missing} does "
                   f"not exist ({tmp_path} does): the run would fail at its first batch (check the root param, "
                   "e.g. --set root=...)"]
    missing.mkdir(parents=True)
    assert cli.main(["validate", str(REPO / "specs" / "imagenet.yaml"), "--set", f"root={missing}"]) == 0
    assert capsys.readouterr().err == ""
    # a remote root is not looked at (validate makes no request)
    assert cli.main(["validate", str(REPO / "specs" / "imagenet.yaml"), "--set", "root=s3://b/train"]) == 0
    assert capsys.readouterr().err == ""

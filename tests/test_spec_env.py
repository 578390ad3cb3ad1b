"""``${env:NAME}``, ``${env:NAME,default}``, the built-in ``${spec_dir}``, and ``NODE.PARAM``
overrides (``--set decode.workers=4``, ``load_graph(path, **{"batch.size": 4})``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from conveyor import SpecErrors, check_spec, load_graph
from conveyor.graphs.params import interpolate

ROOT = Path(__file__).resolve().parent.parent


def test_env_references_with_and_without_default(monkeypatch):
    monkeypatch.setenv("CONVEYOR_T_SIZE", "12")
    monkeypatch.setenv("CONVEYOR_T_DIR", "/data")
    monkeypatch.delenv("CONVEYOR_T_UNSET", raising=False)
    assert interpolate("${env:CONVEYOR_T_SIZE}", {}) == 12  # a whole reference is read as YAML
    assert interpolate("${env:CONVEYOR_T_DIR}/train", {}) == "/data/train"
    assert interpolate("${env:CONVEYOR_T_UNSET,7}", {}) == 7
    assert interpolate("${env:CONVEYOR_T_UNSET, a/b}/x", {}) == "a/b/x"
    assert interpolate("${env:CONVEYOR_T_UNSET,${spec_dir}/d}", {"spec_dir": "/s"}) == "/s/d"
    with pytest.raises(KeyError) as info:
        interpolate({"a": ["${env:CONVEYOR_T_UNSET}"]}, {})
    assert info.value.args == ("env:CONVEYOR_T_UNSET",)


SPEC = """\
params:
  root: "${env:CONVEYOR_T_ROOT,${spec_dir}/data}"
  size: "${env:CONVEYOR_T_SIZE,3}"
nodes:
  files: {op: list_files, url: "${root}/*.txt"}
  batch: {op: batch, size: "${size}", drop_last: "${env:CONVEYOR_T_DROP}"}
"""


def test_env_and_spec_dir_in_params_and_nodes(write_spec, monkeypatch, tmp_path):
    monkeypatch.delenv("CONVEYOR_T_ROOT", raising=False)
    monkeypatch.delenv("CONVEYOR_T_SIZE", raising=False)
    monkeypatch.setenv("CONVEYOR_T_DROP", "true")
    path = write_spec(SPEC)
    plan = check_spec(path)
    assert plan.params == {"root": f"{tmp_path}/data", "size": 3}
    assert plan.nodes["files"].params.url == f"{tmp_path}/data/*.txt"
    assert plan.nodes["batch"].params.drop_last is True
    monkeypatch.setenv("CONVEYOR_T_SIZE", "5")
    assert check_spec(path).nodes["batch"].params.size == 5


def test_an_unset_env_var_without_default_is_a_spec_error_naming_it(write_spec, monkeypatch):
    monkeypatch.delenv("CONVEYOR_T_DROP", raising=False)
    monkeypatch.setenv("CONVEYOR_T_SIZE", "x")
    path = write_spec(SPEC.replace('"${env:CONVEYOR_T_ROOT,${spec_dir}/data}"', '"${env:CONVEYOR_T_NOPE}"'))
    with pytest.raises(SpecErrors) as info:
        check_spec(path)
    errors = [(e.line, e.col, e.node, e.param) for e in info.value.errors]
    # the param that cannot be read, and its use (which is left unresolved)
    assert errors == [(2, 9, None, "root"), (5, 32, "files", "url"), (6, 28, "batch", "size"),
                      (6, 50, "batch", "drop_last")]
    text = str(info.value)
    assert f"{path}:2:9: param 'root': environment variable 'CONVEYOR_T_NOPE' is not set" in text
    assert "environment variable 'CONVEYOR_T_DROP' is not set (set it, or give a default: " \
           "${env:CONVEYOR_T_DROP,default})" in text
    assert "expected a positive int, got string 'x'" in text or "expected an int, got string 'x'" in text


def test_bundled_specs_run_from_any_directory(tmp_path, forker):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = forker.run([sys.executable, "-m", "conveyor", "run", str(ROOT / "specs/numbers.yaml"), "-q",
                      "--set", "batch_size=10"], cwd=tmp_path, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "done: 4 batches, 40 samples" in out.stdout


def test_node_param_overrides_reach_any_node_and_are_checked(tmp_path):
    spec = ROOT / "specs/numbers.yaml"
    with load_graph(spec, **{"batch.size": 5, "parse.workers": 1, "batch.drop_last": True}) as loader:
        sizes = [len(b["label"]) for b in loader]
        assert loader.nodes["parse"].workers == 1
    assert sizes == [5] * 8
    with pytest.raises(SpecErrors) as info:
        check_spec(spec, {"bach.size": 4, "batch.size": "four", "batch.sise": 2})
    text = str(info.value)
    assert "param 'bach.size': override 'bach.size': no node 'bach' (did you mean 'batch'?)" in text
    assert "node 'batch' (batch): param 'size': expected an int, got string 'four'" in text
    assert "node 'batch' (batch): param 'sise': unknown param 'sise' (did you mean 'size'?)" in text


def test_set_node_param_on_the_command_line(tmp_path):
    from conveyor.tools import cli

    assert cli.main(["validate", str(ROOT / "specs/numbers.yaml"), "--set", "parse.workers=3"]) == 0
    assert cli.main(["validate", str(ROOT / "specs/numbers.yaml"), "--set", "parse.workers=-1"]) == 1


def test_a_reference_to_an_environment_variable_without_env_says_how(write_spec, monkeypatch):
    monkeypatch.setenv("CONVEYOR_T_HOME", "/home/x")
    path = write_spec("nodes:\n  files: {op: list_files, url: '${CONVEYOR_T_HOME}/*.txt'}\n")
    with pytest.raises(SpecErrors, match=r"undefined param '\$\{CONVEYOR_T_HOME\}' \(to read the environment "
                                         r"variable, write \$\{env:CONVEYOR_T_HOME\}\)"):
        check_spec(path)


def test_load_graph_and_check_spec_take_a_graph():
    from conveyor import Graph

    graph = Graph().node("files", "list_files", url=f"{ROOT}/examples/data/numbers/odd/*.txt")
    assert list(check_spec(graph).nodes) == ["files"]
    with load_graph(graph) as loader:
        assert len(list(loader)) == 20

"""Third-party ops through the ``conveyor.ops`` entry-point group: examples/plugin_op installs
and its op is listed, checked, run and resumed; a broken plug-in is a warning naming it, and
every other op and command keeps working."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from conveyor import load_graph
from conveyor.tools import cli
from conveyor.graphs import registry
from resume_check import check_resume

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A folder on sys.path where distributions are installed, and a registry that reads the
    entry points again (and forgets them after the test)."""
    path = tmp_path / "site"
    path.mkdir()
    monkeypatch.syspath_prepend(str(path))
    monkeypatch.setattr(registry, "_EXTRA", {})
    monkeypatch.setattr(registry, "_LOADED", {})
    monkeypatch.setattr(registry, "_ENTRY_POINTS_READ", False)
    yield path
    for mod in [m for m in sys.modules if m.startswith(("conveyor_repeat", "broken_plugin_mod", "notop_mod"))]:
        del sys.modules[mod]


def _fake_dist(site: Path, name: str, entry_points: str, modules: dict[str, str]) -> None:
    """An installed distribution as pip leaves it: a dist-info folder and its modules."""
    info = site / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[conveyor.ops]\n{entry_points}\n")
    for mod, text in modules.items():
        (site / f"{mod}.py").write_text(text)


def test_a_plugin_that_fails_to_import_is_a_warning_naming_it(site, capsys, caplog):
    _fake_dist(site, "broken_plugin", "broken = broken_plugin_mod:OP\nnotop = notop_mod:OP",
               {"broken_plugin_mod": "import no_such_module_4b1\n", "notop_mod": "OP = 3\n"})
    with caplog.at_level(logging.WARNING, logger="conveyor.graphs.registry"):
        assert cli.main(["validate", str(ROOT / "specs/numbers.yaml")]) == 0
        assert cli.main(["ops"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ok: ") and "\nshuffle_buffer " in out and "broken" not in out
    assert caplog.messages == [
        "conveyor.ops plugin 'broken' (broken_plugin_mod:OP) failed to load, so op 'broken' is not "
        "available: ModuleNotFoundError: No module named 'no_such_module_4b1'",
        "conveyor.ops plugin 'notop' (notop_mod:OP) is ignored: it loads a int, not an OpSpec"]


def test_the_example_plugin_installs_and_its_op_is_listed_checked_and_resumed(site, tmp_path, capsys):
    src = tmp_path / "src"
    shutil.copytree(ROOT / "examples/plugin_op", src)  # pip writes build files next to the source
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                          "--no-index", "--target", str(site), str(src)], capture_output=True, text=True,
                         timeout=120)
    assert pip.returncode == 0, pip.stderr
    assert (site / "conveyor_repeat-0.1.0.dist-info/entry_points.txt").exists()
    assert cli.main(["ops"]) == 0
    assert "repeat          yield each item `times` times in a row" in capsys.readouterr().out.splitlines()
    assert cli.main(["ops", "repeat"]) == 0
    assert "  times  an int (>= 1), default 2\n         copies of each item, in a row" in capsys.readouterr().out
    spec = tmp_path / "twice.yaml"
    spec.write_text(
        "nodes:\n"
        f"  files: {{op: list_files, url: '{ROOT}/examples/data/numbers/even/*.txt'}}\n"
        "  twice: {op: repeat, times: 3}\n"
        "  batch: {op: batch, size: 4}\n"
        "  out:   {op: map, fn: helpers_fns:indexes}\n")
    assert cli.main(["validate", str(spec), "--set", "twice.times=0"]) == 1
    assert "node 'twice' (repeat): param 'times': expected a positive int, got 0" in capsys.readouterr().err
    with load_graph(spec) as loader:
        batches = [b.tolist() for b in loader]
    assert batches[:3] == [[0, 0, 0, 1], [1, 1, 2, 2], [2, 3, 3, 3]] and len(batches) == 15
    assert check_resume(lambda: load_graph(spec), epochs=2, steps=[0, 1, 2, 3, 14, 15, 22]) == 30


@pytest.fixture
def repeat_op(monkeypatch):
    """examples/plugin_op's op registered (as its entry point would), the registry restored after."""
    monkeypatch.syspath_prepend(str(ROOT / "examples/plugin_op"))
    monkeypatch.setattr(registry, "_EXTRA", {})
    monkeypatch.setattr(registry, "_LOADED", {})
    monkeypatch.setattr(registry, "_ENTRY_POINTS_READ", True)
    import conveyor_repeat

    registry.register(conveyor_repeat.REPEAT)
    yield conveyor_repeat.REPEAT
    for mod in [m for m in sys.modules if m.startswith("conveyor_repeat")]:
        del sys.modules[mod]


def _repeat_spec(tmp_path: Path, *, shuffle: bool = False, batch: int = 3) -> Path:
    spec = tmp_path / "repeat.yaml"
    spec.write_text(
        "nodes:\n"
        f"  files: {{op: list_files, url: '{ROOT}/examples/data/numbers/*/*.txt', shuffle: {str(shuffle).lower()}}}\n"
        "  shard: {op: shard, by: [rank]}\n"
        "  twice: {op: repeat, times: 2}\n"
        f"  batch: {{op: batch, size: {batch}}}\n"
        "  out:   {op: map, fn: helpers_fns:indexes}\n")
    return spec


def _on_rank(monkeypatch, spec: Path, rank: int, world: int):
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))
    return load_graph(spec)


def test_a_plugin_ops_length_rule_gives_len(repeat_op, tmp_path, monkeypatch):
    spec = _repeat_spec(tmp_path)
    for world in (1, 3):  # 40 files; on 3 ranks equalize repeats 2: 14 each, 28 copies, 10 batches of 3
        for rank in range(world):
            with _on_rank(monkeypatch, spec, rank, world) as loader:
                assert len(loader) == sum(1 for _ in loader) == (27 if world == 1 else 10)


def test_equalize_holds_through_a_plugin_op_that_keeps_counts(repeat_op, tmp_path, monkeypatch):
    from conveyor.graphs.api import check_spec
    from conveyor.graphs.even import uneven_nodes

    spec = _repeat_spec(tmp_path)
    assert uneven_nodes(check_spec(spec)) == []  # so the ranks need not agree on each last batch
    counts = []
    for rank in range(3):
        with _on_rank(monkeypatch, spec, rank, 3) as loader:
            counts.append([len(b) for b in loader])
    assert counts[0] == counts[1] == counts[2] and sum(counts[0]) == 28
    undeclared = dataclasses.replace(repeat_op, keeps_count="never", length=None)
    registry.register(undeclared, clobber=True)
    assert uneven_nodes(check_spec(spec)) == ["twice"]  # an op that does not say is taken as uneven


def test_a_plugin_ops_elastic_rule_resumes_on_another_world_size(repeat_op, tmp_path, monkeypatch):
    spec = _repeat_spec(tmp_path, shuffle=True)
    taken, states = [], []
    for rank in range(2):  # 3 copies taken each: the second item's first copy only
        with _on_rank(monkeypatch, spec, rank, 2) as loader:
            taken += next(iter(loader)).tolist()
            states.append(json.loads(json.dumps(loader.state_dict())))
    consumed = set(taken)
    assert len(consumed) == 4
    rest = []
    for rank in range(3):
        with _on_rank(monkeypatch, spec, rank, 3) as loader:
            loader.load_state_dict(states)
            rest.append([i for b in loader for i in b.tolist()])
    new = [i for r in rest for i in r]
    assert set(new) == set(range(40)) - consumed  # an item one of whose copies was taken is consumed
    assert set(Counter(new).values()) == {2}  # every item left, in both its copies
    assert [len(r) for r in rest] == [24, 24, 24]


def test_a_plugin_ops_safe_params_decide_what_a_strict_load_accepts(repeat_op, tmp_path):
    from conveyor import StateError

    spec = _repeat_spec(tmp_path)
    with load_graph(spec) as loader:
        next(iter(loader))
        state = loader.state_dict()
    other = tmp_path / "other.yaml"
    other.write_text(spec.read_text().replace("times: 2", "times: 3"))
    with load_graph(other) as loader, pytest.raises(StateError, match="node 'twice' param 'times'"):
        loader.load_state_dict(state)  # undeclared: taken as changing the data
    registry.register(dataclasses.replace(repeat_op, safe_params=frozenset({"times"})), clobber=True)
    with load_graph(other) as loader:
        loader.load_state_dict(state)  # declared safe by the op itself: loads under strict=True
        assert next(iter(loader)) is not None

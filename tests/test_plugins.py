"""Third-party ops through the ``conveyor.ops`` entry-point group: a broken plug-in is a
warning naming it, and every other op and command keeps working."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _fake_dist(site: Path, name: str, entry_points: str, modules: dict[str, str]) -> None:
    """An installed distribution as pip leaves it: a dist-info folder and its modules."""
    info = site / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[conveyor.ops]\n{entry_points}\n")
    for mod, text in modules.items():
        (site / f"{mod}.py").write_text(text)


def _conveyor(site: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    return subprocess.run([sys.executable, "-m", "conveyor", *args], env=env, capture_output=True,
                          text=True, timeout=60, cwd=ROOT)


def test_a_plugin_that_fails_to_import_is_a_warning_naming_it(tmp_path):
    _fake_dist(tmp_path, "broken_plugin", "broken = broken_plugin_mod:OP\nnotop = notop_mod:OP",
               {"broken_plugin_mod": "import no_such_module_4b1\n", "notop_mod": "OP = 3\n"})
    out = _conveyor(tmp_path, "validate", "specs/numbers.yaml")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ok: specs/numbers.yaml")
    assert "conveyor.ops plugin 'broken' (broken_plugin_mod:OP) failed to load, so op 'broken' is not " \
           "available: ModuleNotFoundError: No module named 'no_such_module_4b1'" in out.stderr
    assert "conveyor.ops plugin 'notop' (notop_mod:OP) is ignored: it loads a int, not an OpSpec" in out.stderr
    assert "Traceback" not in out.stderr

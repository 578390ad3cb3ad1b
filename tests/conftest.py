"""Shared fixtures. Each block below belongs to the tests named in its header."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
if str(TESTS) not in sys.path:  # specs in tests/ name helper functions as helpers_fns:<name>
    sys.path.insert(0, str(TESTS))


# ----- spec, CLI and node tests (test_spec_*.py, test_cli.py, test_nodes_basic.py) -----------

@pytest.fixture
def write_spec(tmp_path: Path):
    """``write_spec(text, name="spec.yaml") -> Path``: a spec file in the test's tmp dir."""

    def write(text: str, name: str = "spec.yaml") -> Path:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return path

    return write


@pytest.fixture
def no_new_threads():
    """Fails the test if threads started during it are still alive shortly after it ends."""
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + 5.0
    while True:
        alive = [t for t in threading.enumerate() if t not in before and t.is_alive()]
        if not alive or time.monotonic() > deadline:
            break
        for t in alive:
            t.join(timeout=0.05)
    assert not alive, f"threads left running: {[t.name for t in alive]}"


# ----- subprocess tests (test_cli.py, test_benchmarks.py): see tests/forked_python.py ---------

@pytest.fixture(scope="session")
def forker():
    """A ``forked_python.Forker``: ``forker.run(cmd, cwd=, env=, timeout=)`` runs ``python -m X``
    or ``python script.py`` as a real process forked from one that imported torch already."""
    from forked_python import Forker

    f = Forker()
    yield f
    f.close()

"""States saved by an earlier release keep loading: each fixture in tests/fixtures/states was
written by ``make_states.py`` with the code of 2026-12-02 (before the house was rebuilt), and
must resume, in today's code, at exactly the batch the uninterrupted run yielded next."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from conveyor import load_graph

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "states"
_spec = importlib.util.spec_from_file_location("make_states", FIXTURES / "make_states.py")
make_states = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_states)


@pytest.mark.parametrize("name", sorted(make_states.CASES))
def test_a_state_saved_by_the_earlier_release_resumes_at_the_next_batch(name: str) -> None:
    state = json.loads((FIXTURES / f"{name}.json").read_text())
    # what torch.load with its defaults reads, too
    assert json.loads(json.dumps(state)) == state
    recorded = json.loads((FIXTURES / f"{name}.next.json").read_text())
    with load_graph(ROOT / recorded["spec"], **recorded["overrides"]) as loader:
        loader.load_state_dict(state)
        it = iter(loader)
        got = [make_states.fingerprint(next(it)) for _ in recorded["batches"]]
    assert got == recorded["batches"]


def test_the_fixtures_state_tensors_fingerprint_tells_batches_apart() -> None:
    a = make_states.fingerprint({"x": torch.arange(4)})
    b = make_states.fingerprint({"x": torch.arange(1, 5)})
    assert a != b and a["x"]["shape"] == [4]

"""map's ``batch`` for a fn whose results do not depend on the batching (``batch_invariant``,
conveyor.text's tokenizers): a state saved with one ``batch`` resumes exactly with another, under
``strict=True``; for a fn that does not declare it, ``batch`` stays a param that changes the data.
(An elastic resume across such a change is refused: tests/test_elastic.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from torchdata.nodes import IterableWrapper

from conveyor import StateError, load_graph
from conveyor.graphs.fn_args import batch_invariant
from conveyor.nodes.map_batches import MapBatches
from conveyor.text import byte_tokenize, hf_tokenize, vocab_tokenize

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "examples/data/text-sample"


def _tens(items: list) -> list:
    return [x * 10 for x in items]


@pytest.mark.parametrize("old,new", [(7, 3), (7, 10), (3, 7), (1, 25)])
def test_a_state_of_one_list_size_resumes_at_the_next_result_with_another(old: int, new: int) -> None:
    """Every step; a saved list longer than the lists of now (7 -> 3) skips whole ones."""
    items = list(range(23))
    for step in range(len(items) + 1):
        node = MapBatches(IterableWrapper(items), fn=_tens, size=old)
        node.reset()
        for _ in range(step):
            next(node)
        state = json.loads(json.dumps(node.state_dict()))
        again = MapBatches(IterableWrapper(items), fn=_tens, size=new)
        again.reset(state)
        assert list(again) == [x * 10 for x in items[step:]], (old, new, step)


def test_the_text_tokenizers_declare_it() -> None:
    assert all(batch_invariant(fn) for fn in (byte_tokenize, vocab_tokenize, hf_tokenize))


def _spec(tmp_path: Path, batch: int, fn: str | None = None) -> Path:
    doc = yaml.safe_load((ROOT / "specs/text.yaml").read_text())
    doc["nodes"]["tokenize"]["batch"] = batch
    if fn is not None:
        doc["nodes"]["tokenize"]["fn"] = fn
        doc["nodes"]["tokenize"]["args"] = {"max_length": 1024}
    path = tmp_path / f"text-{batch}-{'own' if fn else 'byte'}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _ids(batch) -> list[list[int]]:
    return [row[:n].tolist() for row, n in zip(batch["input_ids"], batch["lengths"].tolist())]


@pytest.mark.parametrize("saved,now", [(1024, 256), (256, 1024), (1024, 100)])
def test_text_yaml_resumes_exactly_across_a_change_of_the_tokenizers_batch(tmp_path: Path, saved: int,
                                                                           now: int) -> None:
    old, new = _spec(tmp_path, saved), _spec(tmp_path, now)
    with load_graph(new, root=str(SAMPLE)) as loader:
        everything = [_ids(b) for b in loader]
    for step in (1, 9, 40, len(everything) - 2):
        with load_graph(old, root=str(SAMPLE)) as loader:
            it = iter(loader)
            for _ in range(step):
                next(it)
            state = json.loads(json.dumps(loader.state_dict()))
        with load_graph(new, root=str(SAMPLE)) as loader:
            loader.load_state_dict(state)  # strict=True
            assert [_ids(b) for b in loader] == everything[step:], step


def test_for_a_fn_that_does_not_declare_it_batch_changes_the_data(tmp_path: Path, caplog) -> None:
    fn = "helpers_fns:byte_ids_by_hand"
    with load_graph(_spec(tmp_path, 256, fn), root=str(SAMPLE)) as loader:
        it = iter(loader)
        for _ in range(5):
            next(it)
        state = loader.state_dict()
    with load_graph(_spec(tmp_path, 1024, fn), root=str(SAMPLE)) as loader:
        with pytest.raises(StateError, match=r"node 'tokenize' param 'batch': saved 256, now 1024 \(breaks"):
            loader.load_state_dict(state)
        loader.load_state_dict(state, strict=False)  # loads, with a warning naming it
    assert "param 'batch'" in caplog.text

"""Elastic resume: an epoch interrupted on one world size (or number of worker copies) goes on
on another, every sample delivered exactly once over the two runs (the sample-id ledger), the
new ranks equal, the next epochs those of the new world. In one process: ranks come from
RANK/WORLD_SIZE (tests/test_torchrun_elastic.py runs the same under torchrun)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conveyor import StateError, load_graph

ROOT = Path(__file__).resolve().parent.parent
NUMBERS = ROOT / "specs/numbers.yaml"  # 40 items, windows of 16
TEXT = ROOT / "tests/elastic_text.yaml"


def _ids(batch) -> list[int]:
    if isinstance(batch, list):  # records not collated (read_samples' fields of every kind)
        return [int(r["index"]) for r in batch]
    return [int(i) for i in batch["index"]]


def _open(monkeypatch, spec: Path, rank: int, world: int, **params):
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))
    return load_graph(spec, **params)


def _interrupt(monkeypatch, spec: Path, world: int, steps: int, **params) -> tuple[list[int], list[dict]]:
    """Every rank takes ``steps`` batches and saves: the ids they took, and their states."""
    taken, states = [], []
    for rank in range(world):
        with _open(monkeypatch, spec, rank, world, **params) as loader:
            it = iter(loader)
            for _ in range(steps):
                taken += _ids(next(it))
            states.append(json.loads(json.dumps(loader.state_dict())))  # plain data, as on disk
    return taken, states


def _resume(monkeypatch, spec: Path, world: int, states, **params) -> tuple[list[list[int]], list[list[int]]]:
    """Every new rank loads all old states: its ids for the rest of the epoch, and the next epoch's."""
    rest, following = [], []
    for rank in range(world):
        with _open(monkeypatch, spec, rank, world, **params) as loader:
            loader.load_state_dict(states)
            epoch = loader.epoch
            rest.append([i for b in loader for i in _ids(b)])
            following.append([_ids(b) for b in loader])
        with _open(monkeypatch, spec, rank, world, **params) as fresh:
            fresh.set_epoch(epoch + 1)
            assert following[-1] == [_ids(b) for b in fresh], "the next epoch is not the new world's own"
    return rest, following


def _exactly_once(n: int, old: list[int], rest: list[list[int]], repeats: int = 0) -> None:
    """The ledger: no sample twice in the old run(s) but their own padding (``repeats``: a
    world of W ranks evens its n items by repeating (-n) % W of them, and a shuffle may put a
    repeat into the batches taken), what they left delivered to the new ranks, each the same
    count, repeats only as equalize's padding (ceil(left / world) each)."""
    assert len(old) - len(set(old)) <= repeats
    left = set(range(n)) - set(old) if n else set()
    new = [i for r in rest for i in r]
    assert set(new) == left and not set(new) & set(old)
    share = -(-len(left) // len(rest))
    assert [len(r) for r in rest] == [share] * len(rest)
    assert len(new) - len(left) == share * len(rest) - len(left)  # the padding, nothing more


def _all_ids(monkeypatch, spec: Path, **params) -> list[int]:
    with _open(monkeypatch, spec, 0, 1, **params) as one:
        return sorted(i for b in one for i in _ids(b))


@pytest.mark.parametrize("old,new,steps", [(2, 3, 1), (3, 2, 1), (2, 1, 2), (1, 2, 3)])
def test_numbers_resume_on_another_world_size(monkeypatch, old: int, new: int, steps: int) -> None:
    # 40 items, shuffle windows of 16 partly drained, batches of 4 (old and new ranks alike)
    everything = _all_ids(monkeypatch, NUMBERS, batch_size=4)
    assert everything == list(range(40))
    taken, states = _interrupt(monkeypatch, NUMBERS, old, steps, batch_size=4)
    rest, _ = _resume(monkeypatch, NUMBERS, new, states, batch_size=4)
    _exactly_once(40, taken, rest, repeats=(-40) % old)


FORMATS = ROOT / "tests/fixtures/formats"


@pytest.mark.parametrize("source", [
    "{op: list_mds, url: '%s/mds/plain'}" % FORMATS,
    "{op: list_litdata, url: '%s/litdata/plain'}" % FORMATS,
])
@pytest.mark.parametrize("old,new", [(2, 3), (3, 2)])
def test_mds_and_litdata_resume_on_another_world_size(monkeypatch, tmp_path: Path, source: str, old: int,
                                                      new: int) -> None:
    # 12 samples in each fixture: a listing from index.json, dealt by shard, read by read_samples
    spec = tmp_path / "formats.yaml"
    spec.write_text(f"""nodes:
  samples: {source}
  shard: {{op: shard, by: [rank, worker]}}
  read: {{op: read_samples, allow_pickle: true}}
  batch: {{op: batch, size: 2}}
output: batch
""")
    everything = _all_ids(monkeypatch, spec)  # the datasets' own index column: unique ids
    assert len(set(everything)) == 12
    ids = {i: k for k, i in enumerate(everything)}
    taken, states = _interrupt(monkeypatch, spec, old, 1)
    rest, _ = _resume(monkeypatch, spec, new, states)
    _exactly_once(12, [ids[i] for i in taken], [[ids[i] for i in r] for r in rest])


@pytest.mark.parametrize("old,new,steps", [(2, 3, 2), (3, 2, 1)])
def test_synthetic_records_resume_on_another_world_size(monkeypatch, tmp_path: Path, old: int, new: int,
                                                        steps: int) -> None:
    spec = tmp_path / "synthetic.yaml"
    spec.write_text("""nodes:
  fake: {op: synthetic, count: 24, shape: [3, 4, 4], classes: 5}
  shard: {op: shard, by: [rank, worker]}
  batch: {op: batch, size: 2}
  collate: {op: collate}
output: collate
""")
    assert _all_ids(monkeypatch, spec) == list(range(24))
    taken, states = _interrupt(monkeypatch, spec, old, steps)
    rest, _ = _resume(monkeypatch, spec, new, states)
    _exactly_once(24, taken, rest)


@pytest.fixture
def text_root(tmp_path: Path) -> Path:
    """120 short records in 3 JSONL files (divides by 2, 3 and 4: no equalize padding in the old run)."""
    for f in range(3):
        lines = [json.dumps({"text": f"record {f}-{i} " + "x" * (i % 7)}) for i in range(40)]
        (tmp_path / f"part-{f}.jsonl").write_text("\n".join(lines) + "\n")
    return tmp_path


@pytest.mark.parametrize("old,new,steps", [(2, 3, 2), (3, 2, 3)])
def test_text_graph_resumes_on_another_world_size(monkeypatch, text_root: Path, old: int, new: int,
                                                  steps: int) -> None:
    params = {"root": str(text_root), "window": 16}
    everything = _all_ids(monkeypatch, TEXT, **params)
    assert len(everything) == 120
    taken, states = _interrupt(monkeypatch, TEXT, old, steps, **params)
    rest, _ = _resume(monkeypatch, TEXT, new, states, **params)
    ids = {i: k for k, i in enumerate(everything)}  # sample ids are file * 2**32 + line: renumber
    _exactly_once(120, [ids[i] for i in taken], [[ids[i] for i in r] for r in rest])


@pytest.mark.parametrize("old,new", [(2, 1), (1, 3)])
def test_text_graph_resumes_with_other_worker_copies(monkeypatch, text_root: Path, old: int, new: int) -> None:
    params = {"root": str(text_root), "window": 16, "method": "thread"}
    ids = {i: k for k, i in enumerate(_all_ids(monkeypatch, TEXT, **params))}
    taken, states = _interrupt(monkeypatch, TEXT, 1, 5, copies=old, **params)
    rest, _ = _resume(monkeypatch, TEXT, 1, states, copies=new, **params)
    _exactly_once(120, [ids[i] for i in taken], [[ids[i] for i in r] for r in rest])


def test_a_second_interruption_in_the_same_epoch(monkeypatch) -> None:
    # 2 ranks -> 3 ranks -> 2 ranks in one epoch; then the elastic epoch resumes exactly as usual
    p = {"batch_size": 2}
    taken, states = _interrupt(monkeypatch, NUMBERS, 2, 2, **p)
    pad3 = -(40 - len(taken)) % 3  # the 3-rank world evens what the 2 ranks left
    states3 = []
    for rank in range(3):
        with _open(monkeypatch, NUMBERS, rank, 3, **p) as loader:
            loader.load_state_dict(states)
            it = iter(loader)
            taken += _ids(next(it)) + _ids(next(it))
            states3.append(json.loads(json.dumps(loader.state_dict())))
            rest3 = [i for b in it for i in _ids(b)]
        with _open(monkeypatch, NUMBERS, rank, 3, **p) as again:  # a plain resume inside it
            again.load_state_dict(states3[-1])
            assert [i for b in again for i in _ids(b)] == rest3
    assert len(json.dumps(states3)) < 6000  # a deal is a few ints per old slot, not a list of samples
    rest, _ = _resume(monkeypatch, NUMBERS, 2, states3, **p)
    _exactly_once(40, taken, rest, repeats=pad3)


def test_what_cannot_resume_elastically_is_named(monkeypatch, tmp_path: Path) -> None:
    _, states = _interrupt(monkeypatch, ROOT / "specs/text.yaml", 1, 1, max_tokens=2048)
    with _open(monkeypatch, ROOT / "specs/text.yaml", 0, 2, max_tokens=2048) as loader:
        with pytest.raises(StateError, match=r"node 'batch' \(bucket_batch\) from .*text.yaml:\d+ cannot be "
                                             r"resumed on another world size"):
            loader.load_state_dict(states)
    _, states = _interrupt(monkeypatch, NUMBERS, 2, 1)
    with _open(monkeypatch, NUMBERS, 0, 3) as loader:
        with pytest.raises(StateError, match=r"every rank of the old run"):
            loader.load_state_dict(states[1])  # one rank's state of two
        with _open(monkeypatch, NUMBERS, 1, 2) as later:
            list(later)
            next(iter(later))
            in_epoch_1 = later.state_dict()
        with pytest.raises(StateError, match=r"different epochs"):
            loader.load_state_dict([states[0], in_epoch_1])
    spec = tmp_path / "per_rank_order.yaml"  # a shuffle above the shard: each rank's order is its own
    spec.write_text(f"""\
nodes:
  files:   {{op: list_files, url: "{ROOT}/examples/data/numbers/*/*.txt", shuffle: true}}
  shuffle: {{op: shuffle_buffer, size: 16}}
  shard:   {{op: shard, by: [rank]}}
  parse:   {{op: map, fn: "conveyor.files:read_numbers"}}
  batch:   {{op: batch, size: 4}}
  collate: {{op: collate}}
output: collate
""")
    _, states = _interrupt(monkeypatch, spec, 2, 1)
    with _open(monkeypatch, spec, 0, 3) as loader:
        with pytest.raises(StateError, match=r"node 'shuffle' \(shuffle_buffer\).* lies above node 'shard'"):
            loader.load_state_dict(states)


def test_an_elastic_resume_across_a_change_of_a_batch_invariant_maps_batch_is_refused(
        monkeypatch, tmp_path: Path, text_root: Path) -> None:
    """On the same world such a change loads (tests/test_batch_invariant.py); an elastic resume
    counts the map's consumed lists by the batch of now, so it would lose or repeat records."""
    def with_batch(n: int) -> Path:
        path = tmp_path / f"elastic-batch-{n}.yaml"
        path.write_text(TEXT.read_text().replace(
            'tokenize: {op: map, fn: "conveyor.text:byte_tokenize", args: {max_length: 64}}',
            f'tokenize: {{op: map, fn: "conveyor.text:byte_tokenize", args: {{max_length: 64}}, batch: {n}}}'))
        return path

    params = {"root": str(text_root), "window": 16}
    taken, states = _interrupt(monkeypatch, with_batch(4), 2, 2, **params)
    with _open(monkeypatch, with_batch(8), 0, 3, **params) as loader:
        with pytest.raises(StateError, match=r"node 'tokenize' param 'batch': saved 4, now 8: an elastic resume"):
            loader.load_state_dict(states)
        with pytest.raises(StateError, match=r"an elastic resume"):
            loader.load_state_dict(states, strict=False)  # not a warning: it would lose or repeat records
    rest, _ = _resume(monkeypatch, with_batch(4), 3, states, **params)  # the saved batch: exactly once
    ids = {i: k for k, i in enumerate(_all_ids(monkeypatch, with_batch(4), **params))}
    _exactly_once(120, [ids[i] for i in taken], [[ids[i] for i in r] for r in rest])

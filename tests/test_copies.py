"""Graph-level worker copies: coverage, order, exact resume, and spec errors."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from conveyor import SpecErrors, check_spec, load_graph
from resume_check import check_resume, fingerprint, run_with_states

ROOT = Path(__file__).resolve().parent.parent


def _spec(tmp_path: Path, workers: str, *, shard: str = "{op: shard}", fn: str = "conveyor.files:read_numbers",
          shuffle: str = "") -> Path:
    path = tmp_path / "copies.yaml"
    path.write_text(textwrap.dedent(f"""\
        params: {{batch_size: 4}}
        workers: {workers}
        nodes:
          files:   {{op: list_files, url: "{ROOT}/examples/data/numbers/*/*.txt", shuffle: true}}
          shard:   {shard}
          {shuffle or "keep:    {op: filter, fn: 'chain_fns:keep_two_of_three'}"}
          parse:   {{op: map, fn: "{fn}"}}
          batch:   {{op: batch, size: "${{batch_size}}"}}
          collate: {{op: collate}}
        """))
    return path


def _indices(loader, epochs: int = 2) -> list[list[int]]:
    return [[i for b in loader for i in b["index"].tolist()] for _ in range(epochs)]


@pytest.mark.timeout(180)
def test_copies_cover_the_data_once_in_the_order_of_one_copy(tmp_path: Path) -> None:
    one_to_one = "shuf:    {op: shuffle_buffer, size: 1}"
    with load_graph(_spec(tmp_path, "1", shuffle=one_to_one)) as one:
        base = _indices(one)
    assert sorted(base[0]) == list(range(40))
    assert base[0] != base[1]  # reshuffled
    for workers in ("{copies: 2, method: thread}", "{copies: 3, method: thread}",
                    "{copies: 2, method: process}", "{copies: 3, method: process, mp_context: fork}"):
        with load_graph(_spec(tmp_path, workers, shuffle=one_to_one)) as loader:
            got = _indices(loader)
            assert loader.stats()["nodes"]["parse"]["copies"] in (2, 3)
        assert got == base, workers  # a one-to-one copied part: the order of one copy


def test_copies_with_a_filter_cover_the_kept_items_once(tmp_path: Path) -> None:
    kept = [i for i in range(40) if i % 3 != 0]
    for workers in ("1", "{copies: 3, method: thread}"):
        with load_graph(_spec(tmp_path, workers)) as loader:
            got = _indices(loader)
            stats = loader.stats()["nodes"]
        assert [sorted(e) for e in got] == [kept, kept], workers
        assert stats["keep"]["filtered"] == 14  # counted inside the copies, summed over them


def test_copies_resume_exactly_with_threads(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "{copies: 3, method: thread, until: parse}",
                 shuffle="shuf:    {op: shuffle_buffer, size: 5}")
    assert check_resume(lambda: load_graph(spec), epochs=2) == 20


@pytest.mark.timeout(240)
def test_copies_resume_exactly_with_processes(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "{copies: 2, method: process}", shuffle="shuf:    {op: shuffle_buffer, size: 5}")
    with load_graph(spec) as loader:
        _, states = run_with_states(loader, 2)
    assert check_resume(lambda: load_graph(spec), epochs=2, steps=[0, 3, 10, 11, len(states) - 1]) == 20


def test_a_state_from_two_copies_needs_two_copies(tmp_path: Path) -> None:
    from conveyor import StateError

    with load_graph(_spec(tmp_path, "{copies: 2, method: thread}")) as two:
        next(iter(two))
        state = two.state_dict()
    with load_graph(_spec(tmp_path, "{copies: 3, method: thread}")) as three:
        with pytest.raises(StateError):
            three.load_state_dict(state)
    with load_graph(_spec(tmp_path, "{copies: 2, method: thread}")) as again:
        again.load_state_dict(state)
        assert fingerprint(next(iter(again)))  # resumes


def test_copies_need_a_worker_shard_and_picklable_fns(tmp_path: Path) -> None:
    with pytest.raises(SpecErrors) as info:
        check_spec(_spec(tmp_path, "2", shard="{op: shard, by: [rank]}"))
    assert "no shard with by: [rank, worker] follows it" in str(info.value)
    assert info.value.errors[0].node == "files"
    with pytest.raises(SpecErrors) as info:
        check_spec(_spec(tmp_path, "{copies: 2, method: process}", fn="helpers_fns:unpicklable"))
    err = info.value.errors[0]
    assert (err.node, err.param) == ("parse", "fn") and "cannot be pickled" in err.message
    check_spec(_spec(tmp_path, "{copies: 2, method: thread}", fn="helpers_fns:unpicklable"))  # threads: fine
    with pytest.raises(SpecErrors, match="until 'parze' is not a node \\(did you mean 'parse'"):
        check_spec(_spec(tmp_path, "{copies: 2, until: parze}"))


def test_show_tells_the_worker_copies(tmp_path: Path) -> None:
    from conveyor.cli import show_text

    text = show_text(check_spec(_spec(tmp_path, "{copies: 3, method: thread}")))
    assert "workers: 3 thread copies of the graph up to 'parse', merged round-robin" in text

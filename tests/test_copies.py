"""Graph-level worker copies: coverage, order, exact resume, and spec errors."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from conveyor import SpecErrors, check_spec, load_graph
from resume_check import check_resume, fingerprint

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
                    "{copies: 2, method: process}", "{copies: 3, method: process, mp_context: forkserver}"):
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
    spec = _spec(tmp_path, "{copies: 2, method: process, mp_context: forkserver}", shuffle="shuf:    {op: shuffle_buffer, size: 5}")
    # one new loader restores mid-epoch first, then (its worker processes kept) at the start, on
    # both sides of the epoch boundary and at the end: two loaders start processes, not seven
    assert check_resume(lambda: load_graph(spec), epochs=2, steps=lambda n, e: [3, 0, e, e + 1, n - 1],
                        reuse=True) == 20


def test_a_state_from_two_copies_needs_two_copies(tmp_path: Path) -> None:
    from conveyor import StateError

    with load_graph(_spec(tmp_path, "{copies: 2, method: thread}")) as two:
        next(iter(two))
        state = two.state_dict()
    with load_graph(_spec(tmp_path, "{copies: 3, method: thread}")) as three:
        # other copies resume elastically (tests/test_elastic.py), but not through a filter
        with pytest.raises(StateError, match=r"node 'keep' \(filter\).* cannot be resumed"):
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
    from conveyor.tools.show import show_text

    text = show_text(check_spec(_spec(tmp_path, "{copies: 3, method: thread}")))
    assert "workers: 3 thread copies of the graph up to 'parse', merged round-robin" in text


@pytest.mark.timeout(180)
def test_workers_run_ahead_only_into_the_epoch_asked_for(tmp_path: Path) -> None:
    one_to_one = "shuf:    {op: shuffle_buffer, size: 1}"
    with load_graph(_spec(tmp_path, "1", shuffle=one_to_one)) as one:
        base = _indices(one, 4)
    spec = _spec(tmp_path, "{copies: 2, method: process, mp_context: forkserver}", shuffle=one_to_one)
    with load_graph(spec) as loader:
        whole = [i for b in loader for i in b["index"].tolist()]  # epoch 0; the workers go on into 1
        state = loader.state_dict()
        it = iter(loader)  # epoch 1, taken from the workers' run-ahead
        part = next(it)["index"].tolist()
        rest = [i for b in loader for i in b["index"].tolist()]  # epoch 2: epoch 1 was left half-way
        assert loader.stats()["nodes"]["parse"]["epochs_run_ahead"] == 1
        # back to the end of epoch 0: the copies restart there (told), end at once and run
        # ahead into epoch 1, which is taken; then into epoch 2
        loader.load_state_dict(state)
        again = [i for b in loader for i in b["index"].tolist()]
        last = [i for b in loader for i in b["index"].tolist()]
        assert loader.stats()["nodes"]["parse"]["epochs_run_ahead"] == 3
    assert whole == base[0] and part == base[1][:4] and rest == base[2]
    assert again == base[1] and last == base[2]


@pytest.mark.timeout(60)
def test_close_ends_workers_blocked_on_a_full_pipe() -> None:
    from conveyor.nodes.copies import WorkerCopies
    from helpers_fns import endless_big_items

    node = WorkerCopies(endless_big_items, copies=2, method="process", mp_context="forkserver")
    node.reset(None)
    assert next(node)[0].item() == 1.0 and next(node)[0].item() == 1.0  # copy 0, then copy 1
    assert next(node)[0].item() == 2.0
    workers = list(node._workers)
    node.close()  # each worker is blocked writing a 1 MiB item into a full pipe
    assert [p.exitcode for p in workers] == [0, 0]  # they left on their own, none was killed


@pytest.mark.timeout(60)
def test_a_worker_that_exits_at_start_is_named_with_a_hint() -> None:
    from conveyor.nodes.copies import WorkerCopies
    from helpers_fns import exit_in_copy

    node = WorkerCopies(exit_in_copy, copies=2, method="process", start_timeout=30)
    try:
        with pytest.raises(RuntimeError, match=r"worker copy 0 \(pid \d+\) exited with code 1 .*if __name__ == '__main__'"):
            node.reset(None)
    finally:
        node.close()


@pytest.mark.timeout(60)
def test_a_worker_killed_mid_epoch_is_an_error_naming_the_signal() -> None:
    import os
    import signal

    from conveyor import WorkerError
    from conveyor.nodes.copies import WorkerCopies
    from helpers_fns import endless_big_items

    node = WorkerCopies(endless_big_items, copies=2, method="process", mp_context="forkserver")
    try:
        node.reset(None)
        next(node)
        pid = node.worker_pids()[1]
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(WorkerError, match=rf"^worker copies: worker copy 1 \(pid {pid}\) was killed by signal 9 "
                                              r"\(SIGKILL\): often the out-of-memory killer") as err:
            for _ in range(100):  # what it sent before it died comes first
                next(node)
        assert (err.value.pid, err.value.exitcode) == (pid, -signal.SIGKILL)
    finally:
        node.close()


def _shmem_mib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("Shmem:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no Shmem line in /proc/meminfo")


@pytest.mark.timeout(60)
def test_workers_run_ahead_only_a_few_chunks_of_shared_memory() -> None:
    import time

    from conveyor.nodes.copies import WorkerCopies
    from helpers_fns import endless_big_items

    before = _shmem_mib()
    node = WorkerCopies(endless_big_items, copies=2, method="process", mp_context="forkserver")  # endless 1 MiB items
    try:
        node.reset(None)
        next(node)
        time.sleep(1.5)  # the consumer stalls (a slow training step): the workers must stop soon
        grown = _shmem_mib() - before
    finally:
        node.close()
    # per worker: depth chunks of at most 4 MiB waiting, one being filled; not GBs (874 MiB
    # and growing when nothing bounded it)
    assert grown < 2 * (node.depth + 1) * 4 + 8, f"{grown:.0f} MiB of shared memory after a 1.5 s stall"

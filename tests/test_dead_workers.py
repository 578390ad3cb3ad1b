"""A worker process that dies, a fn that raises StopIteration, errors that lose their way
(issue 32 items 1, 3, 9, 10).

Every kind of worker that runs in a child process is killed here by its pid (from the node's
``worker_pids()``, never by name) while the loader needs it: ``map`` with ``method: process``
(ordered and not), ``map_batches`` with processes (its calls run in a ``Map``), and worker
copies (``workers: {copies: N, method: process}``). Thread workers cannot be killed alone: a
thread that dies takes the whole process with it, so there is nothing to test for them.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest
from torchdata.nodes import IterableWrapper

import helpers_fns
from conveyor import SampleError, WorkerError, load_graph
from resume_check import fingerprint

ROOT = Path(__file__).resolve().parent.parent
NUMBERS = ROOT / "examples/data/numbers"  # 40 files

MAP_SPEC = f"""
nodes:
  files:  {{op: list_files, url: "{NUMBERS}/*/*.txt", shuffle: true}}
  decode: {{op: map, fn: "helpers_fns:slow", args: {{seconds: 0.05}}, workers: 2, method: process}}
  batch:  {{op: batch, size: 2}}
  out:    {{op: prefetch, depth: 2}}
output: out
"""
COPIES_SPEC = f"""
workers: {{copies: 2, method: process, until: parse, mp_context: forkserver}}
nodes:
  files: {{op: list_files, url: "{NUMBERS}/*/*.txt", shuffle: true}}
  shard: {{op: shard}}
  parse: {{op: map, fn: "helpers_fns:slow", args: {{seconds: 0.1}}}}
  batch: {{op: batch, size: 2}}
output: batch
"""
SIGNAL_9 = r"\(pid {pid}\) was killed by signal 9 \(SIGKILL\): often the out-of-memory killer"


def _gone(pid: int, timeout: float = 20.0) -> bool:
    """The process ended (or is a zombie nobody will wait on), within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _batch(batch: list) -> list:
    return fingerprint([r["path"] for r in batch])


def _killed_mid_epoch(spec: Path, node: str, pattern: str, taken: int = 3, stop: bool = False) -> None:
    """Take ``taken`` batches and the state, kill worker 1 of ``node`` (``stop``: stop it with
    SIGSTOP, alive and silent as a fn stuck in a read, for a spec whose ``timeout`` is 2 s),
    expect the error ``pattern`` (``{pid}`` filled in), close, check no worker is left, then
    resume the state in a fresh loader: it gives exactly the batches of an uninterrupted run
    after those (run without workers: the same order, copies included, since they map one to one)."""
    loader = load_graph(spec)
    pids: list[int] = []
    try:
        it = iter(loader)
        before = [_batch(next(it)) for _ in range(taken)]
        state = loader.state_dict()
        pids = loader.nodes[node].worker_pids()
        assert len(pids) == 2, pids
        if stop:
            os.kill(pids[1], signal.SIGSTOP)
        else:
            _kill(pids[1])
        t0 = time.monotonic()
        with pytest.raises(WorkerError, match=pattern.format(pid=pids[1])) as err:
            for _ in range(100):  # a few batches made before the death may come first
                next(it)
        if stop:
            assert 2 <= time.monotonic() - t0 < 30  # the timeout, and a poll or two
        else:
            assert (err.value.pid, err.value.exitcode) == (pids[1], -signal.SIGKILL)
        assert isinstance(err.value, RuntimeError)  # caught where DataLoader's error would be
    finally:
        loader.close()  # (a stopped worker is killed at once)
    assert all(_gone(p) for p in pids), [p for p in pids if not _gone(p, 0)]  # nothing left running
    resumed = load_graph(spec)
    try:
        resumed.load_state_dict(state)
        rest = [_batch(b) for b in resumed]
    finally:
        resumed.close()
    plain = spec.with_name("plain.yaml")
    plain.write_text(re.sub(r", workers: 2, method: process(, timeout: \d+)?", "", "\n".join(
        line for line in spec.read_text().splitlines() if not line.startswith("workers:"))))
    whole = load_graph(plain)
    try:
        expected = [_batch(b) for b in whole]
    finally:
        whole.close()
    assert before + rest == expected


@pytest.mark.timeout(120)
def test_a_killed_map_worker_process_is_an_error_naming_node_pid_and_signal_and_the_state_resumes(
        write_spec) -> None:
    _killed_mid_epoch(write_spec(MAP_SPEC), "decode", r"^node 'decode' \(map\) from .*spec.yaml:4: worker "
                      + SIGNAL_9)


@pytest.mark.timeout(180)
def test_a_killed_worker_copy_is_an_error_naming_copy_pid_and_signal_and_the_state_resumes(write_spec) -> None:
    _killed_mid_epoch(write_spec(COPIES_SPEC), "parse", r"^worker copies up to node 'parse': worker copy 1 "
                      + SIGNAL_9)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("ordered", [True, False])
def test_a_killed_map_worker_wakes_the_map_itself(ordered: bool) -> None:
    from conveyor.nodes import Map

    node = Map(IterableWrapper(range(200)), fn=helpers_fns.slow, args={"seconds": 0.05}, workers=2,
               method="process", ordered=ordered, where="node 'decode' (map)")
    pids: list[int] = []
    try:
        node.reset()
        next(node)
        pids = node.worker_pids()
        _kill(pids[0])
        with pytest.raises(WorkerError, match=r"^node 'decode' \(map\): worker " + SIGNAL_9.format(pid=pids[0])):
            for _ in range(200):
                next(node)
    finally:
        node.close()
    assert all(_gone(p) for p in pids)


@pytest.mark.timeout(60)
def test_a_killed_map_batches_worker_process_is_an_error() -> None:
    from conveyor.nodes import MapBatches

    node = MapBatches(IterableWrapper(range(400)), fn=helpers_fns.slow_list, size=4, workers=2,
                      method="process", where="node 'embed' (map_batches)")
    pids: list[int] = []
    try:
        node.reset()
        next(node)
        pids = node.worker_pids()
        assert len(pids) == 2
        _kill(pids[1])
        with pytest.raises(WorkerError, match=r"^node 'embed' \(map_batches\): worker " + SIGNAL_9.format(pid=pids[1])):
            for _ in range(400):
                next(node)
    finally:
        node.close()
    assert all(_gone(p) for p in pids)


def test_a_worker_error_keeps_its_fields_and_notes_through_pickle() -> None:
    import pickle

    err = WorkerError("node 'decode' (map): worker (pid 7) was killed by signal 9 (SIGKILL)",
                      node="node 'decode' (map)", pid=7, exitcode=-9)
    err.add_note("in worker copy 0")  # a map in a worker copy: the error crosses to the main process
    back = pickle.loads(pickle.dumps(err))
    assert (str(back), back.node, back.pid, back.exitcode, back.__notes__) == (
        str(err), "node 'decode' (map)", 7, -9, ["in worker copy 0"])


def test_thread_workers_have_no_pids_to_kill() -> None:
    from conveyor.nodes import Map

    node = Map(IterableWrapper(range(4)), fn=helpers_fns.ident, workers=2)
    try:
        node.reset()
        assert list(node) == [0, 1, 2, 3] and node.worker_pids() == []
    finally:
        node.close()


# ----- StopIteration from fn or __getitem__ is a SampleError, not the end (item 3) ----------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers,method", [(0, "thread"), (2, "thread"), (2, "process")])
def test_stop_iteration_from_fn_is_a_sample_error_naming_fn_and_item(workers: int, method: str) -> None:
    from conveyor.nodes import Map

    node = Map(IterableWrapper(range(6)), fn=helpers_fns.stop_on_three, workers=workers, method=method,
               where="node 'decode' (map)")
    try:
        node.reset()
        assert [next(node) for _ in range(3)] == [0, 1, 2]
        with pytest.raises(SampleError, match="fn 'stop_on_three' raised StopIteration \\(nothing left\\) on item 3"
                           ) as err:
            next(node)
        assert "in node 'decode' (map)" in err.value.__notes__
    finally:
        node.close()
    skipping = Map(IterableWrapper(range(6)), fn=helpers_fns.stop_on_three, workers=workers, method=method,
                   on_error="skip")
    try:
        skipping.reset()
        assert list(skipping) == [0, 1, 2, 4, 5]
        assert skipping.stats()["skipped"] == 1
        assert [e[:2] for e in skipping.ledger.state()["entries"]] == [["3", "SampleError"]]
    finally:
        skipping.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", ["thread", "process"])
def test_stop_iteration_from_a_datasets_getitem_is_a_sample_error(method: str) -> None:
    from conveyor.dataset import DatasetHandle, getitem
    from conveyor.nodes import Map

    handle = DatasetHandle(obj=helpers_fns.StopsAtThree())
    records = [{"index": i, "dataset": handle} for i in range(6)]
    node = Map(IterableWrapper(records), fn=getitem, workers=2, method=method, where="node 'load' (map)")
    try:
        node.reset()
        assert [next(node)["x"] for _ in range(3)] == [0, 1, 2]
        with pytest.raises(SampleError, match="fn 'getitem' raised StopIteration on item index 3") as err:
            next(node)
        assert "reading item 3 of StopsAtThree" in err.value.__notes__
    finally:
        node.close()


def test_stop_iteration_from_a_filter_or_map_batches_fn_is_a_sample_error() -> None:
    from conveyor.nodes import Filter, MapBatches

    with pytest.raises(SampleError, match="fn 'stop_on_three' raised StopIteration"):
        list(Filter(IterableWrapper(range(6)), fn=helpers_fns.stop_on_three))
    node = MapBatches(IterableWrapper(range(6)), fn=helpers_fns.stop_on_three_list, size=2, on_error="skip")
    node.reset()
    assert list(node) == [0, 1, 2, 4, 5] and node.stats()["skipped"] == 1
    with pytest.raises(SampleError, match="fn 'stop_on_three_list' raised StopIteration .* on item 3"):
        list(MapBatches(IterableWrapper(range(6)), fn=helpers_fns.stop_on_three_list, size=2))


# ----- an iterable source's errors say where (item 9) ---------------------------------------

def test_an_iterable_sources_error_names_the_node_and_the_item(write_spec) -> None:
    spec = write_spec("""
nodes:
  stream: {op: iterable, iterable: "helpers_fns:fails_at_two"}
output: stream
""")
    loader = load_graph(spec)
    try:
        it = iter(loader)
        assert [next(it), next(it)] == [0, 1]
        with pytest.raises(ValueError, match="the stream broke") as err:
            next(it)
    finally:
        loader.close()
    notes = [n for n in err.value.__notes__ if "reading item" in n]
    assert len(notes) == 1 and notes[0].startswith("in node 'stream' (iterable) from "), err.value.__notes__
    assert "reading item 2 of epoch 0 of helpers_fns:fails_at_two" in notes[0]


# ----- an exception that cannot travel back starts with the node, type and message (item 10)

@pytest.mark.timeout(60)
def test_an_untravelled_exception_starts_with_node_type_and_message() -> None:
    from conveyor.nodes import Map

    node = Map(IterableWrapper([1, 2, 3]), fn=helpers_fns.two_arg_error_on_three, workers=1, method="process",
               where="node 'parse' (map)")
    try:
        node.reset()
        assert [next(node), next(node)] == [1, 2]
        with pytest.raises(RuntimeError) as err:
            next(node)
    finally:
        node.close()
    head, _, rest = str(err.value).partition("\n")
    assert head == "node 'parse' (map): TwoArgError: no 3"
    assert "Traceback (most recent call last)" in rest and "two_arg_error_on_three" in rest
    skipping = Map(IterableWrapper(range(1, 5)), fn=helpers_fns.two_arg_error_on_three, workers=1,
                   method="process", on_error="skip")
    try:
        skipping.reset()
        assert list(skipping) == [1, 2, 4]
        assert skipping.ledger.state()["entries"] == [["3", "TwoArgError", "no 3", 1]]  # not the traceback
    finally:
        skipping.close()


@pytest.mark.timeout(120)
def test_an_untravelled_exception_from_a_worker_copy_starts_with_its_node(write_spec) -> None:
    spec = write_spec(f"""
workers: {{copies: 2, method: process, until: parse, mp_context: forkserver}}
nodes:
  files: {{op: list_files, url: "{NUMBERS}/*/*.txt"}}
  shard: {{op: shard}}
  parse: {{op: map, fn: "helpers_fns:two_arg_error_at_index_three"}}
output: parse
""")
    loader = load_graph(spec)
    try:
        with pytest.raises(RuntimeError) as err:
            list(loader)
    finally:
        loader.close()
    head = str(err.value).partition("\n")[0]
    assert head.startswith("node 'parse' (map) from ") and head.endswith(": TwoArgError: no 3"), head


@pytest.mark.timeout(120)
def test_a_worker_copy_alive_but_silent_past_the_timeout_is_an_error_naming_it_and_the_state_resumes(
        write_spec) -> None:
    # without workers: timeout the merge waits for it for ever (the watchdog names it)
    spec = write_spec(COPIES_SPEC.replace("mp_context: forkserver}", "mp_context: forkserver, timeout: 2}"))
    _killed_mid_epoch(spec, "parse", r"^worker copies up to node 'parse': worker copy 1 \(pid {pid}, .*\) sent "
                                     r"nothing for 2 s \(workers: timeout\)", stop=True)


@pytest.mark.parametrize("bad", ["0", "-1", "true", "abc", ".nan"])
def test_a_bad_workers_timeout_is_a_spec_error(write_spec, bad: str) -> None:
    from conveyor import SpecErrors, check_spec

    spec = write_spec(COPIES_SPEC.replace("mp_context: forkserver}", f"mp_context: forkserver, timeout: {bad}}}"))
    with pytest.raises(SpecErrors, match=r"workers: timeout must be a positive number of seconds"):
        check_spec(spec)


MAP_TIMEOUT_SPEC = MAP_SPEC.replace("workers: 2, method: process}", "workers: 2, method: process, timeout: 2}")


@pytest.mark.timeout(120)
def test_a_map_worker_process_alive_but_silent_past_the_timeout_is_an_error_and_the_state_resumes(
        write_spec) -> None:
    spec = write_spec(MAP_TIMEOUT_SPEC)
    _killed_mid_epoch(spec, "decode", r"^node 'decode' \(map\) from .*spec.yaml:4: no result from its worker "
                                      r"processes for 2 s \(timeout\): .*pid {pid}, stopped", stop=True)


@pytest.mark.parametrize("params, message", [
    ("workers: 2, method: process, timeout: 0", "expected a positive number of seconds"),
    ("workers: 2, method: thread, timeout: 5", "it needs method: process and workers >= 1"),
    ("timeout: 5", "it needs method: process and workers >= 1"),
])
def test_a_map_timeout_without_worker_processes_or_not_positive_is_a_spec_error(write_spec, params, message) -> None:
    from conveyor import SpecErrors, check_spec

    spec = write_spec(MAP_SPEC.replace("workers: 2, method: process}", params + "}"))
    with pytest.raises(SpecErrors, match=message) as err:
        check_spec(spec)
    assert any(e.param == "timeout" and e.node == "decode" for e in err.value.errors)

"""Nothing hangs: close() returns whatever fn does, workers do not outlive their parent, a
stalled graph says where it waits (issue 13)."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import helpers_fns
import pytest
from conveyor import load_graph

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent

BLOCKING_SPEC = """
params: {workers: 2}
nodes:
  files:  {op: list_files, url: "%s/*/*.txt", label: parent_dir}
  decode: {op: map, fn: "helpers_fns:block_after", args: {n: 20}, workers: "${workers}"}
  batch:  {op: batch, size: 4}
  out:    {op: prefetch, depth: 2}
output: out
""" % (ROOT / "examples/data/numbers")


def _wait_until(cond, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_close_returns_while_thread_workers_are_blocked_in_fn(write_spec, caplog) -> None:
    helpers_fns.GATE = gate = threading.Event()
    loader = load_graph(write_spec(BLOCKING_SPEC))
    got: list = []
    reader = threading.Thread(target=lambda: got.extend(loader), daemon=True)
    try:
        reader.start()
        assert _wait_until(lambda: helpers_fns.BLOCKED[0] == 2)  # both threads stuck inside fn
        # what was made before the stall reaches the reader while the workers stay blocked
        # (nothing made is kept back behind them); then close() must not wait on them either
        assert _wait_until(lambda: sum(len(b) for b in list(got)) == 20), got
        with caplog.at_level(logging.WARNING):
            t0 = time.monotonic()
            loader.close()
            took = time.monotonic() - t0
        assert took < 15, took  # a bound, not a speed: it blocked for ever before
        reader.join(timeout=10)
        assert not reader.is_alive()  # the reader waiting on the map was woken too
        warned = [r.getMessage() for r in caplog.records if "abandoned" in r.getMessage()]
        assert warned and "node 'decode' (map)" in warned[0], warned
        assert [b for batch in got for b in batch] == list(range(20))
    finally:
        gate.set()
        loader.close()


EXIT_WITH_BLOCKED_FN = """
import sys, threading, time
sys.path.insert(0, %r)
import helpers_fns
from conveyor import load_graph
loader = load_graph(sys.argv[1])
threading.Thread(target=lambda: list(loader), daemon=True).start()
while helpers_fns.BLOCKED[0] < 2:
    time.sleep(0.02)
print("blocked", flush=True)
""" % str(TESTS)


def test_the_interpreter_exits_with_thread_workers_blocked_in_fn(write_spec) -> None:
    # the loader is left open: the exit closes it, and no thread of its holds the exit up
    out = subprocess.run([sys.executable, "-c", EXIT_WITH_BLOCKED_FN, str(write_spec(BLOCKING_SPEC))],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "blocked" in out.stdout
    assert "abandoned" in out.stderr


# ----- map with method: process, an exception that pickles but does not unpickle -----------

def test_an_exception_that_cannot_travel_back_from_a_process_is_raised_as_its_text() -> None:
    import pytest
    from torchdata.nodes import IterableWrapper

    from conveyor.nodes.map import Map

    node = Map(IterableWrapper([1, 2, 3, 4]), fn=helpers_fns.two_arg_error_on_three, workers=1,
               method="process", where="node 'parse' (map)")
    try:
        node.reset()
        assert [next(node), next(node)] == [1, 2]
        with pytest.raises(RuntimeError, match="TwoArgError: no 3") as err:
            next(node)
        assert "in node 'parse' (map)" in err.value.__notes__
    finally:
        node.close()
    skipping = Map(IterableWrapper(range(1, 8)), fn=helpers_fns.two_arg_error_on_three, workers=2,
                   method="process", on_error="skip")
    try:
        skipping.reset()
        assert list(skipping) == [1, 2, 4, 5, 7]
        assert skipping.stats()["skipped"] == 2
    finally:
        skipping.close()



def _two_then_two_arg_error():
    yield 1
    yield 2
    raise helpers_fns.TwoArgError("bad", "input")


def test_an_input_error_that_cannot_travel_to_a_process_and_back_is_raised_as_its_text() -> None:
    import pytest
    from torchdata.nodes import IterableWrapper

    from conveyor.nodes.map import Map

    node = Map(IterableWrapper(_two_then_two_arg_error()), fn=helpers_fns.ident, workers=1,
               method="process")
    try:
        node.reset()
        assert [next(node), next(node)] == [1, 2]
        with pytest.raises(RuntimeError, match="TwoArgError: bad input"):
            next(node)
    finally:
        node.close()


# ----- worker processes end with a main process killed by SIGKILL ---------------------------

ORPHANS = """
import multiprocessing as mp, sys, threading, time
sys.path.insert(0, %r)
from conveyor import load_graph
copies = load_graph(sys.argv[1])
mapped = load_graph(sys.argv[2])
next(iter(copies))  # started from the main thread: the kernel's parent-death signal applies
threading.Thread(target=lambda: next(iter(mapped))).start()  # not: the parent watch must do it
while len(mp.active_children()) < 4:
    time.sleep(0.05)
print(" ".join(str(p.pid) for p in mp.active_children()), flush=True)
time.sleep(120)
""" % str(TESTS)

NUMBERS = ROOT / "examples/data/numbers"
COPIES_SPEC = f"""
workers: {{copies: 2, method: process, until: parse}}
nodes:
  files: {{op: list_files, url: "{NUMBERS}/*/*.txt"}}
  shard: {{op: shard}}
  parse: {{op: map, fn: "conveyor.files:read_numbers"}}
  batch: {{op: batch, size: 4}}
output: batch
"""
PROCESS_MAP_SPEC = f"""
nodes:
  files: {{op: list_files, url: "{NUMBERS}/*/*.txt"}}
  parse: {{op: map, fn: "conveyor.files:read_numbers", workers: 2, method: process}}
  batch: {{op: batch, size: 4}}
output: batch
"""


def _gone(pid: int) -> bool:
    import os

    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie nobody reaps: ended
    except FileNotFoundError:
        if Path("/proc/self").exists():
            return True
    try:  # no /proc: ask the kernel
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_worker_processes_end_when_the_main_process_is_killed(write_spec) -> None:
    import os
    import signal

    main = subprocess.Popen([sys.executable, "-c", ORPHANS, str(write_spec(COPIES_SPEC, "c.yaml")),
                             str(write_spec(PROCESS_MAP_SPEC, "m.yaml"))],
                            stdout=subprocess.PIPE, text=True)
    pids: list[int] = []
    try:
        pids = [int(p) for p in main.stdout.readline().split()]
        assert len(pids) == 4, pids
        main.send_signal(signal.SIGKILL)
        main.wait(timeout=10)
        assert _wait_until(lambda: all(_gone(p) for p in pids), timeout=20), \
            [p for p in pids if not _gone(p)]
    finally:
        for pid in [main.pid] + pids:
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)
        main.stdout.close()


LATE_WATCH = """
import os, sys, time
sys.path.insert(0, %r)
main = os.getpid()
child = os.fork()
if child == 0:  # a worker that reaches its watch only after the main process died
    while os.getppid() == main:
        time.sleep(0.01)
    from conveyor.nodes._workers.parent_watch import watch_parent
    watch_parent(main, what="late worker", from_main_thread=False)
    time.sleep(60)
    os._exit(0)
print(child, flush=True)
time.sleep(120)
""" % str(ROOT)


def test_a_worker_whose_watch_begins_after_the_main_process_died_ends_too() -> None:
    """The race of a fork that runs late on a busy machine: the worker is re-parented before
    its watch begins, and the dead main process stays a zombie until whoever started it reaps
    it (here this test, which does so only at the end): the worker must end all the same."""
    import os
    import signal

    import pytest

    if not Path("/proc/self/stat").exists():
        pytest.skip("a zombie is told from a live process by Linux's /proc only")
    main = subprocess.Popen([sys.executable, "-c", LATE_WATCH], stdout=subprocess.PIPE, text=True)
    worker = None
    try:
        worker = int(main.stdout.readline().split()[0])
        main.send_signal(signal.SIGKILL)
        assert _wait_until(lambda: _gone(worker), timeout=20), f"worker {worker} outlived its main process"
    finally:
        if worker is not None and not _gone(worker):
            os.kill(worker, signal.SIGKILL)
        main.kill()
        main.wait(timeout=10)
        main.stdout.close()


# ----- a stopped worker process: the watchdog says where, close() does not wait for it ------

STOPPABLE_SPEC = f"""
watchdog: 1
workers: {{copies: 2, method: process, until: parse}}
nodes:
  files: {{op: list_files, url: "{NUMBERS}/*/*.txt"}}
  shard: {{op: shard}}
  parse: {{op: map, fn: "conveyor.files:read_numbers"}}
  batch: {{op: batch, size: 2}}
output: batch
"""


def test_a_stopped_worker_is_named_by_the_watchdog_and_killed_at_close(write_spec, caplog) -> None:
    import os
    import signal

    loader = load_graph(write_spec(STOPPABLE_SPEC))
    stopped = None

    def endless() -> None:
        try:
            while True:
                for _ in loader:
                    pass
        except RuntimeError:  # closed under it
            pass

    try:
        next(iter(loader))  # (on a busy machine the workers' start may be reported as a stall)
        copies = loader.nodes["parse"]
        stopped = copies._workers[1]
        os.kill(stopped.pid, signal.SIGSTOP)
        caplog.clear()
        threading.Thread(target=endless, daemon=True).start()
        with caplog.at_level(logging.WARNING):
            def said_stopped() -> list[str]:
                return [r.getMessage() for r in caplog.records if "copy 1 (process" in r.getMessage()
                        and "stopped" in r.getMessage()]

            assert _wait_until(said_stopped, timeout=60), [r.getMessage() for r in caplog.records]
            said = said_stopped()[0]
            assert "no item has moved" in said
            assert "'batch' (batch" in said and "'parse' (map, in worker copies up to here" in said, said
            assert f"waits for worker copy 1 (process, pid {stopped.pid}, stopped" in said, said
            t0 = time.monotonic()
            loader.close()
            assert time.monotonic() - t0 < 15  # a bound, not a speed: 10.5 s before, and a hung exit
        assert stopped.exitcode == -signal.SIGKILL
        assert any("killed worker copy 1" in r.getMessage() for r in caplog.records)
    finally:
        if stopped is not None and stopped.is_alive():
            os.kill(stopped.pid, signal.SIGKILL)
        loader.close()


def test_the_watchdog_spec_key_is_checked(write_spec) -> None:
    import pytest

    from conveyor import SpecErrors

    with pytest.raises(SpecErrors, match="watchdog must be a number of seconds >= 0"):
        load_graph(write_spec(STOPPABLE_SPEC.replace("watchdog: 1", "watchdog: soon")))


# ----- close() waits (boundedly) for a prefetch thread busy in its input --------------------

SLOW_SPEC = f"""
nodes:
  files: {{op: list_files, url: "{NUMBERS}/*/*.txt"}}
  wait:  {{op: map, fn: "helpers_fns:slow", args: {{seconds: 1.5}}}}
  out:   {{op: prefetch, depth: 1}}
output: out
"""


def test_close_ends_a_prefetch_thread_busy_in_its_input(write_spec) -> None:
    # torchdata joins it for 0.5 s and leaves it running: at interpreter exit such a thread,
    # still inside torch code, can abort the process
    loader = load_graph(write_spec(SLOW_SPEC))
    try:
        next(iter(loader))  # the prefetch thread is now inside the next 1.5 s item
    finally:
        loader.close()
    assert not [t.name for t in threading.enumerate() if "_populate_queue" in t.name]


# ----- python - <<EOF: worker processes cannot import a main read from stdin ----------------

FROM_STDIN = """
import logging, sys
logging.basicConfig()
sys.path.insert(0, %r)
from conveyor import load_graph
if __name__ == "__main__":
    out = []
    for spec in sys.argv[1:3]:
        with load_graph(spec) as loader:
            out.append([i for _ in range(2) for b in loader for i in b["index"].tolist()])
    print("same" if out[0] == out[1] and len(out[0]) == 80 else f"differ {out}", flush=True)
    with load_graph(sys.argv[1]) as loader:
        print(loader.nodes["batch"].method, flush=True)
    with load_graph(sys.argv[3]) as loader:  # map's own worker processes
        print(len(list(loader)), loader.nodes["parse"].method, flush=True)
""" % str(TESTS)


def test_worker_processes_fall_back_to_threads_when_main_comes_from_stdin(write_spec) -> None:
    procs = write_spec(COPIES_SPEC.replace("output: batch", "  collate: {op: collate}\noutput: collate")
                       .replace("until: parse", "until: batch"), "procs.yaml")
    threads = write_spec(procs.read_text().replace("method: process", "method: thread"), "threads.yaml")
    mapped = write_spec(PROCESS_MAP_SPEC.replace("method: process", "method: process, mp_context: spawn"),
                        "map.yaml")  # (under fork, map's processes import nothing: they just run)
    out = subprocess.run([sys.executable, "-", str(procs), str(threads), str(mapped)], input=FROM_STDIN,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["same", "thread", "10", "thread"], out.stdout + out.stderr[-2000:]
    said = [line for line in out.stderr.splitlines() if "worker processes need a script file" in line]
    assert len(said) == 2 and "2 worker copies" in said[0] and "node 'parse' (map)" in said[1], said
    assert "__main__" not in out.stderr  # not the advice to add the guard the script already has


# ----- one watchdog thread for the process -------------------------------------------------

@pytest.fixture
def watchers(monkeypatch):
    """The process's watchdog thread, made anew for the test (an earlier test's loader, still
    open or idle, keeps the shared one)."""
    from conveyor.graphs import watchdog as wd

    fresh = wd._Watchers()
    monkeypatch.setattr(wd, "_watchers", fresh)
    return fresh


def test_every_watchdog_is_looked_at_by_one_thread_which_ends_after_the_last_stops(watchers, caplog) -> None:
    from conveyor.graphs import watchdog as wd

    moving = [0]
    stalled = wd.Watchdog(0.2, progress=lambda: 0, report=lambda s: f"stalled dog: nothing for {s:.1f} s")
    busy = wd.Watchdog(0.2, progress=lambda: moving[0], report=lambda s: "busy dog stalled")
    with caplog.at_level(logging.WARNING, logger=wd.__name__):
        stalled.start()
        busy.start()
        thread = watchers._thread
        assert thread is not None and thread.is_alive() and thread.name == "conveyor-watchdog"
        stalled.entered += 1  # a caller waits on each; only the stalled one's graph stands still
        busy.entered += 1
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            moving[0] += 1
            time.sleep(0.01)
        stalled.stop()
        busy.stop()
    said = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("stalled dog: nothing for") for m in said), said
    assert stalled.warnings >= 2  # and again every `after` seconds while the stall lasts
    assert busy.warnings == 0 and "busy dog stalled" not in said
    thread.join(timeout=wd._IDLE + 5)  # it ends once no watchdog is left
    assert not thread.is_alive() and watchers._thread is None


def test_loaders_made_one_after_another_share_the_watchdog_thread(watchers, write_spec) -> None:
    spec = write_spec(STOPPABLE_SPEC.replace("workers: {copies: 2, method: process, until: parse}\n", ""))
    threads = []
    for _ in range(3):
        with load_graph(spec) as loader:
            assert sum(len(b) for b in loader) > 0
            threads.append(watchers._thread)
    assert threads[0] is not None and threads == [threads[0]] * 3  # each loader's, the same thread


def test_a_forked_child_gets_a_watchdog_thread_of_its_own() -> None:
    import multiprocessing as mp

    from conveyor.graphs import watchdog as wd

    parent = wd.Watchdog(60, progress=lambda: 0, report=lambda s: "")
    parent.start()  # the parent's thread runs while the child forks
    try:
        ctx = mp.get_context("fork")
        child = ctx.Process(target=_child_watch)
        child.start()
        child.join(timeout=30)
        assert child.exitcode == 0, child.exitcode
    finally:
        parent.stop()


def _child_watch() -> None:
    from conveyor.graphs import watchdog as wd

    dog = wd.Watchdog(0.1, progress=lambda: 0, report=lambda s: "child stalled")
    dog.start()
    dog.entered += 1
    deadline = time.monotonic() + 10
    while not dog.warnings and time.monotonic() < deadline:
        time.sleep(0.02)
    dog.stop()
    sys.exit(0 if dog.warnings else 3)

"""Shared fixtures. Each block below belongs to the tests named in its header."""

from __future__ import annotations

import functools
import gzip
import os
import sys
import threading
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
if str(TESTS) not in sys.path:  # specs in tests/ name helper functions as helpers_fns:<name>
    sys.path.insert(0, str(TESTS))

# Nothing talks to any address but 127.0.0.1: the torchrun jobs' gloo groups (started with
# --master_addr=127.0.0.1) bind the address the host name resolves to unless told an interface,
# which on a machine whose name is its interface address is that address. Every process the
# tests start inherits this (Ray's cluster: tests/ray_cluster.py).
import socket  # noqa: E402

if "lo" in {name for _, name in socket.if_nameindex()}:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

# Worker processes whose start method is not what a test is about start from multiprocessing's
# fork server (``mp_context: forkserver``), not by forking this process: by the time such a
# test runs, this process holds threads and native libraries' state that earlier tests left
# (fsspec's event loop, gloo, Ray's client, torch's pools), and a child forked while one of
# them held a lock waits on it for ever (both copies of test_lent.py hung so, once in CI). The
# server is one fresh process per pytest process, single-threaded, with torch and conveyor
# imported once: its children start as fast as forks of this one (~0.1 s; spawn: ~14 s for
# two on a busy host).
import multiprocessing  # noqa: E402

multiprocessing.set_forkserver_preload(["torch", "conveyor", "conveyor.graphs.compile", "conveyor.nodes.copies",
                                        "helpers_fns", "chain_fns"])


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


# ----- parallel runs (pytest-xdist; pyproject's addopts say `-n auto --dist loadgroup`) --------

_MOST_WORKERS = 4  # each torchrun test starts 2-4 ranks of its own: more workers only crowd them
_WORKERS_A_CORE = 2  # much of the suite waits on processes it starts (torchrun, ray start, spawn,
# the CLI): on the 2-core host with two busy loops (.ci/busy, fresh clone at 40252b2, 2026-12-03)
# 2 workers took 862 s, 3 took 690 s, 4 took 644 s, all 1,176 tests passing each time


def pytest_xdist_auto_num_workers(config) -> int:
    """How many workers `-n auto` starts: two a core up to four, or PYTEST_XDIST_AUTO_NUM_WORKERS;
    0 (the tests run in this process, as without xdist) when the command names one test file,
    so `python -m pytest tests/test_x.py` starts no workers."""
    env = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS")
    if env:
        return int(env)
    files = {arg.split("::", 1)[0] for arg in config.args}
    if len(files) == 1 and Path(next(iter(files))).is_file():
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(_MOST_WORKERS, _WORKERS_A_CORE * cores))


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups into the test ids
def pytest_collection_modifyitems(config, items) -> None:
    """Keeps the tests that share a module-scoped fixture (a moto server, the Ray cluster, one
    torchrun job or CLI run whose output several tests read) in one xdist worker, so each such
    fixture is set up once, not once a worker: they get the group of their file. The others
    go to whichever worker is free."""
    for item in items:
        defs = getattr(item, "_fixtureinfo", None)
        if defs is None:
            continue
        scopes = {d.scope for fixturedefs in defs.name2fixturedefs.values() for d in fixturedefs}
        if scopes & {"module", "class", "package"}:
            item.add_marker(pytest.mark.xdist_group(Path(str(item.fspath)).stem))


def pytest_collection_finish(session) -> None:
    """In an xdist worker under ``--dist loadgroup``: warn when the groups did not reach the
    test ids (xdist adds ``@<group>`` to them; under pytest 9.2 with pytest-xdist 3.8 it cannot),
    since each module fixture is then set up once a worker (seen on 4 Dec 2026 in a fresh venv:
    tests/test_ray.py's cluster started in each of the four workers)."""
    import warnings

    if not hasattr(session.config, "workerinput") or not session.config.getvalue("loadgroup"):
        return
    lost = [item.nodeid for item in session.items
            if item.get_closest_marker("xdist_group") is not None and "@" not in item.nodeid]
    if lost:
        warnings.warn(pytest.PytestWarning(
            f"--dist loadgroup did not group {len(lost)} tests (e.g. {lost[0]}): this pytest and "
            "pytest-xdist do not work together there, so module fixtures are set up once a worker; "
            "install the test extra's pins (pyproject.toml)"))


@pytest.hookimpl(wrapper=True)
def pytest_collection(session):
    """Every xdist worker must collect the same test ids, and gzip stamps the current second into
    its header: a parameter made with ``gzip.compress`` at collection (test_text_batches.py) made
    ids that differed between workers ("Different tests were collected"). During collection its
    default mtime is 0; a caller that passes one keeps it."""
    real = gzip.compress
    gzip.compress = functools.partial(real, mtime=0)
    try:
        return (yield)
    finally:
        gzip.compress = real

"""Closing: every thread stops; a loader nobody closed does not hang or abort the process."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

from conveyor import load_graph

ROOT = Path(__file__).resolve().parent.parent


def _wait_for_threads(baseline: set[int], timeout: float = 5.0) -> list[threading.Thread]:
    deadline = time.monotonic() + timeout
    while True:
        extra = [t for t in threading.enumerate() if t.ident not in baseline and t.is_alive()]
        if not extra or time.monotonic() > deadline:
            return extra
        time.sleep(0.05)


@pytest.mark.parametrize("spec", ["imagenet.yaml", "numbers.yaml"])
def test_close_mid_epoch_stops_every_thread(spec: str) -> None:
    baseline = {t.ident for t in threading.enumerate()}
    loader = load_graph(ROOT / "specs" / spec, batch_size=4)
    it = iter(loader)
    next(it)
    assert len(threading.enumerate()) > len(baseline)  # prefetch and map threads are running
    loader.close()
    loader.close()  # twice is fine
    assert _wait_for_threads(baseline) == []
    with pytest.raises(RuntimeError, match="closed"):
        iter(loader)


def test_context_manager_closes_and_dropped_loader_is_closed_by_gc() -> None:
    import gc

    baseline = {t.ident for t in threading.enumerate()}
    with load_graph(ROOT / "specs/numbers.yaml", batch_size=4) as loader:
        next(iter(loader))
    assert _wait_for_threads(baseline) == []

    dropped = load_graph(ROOT / "specs/numbers.yaml", batch_size=4)
    next(iter(dropped))
    del dropped
    gc.collect()
    assert _wait_for_threads(baseline) == []


@pytest.mark.parametrize("spec, close", [("pretrain.yaml", True), ("text.yaml", True), ("text.yaml", False),
                                         ("imagenet.yaml", True), ("imagenet.yaml", False)])
def test_a_loader_let_go_frees_its_nodes_without_the_garbage_collector(spec: str, close: bool) -> None:
    """Closed or only dropped, mid-epoch, after a state, a restore, len() and stats, a loader's
    nodes (their shuffle windows, bucket and pack pools) go with its last reference: they are in
    no reference cycle. A cycle left them to the collector's full passes, which a graph
    allocating numpy arrays seldom sets off: each fresh pretrain.yaml loader kept ~15 MB more,
    and past ~8 of them first epochs ran 2-3 x slower."""
    import gc
    import weakref

    baseline = {t.ident for t in threading.enumerate()}
    gc.collect()
    gc.disable()
    try:
        loader = load_graph(ROOT / "specs" / spec)
        it = iter(loader)
        for _ in range(3):
            next(it)
        state = loader.state_dict()  # (the state's check, len() and the stats made cycles too)
        loader.stats()
        if spec == "imagenet.yaml":
            assert len(loader) > 3
        else:  # the data decide text.yaml's and pretrain.yaml's length
            with pytest.raises(TypeError):
                len(loader)
        loader.load_state_dict(state)
        it = iter(loader)
        next(it)
        nodes = {name: weakref.ref(node) for name, node in loader.nodes.items()}
        assert all(ref() is not None for ref in nodes.values())
        if close:
            loader.close()
        del loader, it, _
        assert _wait_for_threads(baseline) == []  # (a thread still running holds its node)
        assert [name for name, ref in nodes.items() if ref() is not None] == []
    finally:
        gc.enable()


DROP_MID_EPOCH = """
import sys
from conveyor import load_graph
loader = load_graph(sys.argv[1], batch_size=4)
for i, batch in enumerate(loader):
    if i == 2:
        break
print("dropped mid-epoch", flush=True)
"""


def test_process_exits_cleanly_with_an_unclosed_loader(forker, tmp_path: Path) -> None:
    # torchdata's own Loader can abort the interpreter at exit here ("terminate called
    # without an active exception"); ours must exit 0 every time. Each run is a real process
    # that ends through the interpreter's own exit (forked from one that imported torch:
    # tests/forked_python.py), so the 4 tries do not pay 4 torch start-ups.
    script = tmp_path / "drop_mid_epoch.py"
    script.write_text(DROP_MID_EPOCH)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    for _ in range(4):
        out = forker.run([sys.executable, str(script), str(ROOT / "specs/imagenet.yaml")], env=env, timeout=60)
        assert out.returncode == 0, out.stderr[-2000:]
        assert "dropped mid-epoch" in out.stdout
        assert "terminate called" not in out.stderr

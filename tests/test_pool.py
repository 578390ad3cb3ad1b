"""map's ordered thread pool: threads that outlive epochs, and nothing stale after a reset."""

from __future__ import annotations

import threading
import time

from torchdata.nodes import IterableWrapper

from conveyor.nodes.map import Map


def test_threads_persist_across_epochs_and_a_reset_drops_results_in_flight() -> None:
    threads: set[int] = set()

    def times_ten(x: int) -> int:
        threads.add(threading.get_ident())
        time.sleep(0.001)
        return x * 10

    before = set(threading.enumerate())  # (an earlier test's unclosed map may still be collected)
    node = Map(IterableWrapper(range(50)), fn=times_ten, workers=2, max_concurrent=6)
    try:
        node.reset()
        first = [next(node) for _ in range(5)]  # leave the epoch with 6 items in flight
        node.reset()
        whole = list(node)
        node.reset()
        again = list(node)
    finally:
        node.close()
    assert first == [0, 10, 20, 30, 40]
    assert whole == again == [x * 10 for x in range(50)]  # from the start, nothing stale
    assert len(threads) == 2  # the same two threads for all three epochs
    assert not [t.name for t in threading.enumerate() if t not in before]  # closed: its threads ended


def test_the_state_is_a_snapshot_and_a_count_whatever_the_window() -> None:
    node = Map(IterableWrapper(range(30)), fn=lambda x: x, workers=3, max_concurrent=9, snapshot_every=4)
    try:
        node.reset()
        for _ in range(10):
            next(node)
        state = node.state_dict()
        rest = list(node)
        node.reset(state)
        assert list(node) == rest == list(range(10, 30))
    finally:
        node.close()
    assert state[Map.SKIP_KEY] < 4  # re-read on restore: under one snapshot gap, whatever the window

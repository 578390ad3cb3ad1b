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


def test_uneven_items_come_out_in_order_with_at_most_the_window_in_flight() -> None:
    lock = threading.Lock()
    inside = [0, 0]  # now, most at once

    def uneven(x: int) -> int:
        with lock:
            inside[0] += 1
            inside[1] = max(inside[1], inside[0])
        time.sleep(0.002 if x % 7 == 0 else 0.0001)  # later items often finish first
        with lock:
            inside[0] -= 1
        return x * 3

    read = []

    def counted():
        for x in range(200):
            read.append(x)
            yield x

    node = Map(IterableWrapper(counted()), fn=uneven, workers=3, max_concurrent=5)
    try:
        node.reset()
        got = []
        for _ in range(200):
            got.append(next(node))
            assert len(read) - len(got) <= 5  # read ahead of what was emitted: the window at most
    finally:
        node.close()
    assert got == [x * 3 for x in range(200)]
    assert inside[1] <= 3


def test_close_wakes_a_thread_waiting_for_an_item_with_an_error() -> None:
    started = threading.Event()
    release = threading.Event()

    def slow(x: int) -> int:
        started.set()
        release.wait(10)
        return x

    node = Map(IterableWrapper(range(10)), fn=slow, workers=1)
    node.reset()
    caught: list[BaseException] = []

    def consume() -> None:
        try:
            next(node)
        except BaseException as exc:  # noqa: BLE001 - the test checks what it was
            caught.append(exc)

    waiter = threading.Thread(target=consume)
    waiter.start()
    assert started.wait(10)
    time.sleep(0.05)  # the waiter is asleep on the item now
    threading.Timer(0.1, release.set).start()  # fn ends after close() woke the waiter
    node.close()
    waiter.join(10)
    assert not waiter.is_alive()
    assert len(caught) == 1 and isinstance(caught[0], RuntimeError) and "closed" in str(caught[0])


def test_a_stuck_later_item_keeps_no_finished_one_back() -> None:
    # the caller gathers results (waits for the window's middle one), but items before a
    # stuck one must still come out: here items 20 and on block until the test lets them go
    gate = threading.Event()

    def fn(x: int) -> int:
        if x >= 20:
            gate.wait(20)
        return x

    node = Map(IterableWrapper(range(24)), fn=fn, workers=2)
    node.reset()
    try:
        got = []
        t0 = time.monotonic()
        for _ in range(20):
            got.append(next(node))
        assert got == list(range(20)) and time.monotonic() - t0 < 10  # not after the gate's 20 s
        gate.set()
        assert list(node) == [20, 21, 22, 23]
    finally:
        gate.set()
        node.close()

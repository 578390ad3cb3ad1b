"""prefetch's adapt: items made in the caller's thread while the consumer comes straight back for
each one, a thread again once it spends time away, and exact resume across the switches."""

from __future__ import annotations

import json
import threading
import time

import pytest
from torchdata.nodes import BaseNode

from conveyor.nodes.prefetch import WINDOW, Prefetch


class _Slow(BaseNode):
    """0..n-1, each after ``delay`` seconds (an input whose items take time to make)."""

    def __init__(self, n: int, delay: float):
        super().__init__()
        self.n, self.delay, self.i = n, delay, 0

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self.i = initial_state["i"] if initial_state else 0

    def next(self) -> int:
        if self.i >= self.n:
            raise StopIteration
        time.sleep(self.delay)
        self.i += 1
        return self.i - 1

    def get_state(self) -> dict:
        return {"i": self.i}


def _threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "conveyor-prefetch" and t.is_alive()}


def test_a_consumer_that_comes_straight_back_gets_its_items_made_inline(no_new_threads) -> None:
    n = 4 * WINDOW
    node = Prefetch(_Slow(n, 0.003), depth=4)  # (a busy host's hiccups stay under 10 % of it)
    node.reset()
    assert not node.inline and _threads()  # it starts with a thread: nothing is known yet
    got = list(node)
    assert got == list(range(n))
    assert node.inline and node.switches == 1
    assert node.stats() == {"made_in": "caller", "mode_switches": 1}
    assert not _threads()  # parked: the thread ended after handing out what it had made
    node.reset()  # the mode holds across epochs: no thread is started
    assert node.inline and not _threads()
    assert list(node) == list(range(n))
    node.close()


def test_a_consumer_away_between_items_keeps_the_thread_or_gets_it_back(no_new_threads) -> None:
    n = 6 * WINDOW
    node = Prefetch(_Slow(n, 0.0005), depth=4)
    node.reset()
    got = [next(node) for _ in range(2 * WINDOW + 2)]  # straight back: inline
    assert node.inline
    for _ in range(2 * WINDOW):
        got.append(next(node))
        time.sleep(0.01)  # a training step: twenty times an item's make time
    assert not node.inline and node.switches == 2 and _threads()
    got += list(node)
    assert got == list(range(n))
    node.close()


def test_adapt_false_keeps_the_thread() -> None:
    node = Prefetch(_Slow(3 * WINDOW, 0.0005), depth=4, adapt=False)
    node.reset()
    assert list(node) == list(range(3 * WINDOW))
    assert not node.inline and node.switches == 0
    assert node.stats() == {"made_in": "thread", "mode_switches": 0}
    node.close()
    with pytest.raises(ValueError, match="adapt"):
        Prefetch(_Slow(1, 0), adapt="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("pause_from", [None, WINDOW + 3])
def test_resume_from_every_step_across_the_switches(pause_from: int | None) -> None:
    # one run whose mode switches (to inline after the first window; back to a thread where
    # the consumer starts pausing), its state taken (through JSON) after every item: each
    # restores, in a fresh node, to exactly the rest of the items
    n = 3 * WINDOW
    node = Prefetch(_Slow(n, 0.0005), depth=3)
    node.reset()
    states, got = [json.loads(json.dumps(node.state_dict()))], []
    for i in range(n):
        got.append(next(node))
        if pause_from is not None and i >= pause_from:
            time.sleep(0.01)
        states.append(json.loads(json.dumps(node.state_dict())))
    assert got == list(range(n)) and node.switches >= 1
    node.close()
    for k, state in enumerate(states):
        again = Prefetch(_Slow(n, 0), depth=3)
        again.reset(state)
        assert list(again) == list(range(k, n)), f"resume after {k} items"
        again.close()


def test_an_input_error_made_inline_reaches_the_consumer_as_itself() -> None:
    class Boom(_Slow):
        def next(self) -> int:
            if self.i == 2 * WINDOW:
                raise KeyError("item 64")
            return super().next()

    node = Prefetch(Boom(3 * WINDOW, 0.0005), depth=4)
    node.reset()
    got = []
    with pytest.raises(KeyError, match="item 64"):
        for x in node:
            got.append(x)
    assert node.inline and got == list(range(2 * WINDOW))
    with pytest.raises(StopIteration):  # the epoch is over, as with the thread
        next(node)
    node.close()

"""Items in lists between nodes (conveyor/nodes/capabilities.py) and prefetch's lists.

``next_many(n)`` must give exactly the items ``n`` calls of ``next()`` would, leave the same
state behind, and never lose or repeat an item at a list's edge; the instrumentation counts
the items of a list as items. Prefetch hands lists over, but its first item comes alone, and
what it emits and its states are those of the item-by-item path.
"""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest
from torchdata.nodes import BaseNode, IterableWrapper

from conveyor.graphs.instrument import Counted
from conveyor.nodes.capabilities import take, take_exactly
from conveyor.nodes.list_files import ListFiles
from conveyor.nodes.map_batches import MapBatches
from conveyor.nodes.prefetch import FIRST_WINDOW, WINDOW, Prefetch
from conveyor.nodes.read_jsonl import ReadJsonl
from conveyor.nodes.shuffle_buffer import ShuffleBuffer
from conveyor.text import byte_tokenize


def _write(tmp: Path) -> str:
    """3 JSONL files with short, long, bad and blank lines (read_jsonl's blocks are 1 MiB,
    so one file holds a block edge too)."""
    rng = random.Random(0)
    for f in range(3):
        lines = []
        for i in range(400 if f < 2 else 3000):
            r = rng.random()
            if r < 0.03:
                lines.append("not json")
            elif r < 0.05:
                lines.append("")
            else:
                lines.append(json.dumps({"text": "x" * rng.randint(1, 900 if f == 2 else 50), "n": i}))
        (tmp / f"p{f}.jsonl").write_text("\n".join(lines) + "\n")
    return str(tmp / "*.jsonl")


def _reader(url: str) -> ReadJsonl:
    return ReadJsonl(ListFiles(url=url, shuffle=True, seed=3), field="text", on_error="skip")


MAKERS: dict[str, Callable[[str], BaseNode]] = {
    "read_jsonl": _reader,
    "shuffle_buffer": lambda url: ShuffleBuffer(_reader(url), size=37, seed=1),
    "map batch": lambda url: MapBatches(ShuffleBuffer(_reader(url), size=37, seed=1),
                                        fn=byte_tokenize, size=16),
    "counted": lambda url: Counted(ShuffleBuffer(Counted(_reader(url)), size=37, seed=1)),
}


def _key(item: Any) -> tuple:
    ids = item.get("input_ids")
    return (item["file"], item["line"], None if ids is None else bytes(ids.astype("uint8")))


def _by_one(node: BaseNode) -> list:
    node.reset()
    return [_key(x) for x in node]


def _by_lists(node: BaseNode, rng: random.Random, state: dict | None = None) -> tuple[list, list]:
    """All items pulled in lists of random sizes; the states taken after each list."""
    node.reset(state)
    out, states = [], []
    while True:
        try:
            got = take(node, rng.choice([1, 2, 3, 7, 64, 500]))
        except StopIteration:
            return out, states
        assert got, "take gave an empty list instead of StopIteration"
        out += [_key(x) for x in got]
        states.append((len(out), json.loads(json.dumps(node.state_dict()))))


@pytest.mark.parametrize("name", list(MAKERS))
def test_lists_give_the_items_and_states_of_one_at_a_time(tmp_path: Path, name: str) -> None:
    url = _write(tmp_path)
    make = MAKERS[name]
    whole = _by_one(make(url))
    assert len(whole) > 3000
    got, states = _by_lists(make(url), random.Random(5))
    assert got == whole
    for pos, state in states[:: max(len(states) // 6, 1)]:  # a state after a list resumes right after it
        rest, _ = _by_lists(make(url), random.Random(pos), state)
        assert got[:pos] + rest == whole, f"resume after {pos} items"


def test_counted_counts_the_items_of_a_list() -> None:
    node = Counted(IterableWrapper(range(10)))
    node.reset()
    assert take(node, 4) == [0, 1, 2, 3] and node.items == 4
    assert take_exactly(node, 100) == [4, 5, 6, 7, 8, 9] and node.items == 10
    with pytest.raises(StopIteration):
        take(node, 3)
    assert take_exactly(node, 3) == []


class _Gate(BaseNode):
    """0, 1, 2, ...; item ``i`` >= ``free`` waits until ``open`` is set."""

    def __init__(self, n: int, free: int = 1):
        super().__init__()
        self.n = n
        self.free = free
        self.open = threading.Event()

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self.i = initial_state["i"] if initial_state else 0

    def next(self) -> int:
        if self.i >= self.n:
            raise StopIteration
        if self.i >= self.free:
            assert self.open.wait(10), "the test did not open the gate"
        self.i += 1
        return self.i - 1

    def get_state(self) -> dict:
        return {"i": self.i}


def test_prefetch_hands_over_its_first_item_alone() -> None:
    # the thread hands items over in lists of up to depth; the first one of an epoch must not
    # wait for the rest of its list (here they cannot come until it has been taken)
    gate = _Gate(9)
    node = Prefetch(gate, depth=4)
    node.reset()
    try:
        assert next(node) == 0
        gate.open.set()
        assert list(node) == list(range(1, 9))
    finally:
        node.close()


@pytest.mark.parametrize("depth,every", [(1, 1), (3, 1), (4, 3)])
def test_prefetch_lists_resume_from_every_step(depth: int, every: int) -> None:
    def make() -> Prefetch:
        return Prefetch(IterableWrapper(range(23)), depth=depth, snapshot_every=every)

    for k in range(24):
        node = make()
        node.reset()
        head = [next(node) for _ in range(k)]
        state = json.loads(json.dumps(node.state_dict()))
        node.close()
        again = make()
        again.reset(state)
        assert head + list(again) == list(range(23)), f"resume after {k}"
        again.close()


def test_prefetch_raises_the_inputs_error_after_the_items_before_it() -> None:
    def boom(x: int) -> int:
        if x == 6:
            raise KeyError("item 6")
        return x

    from torchdata.nodes import Mapper

    node = Prefetch(Mapper(IterableWrapper(range(10)), boom), depth=4)
    node.reset()
    got = []
    with pytest.raises(KeyError, match="item 6"):
        for x in node:
            got.append(x)
    assert got == list(range(6))
    node.close()


def test_shuffle_refuses_a_mid_window_state_of_the_earlier_order() -> None:
    from conveyor.errors import StateError

    def make() -> ShuffleBuffer:
        return ShuffleBuffer(IterableWrapper(range(50)), size=20, seed=2)

    node = make()
    node.reset()
    head = [next(node) for _ in range(7)]
    state = node.state_dict()
    old = {k: v for k, v in state.items() if k != ShuffleBuffer.ORDER_KEY}  # as earlier versions saved it
    again = make()
    with pytest.raises(StateError, match="earlier conveyor"):
        again.reset(old)
    again.reset(state)  # this version's state resumes exactly
    assert head + list(again) == _whole(make())
    at_start = make()
    at_start.reset({**old, ShuffleBuffer.POS_KEY: 0})  # a window's start holds no order: fine
    assert sorted(at_start) == list(range(50))


def _whole(node: BaseNode) -> list:
    node.reset()
    return list(node)


def test_prefetch_holds_back_no_item_while_it_waits_for_the_consumer() -> None:
    # depth 4: the thread makes 4 items and then waits for a credit; all 4 must be in the
    # queue by then (a list it kept back would wait on a consumer that waits on it)
    node = Prefetch(IterableWrapper(range(10)), depth=4, adapt=False)
    node.reset()
    try:
        deadline = time.monotonic() + 10
        while node.ready() < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert node.ready() == 4
        assert list(node) == list(range(10))
    finally:
        node.close()


def test_prefetch_keeps_no_made_item_back_while_its_input_stalls() -> None:
    # item 1 is made, then the input stalls on item 2: the list of 4 it would start is never
    # full, and the consumer must still get item 1 (after a short look), not wait on the stall
    gate = _Gate(6, free=2)
    node = Prefetch(gate, depth=4)
    node.reset()
    try:
        assert next(node) == 0
        t0 = time.monotonic()
        assert next(node) == 1
        assert time.monotonic() - t0 < 5  # a look every 20 ms; the gate would wait 10 s
        gate.open.set()
        assert list(node) == [2, 3, 4, 5]
    finally:
        gate.open.set()
        node.close()


# ----- prefetch's adapt: made in the caller's thread while the consumer comes straight back for
# each item, a thread again once it spends time away, and exact resume across the switches ----

class _Slow(_Gate):
    """0..n-1, each after ``delay`` seconds (an input whose items take time to make)."""

    def __init__(self, n: int, delay: float):
        super().__init__(n, free=n)
        self.delay = delay

    def next(self) -> int:
        if self.i < self.n:
            time.sleep(self.delay)
        return super().next()


def _threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "conveyor-prefetch" and t.is_alive()}


def test_a_consumer_that_comes_straight_back_gets_its_items_made_inline(no_new_threads) -> None:
    n = 4 * WINDOW
    node = Prefetch(_Slow(n, 0.003), depth=4)  # (a busy host's hiccups stay under 10 % of it)
    node.reset()
    assert node.inline and not _threads()  # nothing is known yet: made in the caller's thread
    got = list(node)
    assert got == list(range(n))
    assert node.inline and node.switches == 0 and not _threads()
    assert node.stats() == {"made_in": "caller", "mode_switches": 0}
    node.reset()  # the mode holds across epochs
    assert node.inline and not _threads()
    assert list(node) == list(range(n))
    node.close()


def test_a_consumer_away_between_items_gets_a_thread_and_gives_it_back(no_new_threads) -> None:
    n = 6 * WINDOW
    node = Prefetch(_Slow(n, 0.0005), depth=4)
    node.reset()
    got = []
    for _ in range(FIRST_WINDOW + 2):
        got.append(next(node))
        time.sleep(0.01)  # a training step: twenty times an item's make time
    assert not node.inline and node.switches == 1 and _threads()  # a thread from the first look on
    got += [next(node) for _ in range(2 * WINDOW + 2)]  # straight back: the thread is parked
    assert node.inline and node.switches == 2 and not _threads()
    for _ in range(WINDOW + 2):
        got.append(next(node))
        time.sleep(0.01)
    assert not node.inline and node.switches == 3 and _threads()  # and started again
    got += list(node)
    assert got == list(range(n))
    node.close()
    assert not _threads()


def _spin(seconds: float) -> None:
    """Python work for ``seconds``, holding the GIL (a consumer's step in pure Python)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_a_consumer_whose_time_away_holds_the_gil_gets_its_items_made_inline(no_new_threads) -> None:
    # cheap items, a consumer away ~50 us between them in Python: away is many times the make
    # time, so the first look starts a thread; but the thread cannot run while the consumer
    # holds the GIL, and each hand-over costs thread switches, so the consumer waits longer for
    # an item than making it takes: the next look parks the thread, and it is not started again
    # for that same time away (a graph whose output is records had paid ~17 us an item so)
    n = FIRST_WINDOW + 6 * WINDOW
    node = Prefetch(IterableWrapper(range(n)), depth=4)
    node.reset()
    got = []
    for _ in range(FIRST_WINDOW + 1):
        got.append(next(node))
        _spin(5e-5)
    assert not node.inline and node.switches == 1 and _threads()  # away >> make: a thread
    for _ in range(2 * WINDOW):
        got.append(next(node))
        _spin(5e-5)
    assert node.inline and node.switches == 2 and not _threads()  # it lost: parked
    for item in node:
        got.append(item)
        _spin(5e-5)
    assert got == list(range(n))
    assert node.inline and node.switches == 2 and not _threads()  # not started again
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


@pytest.mark.parametrize("paused", [(0, FIRST_WINDOW + 3), (WINDOW + 3, 3 * WINDOW)])
def test_resume_from_every_step_across_the_switches(paused: tuple[int, int]) -> None:
    # one run whose mode switches (to a thread while the consumer pauses between items, back
    # inline where it comes straight back), its state taken (through JSON) after every item:
    # each restores, in a fresh node, to exactly the rest of the items
    n = 3 * WINDOW
    node = Prefetch(_Slow(n, 0.0005), depth=3)
    node.reset()
    states, got = [json.loads(json.dumps(node.state_dict()))], []
    for i in range(n):
        got.append(next(node))
        if paused[0] <= i < paused[1]:
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

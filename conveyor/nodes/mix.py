"""mix: weighted sampling over several inputs (dataset mixing, class balance).

Each draw picks an input with probability proportional to its weight among the inputs still
running, from a counter-based generator over (seed, epoch, draw number): the state is the
inputs' states, the number of draws, which inputs are done and how many items each gave
(``stats()["drawn"]``, so the counts of a resumed epoch are the uninterrupted run's).
``stop`` says when an epoch ends: ``all`` (when every input is exhausted; the others carry on
with renormalised weights), ``first`` (as soon as one input is exhausted, so the mix keeps its proportions),
``forever`` (an exhausted input restarts from its beginning; the epoch never ends).
"""

from __future__ import annotations

import math
from typing import Sequence

from torchdata.nodes import BaseNode

from conveyor.nodes._rng import uniform
from conveyor.nodes.state_shape import Bool, Children, Fields, Int, ListOf, Null

STOPS = ("all", "first", "forever")


def weights_problem(weights: Sequence[float]) -> str | None:
    """Why ``weights`` cannot weigh the inputs of a mix, or ``None``. A NaN or infinite weight
    (YAML's ``.nan``, ``.inf``), or weights whose sum overflows, made every draw pick the last
    input still running: the inputs one after the other, not mixed."""
    bad = [(i, w) for i, w in enumerate(weights) if not isinstance(w, (int, float)) or isinstance(w, bool)
           or not math.isfinite(w) or w < 0]
    if bad:
        i, w = bad[0]
        return f"weights must be finite numbers >= 0; weight {i} is {w!r}"
    if not any(w > 0 for w in weights):
        return "weights are all 0: nothing could be drawn"
    if not math.isfinite(sum(weights)):
        return f"weights must have a finite sum, got {weights!r}"
    return None


class Mix(BaseNode):
    """Draw items from ``sources`` at random with the given ``weights``.

    Args:
        sources: the inputs.
        weights: one non-negative weight per input, not all zero.
        stop: ``"all"``, ``"first"`` or ``"forever"``.
        seed: base seed (the draws also depend on the epoch).

    Example:
        >>> from torchdata.nodes import IterableWrapper
        >>> out = list(Mix([IterableWrapper("ab"), IterableWrapper("xyz")], weights=[1, 1]))
        >>> sorted(out)
        ['a', 'b', 'x', 'y', 'z']
    """

    INPUTS_KEY = "inputs"
    DRAWS_KEY = "draws"
    DONE_KEY = "done"
    DRAWN_KEY = "drawn"
    STATE_SHAPE = Fields({INPUTS_KEY: Children("sources"), DRAWS_KEY: Int(), DONE_KEY: ListOf(Bool(), length="sources"),
                          DRAWN_KEY: Null(ListOf(Int(), length="sources"))}, optional=(DRAWN_KEY,))

    def __init__(self, sources: Sequence[BaseNode], *, weights: Sequence[float], stop: str = "all",
                 seed: int = 0):
        super().__init__()
        if len(sources) < 1:
            raise ValueError("mix needs at least one input")
        if len(weights) != len(sources):
            raise ValueError(f"{len(weights)=} must equal the number of inputs ({len(sources)})")
        problem = weights_problem(weights)
        if problem:
            raise ValueError(f"{weights=}: {problem}")
        if stop not in STOPS:
            raise ValueError(f"{stop=} must be one of {STOPS}")
        self.sources = list(sources)
        self.weights = [float(w) for w in weights]
        self.stop = stop
        self.seed = seed
        self.epoch = 0
        self._draws = 0
        self._done = [w == 0 for w in self.weights]
        self.counts = [0] * len(self.sources)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def stats(self) -> dict:
        return {"drawn": list(self.counts)}

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self.counts = [0] * len(self.sources)
        if initial_state is not None:
            for src, st in zip(self.sources, initial_state[self.INPUTS_KEY]):
                src.reset(st)
            self._draws = initial_state[self.DRAWS_KEY]
            self._done = list(initial_state[self.DONE_KEY])
            self.counts = list(initial_state.get(self.DRAWN_KEY) or self.counts)  # (older states lack it)
        else:
            for src in self.sources:
                src.reset()
            self._draws = 0
            self._done = [w == 0 for w in self.weights]

    def _pick(self) -> int:
        live = [(i, w) for i, w in enumerate(self.weights) if not self._done[i]]
        total = sum(w for _, w in live)
        x = uniform(self.seed, self.epoch, self._draws) * total
        self._draws += 1
        for i, w in live:
            x -= w
            if x < 0:
                return i
        return live[-1][0]

    def next(self):
        while not all(self._done):
            i = self._pick()
            try:
                item = next(self.sources[i])
                self.counts[i] += 1
                return item
            except StopIteration:
                if self.stop == "first":
                    self._done = [True] * len(self.sources)
                elif self.stop == "forever":
                    self.sources[i].reset()
                    try:
                        item = next(self.sources[i])
                    except StopIteration:  # empty from its start: restarting would spin forever
                        raise ValueError(f"mix input {i} is empty; stop='forever' cannot restart it") from None
                    self.counts[i] += 1
                    return item
                else:
                    self._done[i] = True
        raise StopIteration

    def get_state(self) -> dict:
        return {self.INPUTS_KEY: [s.state_dict() for s in self.sources], self.DRAWS_KEY: self._draws,
                self.DONE_KEY: list(self._done), self.DRAWN_KEY: list(self.counts)}

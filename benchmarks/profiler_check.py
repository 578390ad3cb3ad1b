"""What the torch.profiler hook costs when no profiler records: one flag check per call.

``Counted.__next__`` looks at ``torch.autograd.profiler._is_profiler_enabled`` on every call
(graphs/instrument.py). This times a chain of 8 ``Counted`` nodes over a list, against the
same chain with a ``__next__`` that skips the check (what ``Counted`` was before), in
alternating rounds, in CPU time of the thread (``time.thread_time``: on a shared machine the
wall clock also counts other processes' turns); it prints ns per item per node for each (median
and best round) and their paired difference.

    python benchmarks/profiler_check.py [--items 200000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

from torchdata.nodes import IterableWrapper

from conveyor.graphs.instrument import Counted


class Unchecked(Counted):
    """``Counted`` without the profiler check."""

    def __next__(self):
        if self._timed:
            return self._measured()
        item = self._direct()
        self._n += 1
        return item

    next = __next__


def chain(cls: type, items: int, depth: int = 8) -> Counted:
    node = cls(IterableWrapper(range(items)), "n0")
    for i in range(1, depth):
        node = cls(node, f"n{i}")
    return node


def ns_per_call(cls: type, items: int, depth: int = 8) -> float:
    node = chain(cls, items, depth)
    node.reset()
    t0 = time.thread_time()
    for _ in node:
        pass
    return (time.thread_time() - t0) / items / depth * 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    runs: dict[str, list[float]] = {"checked": [], "unchecked": []}
    for r in range(args.rounds):
        order = [Counted, Unchecked] if r % 2 == 0 else [Unchecked, Counted]
        for cls in order:
            runs["checked" if cls is Counted else "unchecked"].append(ns_per_call(cls, args.items))
    diffs = [a - b for a, b in zip(runs["checked"], runs["unchecked"])]
    for name, values in runs.items():
        print(f"{name:>9}: median {statistics.median(values):6.1f} ns per item per node "
              f"(best {min(values):.1f}, worst {max(values):.1f})")
    print(f"difference: median {statistics.median(diffs):+.1f} ns per item per node (paired by round), "
          f"best rounds {min(runs['checked']) - min(runs['unchecked']):+.1f} ns")


if __name__ == "__main__":
    main()

"""What the always-on per-node stats cost: instrumented ``Counted`` against bare wrappers.

Every node of a compiled graph is wrapped in ``conveyor.graphs.instrument.Counted``, which
times each ``next()`` (two ``perf_counter`` calls), notes its thread, samples buffered
nodes' queues and, for maps with thread workers, times ``fn``. Three wrappers are compared,
on the same spec, in the same process:

  on      ``Counted``: all of the above
  bare    ``BareCounted``: the same lean dispatch (``Counted`` calls its inner node's
          ``next()`` directly and inlines BaseNode's ``__next__``), but only counts items:
          what measuring costs
  before  ``LegacyCounted`` (below): the wrapper as it was before issue 8, BaseNode's
          dispatch and a count: what switching to ``Counted`` costs a user

Workloads:

  imagenet    specs/imagenet.yaml on the bundled sample linked ``--copies`` times (JPEG
              decode in 2 threads: ~2 ms of work an item against ~1 us of wrappers)
  text        specs/text.yaml: byte tokenizing inline, ~20 us an item through 3 wrapped
              per-item nodes: the cheap-item worst case
  cheap-map   specs/imagenet.yaml with a near-free map fn (benchmarks/_common.py
              ``cheap_transform``) in 2 threads: bound by thread hand-offs

One loader per wrapper is built and run for an untimed epoch; then each round times
``--epochs`` epochs of each (from ``iter()`` to exhaustion), the order rotated every round.
The table gives median samples/s and the median of the per-round ratios (paired: a slow
spell on a shared machine hits all three of a round), and a prediction that noise cannot
touch: each wrapper's own cost (ns per item per node, on a chain of minimal nodes) times the
wrapped calls per sample, against the bare graph's best time per sample.

    python benchmarks/stats_overhead.py                 # ~3 min on 2 cores
    python benchmarks/stats_overhead.py --quick         # seconds: smoke test
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import _common as C  # noqa: E402
from torchdata.nodes import BaseNode, IterableWrapper  # noqa: E402

import conveyor.graphs.compile as compile_mod  # noqa: E402
from conveyor import load_graph  # noqa: E402
from conveyor.tools.measure import batch_len  # noqa: E402
from conveyor.graphs.instrument import BareCounted, Counted  # noqa: E402



class LegacyCounted(Counted):
    """The wrapper as it was before issue 8: BaseNode's dispatch, then a count."""

    __next__ = BaseNode.__next__

    def next(self):
        item = next(self.inner)
        self._n += 1
        return item


VARIANTS = {"on": Counted, "bare": BareCounted, "legacy": LegacyCounted}  # legacy: "before"


def build(spec: str, variant: str, overrides: dict[str, Any]) -> Any:
    """A loader whose nodes are wrapped in ``variant``'s class, run for one untimed epoch."""
    compile_mod.Counted = VARIANTS[variant]  # what compile_plan wraps every node in
    try:
        loader = load_graph(spec, **overrides)
    finally:
        compile_mod.Counted = Counted
    for _ in loader:
        pass
    return loader


def timed_epochs(loader: Any, epochs: int) -> tuple[float, float]:
    """(samples/s over ``epochs`` epochs, wrapped calls per sample in the last one)."""
    samples = last = 0
    t0 = time.perf_counter()
    for _ in range(epochs):
        last = 0
        for batch in loader:
            last += batch_len(batch)
        samples += last
    wall = time.perf_counter() - t0
    nodes = loader.stats()["nodes"].values()
    # every wrapped next(), plus the fn of maps with thread workers (also timed)
    calls = sum(e["items"] + (e["items"] if (e["perf"] or {}).get("threads", 1) > 1 else 0) for e in nodes)
    return samples / wall, calls / max(last, 1)


class _Pass(BaseNode):
    """A minimal node: passes its source's items through."""

    def __init__(self, source: BaseNode):
        super().__init__()
        self.source = source

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self.source.reset(initial_state)

    def next(self):
        return next(self.source)

    def get_state(self) -> dict:
        return self.source.state_dict()


def micro(nodes: int = 6, items: int = 200_000) -> dict[str, float]:
    """ns per item per node of each wrapper, on a chain of minimal nodes each wrapped as the
    compiler wraps them (so the cost includes what the wrapper saves or adds in dispatch)."""
    out = {}
    for variant in ("bare", "on", "legacy") * 3:
        node: Any = IterableWrapper(range(items))
        for _ in range(nodes):
            node = VARIANTS[variant](_Pass(node))
        node.reset()
        t0 = time.perf_counter()
        for _ in node:
            pass
        ns = 1e9 * (time.perf_counter() - t0) / (items * nodes)
        out[variant] = min(out.get(variant, float("inf")), ns)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--epochs", type=int, default=3, help="timed epochs per run")
    ap.add_argument("--copies", type=int, default=4, help="links per bundled image (imagenet)")
    ap.add_argument("--only", nargs="*", help="workloads to run (imagenet, text, cheap-map)")
    ap.add_argument("--quick", action="store_true", help="2 rounds, 1 epoch: a smoke test")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.epochs, args.copies = 2, 1, 1

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "train"
        n = C.link_subset(REPO / "examples/data/imagenet-sample/train", root, 10_000, copies=args.copies)
        workloads = {
            "imagenet": (str(REPO / "specs/imagenet.yaml"), {"root": str(root)}),
            "text": (str(REPO / "specs/text.yaml"), {"root": str(REPO / "examples/data/text-sample")}),
            "cheap-map": (str(_cheap_spec(Path(tmp))), {"root": str(root)}),
        }
        if args.only:
            workloads = {k: v for k, v in workloads.items() if k in args.only}
        print(f"# stats overhead: {args.rounds} rounds x {args.epochs} timed epochs; imagenet: {n} images")
        for k, v in C.machine().items():
            print(f"- {k}: {v}")
        m = micro()
        rows = []
        for name, (spec, overrides) in workloads.items():
            loaders = {v: build(spec, v, overrides) for v in VARIANTS}
            rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
            calls = 0.0
            try:
                for r in range(args.rounds):
                    order = list(VARIANTS)[r % 3:] + list(VARIANTS)[:r % 3]  # rotated each round
                    for variant in order:
                        rate, c = timed_epochs(loaders[variant], args.epochs)
                        rates[variant].append(rate)
                        calls = c if variant == "on" else calls
                    print(f"  {name} round {r}: " + ", ".join(f"{v} {rates[v][-1]:,.0f}/s" for v in VARIANTS),
                          file=sys.stderr)
            finally:
                for loader in loaders.values():
                    loader.close()

            def paired(a: str, b: str) -> str:
                return f"{100 * (1 - statistics.median(x / y for x, y in zip(rates[a], rates[b]))):+.1f} %"

            med = {v: statistics.median(rates[v]) for v in VARIANTS}
            bare_s = 1.0 / max(rates["bare"])  # the bare graph's best seconds per sample
            rows.append([name, f"{calls:.2f}", f"{med['bare']:,.0f}", f"{med['on']:,.0f}", f"{med['legacy']:,.0f}",
                         paired("on", "bare"), paired("on", "legacy"),
                         f"{100 * calls * (m['on'] - m['bare']) * 1e-9 / bare_s:.2f} %",
                         f"{100 * calls * (m['on'] - m['legacy']) * 1e-9 / bare_s:+.2f} %"])
        print()
        print(C.md_table(["workload", "wrapped calls / sample", "bare samples/s", "on samples/s",
                          "before samples/s", "on vs bare (paired median)", "on vs before (paired median)",
                          "on vs bare (micro x calls)", "on vs before (micro x calls)"],
                         rows, [False] + [True] * 8))
        print(f"\nmicro: a chain of 6 wrapped minimal nodes, ns per item per node: bare {m['bare']:.0f}, "
              f"stats on {m['on']:.0f} (+{m['on'] - m['bare']:.0f}); the wrapper before issue 8 "
              f"{m['legacy']:.0f}")


def _cheap_spec(tmp: Path) -> Path:
    text = (REPO / "specs/imagenet.yaml").read_text()
    path = tmp / "imagenet-cheap.yaml"
    path.write_text(text.replace("conveyor.image:train_transform", "_common:cheap_transform"))
    return path


if __name__ == "__main__":
    main()

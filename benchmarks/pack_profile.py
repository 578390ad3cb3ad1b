"""Where specs/pretrain.yaml's time goes: the pack node's parts, page faults, first and later epochs.

Two measurements on the bundled sample (examples/data/text-sample), in one process:

* ``parts``: a fresh loader pulled for ``--epochs`` epochs, each of pack_tokens' parts timed on
  the thread that runs it (thread CPU time) with the page faults it took: reading a pool from
  the input (``_take_pool``: read_jsonl, shuffle_buffer and the tokenizer's map below pack),
  checking and cutting its documents (``_pool_pieces``), best-fit, laying the rows out
  (``lay_out``) and the rest of pack (handing out batches, the row order, states). The first
  epoch is shown apart: a fresh loader's first pools make the arrays the later ones reuse.
* ``epochs``: wall time of each epoch of a fresh loader (``--rounds`` loaders), against the
  epoch of the bare loop of ``benchmarks/text_throughput.py`` (json + bytes + greedy pack).

    python benchmarks/pack_profile.py                  # ~10 s
    python benchmarks/pack_profile.py --spec /tmp/variant.yaml --epochs 4
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import md_table  # noqa: E402
from text_throughput import PACK_BATCH, SEQ_LEN, bare_pack  # noqa: E402

import conveyor.nodes.pack_tokens as pack_module  # noqa: E402
from conveyor import load_graph  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("_take_pool", "_pool_pieces", "best_fit", "lay_out")


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


def _timed(name: str, fn: Callable, spent: collections.Counter, faults: collections.Counter) -> Callable:
    def run(*args: Any, **kw: Any) -> Any:
        f0, t0 = _faults(), time.thread_time()
        try:
            return fn(*args, **kw)
        finally:
            spent[name] += time.thread_time() - t0
            faults[name] += _faults() - f0
    return run


def parts(spec: Path, epochs: int) -> str:
    """Thread CPU ms and page faults per epoch of each of pack's parts."""
    spent: collections.Counter = collections.Counter()
    faults: collections.Counter = collections.Counter()
    saved = (pack_module.PackTokens._take_pool, pack_module.PackTokens._pool_pieces, dict(pack_module._PACKERS),
             pack_module.lay_out, pack_module.PackTokens.next)
    pack_module.PackTokens._take_pool = _timed("_take_pool", saved[0], spent, faults)
    pack_module.PackTokens._pool_pieces = _timed("_pool_pieces", saved[1], spent, faults)
    pack_module._PACKERS.update({k: _timed("best_fit" if k == "best_fit" else k, v, spent, faults)
                                 for k, v in saved[2].items()})
    pack_module.lay_out = _timed("lay_out", saved[3], spent, faults)
    pack_module.PackTokens.next = _timed("pack (all)", saved[4], spent, faults)
    per_epoch: list[tuple[dict, dict]] = []
    try:
        with load_graph(spec) as loader:
            for _ in range(epochs):
                spent.clear()
                faults.clear()
                for _batch in loader:
                    pass
                per_epoch.append((dict(spent), dict(faults)))
    finally:
        (pack_module.PackTokens._take_pool, pack_module.PackTokens._pool_pieces, _, pack_module.lay_out,
         pack_module.PackTokens.next) = saved
        pack_module._PACKERS.clear()
        pack_module._PACKERS.update(saved[2])
    rows = []
    for name in (*PARTS, "rest of pack", "pack (all)"):
        def ms(s: dict, f: dict) -> tuple[float, int]:
            if name == "rest of pack":
                return (s.get("pack (all)", 0) - sum(s.get(p, 0) for p in PARTS)) * 1e3, \
                    f.get("pack (all)", 0) - sum(f.get(p, 0) for p in PARTS)
            return s.get(name, 0) * 1e3, f.get(name, 0)
        first = ms(*per_epoch[0])
        later = [ms(*e) for e in per_epoch[1:]] or [first]
        label = f"{name} (input: read, shuffle, tokenize)" if name == "_take_pool" else name
        rows.append([label, f"{first[0]:.2f}", f"{first[1]:,}", f"{statistics.median(t for t, _ in later):.2f}",
                     f"{statistics.median(n for _, n in later):,.0f}"])
    return md_table(["part", "first epoch ms", "faults", "later epochs ms (median)", "faults"], rows,
                    [False, True, True, True, True])


def epochs(spec: Path, epochs: int, rounds: int, root: str) -> str:
    """Wall ms of each epoch of fresh loaders against the bare loop's epoch."""
    paths = sorted(glob.glob(os.path.join(root, "*.jsonl")))
    graph: list[list[float]] = []
    bare: list[float] = []
    for _ in range(rounds):
        with load_graph(spec) as loader:
            times = []
            for _ in range(epochs):
                t0 = time.perf_counter()
                for _batch in loader:
                    pass
                times.append((time.perf_counter() - t0) * 1e3)
            graph.append(times)
        t0 = time.perf_counter()
        bare_pack(paths, 1, SEQ_LEN, PACK_BATCH)
        bare.append((time.perf_counter() - t0) * 1e3)
    b = statistics.median(bare)
    rows = [[f"epoch {e + 1}", f"{statistics.median(g[e] for g in graph):.1f}",
             f"{b / statistics.median(g[e] for g in graph):.2f}"] for e in range(epochs)]
    whole = statistics.median(sum(g) / epochs for g in graph)
    rows.append([f"all {epochs} (as text_throughput counts them)", f"{whole:.1f}", f"{b / whole:.2f}"])
    return (f"bare json + bytes + greedy pack: {b:.1f} ms an epoch (median of {rounds})\n\n"
            + md_table(["graph epoch", "ms (median)", "bare / graph"], rows, [False, True, True]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default=str(ROOT / "specs" / "pretrain.yaml"))
    ap.add_argument("--root", default=str(ROOT / "examples" / "data" / "text-sample"))
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    os.chdir(ROOT)
    spec = Path(args.spec)
    print(f"{spec.name}: pack_tokens' parts, thread CPU ms and page faults an epoch, one fresh loader\n")
    print(parts(spec, max(args.epochs, 2)))
    print()
    print(epochs(spec, args.epochs, args.rounds, args.root))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""One spec's loader rate under two checkouts of conveyor, in alternating fresh processes.

A change to conveyor itself cannot be timed in one process against the code before it (one
``conveyor`` package per process), and whole-process timers (``farm-bench``) drown a loader's
tens of milliseconds in torch's import. So each process imports conveyor from one checkout,
times ``--loaders`` fresh loaders of the spec (each ``--epochs`` whole epochs from the first
``next``, build excluded) and prints their median rate; the checkouts take turns, ``--pairs``
times, and each pair gives the ratio B / A. Start-up is not in the figures (each loader is
timed from after ``load_graph``).

    git worktree add /tmp/before <commit>
    python benchmarks/checkouts_ab.py --a /tmp/before --b . --spec specs/text.yaml
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "examples" / "data" / "text-sample"


def child(repo: str, spec: str, root: str, loaders: int, epochs: int) -> None:
    """In the child process: the median rate of ``loaders`` fresh loaders, printed (rows of
    input_ids a second, or tokens where the batches are packed rows)."""
    sys.path.insert(0, repo)
    import conveyor
    from conveyor import load_graph

    if not Path(conveyor.__file__).resolve().is_relative_to(Path(repo).resolve()):
        raise SystemExit(f"conveyor came from {conveyor.__file__}, not from {repo}")
    rates = []
    for _ in range(loaders):
        loader = load_graph(spec, root=root)
        t0 = time.perf_counter()
        n = 0
        for _ in range(epochs):
            for batch in loader:
                ids = batch["input_ids"]
                n += ids.numel() if "cu_seqlens" in batch else ids.shape[0]
        rates.append(n / (time.perf_counter() - t0))
        loader.close()
    print(statistics.median(rates))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", required=True, help="checkout A (the code before)")
    ap.add_argument("--b", required=True, help="checkout B (the code after)")
    ap.add_argument("--spec", default=str(ROOT / "specs" / "text.yaml"))
    ap.add_argument("--root", default=str(SAMPLE), help="the spec's root param")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--loaders", type=int, default=12)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    spec = str(Path(args.spec).resolve())
    if args.child:
        child(args.a, spec, args.root, args.loaders, args.epochs)
        return 0
    rates: dict[str, list[float]] = {"A": [], "B": []}
    for i in range(args.pairs):
        for name, repo in (("A", args.a), ("B", args.b)):
            out = subprocess.run([sys.executable, __file__, "--child", "--a", str(Path(repo).resolve()),
                                  "--b", "", "--spec", spec, "--root", args.root, "--loaders", str(args.loaders),
                                  "--epochs", str(args.epochs)], cwd=repo, capture_output=True, text=True)
            if out.returncode:
                print(out.stderr, file=sys.stderr)
                return 1
            rates[name].append(float(out.stdout.split()[-1]))
        print(f"pair {i + 1}/{args.pairs}: A {rates['A'][-1]:,.0f}/s, B {rates['B'][-1]:,.0f}/s", file=sys.stderr)
    ratios = [b / a for a, b in zip(rates["A"], rates["B"])]
    print(f"{Path(spec).name}, {args.loaders} fresh loaders x {args.epochs} epochs a process, {args.pairs} pairs")
    print(f"A {args.a}: median {statistics.median(rates['A']):,.0f}/s ({min(rates['A']):,.0f}-{max(rates['A']):,.0f})")
    print(f"B {args.b}: median {statistics.median(rates['B']):,.0f}/s ({min(rates['B']):,.0f}-{max(rates['B']):,.0f})")
    print(f"B / A per pair: median {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Rows per second: the same records read as Parquet (read_parquet) and as JSONL (read_jsonl).

    python benchmarks/parquet_vs_jsonl.py [--rows 200000] [--rounds 3] [--epochs 2]

Writes ``--rows`` text records (~200 characters, an int label, a float score) once as JSONL
(4 files) and once as Parquet (4 files, row groups of 10,000, snappy), into a temporary folder.
Each contender is the graph ``list_files -> read_X -> batch(256)`` as a spec, built fresh for
every round; rounds alternate the order. Start-up (building the loader and the first batch)
is reported apart from the steady rate (rows after the first batch / their seconds).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, md_table, median  # noqa: E402

from conveyor import load_graph  # noqa: E402

SPEC = """
params: {{root: "{root}"}}
nodes:
  files: {{op: list_files, url: "${{root}}/*.{ext}"}}
  rows:  {{op: {op}}}
  batch: {{op: batch, size: 256}}
output: batch
"""

WORDS = "the quick brown fox jumps over a lazy dog while data loaders wait on tokenizers".split()


def write_data(root: Path, rows: int, files: int = 4) -> None:
    per = rows // files
    for f in range(files):
        start = f * per
        text = [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(38)) for i in range(start, start + per)]
        label = [i % 1000 for i in range(start, start + per)]
        score = [i / 7 for i in range(start, start + per)]
        pq.write_table(pa.table({"text": text, "label": label, "score": score}), root / f"part-{f}.parquet",
                       row_group_size=10_000)
        with open(root / f"part-{f}.jsonl", "w", encoding="utf-8") as fh:
            for t, lab, s in zip(text, label, score):
                fh.write(json.dumps({"text": t, "label": lab, "score": s}) + "\n")


def run_once(spec: Path, epochs: int) -> tuple[float, float, int]:
    """(start-up seconds, steady rows/s, rows) for one fresh loader over ``epochs`` epochs."""
    t0 = time.perf_counter()
    rows = 0
    startup = steady_t = 0.0
    with load_graph(spec) as loader:
        for e in range(epochs):
            it = iter(loader)
            first = next(it)
            if e == 0:
                startup = time.perf_counter() - t0
                t1 = time.perf_counter()
            else:
                rows += len(first)
            for batch in it:
                rows += len(batch)
        steady_t = time.perf_counter() - t1
    return startup, rows / steady_t, rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_data(root, args.rows)
        specs = {}
        for name, ext, op in (("read_jsonl", "jsonl", "read_jsonl"), ("read_parquet", "parquet", "read_parquet")):
            specs[name] = root / f"{name}.yaml"
            specs[name].write_text(SPEC.format(root=root.as_posix(), ext=ext, op=op))
        results: dict[str, list[tuple[float, float, int]]] = {n: [] for n in specs}
        for r in range(args.rounds):
            order = list(specs) if r % 2 == 0 else list(reversed(specs))
            for name in order:
                results[name].append(run_once(specs[name], args.epochs))
                print(f"round {r + 1}: {name}: {results[name][-1][1]:,.0f} rows/s", file=sys.stderr)
        sizes = {n: sum(p.stat().st_size for p in root.glob(f"*.{ext}")) for n, ext in
                 (("read_jsonl", "jsonl"), ("read_parquet", "parquet"))}
        base = median([x[1] for x in results["read_jsonl"]])
        rows = []
        for name, res in results.items():
            rate = median([x[1] for x in res])
            rows.append([name, f"{sizes[name] / 2**20:.1f} MiB", f"{median([x[0] for x in res]) * 1000:.0f} ms",
                         f"{rate:,.0f}", f"{min(x[1] for x in res):,.0f}-{max(x[1] for x in res):,.0f}",
                         f"{rate / base:.2f}"])
        print(md_table(["contender", "on disk", "start-up", "rows/s (median)", "range", "÷ read_jsonl"], rows,
                       [False, True, True, True, True, True]))
        m = machine()
        print(f"\n{args.rows:,} rows x {args.epochs} epochs, {args.rounds} alternating rounds; "
              f"{m.get('cpu', '?')}, {m.get('cpus (nproc)', '?')} cores; python {sys.version.split()[0]}, "
              f"pyarrow {pa.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Padding waste of pack_tokens: best-fit against first-fit against concatenate-and-chunk.

On the bundled docstring corpus (``examples/data/text-sample``, 4,016 documents), tokenized as
``specs/pretrain.yaml`` does (UTF-8 bytes plus an end-of-text id) and shuffled once with a fixed
seed, the same documents are packed into rows of ``seq_len`` tokens three ways:

* ``best_fit``: pack_tokens, best-fit decreasing over pools of ``--pool`` documents;
* ``first_fit``: pack_tokens, first-fit in the pool's order, the same pools;
* ``concat+chunk``: every document concatenated and cut every ``seq_len`` tokens (Hugging
  Face's ``group_texts``): no padding but the last row's, the reference, at the price of
  documents cut across rows and attending to each other.

For each: rows, waste (padding / all tokens of the rows), documents cut (split across rows:
over ``seq_len`` for pack_tokens, at any row edge for concat+chunk), rows with more than one
document, and pack_tokens' rows per second (the node alone, over the token lists in memory).
The target (issue 30): best-fit wastes at most 1 % and no more than first-fit.

    python benchmarks/packing.py                         # seq_len 1024 and 2048, pool 1000
    python benchmarks/packing.py --docs 600 --pool 200   # the smallest run (tests/test_benchmarks.py)
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from torchdata.nodes import IterableWrapper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import md_table  # noqa: E402

from conveyor.nodes import PackTokens  # noqa: E402
from conveyor.text import byte_tokenize  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def documents(root: Path, limit: int | None, seed: int = 0) -> list[dict]:
    records = [json.loads(line) for f in sorted(root.glob("*.jsonl")) for line in f.read_text().splitlines()]
    random.Random(seed).shuffle(records)
    return byte_tokenize(records[:limit], add_eos=True, dtype="int16")


def packed(docs: list[dict], seq_len: int, algorithm: str, pool: int) -> dict:
    node = PackTokens(IterableWrapper(docs), seq_len=seq_len, algorithm=algorithm, pool=pool)
    node.reset()
    t0 = time.perf_counter()
    multi = sum(row["num_docs"] > 1 for row in node)
    seconds = time.perf_counter() - t0
    s = node.stats()
    return {"rows": s["rows"], "waste": 1 - s["real_tokens"] / s["padded_tokens"], "cut": s["split"],
            "multi": multi, "rows_per_s": s["rows"] / seconds, "real": s["real_tokens"]}


def concat_chunk(docs: list[dict], seq_len: int) -> dict:
    ends, total = [], 0
    for d in docs:
        total += len(d["input_ids"])
        ends.append(total)
    rows = -(-total // seq_len)
    starts = [0] + ends[:-1]
    cut = sum(s // seq_len != (e - 1) // seq_len for s, e in zip(starts, ends))
    return {"rows": rows, "waste": 1 - total / (rows * seq_len), "cut": cut, "multi": None,
            "rows_per_s": None, "real": total}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=ROOT / "examples/data/text-sample")
    ap.add_argument("--seq-lens", type=int, nargs="+", default=[1024, 2048])
    ap.add_argument("--pool", type=int, default=1000, help="documents packed together")
    ap.add_argument("--docs", type=int, default=None, help="use only this many documents (default: all)")
    args = ap.parse_args()
    docs = documents(args.root, args.docs)
    tokens = sum(len(d["input_ids"]) for d in docs)
    print(f"{len(docs)} documents, {tokens:,} tokens (bytes + eos), pool {args.pool}\n")
    table, verdicts = [], []
    for seq_len in args.seq_lens:
        got = {"best_fit": packed(docs, seq_len, "best_fit", args.pool),
               "first_fit": packed(docs, seq_len, "first_fit", args.pool),
               "concat+chunk": concat_chunk(docs, seq_len)}
        for name, r in got.items():
            assert r["real"] == tokens, f"{name} lost tokens"
            table.append([seq_len, name, r["rows"], f"{100 * r['waste']:.2f} %", r["cut"],
                          "" if r["multi"] is None else r["multi"],
                          "" if r["rows_per_s"] is None else f"{r['rows_per_s']:,.0f}"])
        best, first = got["best_fit"]["waste"], got["first_fit"]["waste"]
        verdicts.append(f"seq_len {seq_len}: best-fit wastes {100 * best:.2f} % (target <= 1 %: "
                        f"{'met' if best <= 0.01 else 'MISSED'}), first-fit {100 * first:.2f} % "
                        f"(best <= first: {'met' if best <= first else 'MISSED'})")
    print(md_table(["seq_len", "packing", "rows", "waste", "documents cut", "rows of >1 doc", "rows/s"], table))
    print()
    print("\n".join(verdicts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

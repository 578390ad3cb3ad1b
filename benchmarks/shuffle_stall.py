"""Does a shuffle window stall the graph? (issue 12.7)

The shape of the issue's measurement: ``read_jsonl -> map(sleep 0.5 ms, inline) ->
shuffle_buffer(2000) -> map(sleep 1 ms, 2 threads) -> batch(32) -> collate`` over 6,000
records, against the same graph without the shuffle. The sleeps stand for read latency
upstream of the shuffle and for decode downstream of it; they need no CPU, so the figures
hold on a busy machine better than CPU-bound ones would (the thread hand-offs still do).

Contenders, each from a fresh loader per round, rounds alternating:

* ``no shuffle`` — the graph without ``shuffle_buffer``;
* ``shuffle_buffer`` — this code (the next window is read while the current one drains);
* ``fill-then-emit`` — a window read whole before any of it is emitted (the algorithm before
  issue 12.7, kept here as a reference: same windows, same permutation).

Printed per contender: the median over rounds of the rate from batch 10 to the end of the
epoch (what the target is about), of the rate from batch 10 until the last window starts
draining (the stretch where upstream reads and downstream work must overlap; the drain of the
last window has no reads left and runs faster), of the whole-epoch rate, and of the
first-batch latency (an epoch's first window is read before its first item can come out,
whatever the algorithm: with reads of 0.5 ms, 2,000 records are ~1 s).

    flock /tmp/bench.lock python benchmarks/shuffle_stall.py [--rounds 3] [--records 6000]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import foreign_share, cpu_snapshot, md_table, median  # noqa: E402

from conveyor import load_graph  # noqa: E402
from conveyor.graphs import ops  # noqa: E402
from conveyor.nodes.shuffle_buffer import ShuffleBuffer  # noqa: E402


def read_latency(item: dict) -> dict:
    """0.5 ms of waiting per record, as a remote read would."""
    time.sleep(0.0005)
    return item


def decode_cost(item: dict) -> dict:
    """1 ms of waiting per record, as a decode in a thread that releases the GIL would."""
    time.sleep(0.001)
    return {"index": item["index"], "n": len(item["text"])}


class FillThenEmit(ShuffleBuffer):
    """The window shuffle before issue 12.7: each window is read whole, then emitted."""

    def next_many(self, n: int) -> list:
        if self._buf is None or self._pos >= len(self._buf):
            if self._buf is not None:
                if self._exhausted:
                    raise StopIteration
                self._window += 1
            self._start_state = self.source.state_dict()
            buf: list = []
            self._read(buf, self.size)
            if not buf:
                raise StopIteration
            self._buf, self._pos = self._permute(buf), 0
        k = min(n, len(self._buf) - self._pos)
        out = self._buf[self._pos:self._pos + k]
        self._pos += k
        return out


SPEC = """params: {{root: "", window: 2000}}
nodes:
  files:   {{op: list_files, url: "${{root}}/*.jsonl"}}
  read:    {{op: read_jsonl}}
  latency: {{op: map, fn: "shuffle_stall:read_latency"}}
{shuffle}  decode:  {{op: map, fn: "shuffle_stall:decode_cost", workers: 2}}
  batch:   {{op: batch, size: 32, drop_last: false}}
  collate: {{op: collate}}
output: collate
"""


def write_data(root: Path, records: int) -> None:
    rng = random.Random(0)
    per_file = records // 4
    for f in range(4):
        with open(root / f"part-{f}.jsonl", "w") as out:
            for i in range(per_file):
                out.write(json.dumps({"text": "x" * rng.randint(20, 200), "id": f * per_file + i}) + "\n")


def one_epoch(spec: Path, root: Path, window: int = 2000) -> dict:
    with load_graph(spec, root=str(root)) as loader:
        cpu0, t0 = cpu_snapshot(), time.perf_counter()
        marks = []
        n = 0
        for batch in loader:
            n += len(batch["index"])
            marks.append((time.perf_counter(), n))
        total = time.perf_counter() - t0
        share = foreign_share(cpu0, cpu_snapshot(), total)
    (ta, na), (tb, nb) = marks[9], marks[-1]
    # batch 10 until the last window starts draining (after it, nothing is read upstream)
    tm, nm = marks[max(10, (n - window) // 32 - 1)]
    return {"records": n, "steady": (nb - na) / (tb - ta), "mid": (nm - na) / (tm - ta), "whole": n / total,
            "first_s": marks[0][0] - t0, "foreign": share}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--records", type=int, default=6000)
    ap.add_argument("--window", type=int, default=2000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="shuffle-stall-") as tmp:
        root = Path(tmp) / "data"
        root.mkdir()
        write_data(root, args.records)
        specs = {}
        for name, shuffle in [("no shuffle", ""),
                              ("shuffle_buffer", "  shuffle: {op: shuffle_buffer, size: \"${window}\"}\n"),
                              ("fill-then-emit", "  shuffle: {op: shuffle_buffer, size: \"${window}\"}\n")]:
            spec = Path(tmp) / f"{name.replace(' ', '_')}.yaml"
            spec.write_text(SPEC.format(shuffle=shuffle).replace("window: 2000", f"window: {args.window}"))
            specs[name] = spec
        results: dict[str, list[dict]] = {name: [] for name in specs}
        one_epoch(specs["no shuffle"], root)  # warm-up, untimed: imports, page cache
        for r in range(args.rounds):
            order = list(specs) if r % 2 == 0 else list(reversed(specs))
            for name in order:
                ops.ShuffleBuffer = FillThenEmit if name == "fill-then-emit" else ShuffleBuffer
                try:
                    results[name].append(one_epoch(specs[name], root, args.window))
                finally:
                    ops.ShuffleBuffer = ShuffleBuffer
                res = results[name][-1]
                print(f"round {r} {name:>15}: {res['steady']:7.0f} rec/s from batch 10, "
                      f"{res['mid']:7.0f} before the last window, "
                      f"{res['whole']:7.0f} whole epoch, first batch {res['first_s']:.3f} s, "
                      f"others used {res['foreign']:.0%} of the CPUs", flush=True)
    base = median([x["steady"] for x in results["no shuffle"]])
    base_mid = median([x["mid"] for x in results["no shuffle"]])
    base_whole = median([x["whole"] for x in results["no shuffle"]])
    rows = []
    for name, runs in results.items():
        steady, whole = median([x["steady"] for x in runs]), median([x["whole"] for x in runs])
        mid = median([x["mid"] for x in runs])
        rows.append([name, f"{steady:,.0f}", f"{steady / base:.2f}", f"{mid:,.0f}", f"{mid / base_mid:.2f}",
                     f"{whole:,.0f}",
                     f"{whole / base_whole:.2f}", f"{median([x['first_s'] for x in runs]):.3f}",
                     f"{median([x['foreign'] for x in runs]):.0%}"])
    print()
    print(f"{args.records} records, window {args.window}, {args.rounds} rounds (medians)")
    print(md_table(["contender", "rec/s from batch 10", "x no shuffle", "rec/s batch 10 to last window",
                    "x no shuffle", "rec/s whole epoch", "x no shuffle", "first batch s",
                    "CPU used by others"], rows, [False] + [True] * 8))


if __name__ == "__main__":
    main()

"""Text graph throughput against bare Python loops doing the same reading and tokenizing (issue 18).

Contenders, timed side by side in one process, in alternating rounds (the order rotates each
round, so drift and other processes' load hit all of them; each starts after a full garbage
collection, so none pays for one that the allocations of those before it made due: ~50 ms with
torch loaded, as long as a whole run), ``--epochs`` epochs each, over the bundled docstring
corpus (examples/data/text-sample):

The table also gives the graph's padding waste (1 - pad_collate's padding efficiency) and,
below it, the size of a mid-epoch state and the time to take one.

* ``bare json + bytes``: open each file, ``json.loads`` each line, ``list(text.encode())[:1024]``
  (issue 18's reference loop);
* ``bare orjson + bytes``: the same with ``orjson.loads`` (what the graph parses with);
* ``bare json + bytes + buckets + pad``: text.yaml's work (shuffle window, length buckets
  under the token budget, padding to int64 with lengths and mask) as a plain loop a user who
  knows numpy would write, without provenance, state or error handling (``bare_buckets``):
  how much of the gap to the bare loop is the work itself;
* ``graph: specs/text.yaml``: a fresh ``load_graph`` each round, iterated to the end of each
  epoch (files, shard, read, shuffle, tokenize, bucket_batch, pad_collate, prefetch). This
  consumer takes each batch and comes straight back, so prefetch's ``adapt`` parks its thread
  after the first window of batches and makes them in the caller's thread (nodes/prefetch.py);
  ``graph: text.yaml, prefetch adapt: false`` keeps the thread (what it cost before);
* with ``--step MS``: text.yaml with and without its prefetch node, under a consumer that
  sleeps MS ms a batch (a training step that leaves the GIL free): the thread must still
  make the next batch during the step (adapt keeps it for such a consumer);
* ``bare json + bytes + greedy pack`` against ``graph: pretrain.yaml`` (skipped with
  ``--no-pack``; issue 30): the bare loop reads the same lines, takes each text's UTF-8
  bytes plus the end-of-text id (the tokenizer pretrain.yaml names: ``byte_tokenize`` with
  ``add_eos``), packs them greedily into rows of 1,024 (a document that does not fit goes
  on in the next row) and makes a tensor of each 8 rows; the graph lists, shards, reads,
  shuffles, tokenizes, packs best-fit (pack_tokens: document boundaries, labels, positions,
  cu_seqlens), batches, collates and prefetches. Both are counted in real tokens per second;
* with ``tokenizers`` (skipped with ``--no-hf``): a byte-level BPE tokenizer trained on the
  sample at start (``conveyor.text.train_tokenizer``, 1,000 ids), then ``bare json + hf
  encode`` (``tok.encode(text).ids`` per line), ``bare json + hf encode_batch`` (lists of
  256 lines) and ``graph: text.yaml + hf_tokenize`` (the spec with ``conveyor.text:hf_tokenize``,
  ``batch: 256``, boundaries and budget divided by 4: ids are ~4 bytes of this text).

Records/s count whole epochs from the first ``next`` (a graph's epoch restarts, shuffle
fills and prefetch included); the graph's start-up (``load_graph``: parse, check, build) is
reported apart, as is its time to the first batch, and, on a line of its own, each later
epoch's restart: ``iter()`` (every node reset, the prefetch thread started) and the wait for
that epoch's first batch (the shuffle window and the first bucket or pack pool filled). Ratios are per round (graph / bare in the
same round), then the median. ``--breakdown`` prints where a record's time goes instead:
the graph pulled node by node in this thread (each node's increment over the chain below
it), with the per-node wrapper (``Counted``), a count-only wrapper and no wrapper at all.

    flock /tmp/bench.lock python benchmarks/text_throughput.py             # the table (~1 min)
    flock /tmp/bench.lock python benchmarks/text_throughput.py --breakdown
    python benchmarks/text_throughput.py --profile          # cProfile self time by node (shares)
    python benchmarks/text_throughput.py --rounds 9 --epochs 3 --no-hf
"""

from __future__ import annotations

import argparse
import gc
import glob
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import cpu_snapshot, foreign_share, md_table  # noqa: E402

from conveyor import load_graph  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "specs" / "text.yaml"
PACK_SPEC = ROOT / "specs" / "pretrain.yaml"
MAX_LENGTH = 1024
HF_BATCH = 256
EOS = 257  # byte_tokenize's end-of-text id
SEQ_LEN, PACK_BATCH = 1024, 8  # specs/pretrain.yaml's defaults


# ----- the bare loops ------------------------------------------------------------------------

def bare_bytes(paths: list[str], epochs: int, loads: Callable[[bytes], Any]) -> int:
    n = 0
    for _ in range(epochs):
        for p in paths:
            with open(p, "rb") as f:
                for line in f:
                    ids = list(loads(line)["text"].encode())[:MAX_LENGTH]
                    n += ids is not None
    return n


def bare_buckets(paths: list[str], epochs: int, seed: int = 0) -> int:
    """text.yaml's work as a user would write it who knows numpy, for scale: json.loads each
    line of the files (in a seeded random order each epoch), a shuffle window of the spec's
    size, the UTF-8 bytes cut at 1,024, a bucket per length boundary of the spec's whose batch
    is cut when one more text would pass ``max_tokens`` after padding to a multiple of 8, and
    each batch padded into an int64 tensor with its lengths and an int64 attention mask. No
    provenance, no state, no sorting pool, no skip or error handling; records in batches made
    (the buckets' tails included)."""
    import bisect
    import random

    import numpy as np
    import torch

    doc = yaml.safe_load(SPEC.read_text(encoding="utf-8"))
    bounds = doc["nodes"]["batch"]["boundaries"]
    budget, window = int(doc["params"]["max_tokens"]), int(doc["nodes"]["shuffle"]["size"])

    def collate(texts: list[bytes]) -> int:
        lengths = np.fromiter(map(len, texts), np.int64, len(texts))
        longest = int(lengths.max())
        longest += -longest % 8
        mask = np.arange(longest) < lengths[:, None]
        ids = np.zeros((len(texts), longest), np.int64)
        ids[mask] = np.frombuffer(b"".join(texts), np.uint8)
        batch = {"input_ids": torch.from_numpy(ids), "lengths": torch.from_numpy(lengths),
                 "attention_mask": torch.from_numpy(mask.astype(np.int64))}
        return batch["input_ids"].shape[0]

    n = 0
    for epoch in range(epochs):
        rng = random.Random(seed * 1000 + epoch)
        order = list(paths)
        rng.shuffle(order)
        buckets: list[list[bytes]] = [[] for _ in bounds]
        pool: list[bytes] = []

        def add(text: bytes) -> int:
            b = min(bisect.bisect_left(bounds, len(text)), len(bounds) - 1)
            bucket = buckets[b]
            bucket.append(text)
            top = bounds[b] + (-bounds[b] % 8)
            if (len(bucket) + 1) * top > budget:
                buckets[b] = []
                return collate(bucket)
            return 0

        for p in order:
            with open(p, "rb") as f:
                for line in f:
                    text = json.loads(line)["text"].encode()[:MAX_LENGTH]
                    if len(pool) < window:
                        pool.append(text)
                        continue
                    i = rng.randrange(window)
                    pool[i], text = text, pool[i]
                    n += add(text)
        rng.shuffle(pool)
        for text in pool:
            n += add(text)
        n += sum(collate(b) for b in buckets if b)
    return n


def bare_pack(paths: list[str], epochs: int, seq_len: int, batch_size: int) -> int:
    """Issue 30's reference, written as a user would who knows numpy: json.loads each line,
    its UTF-8 bytes plus the end-of-text id (``byte_tokenize``'s add_eos) as int16, packed
    greedily (documents one after another, a row cut every ``seq_len`` tokens, a document
    going on in the next row), ``batch_size`` rows an int64 tensor; the tokens of the
    batches made (the tail short of a batch is dropped, as pretrain.yaml's drop_last does)."""
    import numpy as np
    import torch

    n = 0
    k = seq_len * batch_size
    for _ in range(epochs):
        pending: list = []
        have = 0
        for p in paths:
            with open(p, "rb") as f:
                for line in f:
                    data = json.loads(line)["text"].encode()
                    doc = np.empty(len(data) + 1, np.int16)
                    doc[:-1] = np.frombuffer(data, np.uint8)
                    doc[-1] = EOS
                    pending.append(doc)
                    have += doc.shape[0]
                    if have >= k:
                        flat = np.concatenate(pending)
                        batch = torch.from_numpy(flat[:k].astype(np.int64).reshape(batch_size, seq_len))
                        n += batch.numel()
                        pending, have = [flat[k:]], flat.shape[0] - k
    return n


def bare_hf(paths: list[str], epochs: int, tok: Any, batch: int | None) -> int:
    n = 0
    for _ in range(epochs):
        for p in paths:
            with open(p, "rb") as f:
                if batch is None:
                    for line in f:
                        ids = tok.encode(json.loads(line)["text"]).ids
                        n += ids is not None
                    continue
                texts: list[str] = []
                for line in f:
                    texts.append(json.loads(line)["text"])
                    if len(texts) == batch:
                        n += len([e.ids for e in tok.encode_batch(texts)])
                        texts = []
                if texts:
                    n += len([e.ids for e in tok.encode_batch(texts)])
    return n


# ----- the graph -------------------------------------------------------------------------------

def graph(spec: Path, epochs: int, root: str, count: Callable[[Any], int] | None = None,
          step: float = 0.0) -> dict[str, Any]:
    """A fresh loader, ``epochs`` whole epochs from the first ``next``; ``count(batch)`` gives
    what a batch counts (default: its rows of input_ids); ``step``: seconds the consumer
    sleeps after each batch (a training step that leaves the GIL free, as CUDA waits do).
    Apart: the build, the first batch, and for each epoch after the first its restart:
    ``iter()`` (every node reset, the prefetch thread started) and the wait for its first
    batch (the shuffle window and the first bucket pool or pack pool filled)."""
    count = count or (lambda batch: batch["input_ids"].shape[0])
    t0 = time.perf_counter()
    loader = load_graph(spec, root=root)
    t1 = time.perf_counter()
    n = 0
    first = None
    restarts: list[tuple[float, float]] = []
    try:
        for epoch in range(epochs):
            e0 = time.perf_counter()
            it = iter(loader)
            e1 = time.perf_counter()
            for i, batch in enumerate(it):
                n += count(batch)
                if step:
                    time.sleep(step)
                if i == 0:
                    e2 = time.perf_counter()
                    if first is None:
                        first = e2
                    if epoch:
                        restarts.append((e1 - e0, e2 - e1))
        t2 = time.perf_counter()
        nodes = loader.stats()["nodes"]
        padder = nodes.get("collate") or nodes.get("pack") or {}  # pad_collate's or pack_tokens's figures
        out = loader.nodes.get("out")
        inline = getattr(out, "inline", None)  # prefetch's mode at the end (adapt)
    finally:
        loader.close()
    return {"records": n, "build_s": t1 - t0, "first_s": (first or t2) - t1, "seconds": t2 - t1,
            "padding": padder.get("padding_efficiency"), "restarts": restarts, "inline": inline}


def variant(spec: Path, out: Path, change: Callable[[dict], None]) -> Path:
    """``spec`` with ``change`` applied to its parsed YAML, written to ``out`` (the loaders are
    given ``root``, so ``${spec_dir}`` does not matter)."""
    doc = yaml.safe_load(spec.read_text(encoding="utf-8"))
    change(doc)
    out.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return out


def no_prefetch(doc: dict) -> None:
    """The spec without its output prefetch node: the node below it is the output."""
    out = doc["output"]
    node = doc["nodes"].pop(out)
    assert node["op"] == "prefetch", node
    doc["output"] = node.get("input") or list(doc["nodes"])[-1]


def prefetch_always_threaded(doc: dict) -> None:
    doc["nodes"][doc["output"]]["adapt"] = False


def state_figures(spec: Path, root: str, steps: int = 20, takes: int = 500) -> tuple[int, float]:
    """(JSON bytes of a mid-epoch state, median microseconds to take one) for ``spec``."""
    with load_graph(spec, root=root) as loader:
        it = iter(loader)
        for _ in range(steps):
            next(it)
        times = []
        for _ in range(takes):
            t0 = time.perf_counter()
            state = loader.state_dict()
            times.append(time.perf_counter() - t0)
    return len(json.dumps(state)), statistics.median(times) * 1e6


def hf_spec(tokenizer: str, out: Path) -> Path:
    """specs/text.yaml with hf_tokenize; lengths in ids (~4 bytes each here), not bytes."""
    spec = yaml.safe_load(SPEC.read_text(encoding="utf-8"))
    spec["params"]["max_length"] = MAX_LENGTH // 4
    spec["params"]["max_tokens"] = spec["params"]["max_tokens"] // 4
    spec["nodes"]["tokenize"] = {"op": "map", "fn": "conveyor.text:hf_tokenize", "batch": HF_BATCH,
                                 "args": {"tokenizer": tokenizer, "max_length": "${max_length}", "dtype": "int32"}}
    batch = spec["nodes"]["batch"]
    batch["boundaries"] = [max(b // 4, 8) for b in batch["boundaries"]]
    out.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return out


# ----- rounds ----------------------------------------------------------------------------------

def run_rounds(contenders: dict[str, Callable[[], dict[str, float]]], rounds: int) -> dict[str, list[dict]]:
    results: dict[str, list[dict]] = {name: [] for name in contenders}
    names = list(contenders)
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            # a full collection (~50 ms with torch loaded, as long as a run) that the ones
            # before made due runs here, not in this contender's time
            gc.collect()
            cpu0 = cpu_snapshot()
            t0 = time.perf_counter()
            res = contenders[name]()
            res["foreign"] = foreign_share(cpu0, cpu_snapshot(), time.perf_counter() - t0)
            res["rate"] = res["records"] / res["seconds"]
            results[name].append(res)
        print(f"round {r + 1}/{rounds}: " + ", ".join(f"{n} {results[n][-1]['rate']:,.0f}/s" for n in names),
              file=sys.stderr)
    return results


def timed(fn: Callable[[], int]) -> Callable[[], dict[str, float]]:
    def run() -> dict[str, float]:
        t0 = time.perf_counter()
        n = fn()
        return {"records": n, "seconds": time.perf_counter() - t0}
    return run


def table(results: dict[str, list[dict]], pairs: list[tuple[str, str]]) -> str:
    rows = []
    for name, runs in results.items():
        rates = [r["rate"] for r in runs]
        build = [r["build_s"] for r in runs if "build_s" in r]
        first = [r["first_s"] for r in runs if "first_s" in r]
        padding = [r["padding"] for r in runs if r.get("padding") is not None]
        rows.append([name, f"{statistics.median(rates):,.0f}", f"{min(rates):,.0f}-{max(rates):,.0f}",
                     f"{statistics.median(build) * 1e3:.0f}" if build else "",
                     f"{statistics.median(first) * 1e3:.1f}" if first else "",
                     f"{1 - statistics.median(padding):.1%}" if padding else "",
                     f"{statistics.median(r['foreign'] for r in runs):.0%}"])
    out = md_table(["contender", "records/s (median)", "range", "start-up ms", "first batch ms", "padding waste",
                    "others' CPU"], rows, [False, True, True, True, True, True, True])
    ratio_rows = []
    for a, b in pairs:
        if a in results and b in results:
            ratios = [x["rate"] / y["rate"] for x, y in zip(results[a], results[b])]
            ratio_rows.append([f"{a} / {b}", f"{statistics.median(ratios):.2f}",
                               f"{min(ratios):.2f}-{max(ratios):.2f}"])
    mode_lines = []
    for name, runs in results.items():
        modes = [r["inline"] for r in runs if r.get("inline") is not None]
        if modes:
            mode_lines.append(f"{name}: prefetch made the batches inline at the end of {sum(modes)} of "
                              f"{len(modes)} runs (adapt), in its thread at the end of the rest")
    restart_lines = []
    for name, runs in results.items():
        got = [r for run in runs for r in run.get("restarts", [])]
        if got:
            it_ms = [a * 1e3 for a, _ in got]
            wait_ms = [b * 1e3 for _, b in got]
            restart_lines.append(
                f"epoch restart of {name} (epochs after the first, {len(got)} of them): iter() (reset + thread "
                f"start) {statistics.median(it_ms):.2f} ms ({min(it_ms):.2f}-{max(it_ms):.2f}), then the first "
                f"batch {statistics.median(wait_ms):.2f} ms ({min(wait_ms):.2f}-{max(wait_ms):.2f})")
    return (out + "\n\n" + md_table(["ratio (per round)", "median", "range"], ratio_rows, [False, True, True])
            + ("\n\n" + "\n".join(restart_lines) if restart_lines else "")
            + ("\n\n" + "\n".join(mode_lines) if mode_lines else ""))


# ----- breakdown -------------------------------------------------------------------------------

def breakdown(spec: Path, root: str, epochs: int, rounds: int) -> str:
    """Records/s pulling the graph up to each node in this thread, under three wrappers."""
    import conveyor.graphs.compile as compile_mod
    from conveyor.graphs.api import check_spec
    from conveyor.graphs.instrument import BareCounted, Counted

    plan = check_spec(spec, {"root": root})
    stages = [n for n in plan.nodes if plan.nodes[n].op.name not in ("list_files", "shard", "prefetch")]
    wrappers = {"Counted": Counted, "count only": BareCounted, "none": lambda node, *args, **kw: node}
    times: dict[tuple[str, str], list[float]] = {}
    records = 0
    for _ in range(rounds):
        for wname, wrap in wrappers.items():
            saved = compile_mod.Counted
            compile_mod.Counted = wrap
            try:
                compiled = compile_mod.compile_plan(plan)
            finally:
                compile_mod.Counted = saved
            nodes = compiled.nodes
            for stage in stages:
                node = nodes[stage]
                t0 = time.thread_time()
                for epoch in range(epochs):
                    for n in nodes.values():
                        inner = getattr(n, "inner", n)
                        if callable(getattr(inner, "set_epoch", None)):
                            inner.set_epoch(epoch)
                    node.reset()
                    for _ in node:
                        pass
                times.setdefault((wname, stage), []).append(time.thread_time() - t0)
            for n in nodes.values():
                close = getattr(getattr(n, "inner", n), "close", None)
                if callable(close):
                    close()
        with load_graph(spec, root=root) as loader:
            t0 = time.process_time()  # two threads: the caller's and prefetch's
            records = 0
            for _ in range(epochs):
                for batch in loader:
                    records += batch["input_ids"].shape[0]
            times.setdefault(("Counted", "loader (+ prefetch)"), []).append(time.process_time() - t0)
    stages.append("loader (+ prefetch)")
    paths = sorted(glob.glob(os.path.join(root, "*.jsonl")))
    for _ in range(rounds):
        t0 = time.thread_time()
        bare_bytes(paths, epochs, json.loads)
        times.setdefault(("none", "bare loop: json + bytes"), []).append(time.thread_time() - t0)
    stages.append("bare loop: json + bytes")
    rows = []
    prev = {w: 0.0 for w in wrappers}
    for stage in stages:
        if stage.startswith("bare"):
            prev = {w: 0.0 for w in wrappers}
        row = [stage]
        for wname in wrappers:
            if (wname, stage) not in times:
                row += ["", ""]
                continue
            us = statistics.median(times[(wname, stage)]) / records * 1e6
            row += [f"{us:.2f}", f"{us - prev[wname]:+.2f}"]
            prev[wname] = us
        rows.append(row)
    headers = ["pulled up to"] + [f"{w} {k}" for w in wrappers for k in ("us/rec", "node")]
    return (f"CPU us per record ({records} records in {epochs} epochs; thread CPU time, process CPU "
            f"time for the loader), median of {rounds} rounds; 'node': the increment over the row above; "
            "the last row is issue 18's bare loop, for scale\n\n"
            + md_table(headers, rows, [False] + [True] * (2 * len(wrappers))))


_GROUPS = [  # (file name part, group): where a function's self time is charged
    ("instrument.py", "instrumentation (Counted)"),
    ("read_jsonl.py", "read_jsonl (+ json/orjson, fsspec)"), ("json/", "read_jsonl (+ json/orjson, fsspec)"),
    ("_line_files.py", "read_jsonl (+ json/orjson, fsspec)"),
    ("fsspec", "read_jsonl (+ json/orjson, fsspec)"),
    ("shuffle_buffer.py", "shuffle_buffer (+ random)"), ("random.py", "shuffle_buffer (+ random)"),
    ("text.py", "tokenizer fn (conveyor.text)"),
    ("map.py", "map node (Map, Call, Enumerate, CarryErrors, MapBatches)"),
    ("map_calls.py", "map node (Map, Call, Enumerate, CarryErrors, MapBatches)"),
    ("map_engines.py", "map node (Map, Call, Enumerate, CarryErrors, MapBatches)"),
    ("torchdata_threads.py", "map node (Map, Call, Enumerate, CarryErrors, MapBatches)"),
    ("map_batches.py", "map node (Map, Call, Enumerate, CarryErrors, MapBatches)"),
    ("bucket_batch.py", "bucket_batch"),
    ("pad_collate.py", "pad_collate (+ default_collate)"), ("_padding.py", "pad_collate (+ default_collate)"),
    ("collate.py", "pad_collate (+ default_collate)"),
    ("typing.py", "pad_collate (+ default_collate)"), ("numeric.py", "pad_collate (+ default_collate)"),
    ("base_node.py", "torchdata BaseNode.__next__ / state_dict"),
]


def profile(spec: Path, root: str, epochs: int) -> str:
    """cProfile of the graph pulled up to pad_collate in this thread, self time by group."""
    import cProfile
    import collections
    import pstats

    loader = load_graph(spec, root=root)
    node = loader._c.nodes["collate"]

    def run() -> int:
        n = 0
        for epoch in range(epochs):
            for counted in loader._c.nodes.values():  # what the Loader's run does at each epoch
                set_epoch = getattr(counted.inner, "set_epoch", None)
                if callable(set_epoch):
                    set_epoch(epoch)
            node.reset()
            for batch in node:
                n += batch["input_ids"].shape[0]
        return n

    try:
        run()  # warm: imports, the instrumentation's warm-up
        prof = cProfile.Profile()
        prof.enable()
        n = run()
        prof.disable()
    finally:
        loader.close()

    def group(fn: tuple) -> str:
        return next((g for part, g in _GROUPS if part in fn[0]), "other")

    spent: collections.Counter = collections.Counter()
    for fn, (_cc, _nc, tt, _ct, callers) in pstats.Stats(prof).stats.items():  # type: ignore[attr-defined]
        if fn[0] == "~" and callers:  # a builtin: charged to its callers
            for caller, c in callers.items():
                spent[group(caller)] += c[2]
        else:
            spent[group(fn)] += tt
    total = sum(spent.values())
    rows = [[g, f"{t / n * 1e6:.2f}", f"{t / total:.0%}"] for g, t in spent.most_common()]
    rows.append(["all (under cProfile, which inflates calls)", f"{total / n * 1e6:.2f}", "100%"])
    return md_table(["where", "us per record", "share"], rows, [False, True, True])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=str(ROOT / "examples" / "data" / "text-sample"))
    ap.add_argument("--spec", default=str(SPEC), help="the byte-level text spec (default specs/text.yaml)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--no-hf", action="store_true", help="skip the tokenizers contenders")
    ap.add_argument("--no-pack", action="store_true", help="skip the packing contenders (specs/pretrain.yaml)")
    ap.add_argument("--step", type=float, default=0.0, metavar="MS",
                    help="also time text.yaml with and without its prefetch node under a consumer that "
                         "sleeps MS milliseconds a batch (a GIL-free training step)")
    ap.add_argument("--breakdown", action="store_true", help="per-node costs instead of the table")
    ap.add_argument("--profile", action="store_true", help="cProfile self time by node instead of the table")
    args = ap.parse_args(argv)
    os.chdir(ROOT)  # the spec's default root is relative to the repository
    if args.breakdown:
        print(breakdown(Path(args.spec), args.root, args.epochs, args.rounds))
        return 0
    if args.profile:
        print(profile(Path(args.spec), args.root, args.epochs))
        return 0
    import orjson

    paths = sorted(glob.glob(os.path.join(args.root, "*.jsonl")))
    e = args.epochs
    tmp_dir = tempfile.TemporaryDirectory()
    tmp = Path(tmp_dir.name)
    threaded = variant(Path(args.spec), tmp / "text-threaded.yaml", prefetch_always_threaded)
    unfetched = variant(Path(args.spec), tmp / "text-no-prefetch.yaml", no_prefetch)
    contenders: dict[str, Callable[[], dict[str, float]]] = {
        "bare json + bytes": timed(lambda: bare_bytes(paths, e, json.loads)),
        "bare orjson + bytes": timed(lambda: bare_bytes(paths, e, orjson.loads)),
        "bare json + bytes + buckets + pad": timed(lambda: bare_buckets(paths, e)),
        "graph: text.yaml": lambda: graph(Path(args.spec), e, args.root),
        "graph: text.yaml, prefetch adapt: false": lambda: graph(threaded, e, args.root),
    }
    pairs = [("graph: text.yaml", "bare json + bytes"), ("graph: text.yaml", "bare orjson + bytes"),
             ("graph: text.yaml", "bare json + bytes + buckets + pad"),
             ("bare json + bytes + buckets + pad", "bare json + bytes"),
             ("graph: text.yaml, prefetch adapt: false", "bare json + bytes")]
    if args.step:  # a consumer with a GIL-free step: prefetch's thread must still overlap with it
        step = args.step / 1e3
        with_step, without = f"graph: text.yaml + {args.step:g} ms step", f"graph: text.yaml without prefetch + {args.step:g} ms step"
        contenders.update({with_step: lambda: graph(Path(args.spec), e, args.root, step=step),
                           without: lambda: graph(unfetched, e, args.root, step=step)})
        pairs.append((with_step, without))
    if not args.no_pack:  # counted in real tokens (a packed batch's num_tokens), not records
        contenders.update({
            "bare json + bytes + greedy pack (tokens)": timed(lambda: bare_pack(paths, e, SEQ_LEN, PACK_BATCH)),
            "graph: pretrain.yaml (tokens)": lambda: graph(PACK_SPEC, e, args.root,
                                                          lambda batch: int(batch["num_tokens"].sum())),
        })
        pairs.append(("graph: pretrain.yaml (tokens)", "bare json + bytes + greedy pack (tokens)"))
    with tmp_dir:
        if not args.no_hf:
            from tokenizers import Tokenizer

            from conveyor.text import train_tokenizer

            tok_path = train_tokenizer(os.path.join(args.root, "*.jsonl"), os.path.join(tmp, "tokenizer.json"))
            tok = Tokenizer.from_file(tok_path)
            spec = hf_spec(tok_path, Path(tmp) / "text-hf.yaml")
            contenders.update({
                "bare json + hf encode": timed(lambda: bare_hf(paths, e, tok, None)),
                "bare json + hf encode_batch": timed(lambda: bare_hf(paths, e, tok, HF_BATCH)),
                "graph: text.yaml + hf_tokenize": lambda: graph(spec, e, args.root),
            })
            pairs += [("graph: text.yaml + hf_tokenize", "bare json + hf encode"),
                      ("graph: text.yaml + hf_tokenize", "bare json + hf encode_batch")]
        for fn in contenders.values():  # warm up: imports, page cache, tokenizer threads
            fn()
        results = run_rounds(contenders, args.rounds)
    print(f"{args.epochs} epochs per run, {args.rounds} alternating rounds, {os.cpu_count()} CPUs; "
          f"others' CPU = share of the machine other processes used meanwhile\n")
    print(table(results, pairs))
    size, took = state_figures(Path(args.spec), args.root)
    print(f"\nstate of {Path(args.spec).name} after 20 batches: {size:,} bytes of JSON, {took:.1f} us to take")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``conveyor run SPEC``: run the graph for some epochs or steps with a progress bar, then print
each node's counts (stdout) and where the time went (stderr); ``--trace`` writes a Chrome trace,
``--skipped`` the ledger of skipped samples. Ctrl-C stops it with the summary up to there."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from conveyor.graphs.compile import compile_plan
from conveyor.graphs.loader import Loader
from conveyor.graphs.validate import Plan
from conveyor.tools._args import INTERRUPTED, add_spec_args, checked_plan
from conveyor.tools.bottleneck import find_bottleneck, node_rows
from conveyor.tools.measure import Meter, batch_len
from conveyor.tools.tables import node_table, pct
from conveyor.tools.trace import trace_recorder, write_trace


def cmd_run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    plan = checked_plan(args)
    batches = samples = 0
    interrupted = False
    recorder = trace_recorder(args)
    t0 = time.perf_counter()
    with Loader(compile_plan(plan)) as loader:
        meter = Meter(loader)
        if recorder is not None:
            recorder.attach(loader)
        with tqdm(total=args.steps, unit="batch", disable=args.quiet, file=sys.stderr,
                  dynamic_ncols=True) as bar:
            try:
                for _ in range(args.epochs):
                    for batch in loader:
                        n = batch_len(batch)
                        batches += 1
                        samples += n
                        elapsed = max(time.perf_counter() - t0, 1e-9)
                        bar.set_postfix_str(f"epoch {loader.epoch}, {samples / elapsed:,.1f} samples/s",
                                            refresh=False)
                        bar.update(1)
                        if args.steps and batches >= args.steps:
                            break
                    meter.fold()
                    if args.steps and batches >= args.steps:
                        break
            except KeyboardInterrupt:  # Ctrl-C: stop, close the loader, report what was done
                interrupted = True
                meter.fold()
        elapsed = time.perf_counter() - t0
        stats = loader.stats()
        if args.skipped:
            from conveyor.tools.check import write_ledger

            ledger = loader.skipped()
            write_ledger(args.skipped, ledger["entries"])
            print(f"skipped: {ledger['count']} skip(s), {len(ledger['entries'])} sample(s) named in {args.skipped}",
                  file=sys.stderr)
        rows = node_rows(loader, meter.raws, elapsed)
        root = meter.raws.get(plan.output, {}).get("seconds", 0.0)
    for name, entry in stats["nodes"].items():
        extra = ", ".join(f"{k} {v}" for k, v in entry.items() if k not in ("op", "items", "perf"))
        print(f"  {name:<12} {entry['op']:<15} {entry['items']:>9} items" + (f"  ({extra})" if extra else ""))
    print(f"done: {batches} batches, {samples} samples, {loader.epoch + 1} epoch(s) in {elapsed:.2f} s "
          f"({batches / elapsed:,.1f} batches/s, {samples / elapsed:,.1f} samples/s)")
    sys.stdout.flush()
    _, sentence = find_bottleneck(rows, elapsed)
    print(f"where the time went ({elapsed:.2f} s, all epochs; the loop waited for data "
          f"{pct(root / elapsed if elapsed > 0 else 0.0)} of the time):\n{node_table(rows, sizes=False)}\n{sentence}.",
          file=sys.stderr)
    if recorder is not None:
        write_trace(recorder, args.trace)
    if interrupted:
        print(f"conveyor: interrupted after {batches} batches (the summary above is up to there)",
              file=sys.stderr)
        return INTERRUPTED
    if batches == 0 and args.epochs > 0 and args.steps != 0:
        print(f"conveyor: warning: no batch came out of {args.epochs} epoch(s): "
              f"{_why_no_batch(stats, plan)}", file=sys.stderr)
        return 1
    return 0


def _why_no_batch(stats: dict[str, Any], plan: Plan) -> str:
    """Where the items stopped: the first node that received items and yielded none."""
    counts = {name: entry.get("items", 0) for name, entry in stats.get("nodes", {}).items()}
    for name, node in plan.nodes.items():
        fed = [i for i in node.inputs if counts.get(i)]
        if counts.get(name, 0) == 0 and fed:
            got = sum(counts[i] for i in fed)
            hint = ""
            size = node.op.batch_rows(node.params) if node.op.batch_rows is not None else None
            drop_last = getattr(node.params, "drop_last", False)
            if drop_last and isinstance(size, int) and size > got:
                hint = (f": a batch of {size} with drop_last: true needs at least {size} items; "
                        "lower the batch size or set drop_last: false")
            return f"node '{name}' ({node.op.name}) received {got} item(s) and yielded none{hint}"
    return "the sources yielded no items"



def add_parser(sub: Any) -> None:
    """Add ``conveyor run`` to the CLI's subcommands."""
    run = sub.add_parser("run", help="run the graph and report throughput")
    add_spec_args(run)
    run.add_argument("--epochs", type=int, default=1, help="epochs to run (default 1)")
    run.add_argument("--steps", type=int, default=None, help="stop after this many batches")
    run.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    run.add_argument("--trace", metavar="FILE", help="write a Chrome trace of per-node spans (bounded)")
    run.add_argument("--skipped", metavar="FILE",
                     help="write the ledger of skipped samples (on_error: skip) as JSON lines")
    run.set_defaults(func=cmd_run)

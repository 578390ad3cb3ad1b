"""``conveyor run SPEC``: run the graph for some epochs or steps with a progress bar, then print
one table of each node's counts and timings over the whole run and where the time went;
``--trace`` writes a Chrome trace, ``--skipped`` the ledger of skipped samples. Ctrl-C stops it
with the summary up to there."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from conveyor.errors import ConveyorError
from conveyor.graphs.compile import compile_plan
from conveyor.graphs.loader import Loader
from conveyor.graphs.validate import Plan
from conveyor.tools._args import INTERRUPTED, UsageError, add_spec_args, checked_plan
from conveyor.tools.bottleneck import find_bottleneck, node_rows
from conveyor.tools.measure import Meter, batch_len
from conveyor.tools.tables import node_table, pct
from conveyor.tools.trace import trace_recorder, write_trace


def cmd_run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    if args.epochs < 1:
        raise UsageError(f"--epochs must be >= 1, got {args.epochs}")
    if args.steps is not None and args.steps < 1:
        raise UsageError(f"--steps must be >= 1 (batches to stop after), got {args.steps}")
    plan = checked_plan(args)
    batches = samples = 0
    waited = 0.0  # seconds the loop spent in iter() and next(): waiting for data
    interrupted = False
    recorder = trace_recorder(args)
    totals = NodeTotals()
    t0 = time.perf_counter()
    with Loader(compile_plan(plan)) as loader:
        meter = Meter(loader)
        if recorder is not None:
            recorder.attach(loader)
        with tqdm(total=_total_batches(loader, args), unit="batch", disable=args.quiet, file=sys.stderr,
                  dynamic_ncols=True) as bar:
            folded = True
            try:
                for _ in range(args.epochs):
                    folded = False
                    t = time.perf_counter()
                    it = iter(loader)
                    while True:
                        try:
                            batch = next(it)
                        except StopIteration:
                            break
                        finally:
                            now = time.perf_counter()
                            waited += now - t
                        n = batch_len(batch)
                        batches += 1
                        samples += n
                        bar.set_postfix_str(f"epoch {loader.epoch}, {samples / max(now - t0, 1e-9):,.1f} samples/s",
                                            refresh=False)
                        bar.update(1)
                        if args.steps and batches >= args.steps:
                            break
                        t = time.perf_counter()
                    meter.fold()
                    totals.add(loader.stats())
                    folded = True
                    if args.steps and batches >= args.steps:
                        break
            except KeyboardInterrupt:  # Ctrl-C: stop, close the loader, report what was done
                interrupted = True
                if not folded:
                    meter.fold()
                    totals.add(loader.stats())
        elapsed = time.perf_counter() - t0
        if args.skipped:
            from conveyor.tools.check import write_ledger

            ledger = loader.skipped()
            write_ledger(args.skipped, ledger["entries"])
            print(f"skipped: {ledger['count']} skip(s), {len(ledger['entries'])} sample(s) named in {args.skipped}",
                  file=sys.stderr)
        rows = node_rows(loader, meter.raws, elapsed)
    totals.fill(rows)
    print(node_table(rows, sizes=False, notes=True))
    print(f"done: {batches} batches, {samples} samples, {loader.epoch + 1} epoch(s) in {elapsed:.2f} s "
          f"({batches / elapsed:,.1f} batches/s, {samples / elapsed:,.1f} samples/s)")
    sys.stdout.flush()
    _, sentence = find_bottleneck(rows, elapsed)
    print(f"where the time went ({elapsed:.2f} s, all epochs): the loop waited for data "
          f"{pct(min(1.0, waited / elapsed) if elapsed > 0 else 0.0)} of the time; {sentence}.",
          file=sys.stderr)
    if recorder is not None:
        write_trace(recorder, args.trace)
    if interrupted:
        print(f"conveyor: interrupted after {batches} batches (the summary above is up to there)",
              file=sys.stderr)
        return INTERRUPTED
    if batches == 0:
        print(f"conveyor: warning: no batch came out of {args.epochs} epoch(s): "
              f"{_why_no_batch(totals.items(), plan)}", file=sys.stderr)
        return 1
    return 0


def _total_batches(loader: Loader, args: argparse.Namespace) -> int | None:
    """The progress bar's total: ``--steps``, or the epochs' batches where ``len()`` is known."""
    try:
        per_epoch = len(loader)
    except (TypeError, ConveyorError):  # the data decide the length: a bar without a total
        per_epoch = None
    if per_epoch is None:
        return args.steps
    whole = per_epoch * max(args.epochs, 0)
    return min(whole, args.steps) if args.steps else whole


class NodeTotals:
    """Each node's own counts (``Loader.stats()``), summed over the epochs of a run, so the one
    table ``conveyor run`` prints has the same span for every column: whole numbers are summed
    (items, requests, skipped, ...), a padding efficiency is recomputed from the summed tokens,
    settings (a copy count) are shown as they are, and other figures (ratios, lists) only for a
    run of one epoch."""

    SETTINGS = frozenset({"copies", "method", "boundaries", "epochs_run_ahead",  # not per-epoch counts
                          "made_in", "mode_switches"})

    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, Any]] = {}
        self.epochs = 0

    def add(self, stats: dict[str, Any]) -> None:
        self.epochs += 1
        for name, entry in stats.get("nodes", {}).items():
            total = self.nodes.setdefault(name, {})
            for key, value in entry.items():
                if key in ("op", "perf"):
                    continue
                if key in self.SETTINGS:
                    total[key] = value
                elif isinstance(value, int) and not isinstance(value, bool):
                    total[key] = total.get(key, 0) + value
                elif self.epochs == 1:
                    total[key] = value
                else:
                    total.pop(key, None)
            if self.epochs > 1 and "real_tokens" in total and total.get("padded_tokens"):
                total["padding_efficiency"] = round(total["real_tokens"] / total["padded_tokens"], 4)

    def items(self) -> dict[str, int]:
        """Items out of each node, over the run."""
        return {name: total["items"] for name, total in self.nodes.items()}

    def fill(self, rows: dict[str, dict[str, Any]]) -> None:
        """Give every row its count over the run (also the nodes counted in worker copies) and
        its own counts as a note."""
        for name, row in rows.items():
            total = self.nodes.get(name, {})
            if row.get("items") is None and "items" in total:
                row["items"] = total["items"]
            row["notes"] = ", ".join(f"{k} {v}" for k, v in total.items() if k != "items")


def _why_no_batch(counts: dict[str, int], plan: Plan) -> str:
    """Where the items stopped: the first node that received items and yielded none."""
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

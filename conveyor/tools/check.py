"""``conveyor check SPEC``: a pre-flight over one whole epoch, so a corrupt dataset is found
before a three-day run and not in its thirtieth hour.

    conveyor check specs/imagenet.yaml [--set root=...] [--out skipped.jsonl] [--limit N]

Every sample of one epoch (this rank's share; all of them outside torchrun) goes through the
graph's readers and map functions as the spec runs them, in parallel (map workers and worker
copies as configured), with no batching and no training: the graph is cut before its first
batching node (batch, bucket_batch, collate, pad_collate, pin_memory, to_device, prefetch),
and every node that has ``on_error`` skips and records instead of raising. What failed is
written as the skip ledger (one JSON object a line: node, sample, error, message, times) with
a summary by node and error type. Exit status 0 when nothing failed, 1 when something did.

Example:
    >>> result = check(check_spec("specs/imagenet.yaml"))       # doctest: +SKIP
    >>> result.samples, result.failed
    (200, 0)
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from conveyor.graphs.compile import compile_plan, topological
from conveyor.graphs.loader import Loader
from conveyor.graphs.validate import Plan
from conveyor.tools._args import add_spec_args, checked_plan



@dataclass
class CheckResult:
    """What one check found."""

    samples: int                  # samples that came through every reader and map
    failed: int                   # skips, all nodes (a sample skipped twice counts twice)
    entries: list[dict]           # the ledger: the first 1,000 distinct samples of each node
    seconds: float
    output: str                   # the node the check read from
    by_node: dict[str, collections.Counter] = field(default_factory=dict)


def _after_samples(op: Any) -> bool:
    """An op that only groups, pads, moves or buffers samples: the check stops before the first
    of them (its ``OpSpec`` says it batches, collates or passes items through)."""
    return op.batches or op.collates or op.pass_through


def per_sample_plan(plan: Plan) -> Plan:
    """``plan`` cut before its first batching node, with ``on_error: skip`` wherever it exists."""
    out = plan.output
    while _after_samples(plan.nodes[out].op) and len(plan.nodes[out].inputs) == 1:
        out = plan.nodes[out].inputs[0]
    keep = topological(plan, out)
    nodes = {}
    for name in keep:
        p = plan.nodes[name]
        params = p.params
        if any(f.name == "on_error" for f in dataclasses.fields(params)):
            params = dataclasses.replace(params, on_error=type(params.on_error)("skip"))
        nodes[name] = dataclasses.replace(p, params=params)
    copies = plan.copies
    if copies is not None and copies.until not in keep:
        copies = dataclasses.replace(copies, until=out)
    return dataclasses.replace(plan, nodes=nodes, output=out, copies=copies, even_batches="never")


def check(plan: Plan, *, progress: Callable[[int, int], None] | None = None, every: float = 2.0) -> CheckResult:
    """Run one epoch of ``per_sample_plan(plan)`` and gather its skip ledger.

    Args:
        plan: a checked spec.
        progress: called every ``every`` seconds with (samples so far, failures so far).
        every: see ``progress``.
    """
    cut = per_sample_plan(plan)
    t0 = time.perf_counter()
    n = 0
    with Loader(compile_plan(cut)) as loader:
        last = t0
        for _ in loader:
            n += 1
            if progress is not None and time.perf_counter() - last >= every:
                last = time.perf_counter()
                progress(n, loader.skipped()["count"])
        ledger = loader.skipped()
    by_node: dict[str, collections.Counter] = {}
    for e in ledger["entries"]:
        by_node.setdefault(e["node"], collections.Counter())[e["error"]] += e["times"]
    return CheckResult(n, ledger["count"], ledger["entries"], time.perf_counter() - t0, cut.output, by_node)


def write_ledger(path: str, entries: list[dict]) -> None:
    """The ledger as JSON lines (``conveyor run --skipped`` and ``conveyor check --out``)."""
    with open(path, "w", encoding="utf-8") as f:
        for e in entries:
            f.write(json.dumps(e, ensure_ascii=False) + "\n")


def summary(result: CheckResult, spec: str) -> str:
    """The lines ``conveyor check`` prints."""
    lines = [f"check {spec}: {result.samples + result.failed} samples through the readers and maps up to "
             f"'{result.output}' in {result.seconds:.1f} s: {result.samples} ok, {result.failed} failed"]
    for node, kinds in result.by_node.items():
        lines.append(f"  {node}: " + ", ".join(f"{k} x{v}" for k, v in kinds.most_common()))
    for e in result.entries[:10]:
        lines.append(f"  {e['sample']}: {e['error']}: {e['message']}")
    if len(result.entries) > 10:
        lines.append(f"  ... and {len(result.entries) - 10} more in the ledger")
    kept = sum(e["times"] for e in result.entries)
    if result.failed > kept:
        lines.append(f"  ({result.failed - kept} further failures were counted, not named: each node names its "
                     "first 1,000 samples)")
    return "\n".join(lines)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``conveyor check`` to the CLI's subcommands."""
    p = subparsers.add_parser("check", help="run every sample of one epoch through the readers and maps; "
                                            "write the ledger of what fails")
    add_spec_args(p)
    p.add_argument("--out", metavar="FILE", default="skipped.jsonl",
                   help="where the ledger goes, one JSON object a line (default: skipped.jsonl)")
    p.set_defaults(func=cmd_check)
    return p


def cmd_check(args: argparse.Namespace) -> int:
    return run(args, checked_plan(args))


def run(args: argparse.Namespace, plan: Plan) -> int:
    """``conveyor check``: progress on stderr, the summary on stdout, the ledger to ``--out``."""
    def progress(n: int, failed: int) -> None:
        print(f"checked {n} samples, {failed} failed so far", file=sys.stderr, flush=True)

    result = check(plan, progress=progress)
    write_ledger(args.out, result.entries)
    print(summary(result, args.spec))
    print(f"ledger: {len(result.entries)} sample(s) written to {args.out}")
    return 1 if result.failed else 0

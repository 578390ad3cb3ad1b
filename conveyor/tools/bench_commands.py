"""``conveyor bench SPEC`` and ``conveyor tune SPEC``: their command lines.

``bench`` runs the graph with no model (``run_bench``) and prints where the time goes, the
limiting node and the memory the buffers hold; ``--report`` writes all of it, with charts, as
one HTML page. ``tune`` measures params in alternating rounds and picks the knee of the
throughput curve, or says the noise hides it (``--plot`` draws the curve as SVG, ``--write``
saves the pick as a params file, ``--report`` benches the pick, or draws the curve alone when
there is none): both run ``bench_report``.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from conveyor.graphs.api import check_spec, read_spec
from conveyor.graphs.validate import Plan
from conveyor.tools._args import UsageError, add_spec_args, checked_plan, declared_params, overrides
from conveyor.tools.trace import trace_recorder, write_trace


def _progress_line(total: float) -> Any:
    """A progress callback for ``drive``: one line on stderr, rewritten in place on a terminal."""
    tty = sys.stderr.isatty()

    def progress(measured: float, samples: int) -> None:
        rate = samples / measured if measured > 0 else 0.0
        line = f"measuring: {measured:.0f}/{total:g} s, {rate:,.1f} samples/s so far"
        print(("\r" + line) if tty else line, end="" if tty else "\n", file=sys.stderr, flush=True)

    return progress


def bench_report(args: argparse.Namespace, plan: Plan, *, tune: Any = None, title: str | None = None) -> Any:
    """Run the bench of ``plan`` (progress on stderr), write ``--report``/``--trace``; the result."""
    from conveyor.tools.bench import bench_warmup, run_bench
    from conveyor.tools.report import Timeline, write_report

    recorder = trace_recorder(args)
    timeline = Timeline() if getattr(args, "report", None) else None
    warm = args.warmup if args.warmup is not None else bench_warmup(args.seconds)
    print(f"bench {plan.path}: warming up {warm:g} s, then measuring {args.seconds:g} s", file=sys.stderr,
          flush=True)
    result = run_bench(plan, seconds=args.seconds, warmup=args.warmup,
                       step_time=(getattr(args, "step_time", None) or 0.0) / 1000.0,
                       on_loader=recorder.attach if recorder is not None else None,
                       timeline=timeline, progress=_progress_line(args.seconds))
    if sys.stderr.isatty():
        print(file=sys.stderr)
    if recorder is not None:
        write_trace(recorder, args.trace)
    if timeline is not None:
        write_report(args.report, result, timeline, order=list(plan.nodes),
                     inputs={n: list(node.inputs) for n, node in plan.nodes.items()}, tune=tune, title=title)
        print(f"report: written to {args.report} (one HTML file; open it in a browser)", file=sys.stderr)
    return result



def cmd_bench(args: argparse.Namespace) -> int:
    from conveyor.tools.bench import format_report

    if args.seconds <= 0:
        raise UsageError(f"--seconds must be > 0, got {args.seconds}")
    if args.step_time is not None and args.step_time < 0:
        raise UsageError(f"--step-time must be >= 0 (milliseconds), got {args.step_time}")
    result = bench_report(args, checked_plan(args))
    print(format_report(result))
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    from conveyor.tools import tune
    from conveyor.tools.plots import tune_svg

    if args.seconds <= 0:
        raise UsageError(f"--seconds must be > 0, got {args.seconds}")
    if args.rounds < 1:
        raise UsageError(f"--rounds must be >= 1, got {args.rounds}")
    doc = read_spec(args.spec)
    base = overrides(args, doc)
    try:
        grid = tune.parse_grid(args.param, declared_params(doc) or {})
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    clash = sorted(set(grid) & set(base))
    if clash:
        raise UsageError(f"{', '.join(clash)}: given both to --param (swept) and --set/--params (fixed)")
    n = len(tune.settings(grid))
    print(f"tune {args.spec}: {n} setting(s) x {args.rounds} round(s), about {args.seconds:g} s each after "
          "a warm-up")

    def progress(p: Any, r: int) -> None:
        print(f"  round {r}: {p.label()}: {p.rates[-1]:,.1f} samples/s", flush=True)

    points = tune.sweep(doc, grid, base=base, seconds=args.seconds, warmup=args.warmup, rounds=args.rounds,
                        progress=progress)
    verdict = tune.decide(points)
    print()
    print(tune.format_curve(points, verdict))
    print()
    print(verdict.sentence)
    if verdict.pick is not None:
        print(f"use: conveyor run {args.spec} {tune.set_args(verdict.pick.params)}")
    if args.plot:
        with open(args.plot, "w", encoding="utf-8") as f:
            f.write(tune_svg(points, verdict, title=f"conveyor tune {os.path.basename(args.spec)}"))
        print(f"plot: written to {args.plot}")
    if args.write:
        if verdict.pick is None:
            print(f"not written: {args.write} (no pick)")
        else:
            best = verdict.best
            share = verdict.pick.samples_per_s / best.samples_per_s if best.samples_per_s else 0.0
            header = (f"conveyor tune {args.spec}: {verdict.pick.samples_per_s:,.1f} samples/s, {share:.0%} of "
                      f"the best measured\nuse: conveyor run {args.spec} --params {args.write}")
            with open(args.write, "w", encoding="utf-8") as f:
                f.write(tune.params_yaml(verdict.pick.params, header))
            print(f"wrote {args.write}")
    if args.report and verdict.pick is None:  # nothing to bench: the page has the curve alone
        from conveyor.tools.report import render_tune_page

        with open(args.report, "w", encoding="utf-8") as f:
            f.write(render_tune_page(points, verdict, title=f"conveyor tune {args.spec}: no pick"))
        print(f"report: written to {args.report} (the curve only: no pick to bench)")
    elif args.report:
        plan = check_spec(doc, {**base, **verdict.pick.params})
        bench_report(args, plan, tune=(points, verdict),
                     title=f"conveyor tune {args.spec}: bench of {verdict.pick.label()}")
    return 0



def add_parsers(sub: Any) -> None:
    """Add ``conveyor bench`` and ``conveyor tune`` to the CLI's subcommands."""
    bench = sub.add_parser("bench", help="run the graph with no model: where the time goes, the bottleneck")
    add_spec_args(bench)
    bench.add_argument("--seconds", type=float, default=10.0, help="seconds measured (default 10)")
    bench.add_argument("--warmup", type=float, default=None,
                       help="seconds before measuring (default: a quarter of --seconds, at most 3)")
    bench.add_argument("--step-time", type=float, default=None, metavar="MS",
                       help="simulate a trainer taking MS milliseconds per batch")
    bench.add_argument("--trace", metavar="FILE", help="write a Chrome trace of per-node spans (bounded)")
    bench.add_argument("--report", metavar="FILE", help="write a self-contained HTML report of the run")
    bench.set_defaults(func=cmd_bench)

    tune = sub.add_parser("tune", help="sweep params and pick the knee of the throughput curve")
    add_spec_args(tune)
    tune.add_argument("--param", action="append", required=True, metavar="K=V1,V2",
                      help="a declared param and the values to try, cheapest first (repeatable)")
    tune.add_argument("--seconds", type=float, default=2.0,
                      help="seconds measured per setting and round (default 2)")
    tune.add_argument("--rounds", type=int, default=3,
                      help="rounds per setting, alternating the order (default 3); the spread is their range")
    tune.add_argument("--warmup", type=float, default=None,
                      help="seconds before measuring each setting (default: a quarter of --seconds, at most 2)")
    tune.add_argument("--write", metavar="FILE", help="write the pick as a params file (for --params)")
    tune.add_argument("--plot", metavar="FILE", help="write the curve as an SVG picture")
    tune.add_argument("--report", metavar="FILE",
                      help="bench the pick and write an HTML report with the curve (--seconds long)")
    tune.set_defaults(func=cmd_tune)

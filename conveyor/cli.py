"""The ``conveyor`` command: run, validate, show, bench and tune a spec.

    conveyor run SPEC [--set k=v ...] [--params FILE] [--epochs N] [--steps N] [--trace FILE]
    conveyor validate SPEC [--set k=v ...]
    conveyor show SPEC [--format text|dot|mermaid] [--batch] [--set k=v ...]
    conveyor bench SPEC [--seconds N] [--step-time MS] [--set k=v ...] [--trace FILE] [--report FILE]
    conveyor tune SPEC --param workers=1,2,4,8 [--param k=a,b] [--seconds N] [--rounds N]
                       [--write FILE] [--plot FILE.svg] [--report FILE.html]
    conveyor check SPEC [--set k=v ...] [--out skipped.jsonl]   (conveyor/check.py)
    conveyor pack SRC DST [--shard-size 256MB]          (conveyor/pack.py)
    conveyor ops [OP]                                   (conveyor/reference.py)

``validate`` prints every problem as ``file:line:col: node 'x' (op): message`` and exits 1,
or prints ``ok`` and the nodes and exits 0. Spec errors exit 1 from every command; bad
command-line usage exits 2. ``run`` prints each node's counts (stdout) and where the time
went (stderr); ``bench`` prints a table per node, names the node that limits the graph and
estimates the memory its buffers hold (``--report`` writes all of it, with charts, as one
HTML page); ``tune`` measures params in alternating rounds and picks the knee of the
throughput curve, or says the noise hides it (``--plot`` draws the curve as SVG). ``--params FILE`` reads overrides from a YAML mapping (``tune --write``
makes one); ``--set`` wins over it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import time
from typing import Any, Sequence

import yaml

from conveyor.bench import Meter, batch_len, find_bottleneck, node_rows, node_table, pct
from conveyor.errors import ConveyorError, SpecErrors
from conveyor.graphs.api import check_spec, read_spec
from conveyor.graphs.compile import compile_plan, node_params
from conveyor.graphs.loader import Loader
from conveyor.graphs.params import parse_set, redact_texts, secret_texts
from conveyor.graphs.validate import Plan
from conveyor.graphs.yaml_loader import Located

__all__ = ["batch_len", "build_parser", "main"]  # batch_len lives in conveyor.bench now


INTERRUPTED = 130  # the shell's status for a command stopped by Ctrl-C (128 + SIGINT)


class UsageError(Exception):
    """A mistake on the command line itself (exit status 2, like argparse's own)."""


def _declared(doc: Located) -> dict[str, Any] | None:
    declared = doc.data.get("params") if isinstance(doc.data, dict) else None
    return declared if isinstance(declared, dict) else None


def _overrides(args: argparse.Namespace, doc: Located) -> dict[str, Any]:
    """``--params FILE`` values, then ``--set`` values over them."""
    overrides: dict[str, Any] = {}
    if getattr(args, "params", None):
        with open(args.params, encoding="utf-8") as f:
            try:
                data = yaml.safe_load(f)
            except yaml.YAMLError as exc:
                raise UsageError(f"--params {args.params}: not YAML: {exc}") from None
        if data is not None and not isinstance(data, dict):
            raise UsageError(f"--params {args.params}: expected a mapping of param: value, "
                             f"got {type(data).__name__}")
        overrides.update({str(k): v for k, v in (data or {}).items()})
    try:
        overrides.update(parse_set(args.set or [], _declared(doc)))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return overrides


def _plan(args: argparse.Namespace) -> Plan:
    """Read the spec, parse ``--params`` and ``--set`` against its declared params, check it all."""
    doc = read_spec(args.spec)
    return check_spec(doc, _overrides(args, doc))


def _fmt_params(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in params.items())


def show_text(plan: Plan) -> str:
    lines = [f"graph {plan.path} -> output '{plan.output}'" + ("" if plan.resumable else " (not resumable)")]
    if plan.params:
        hidden = getattr(plan, "secret_params", ())
        lines.append("params: " + _fmt_params({k: "***" if k in hidden else v for k, v in plan.params.items()}))
    copies = getattr(plan, "copies", None)
    if copies is not None and copies.count > 1:
        lines.append(f"workers: {copies.count} {copies.method} copies of the graph up to '{copies.until}', "
                     "merged round-robin")
    from conveyor.graphs.even import uneven_nodes

    uneven, mode = uneven_nodes(plan), getattr(plan, "even_batches", "auto")
    if mode == "always" or (mode == "auto" and uneven):
        why = f" ({', '.join(uneven)} can give ranks different counts)" if uneven else ""
        lines.append(f"ranks: agree on each epoch's last batch under torch.distributed{why}")
    elif mode == "never" and uneven:
        lines.append(f"ranks: even_batches: never, though {', '.join(uneven)} can give ranks different "
                     "counts: balance them yourself or DDP waits on the rank that has more")
    for name, node in plan.nodes.items():
        src = f" <- {', '.join(node.inputs)}" if node.inputs else ""
        lines.append(f"  {name}: {node.op.name}{src}")
        params = node_params(node.params)
        if params:
            lines.append(f"      {_fmt_params(params)}")
    return "\n".join(lines)


def _label(name: str, plan: Plan) -> str:
    node = plan.nodes[name]
    params = node_params(node.params)
    detail = "\\n".join(f"{k}: {json.dumps(v)}" for k, v in params.items() if v not in (None, {}, []))
    return f"{name} ({node.op.name})" + (f"\\n{detail}" if detail else "")


def _dot_id(name: str) -> str:
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def show_dot(plan: Plan) -> str:
    lines = ["digraph conveyor {", "  rankdir=TB;", '  node [shape=box, fontname="monospace"];']
    for name in plan.nodes:
        label = _label(name, plan).replace('"', '\\"')
        style = ", style=bold" if name == plan.output else ""
        lines.append(f'  {_dot_id(name)} [label="{label}"{style}];')
    for name, node in plan.nodes.items():
        for i in node.inputs:
            lines.append(f"  {_dot_id(i)} -> {_dot_id(name)};")
    lines.append("}")
    return "\n".join(lines)


_MERMAID_WORDS = {"end", "graph", "subgraph", "flowchart", "style", "class", "classDef", "click",
                  "linkStyle", "direction"}


def show_mermaid(plan: Plan) -> str:
    # a node name is its mermaid id when mermaid can read it as one; else n<index> (the label
    # always shows the name)
    ids = {name: name if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) and name not in _MERMAID_WORDS
           else f"n{i}" for i, name in enumerate(plan.nodes)}
    lines = ["flowchart TD"]
    for name in plan.nodes:
        label = _label(name, plan).replace("\\n", "<br/>").replace('"', "#quot;")
        lines.append(f'  {ids[name]}["{label}"]')
    for name, node in plan.nodes.items():
        for i in node.inputs:
            lines.append(f"  {ids[i]} --> {ids[name]}")
    return "\n".join(lines)


def cmd_validate(args: argparse.Namespace) -> int:
    plan = _plan(args)
    print(f"ok: {args.spec}: {len(plan.nodes)} nodes, output '{plan.output}'")
    for name, node in plan.nodes.items():
        src = f" <- {', '.join(node.inputs)}" if node.inputs else ""
        print(f"  {name} ({node.op.name}){src}")
    return 0


def _hide_secrets(text: str, plan: Plan) -> str:
    """``text`` with the values given to secret params (storage_options), wherever they came
    from (a spec param, --set), replaced by ***."""
    from conveyor.graphs.compile import SECRET_PARAMS
    from conveyor.storage import redact, secret_values

    for node in plan.nodes.values():
        for name in SECRET_PARAMS:
            value = node.raw.get(name)
            secrets = secret_values(value) if isinstance(value, dict) else (
                {value} if isinstance(value, str) and len(value) >= 4 else set())
            for secret in sorted(secrets, key=len, reverse=True):
                text = text.replace(secret, "***")
    texts = [secret_texts(plan.params.get(k)) for k in getattr(plan, "secret_params", ())]
    return redact(redact_texts(text, set().union(*texts)))


def cmd_show(args: argparse.Namespace) -> int:
    plan = _plan(args)
    text = {"text": show_text, "dot": show_dot, "mermaid": show_mermaid}[args.format](plan)
    print(_hide_secrets(text, plan))
    if args.batch:
        print(_hide_secrets("\n".join(_first_batch(plan)), plan))
    return 0


def _first_batch(plan: Plan) -> list[str]:
    """The first batch's structure (``loader.peek()``) and the epoch's length, as lines."""
    from conveyor.batch_info import describe_batch

    with Loader(compile_plan(plan)) as loader:
        try:
            length = f"{len(loader)} batches per epoch on this rank"
        except TypeError as exc:
            length = str(exc)
        batch = loader.peek()
        return [f"first batch of epoch 0 ({length}):"] + ["  " + line for line in describe_batch(batch)]


def _trace_recorder(args: argparse.Namespace) -> Any:
    if not getattr(args, "trace", None):
        return None
    from conveyor.trace import TraceRecorder

    return TraceRecorder()


def _write_trace(recorder: Any, path: str) -> None:
    recorder.detach()
    n = recorder.write(path)
    print(f"trace: {n} spans written to {path} (open it in ui.perfetto.dev or chrome://tracing)",
          file=sys.stderr)


def cmd_run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    plan = _plan(args)
    batches = samples = 0
    interrupted = False
    recorder = _trace_recorder(args)
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
            from conveyor.check import write_ledger

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
        _write_trace(recorder, args.trace)
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


def _progress_line(total: float) -> Any:
    """A progress callback for ``drive``: one line on stderr, rewritten in place on a terminal."""
    tty = sys.stderr.isatty()

    def progress(measured: float, samples: int) -> None:
        rate = samples / measured if measured > 0 else 0.0
        line = f"measuring: {measured:.0f}/{total:g} s, {rate:,.1f} samples/s so far"
        print(("\r" + line) if tty else line, end="" if tty else "\n", file=sys.stderr, flush=True)

    return progress


def _bench_report(args: argparse.Namespace, plan: Plan, *, tune: Any = None, title: str | None = None) -> Any:
    """Run the bench of ``plan`` (progress on stderr), write ``--report``/``--trace``; the result."""
    from conveyor.bench import bench_warmup, run_bench
    from conveyor.report import Timeline, write_report

    recorder = _trace_recorder(args)
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
        _write_trace(recorder, args.trace)
    if timeline is not None:
        write_report(args.report, result, timeline, order=list(plan.nodes),
                     inputs={n: list(node.inputs) for n, node in plan.nodes.items()}, tune=tune, title=title)
        print(f"report: written to {args.report} (one HTML file; open it in a browser)", file=sys.stderr)
    return result


def cmd_check(args: argparse.Namespace) -> int:
    from conveyor.check import run

    return run(args, _plan(args))


def cmd_bench(args: argparse.Namespace) -> int:
    from conveyor.bench import format_report

    if args.seconds <= 0:
        raise UsageError(f"--seconds must be > 0, got {args.seconds}")
    if args.step_time is not None and args.step_time < 0:
        raise UsageError(f"--step-time must be >= 0 (milliseconds), got {args.step_time}")
    result = _bench_report(args, _plan(args))
    print(format_report(result))
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    from conveyor import tune
    from conveyor.plots import tune_svg

    if args.seconds <= 0:
        raise UsageError(f"--seconds must be > 0, got {args.seconds}")
    if args.rounds < 1:
        raise UsageError(f"--rounds must be >= 1, got {args.rounds}")
    doc = read_spec(args.spec)
    base = _overrides(args, doc)
    try:
        grid = tune.parse_grid(args.param, _declared(doc) or {})
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
    if args.report:
        chosen = verdict.pick or verdict.best
        plan = check_spec(doc, {**base, **chosen.params})
        _bench_report(args, plan, tune=(points, verdict),
                      title=f"conveyor tune {args.spec}: bench of {chosen.label()}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="conveyor", description="PyTorch data loading as a declared graph")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("spec", help="path of the YAML spec")
        p.add_argument("--set", action="append", metavar="K=V", help="override a spec param (repeatable)")
        p.add_argument("--params", metavar="FILE", help="YAML mapping of param overrides (--set wins)")

    run = sub.add_parser("run", help="run the graph and report throughput")
    common(run)
    run.add_argument("--epochs", type=int, default=1, help="epochs to run (default 1)")
    run.add_argument("--steps", type=int, default=None, help="stop after this many batches")
    run.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    run.add_argument("--trace", metavar="FILE", help="write a Chrome trace of per-node spans (bounded)")
    run.add_argument("--skipped", metavar="FILE",
                     help="write the ledger of skipped samples (on_error: skip) as JSON lines")
    run.set_defaults(func=cmd_run)

    from conveyor import check as check_cmd

    check_cmd.add_parser(sub, common).set_defaults(func=cmd_check)

    bench = sub.add_parser("bench", help="run the graph with no model: where the time goes, the bottleneck")
    common(bench)
    bench.add_argument("--seconds", type=float, default=10.0, help="seconds measured (default 10)")
    bench.add_argument("--warmup", type=float, default=None,
                       help="seconds before measuring (default: a quarter of --seconds, at most 3)")
    bench.add_argument("--step-time", type=float, default=None, metavar="MS",
                       help="simulate a trainer taking MS milliseconds per batch")
    bench.add_argument("--trace", metavar="FILE", help="write a Chrome trace of per-node spans (bounded)")
    bench.add_argument("--report", metavar="FILE", help="write a self-contained HTML report of the run")
    bench.set_defaults(func=cmd_bench)

    tune = sub.add_parser("tune", help="sweep params and pick the knee of the throughput curve")
    common(tune)
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

    val = sub.add_parser("validate", help="check the spec and list every problem")
    common(val)
    val.set_defaults(func=cmd_validate)

    show = sub.add_parser("show", help="print the compiled graph")
    common(show)
    show.add_argument("--format", choices=("text", "dot", "mermaid"), default="text")
    show.add_argument("--batch", action="store_true",
                      help="also build the loader and print its first batch: keys, shapes, dtypes, ranges")
    show.set_defaults(func=cmd_show)

    from conveyor import reference  # conveyor ops [OP]: the reference, from the op registry

    reference.add_parser(sub)

    # --- conveyor pack (conveyor/pack.py, another module's command): added when present ---
    try:
        from conveyor import pack
    except ModuleNotFoundError as exc:
        if exc.name != "conveyor.pack":
            raise
    else:
        pack.add_parser(sub)
    return parser


def _import_path(spec: Any) -> None:
    """Put the current folder, then the spec's folder, first on the import path, as
    ``python -m`` puts the current folder: a spec's ``fn: myfns:double`` finds ``myfns.py``
    where the user runs the command or beside the spec (a console script's path holds
    neither; ``load_graph`` in a script has the script's folder)."""
    folders = [os.getcwd()]
    if isinstance(spec, str) and os.path.isfile(spec):
        folders.append(os.path.dirname(os.path.abspath(spec)))
    for folder in reversed(folders):
        if folder not in sys.path:
            sys.path.insert(0, folder)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _import_path(getattr(args, "spec", None))
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except UsageError as exc:
        print(f"conveyor: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C outside a run's loop (checking, building, closing)
        print("conveyor: interrupted", file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:  # `conveyor show spec.yaml | head`: the reader left, say nothing more
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so that the flush at exit does not fail again
        return 1
    except SpecErrors as exc:
        for err in exc.errors:
            print(err, file=sys.stderr)
        print(f"{len(exc.errors)} error(s) in {args.spec}", file=sys.stderr)
        return 1
    except FileNotFoundError as exc:  # the spec file, or a SourceError (no file matches ...)
        print(f"conveyor: {exc}", file=sys.stderr)
        for note in getattr(exc, "__notes__", ()):  # the node it came from
            print(f"  {note}", file=sys.stderr)
        return 1
    except ConveyorError as exc:
        print(f"conveyor: {type(exc).__name__}: {exc}", file=sys.stderr)
        for note in getattr(exc, "__notes__", ()):  # the node it came from ("in node 'read' ...")
            print(f"  {note}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

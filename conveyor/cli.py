"""The ``conveyor`` command: run, validate and show a spec.

    conveyor run SPEC [--set k=v ...] [--epochs N] [--steps N]
    conveyor validate SPEC [--set k=v ...]
    conveyor show SPEC [--format text|dot|mermaid] [--set k=v ...]

``validate`` prints every problem as ``file:line:col: node 'x' (op): message`` and exits 1,
or prints ``ok`` and the nodes and exits 0. Spec errors exit 1 from every command; bad
command-line usage exits 2.
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

from conveyor.errors import ConveyorError, SpecErrors
from conveyor.graphs.api import check_spec, read_spec
from conveyor.graphs.compile import compile_plan, node_params
from conveyor.graphs.loader import Loader
from conveyor.graphs.params import parse_set
from conveyor.graphs.validate import Plan


def batch_len(batch: Any) -> int:
    """Samples in a batch: the leading dim of its first tensor, or its length."""
    first = batch
    while isinstance(first, (dict, list, tuple)) and not hasattr(first, "shape"):
        if isinstance(first, dict):
            if not first:
                return 0
            first = next(iter(first.values()))
        elif isinstance(first, (list, tuple)):
            if not first or not isinstance(first[0], (dict, list, tuple)) and not hasattr(first[0], "shape"):
                return len(first)
            if isinstance(batch, list) and first is batch:
                return len(first)
            first = first[0]
    shape = getattr(first, "shape", None)
    return int(shape[0]) if shape else 1


class UsageError(Exception):
    """A mistake on the command line itself (exit status 2, like argparse's own)."""


def _plan(args: argparse.Namespace) -> Plan:
    """Read the spec, parse ``--set`` against its declared params, and check the whole spec."""
    doc = read_spec(args.spec)
    declared = doc.data.get("params") if isinstance(doc.data, dict) else None
    try:
        overrides = parse_set(args.set or [], declared if isinstance(declared, dict) else None)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return check_spec(doc, overrides)


def _fmt_params(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in params.items())


def show_text(plan: Plan) -> str:
    lines = [f"graph {plan.path} -> output '{plan.output}'" + ("" if plan.resumable else " (not resumable)")]
    if plan.params:
        lines.append("params: " + _fmt_params(plan.params))
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


def cmd_show(args: argparse.Namespace) -> int:
    plan = _plan(args)
    print({"text": show_text, "dot": show_dot, "mermaid": show_mermaid}[args.format](plan))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    plan = _plan(args)
    batches = samples = 0
    t0 = time.perf_counter()
    with Loader(compile_plan(plan)) as loader:
        with tqdm(total=args.steps, unit="batch", disable=args.quiet, file=sys.stderr,
                  dynamic_ncols=True) as bar:
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
                if args.steps and batches >= args.steps:
                    break
        elapsed = time.perf_counter() - t0
        stats = loader.stats()
    for name, entry in stats["nodes"].items():
        extra = ", ".join(f"{k} {v}" for k, v in entry.items() if k not in ("op", "items"))
        print(f"  {name:<12} {entry['op']:<15} {entry['items']:>9} items" + (f"  ({extra})" if extra else ""))
    print(f"done: {batches} batches, {samples} samples, {loader.epoch + 1} epoch(s) in {elapsed:.2f} s "
          f"({batches / elapsed:,.1f} batches/s, {samples / elapsed:,.1f} samples/s)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="conveyor", description="PyTorch data loading as a declared graph")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("spec", help="path of the YAML spec")
        p.add_argument("--set", action="append", metavar="K=V", help="override a spec param (repeatable)")

    run = sub.add_parser("run", help="run the graph and report throughput")
    common(run)
    run.add_argument("--epochs", type=int, default=1, help="epochs to run (default 1)")
    run.add_argument("--steps", type=int, default=None, help="stop after this many batches")
    run.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    run.set_defaults(func=cmd_run)

    val = sub.add_parser("validate", help="check the spec and list every problem")
    common(val)
    val.set_defaults(func=cmd_validate)

    show = sub.add_parser("show", help="print the compiled graph")
    common(show)
    show.add_argument("--format", choices=("text", "dot", "mermaid"), default="text")
    show.set_defaults(func=cmd_show)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except UsageError as exc:
        print(f"conveyor: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `conveyor show spec.yaml | head`: the reader left, say nothing more
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so that the flush at exit does not fail again
        return 1
    except SpecErrors as exc:
        for err in exc.errors:
            print(err, file=sys.stderr)
        print(f"{len(exc.errors)} error(s) in {args.spec}", file=sys.stderr)
        return 1
    except FileNotFoundError as exc:
        print(f"conveyor: {exc}", file=sys.stderr)
        return 1
    except ConveyorError as exc:
        print(f"conveyor: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

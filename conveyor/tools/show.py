"""``conveyor validate SPEC`` and ``conveyor show SPEC``: the checked graph, as text, Graphviz dot
or Mermaid, with the values of secret params hidden; ``show --batch`` adds the first batch's
structure."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any

from conveyor.graphs.compile import compile_plan, node_params
from conveyor.graphs.loader import Loader
from conveyor.graphs.params import redact_texts, secret_texts
from conveyor.graphs.validate import Plan
from conveyor.tools._args import add_spec_args, checked_plan


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
    plan = checked_plan(args)
    print(f"ok: {args.spec}: {len(plan.nodes)} nodes, output '{plan.output}'")
    for name, node in plan.nodes.items():
        src = f" <- {', '.join(node.inputs)}" if node.inputs else ""
        print(f"  {name} ({node.op.name}){src}")
    for warning in missing_roots(plan):
        print(f"conveyor: warning: {warning}", file=sys.stderr)
    return 0


def missing_roots(plan: Plan) -> list[str]:
    """A sentence for each local path a node reads from (``OpSpec.reads_from``) whose fixed
    part, before any wildcard, does not exist: the run would fail at its first batch."""
    from conveyor.storage import fixed_part, is_local

    out = []
    for name, node in plan.nodes.items():
        if node.op.reads_from is None:
            continue
        for url in node.op.reads_from(node.params):
            if not isinstance(url, str) or not url or not is_local(url):
                continue
            path = url[len("file://"):] if url.startswith("file://") else url
            fixed, wild = fixed_part(path)
            folder = fixed.rsplit("/", 1)[0] if wild and "/" in fixed else fixed
            if folder and not os.path.exists(folder):
                shown = folder
                while shown not in ("", "/") and not os.path.exists(shown):
                    shown = os.path.dirname(shown.rstrip("/"))
                near = f" ({shown} does)" if shown not in ("", "/") else ""
                out.append(f"node '{name}' ({node.op.name}) reads from {url}, but {folder} does not exist"
                           f"{near}: the run would fail at its first batch (check the root param, "
                           "e.g. --set root=...)")
    return out


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
    plan = checked_plan(args)
    text = {"text": show_text, "dot": show_dot, "mermaid": show_mermaid}[args.format](plan)
    print(_hide_secrets(text, plan))
    if args.batch:
        print(_hide_secrets("\n".join(_first_batch(plan)), plan))
    return 0


def _first_batch(plan: Plan) -> list[str]:
    """The first batch's structure (``loader.peek()``) and the epoch's length, as lines."""
    from conveyor.tools.batch_info import describe_batch

    with Loader(compile_plan(plan)) as loader:
        try:
            length = f"{len(loader)} batches per epoch on this rank"
        except TypeError as exc:
            length = str(exc)
        batch = loader.peek()
        return [f"first batch of epoch 0 ({length}):"] + ["  " + line for line in describe_batch(batch)]


def add_parsers(sub: Any) -> None:
    """Add ``conveyor validate`` and ``conveyor show`` to the CLI's subcommands."""
    val = sub.add_parser("validate", help="check the spec and list every problem")
    add_spec_args(val)
    val.set_defaults(func=cmd_validate)

    show = sub.add_parser("show", help="print the compiled graph")
    add_spec_args(show)
    show.add_argument("--format", choices=("text", "dot", "mermaid"), default="text")
    show.add_argument("--batch", action="store_true",
                      help="also build the loader and print its first batch: keys, shapes, dtypes, ranges")
    show.set_defaults(func=cmd_show)

"""The ops reference, from the registry: ``conveyor ops``, ``conveyor ops OP`` and docs/ops.md.

Everything shown comes from the ``OpSpec`` table (``conveyor/graphs/registry.py``): an op's one
line (``doc``), what it reads and yields (``items_in``, ``items_out``), the facts a user plans
with (whether ``len(loader)`` is known through it, what it does to the ranks' counts, which
params a state survives a change of: ``length``, ``keeps_count``, ``safe_params``), an
``example`` line, and each param's type, default and ``doc`` from its params dataclass. So an op added to the table
(a built-in, or a plug-in through the ``conveyor.ops`` entry points) is in the reference with
nothing else to write. docs/ops.md holds the built-in ops; regenerate it with

    python -m conveyor.tools.reference docs/ops.md

(a test fails when it is stale).
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import sys
import typing
from typing import Any, Sequence

from conveyor.graphs.registry import OpSpec, builtin_op_names, describe, get_op, op_names

_INPUTS = {
    "none": "none: a source",
    "one": "one stream (`input: NAME`; left out, the node written above)",
    "many": "several streams, named as a list (`input: [a, b]`)",
}


def _show(value: Any) -> str:
    """A default as it would be written in a spec."""
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value if value else '""'
    return json.dumps(value)


def facts(op: OpSpec) -> list[tuple[str, str]]:
    """(label, text) for what an op's declared facts mean to a user: ``len()``, the ranks'
    counts, the params that leave the data the same."""
    out = []
    why = op.unknown_length
    if op.length is None:
        out.append(("len()", f"unknown: it {why}" if why else "unknown: it has no length rule"))
    else:
        out.append(("len()", f"counted, unless it {why}" if why else "counted from its params and inputs"))
    if op.shards_itself:
        out.append(("ranks", "its stream may give each rank its own share: the ranks agree on each epoch's "
                             "last batch"))
    elif op.keeps_count == "always":
        out.append(("ranks", "equal counts stay equal (shard's equalize holds through it)"))
    elif op.keeps_count == "unless_skipping":
        out.append(("ranks", "equal counts stay equal, unless on_error: skip drops items"))
    elif op.inputs != "none":
        out.append(("ranks", "counts may change with the data: after a rank shard, the ranks agree on each "
                             "epoch's last batch"))
    if op.safe_params:
        names = [f.name for f in dataclasses.fields(op.params) if f.name in op.safe_params]
        out.append(("safe", ", ".join(names) + " (changing them leaves the data the same: a saved state still loads under strict=True)"))
    if op.safe_change is not None:
        when = (op.safe_change.__doc__ or "").strip().splitlines()[0].rstrip(".")
        out.append(("safe when", f"{when} (a saved state still loads under strict=True; not by an elastic resume)"))
    return out


def param_rows(op: OpSpec) -> list[tuple[str, str, str, str]]:
    """(name, type, default, doc) for each of ``op``'s params, in declaration order."""
    hints = typing.get_type_hints(op.params)
    rows = []
    for f in dataclasses.fields(op.params):
        if f.default is not dataclasses.MISSING:
            default = _show(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            default = _show(f.default_factory())
        else:
            default = "(required)"
        kind = describe(hints[f.name])
        low = f.metadata.get("min")
        if low is not None:
            kind += f" (>= {low})"
        rows.append((f.name, kind, default, f.metadata.get("doc", "")))
    return rows


def op_list(names: Sequence[str] | None = None) -> str:
    """One line per op: its name and what it does."""
    names = list(names) if names is not None else op_names()
    width = max(len(n) for n in names)
    lines = []
    for name in names:
        op = get_op(name)
        lines.append(f"{name:<{width}}  {op.doc if op else ''}")
    return "\n".join(lines)


def op_text(name: str) -> str:
    """Everything about one op, for the terminal."""
    op = get_op(name)
    if op is None:
        raise KeyError(name)
    lines = [f"{op.name}: {op.doc}", "", f"input:  {_INPUTS[op.inputs].replace('`', '')}"]
    if op.items_in:
        lines.append(f"reads:  {op.items_in}")
    if op.items_out:
        lines.append(f"yields: {op.items_out}")
    lines += [f"{label + ':':<7} {text}" for label, text in facts(op)]
    lines += ["", "params:"]
    rows = param_rows(op)
    if not rows:
        lines.append("  (none)")
    width = max((len(r[0]) for r in rows), default=0)
    for pname, kind, default, doc in rows:
        lines.append(f"  {pname:<{width}}  {kind}, " + ("required" if default == "(required)" else
                                                         f"default {default}"))
        if doc:
            lines.append(f"  {'':<{width}}  {doc}")
    if op.example:
        lines += ["", "example:", f"  {op.example}"]
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(names: Sequence[str] | None = None) -> str:
    """docs/ops.md: an index, then a section per op (default: the built-in ops)."""
    names = list(names) if names is not None else builtin_op_names()
    out = ["# Ops reference", "",
           "<!-- Generated from the op registry by `python -m conveyor.tools.reference docs/ops.md`: do not edit. -->",
           "",
           "Every node of a spec is `name: {op: OP, input: ..., params...}`. The same text is printed by",
           "`conveyor ops` (one line per op, installed plug-ins included) and `conveyor ops OP`.", "",
           "| op | does |", "|---|---|"]
    for name in names:
        out.append(f"| [`{name}`](#{name}) | {_cell(get_op(name).doc)} |")  # type: ignore[union-attr]
    for name in names:
        op = get_op(name)
        assert op is not None
        out += ["", f"## {name}", "", op.doc, "", f"- input: {_INPUTS[op.inputs]}"]
        if op.items_in:
            out.append(f"- reads: {op.items_in}")
        if op.items_out:
            out.append(f"- yields: {op.items_out}")
        out += [f"- {label}: {text}" for label, text in facts(op)]
        rows = param_rows(op)
        if rows:
            out += ["", "| param | type | default | |", "|---|---|---|---|"]
            out += [f"| `{p}` | {_cell(k)} | `{_cell(d)}` | {_cell(doc)} |" for p, k, d, doc in rows]
        else:
            out += ["", "No params."]
        if op.example:
            out += ["", "```yaml", op.example, "```"]
    return "\n".join(out) + "\n"


def cmd_ops(args: argparse.Namespace) -> int:
    """``conveyor ops [OP]``."""
    if args.op is None:
        print(op_list())
        return 0
    try:
        print(op_text(args.op))
    except KeyError:
        from conveyor.errors import did_you_mean

        known = op_names()
        print(f"conveyor: no op '{args.op}'" + (did_you_mean(args.op, known) or f"; ops: {', '.join(known)}"),
              file=sys.stderr)
        return 1
    return 0


def add_parser(sub: Any) -> None:
    """Add ``conveyor ops`` to the CLI's subcommands."""
    ops = sub.add_parser("ops", help="list the ops, or describe one (params, items, an example)")
    ops.add_argument("op", nargs="?", help="the op to describe")
    ops.set_defaults(func=cmd_ops)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m conveyor.tools.reference [PATH]``: write docs/ops.md (or print it)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    text = markdown()
    if not argv:
        sys.stdout.write(text)
        return 0
    with open(argv[0], "w", encoding="utf-8") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

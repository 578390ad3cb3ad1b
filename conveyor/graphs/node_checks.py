"""One node of a spec checked: its op, its params and its inputs, every problem collected.

``validate`` (conveyor/graphs/validate.py) walks the spec's nodes and asks this module, for
each, which op it names (a did-you-mean for an unknown one), whether its params fit the op's
params dataclass (unknown, missing, wrong type, out of range, a ``${param}`` or
``${env:NAME}`` that is not there, a ``fn`` that cannot be imported) and what its inputs are
(the node above when it names none; a source given one, a fan-in op without a list). Each
problem goes to ``Errors`` with its ``file:line:col``; nothing stops at the first.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from typing import Any, Mapping

from conveyor.errors import ConveyorError, SpecError
from conveyor.graphs.params import SPEC_DIR, did_you_mean, env_name, interpolate
from conveyor.graphs.registry import Fn, OpSpec, coerce, get_op, resolve_fn
from conveyor.graphs.yaml_loader import Located

SECRET_PARAMS = ("storage_options",)  # never shown; compile.py keeps them out of states too
NODE_KEYS = ("op", "input")


class Errors:
    """The problems found so far, each placed at ``file:line:col`` in the document."""

    def __init__(self, doc: Located):
        self.doc = doc
        self.items: list[SpecError] = []

    def add(self, message: str, at: tuple, *, key: bool = False, node: str | None = None,
            op: str | None = None, param: str | None = None) -> None:
        line, col = self.doc.where(at, key=key)
        self.items.append(SpecError(message, self.doc.path, line, col, node, op, param))


def type_name(v: Any) -> str:
    """How a spec's value is named in a message: ``int``, ``string``, ``mapping`` ..."""
    return {bool: "bool", int: "int", float: "float", str: "string", list: "list", dict: "mapping",
            type(None): "null"}.get(type(v), type(v).__name__)


def check_params(op: OpSpec, name: str, body: dict[str, Any], params: Mapping[str, Any],
                 errs: Errors) -> tuple[Any, dict[str, Any]]:
    """The node's params as the op's params dataclass (None when one is wrong) and as written
    (after ``${...}`` interpolation)."""
    fields = {f.name: f for f in dataclasses.fields(op.params)}
    hints = typing.get_type_hints(op.params)
    values: dict[str, Any] = {}
    raw: dict[str, Any] = {}
    ok = True
    at_node = ("nodes", name)
    suggested: set[str] = set()  # a typo'd param is reported once, not also as missing
    for key, value in body.items():
        if key in NODE_KEYS:
            continue
        if key not in fields:
            choices = list(fields) + list(NODE_KEYS)
            hint = did_you_mean(key, choices) or (
                f"; {op.name} takes: {', '.join(fields) or 'no params'}")
            suggested.update(c for c in choices if hint == f" (did you mean '{c}'?)")
            errs.add(f"unknown param '{key}'{hint}", at_node + (key,), key=True, node=name, op=op.name,
                     param=key)
            ok = False
            continue
        try:
            value = interpolate(value, params)
        except KeyError as missing:
            ref = missing.args[0]
            if env_name(ref) is not None:
                errs.add(env_unset_message(ref), at_node + (key,), node=name, op=op.name, param=key)
                ok = False
                continue
            env_hint = f" (to read the environment variable, write ${{env:{ref}}})" if ref in os.environ else ""
            errs.add(f"undefined param '${{{ref}}}'" + (did_you_mean(ref, params) or env_hint)
                     + f"; declare it under params: "
                       f"({', '.join(sorted(set(params) - {SPEC_DIR})) or 'none declared'})",
                     at_node + (key,), node=name, op=op.name, param=key)
            ok = False
            continue
        raw[key] = value
        try:
            typed = coerce(hints[key], value)
        except TypeError as expected:
            shown = "(value hidden: it may hold secrets)" if key in SECRET_PARAMS else repr(value)
            errs.add(f"expected {expected.args[0]}, got {type_name(value)} {shown}",
                     at_node + (key,), node=name, op=op.name, param=key)
            ok = False
            continue
        low = fields[key].metadata.get("min")
        if low is not None and typed is not None and isinstance(typed, (int, float)) and typed < low:
            kind = "an int" if isinstance(typed, int) else "a number"
            what = "a positive int" if low == 1 and isinstance(typed, int) else f"{kind} >= {low}"
            errs.add(f"expected {what}, got {typed!r}", at_node + (key,), node=name, op=op.name, param=key)
            ok = False
            continue
        high = fields[key].metadata.get("max")
        if high is not None and typed is not None and isinstance(typed, (int, float)) and typed > high:
            errs.add(f"expected at most {high}, got {typed!r} (a bound checked with the spec: more would "
                     f"hang or exhaust memory at run time)", at_node + (key,), node=name, op=op.name, param=key)
            ok = False
            continue
        if hints[key] is Fn:
            try:
                resolve_fn(typed)
            except ValueError as exc:
                errs.add(str(exc), at_node + (key,), node=name, op=op.name, param=key)
                ok = False
                continue
        values[key] = typed
    for fname, f in fields.items():
        if fname not in values and fname not in body and fname not in suggested \
                and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            errs.add(f"missing; {op.name} requires it" + (f" ({f.metadata['doc']})" if f.metadata.get("doc") else ""),
                     at_node, key=True, node=name, op=op.name, param=fname)
            ok = False
    if not ok:
        return None, raw
    return op.params(**values), raw


def inputs_of(name: str, body: dict[str, Any], op: OpSpec, previous: str | None,
              errs: Errors) -> list[str]:
    """The names the node reads (``previous``, the node above, when it names none)."""
    at = ("nodes", name, "input")
    given = body.get("input")
    if op.inputs == "none":
        if given is not None:
            errs.add(f"{op.name} is a source and takes no input", at, key=True, node=name, op=op.name,
                     param="input")
        return []
    if given is None:
        if op.inputs == "many":
            errs.add(f"{op.name} combines several inputs: name them, e.g. input: [a, b]", ("nodes", name),
                     key=True, node=name, op=op.name, param="input")
            return []
        if previous is None:
            errs.add("no input: this is the first node, so name an input or start with a source "
                     "such as list_files", ("nodes", name), key=True, node=name, op=op.name, param="input")
            return []
        return [previous]
    if op.inputs == "many" and isinstance(given, str):
        errs.add(f"{op.name} combines several inputs: name them as a list, e.g. input: [{given}, other]",
                 at, node=name, op=op.name, param="input")
        return []
    names = [given] if isinstance(given, str) else given
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names) or not names:
        errs.add(f"input must be a node name or a list of names, got {given!r}", at, node=name,
                 op=op.name, param="input")
        return []
    if op.inputs == "one" and len(names) != 1:
        errs.add(f"{op.name} takes one input, got {len(names)}", at, node=name, op=op.name, param="input")
        return []
    return names


def op_of(name: str, body: Any, known: list[str], errs: Errors) -> OpSpec | None:
    """The node's ``OpSpec``, or ``None`` after reporting why there is none."""
    at = ("nodes", name)
    if not isinstance(body, dict):
        errs.add(f"a node is a mapping like {{op: batch, size: 32}}, got {type_name(body)}", at, node=name)
        return None
    op_name = body.get("op")
    if op_name is None:
        errs.add("missing: every node names its op, e.g. op: batch", at, key=True, node=name, param="op")
        return None
    try:
        op = get_op(op_name) if isinstance(op_name, str) else None
    except ConveyorError as exc:  # a registered op whose module fails to import
        errs.add(str(exc), at + ("op",), node=name, param="op")
        return None
    if op is None:
        hint = did_you_mean(str(op_name), known)
        errs.add(f"unknown op '{op_name}'" + (hint or f"; known ops: {', '.join(known)}"), at + ("op",),
                 node=name, param="op")
    return op


def mentioned(body: Any, previous: str | None) -> list[str]:
    """The nodes a node may have meant to read: what its ``input`` names, else the node above."""
    given = body.get("input") if isinstance(body, dict) else None
    names = given if isinstance(given, list) else [given]
    named = [n for n in names if isinstance(n, str)]
    if not named and previous is not None:
        return [previous]
    return named

def env_unset_message(ref: str) -> str:
    """The message for ``${env:NAME}`` when NAME is not set."""
    name = env_name(ref)
    return (f"environment variable '{name}' is not set (set it, or give a default: "
            f"${{env:{name},default}})")

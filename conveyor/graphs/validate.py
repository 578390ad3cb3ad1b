"""Whole-spec checks, all errors at once, each with ``file:line:col``, node and param.

``validate(doc, overrides)`` reads a parsed spec (with positions) and returns a ``Plan``: the
merged params, every node with its op, typed params and resolved inputs, and the output.
It never stops at the first problem: every mistake it can find is collected and raised
together as ``SpecErrors``. What it checks: the spec's top-level keys; param overrides
(unknown key, wrong type); ``${param}`` references; each node's op (with a did-you-mean),
its params (unknown, missing, wrong type, out of range, ``fn`` that cannot be imported, a
process map whose fn cannot be pickled); inputs (dangling, a source given an input, a fan-in
op without a list); cycles; nodes nothing consumes; the output; and graph-level rules (an
unordered map in a graph that must resume exactly; a shuffle buffer placed after a decode).
"""

from __future__ import annotations

import dataclasses
import os
import typing
from dataclasses import dataclass, field
from typing import Any, Mapping

from conveyor.errors import ConveyorError, SpecError, SpecErrors
from conveyor.graphs.copies_check import check_copies
from conveyor.graphs.even import MODES as EVEN_MODES
from conveyor.graphs.opspec import SpecGraph
from conveyor.graphs.params import (SPEC_DIR, apply_overrides, builtin_params, did_you_mean, env_name, interpolate,
                                    redact_texts, referenced, secret_texts, split_overrides)
from conveyor.graphs.registry import Fn, OpSpec, coerce, get_op, op_names, resolve_fn
from conveyor.graphs.yaml_loader import Located

SECRET_PARAMS = ("storage_options",)  # never shown; compile.py keeps them out of states too
TOP_KEYS = ("params", "nodes", "output", "resumable", "workers", "even_batches", "watchdog", "description")
NODE_KEYS = ("op", "input")
MAX_NODES = 500  # keeps the checks (did-you-mean hints compare names) within seconds


@dataclass
class NodePlan:
    """One node, checked: its op, typed params (a dataclass), input names and position."""

    name: str
    op: OpSpec
    params: Any
    inputs: list[str]
    line: int
    col: int
    raw: dict[str, Any] = field(default_factory=dict)  # params after interpolation, as written


@dataclass
class Plan:
    """A checked spec, ready to compile."""

    path: str
    params: dict[str, Any]
    nodes: dict[str, NodePlan]
    output: str
    resumable: bool
    seed: int
    copies: Any = None  # CopiesPlan from the top-level `workers`, or None
    even_batches: str = "auto"  # auto | always | never: see conveyor/graphs/even.py
    secret_params: frozenset = frozenset()  # params that reach storage_options: never shown
    watchdog: float = 60.0  # seconds of stall before a warning says where: conveyor/graphs/watchdog.py
    spec_dir: str = ""  # what ${spec_dir} stood for: states name paths under it by that reference


class _Errors:
    def __init__(self, doc: Located):
        self.doc = doc
        self.items: list[SpecError] = []

    def add(self, message: str, at: tuple, *, key: bool = False, node: str | None = None,
            op: str | None = None, param: str | None = None) -> None:
        line, col = self.doc.where(at, key=key)
        self.items.append(SpecError(message, self.doc.path, line, col, node, op, param))


def _type_name(v: Any) -> str:
    return {bool: "bool", int: "int", float: "float", str: "string", list: "list", dict: "mapping",
            type(None): "null"}.get(type(v), type(v).__name__)


def _check_params(op: OpSpec, name: str, body: dict[str, Any], params: Mapping[str, Any],
                  errs: _Errors) -> tuple[Any, dict[str, Any]]:
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
            errs.add(f"expected {expected.args[0]}, got {_type_name(value)} {shown}",
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


def _inputs_of(name: str, body: dict[str, Any], op: OpSpec, previous: str | None,
               errs: _Errors) -> list[str]:
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


def _op_of(name: str, body: Any, known: list[str], errs: _Errors) -> OpSpec | None:
    """The node's ``OpSpec``, or ``None`` after reporting why there is none."""
    at = ("nodes", name)
    if not isinstance(body, dict):
        errs.add(f"a node is a mapping like {{op: batch, size: 32}}, got {_type_name(body)}", at, node=name)
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


def _mentioned(body: Any, previous: str | None) -> list[str]:
    """The nodes a node may have meant to read: what its ``input`` names, else the node above."""
    given = body.get("input") if isinstance(body, dict) else None
    names = given if isinstance(given, list) else [given]
    named = [n for n in names if isinstance(n, str)]
    if not named and previous is not None:
        return [previous]
    return named


def _find_cycle(inputs: dict[str, list[str]]) -> list[str] | None:
    """A cycle as ``[a, ..., a]`` (each node reads the next), or None. Iterative: a spec may
    chain more nodes than Python's recursion limit."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in inputs:
        if start in state:
            continue
        path: list[str] = [start]
        todo: list[list[str]] = [[m for m in inputs[start] if m in inputs]]
        state[start] = 1
        while path:
            if not todo[-1]:
                state[path.pop()] = 2
                todo.pop()
                continue
            m = todo[-1].pop(0)
            if state.get(m) == 1:
                return path[path.index(m):] + [m]
            if m not in state:
                state[m] = 1
                path.append(m)
                todo.append([k for k in inputs[m] if k in inputs])
    return None


def secret_params(data: Any) -> set[str]:
    """The params whose values reach a node's ``storage_options`` (through ``${name}``)."""
    nodes = data.get("nodes") if isinstance(data, dict) else None
    names: set[str] = set()
    for body in nodes.values() if isinstance(nodes, dict) else ():
        if isinstance(body, dict):
            for key in SECRET_PARAMS:
                names |= referenced(body.get(key))
    return names


def validate(doc: Located, overrides: Mapping[str, Any] | None = None) -> Plan:
    """Check a parsed spec and return its ``Plan``.

    Values that reach ``storage_options`` (a param it names, whatever its value) never appear
    in an error: they are replaced by ``***``; ``Plan.secret_params`` names those params.

    Args:
        doc: the spec as read by ``load_yaml``.
        overrides: typed param overrides (keyword arguments or ``--set``).

    Raises:
        SpecErrors: every problem found, in file order.
    """
    secret = secret_params(doc.data)
    try:
        plan = _validate(doc, overrides, secret)
    except SpecErrors as exc:
        if not secret:
            raise
        declared = doc.data.get("params") if isinstance(doc.data, dict) else None
        values = [v for k, v in {**(declared if isinstance(declared, dict) else {}),
                                 **dict(overrides or {})}.items() if k in secret]
        texts = set().union(*(secret_texts(v) for v in values)) if values else set()
        raise SpecErrors([dataclasses.replace(e, message=redact_texts(e.message, texts))
                          for e in exc.errors]) from None
    plan.secret_params = frozenset(secret)
    return plan


def _validate(doc: Located, overrides: Mapping[str, Any] | None, secret: set[str]) -> Plan:
    errs = _Errors(doc)
    data = doc.data
    if not isinstance(data, dict):
        errs.add("a spec is a mapping with 'params', 'nodes' and 'output'", ())
        raise SpecErrors(errs.items)
    for key in data:
        if key not in TOP_KEYS:
            errs.add(f"unknown top-level key '{key}'"
                     + (did_you_mean(key, TOP_KEYS) or f"; a spec has: {', '.join(TOP_KEYS)}"), (key,), key=True)

    declared = data.get("params") or {}
    if not isinstance(declared, dict):
        errs.add("params must be a mapping of name: default", ("params",))
        declared = {}
    line, col = doc.where(("params",), key=True) if "params" in data else (1, 1)
    raw_nodes = data.get("nodes")
    param_overrides, node_overrides = split_overrides(
        dict(overrides or {}), declared, raw_nodes if isinstance(raw_nodes, dict) else {})
    params, override_errors = apply_overrides(declared, param_overrides, where=(doc.path, line, col),
                                              secret=secret)
    errs.items.extend(override_errors)
    builtins = builtin_params(doc.path)
    params = _resolve_params(params, builtins, errs)
    scope = {**builtins, **params}  # what ${...} in node params may name

    resumable = data.get("resumable", True)
    if not isinstance(resumable, bool):
        errs.add(f"resumable must be true or false, got {resumable!r}", ("resumable",))
        resumable = True

    even = data.get("even_batches", "auto")
    if even not in EVEN_MODES:
        errs.add(f"even_batches must be one of {' | '.join(EVEN_MODES)}, got {even!r}", ("even_batches",))
        even = "auto"

    watchdog = data.get("watchdog", 60)
    if isinstance(watchdog, bool) or not isinstance(watchdog, (int, float)) or not watchdog >= 0:
        errs.add(f"watchdog must be a number of seconds >= 0 (0: off), got {watchdog!r}", ("watchdog",))
        watchdog = 60

    nodes: dict[str, NodePlan] = {}
    if not isinstance(raw_nodes, dict) or not raw_nodes:
        errs.add("the spec needs 'nodes': a mapping of name: {op: ..., params}",
                 ("nodes",) if "nodes" in data else ())
        raise SpecErrors(errs.items)
    raw_nodes = _override_nodes(raw_nodes, node_overrides, errs, (line, col))

    if len(raw_nodes) > MAX_NODES:
        errs.add(f"the spec has {len(raw_nodes)} nodes; a spec is refused past {MAX_NODES}", ("nodes",),
                 key=True)
        raise SpecErrors(errs.items)

    known = op_names()
    previous: str | None = None
    # nodes that may be read by a node whose inputs could not be worked out (a broken node, a
    # misspelt input): not also reported as consumed by nothing, which would only repeat the error
    maybe_used: set[str] = set()
    for name, body in raw_nodes.items():
        at = ("nodes", name)
        nline, ncol = doc.where(at, key=True)
        op = _op_of(name, body, known, errs)
        if op is None:
            maybe_used.update(_mentioned(body, previous))
            previous = name
            continue
        before = len(errs.items)
        inputs = _inputs_of(name, body, op, previous, errs)
        inputs_ok = len(errs.items) == before
        if not inputs_ok:
            maybe_used.update(_mentioned(body, previous))
        typed, raw = _check_params(op, name, body, scope, errs)
        if typed is not None and op.check is not None and inputs_ok:
            for pname, message in op.check(typed, len(inputs)):
                # a param, or a path into one (("args", "sizee")): then the key or item it names
                path = pname if isinstance(pname, tuple) else (pname,)
                errs.add(message, at + path, key=len(path) > 1, node=name, op=op.name, param=path[0])
        nodes[name] = NodePlan(name, op, typed, inputs, nline, ncol, raw)
        previous = name

    # inputs must exist
    all_names = list(raw_nodes)
    for plan in nodes.values():
        for i, inp in enumerate(plan.inputs):
            if inp not in raw_nodes:
                at = ("nodes", plan.name, "input") + ((i,) if isinstance(raw_nodes[plan.name].get("input"), list) else ())
                hint = did_you_mean(inp, all_names)
                errs.add(f"input '{inp}' is not defined" + hint, at, node=plan.name, op=plan.op.name,
                         param="input")
                maybe_used.update(n for n in all_names if hint == f" (did you mean '{n}'?)")

    graph = {n: [i for i in p.inputs if i in raw_nodes] for n, p in nodes.items()}
    cycle = _find_cycle(graph)
    if cycle:
        first = cycle[0]
        errs.add("cycle: " + " -> ".join(reversed(cycle)), ("nodes", first), key=True, node=first,
                 op=nodes[first].op.name)

    copies = None
    output = data.get("output", all_names[-1])
    if not isinstance(output, str) or output not in raw_nodes:
        errs.add(f"output '{output}' is not a node" + did_you_mean(str(output), all_names),
                 ("output",) if "output" in data else ("nodes",), param="output")
    elif not cycle:
        used = {i for p in nodes.values() for i in p.inputs}
        consumers: dict[str, list[str]] = {}
        for p in nodes.values():
            for i in p.inputs:
                consumers.setdefault(i, []).append(p.name)
        for n, by in consumers.items():
            if len(by) > 1:
                what = (f"{len(by)} nodes ({', '.join(by)})" if len(set(by)) == len(by)
                        else f"node '{by[0]}' {len(by)} times")
                errs.add(f"node '{n}' feeds {what}: a stream can feed only one node; build a second "
                         "source for the other branch", ("nodes", by[1]), key=True, node=by[1],
                         op=nodes[by[1]].op.name, param="input")
        for n in all_names:
            if n not in used and n not in maybe_used and n != output:
                errs.add(f"nothing consumes node '{n}' and it is not the output '{output}': "
                         "remove it or name it as an input", ("nodes", n), key=True, node=n,
                         op=nodes[n].op.name if n in nodes else None)
        _graph_rules(nodes, graph, resumable, errs)
        copies = check_copies(data.get("workers"), nodes, graph, output, scope, errs, raw_nodes)

    seed = params.get("seed", 0)
    if errs.items:
        raise SpecErrors(errs.items)
    return Plan(doc.path, params, nodes, output, resumable, seed if isinstance(seed, int) else 0,
                copies, even, watchdog=float(watchdog), spec_dir=builtins[SPEC_DIR])


def env_unset_message(ref: str) -> str:
    name = env_name(ref)
    return (f"environment variable '{name}' is not set (set it, or give a default: "
            f"${{env:{name},default}})")


def _resolve_params(params: dict[str, Any], builtins: dict[str, Any], errs: _Errors) -> dict[str, Any]:
    """Declared params with ``${env:...}`` and built-in references (``${spec_dir}``) replaced."""
    out = {}
    for key, value in params.items():
        try:
            out[key] = interpolate(value, builtins, partial=True)
        except KeyError as missing:
            errs.add(env_unset_message(missing.args[0]), ("params", key), param=key)
            out[key] = value
    return out


def _override_nodes(raw_nodes: dict[str, Any], overrides: dict[tuple[str, str], Any], errs: _Errors,
                    where: tuple[int, int]) -> dict[str, Any]:
    """The spec's nodes with ``NODE.PARAM`` overrides applied (copies: the document is kept
    as read). The values are then checked like the spec's own."""
    if not overrides:
        return raw_nodes
    out = dict(raw_nodes)
    for (node, pname), value in overrides.items():
        if node not in raw_nodes:
            errs.items.append(SpecError(
                f"override '{node}.{pname}': no node '{node}'" + did_you_mean(node, raw_nodes)
                + f"; nodes: {', '.join(raw_nodes)} (a param override names a declared param, "
                "a node-param override NODE.PARAM)", errs.doc.path, where[0], where[1],
                param=f"{node}.{pname}"))
            continue
        if not isinstance(out[node], dict) or not pname:
            continue  # the node itself is reported as broken
        out[node] = {**out[node], pname: value}
    return out


def _batched_before(name: str, nodes: dict[str, NodePlan], graph: dict[str, list[str]]) -> bool:
    """Whether some node above ``name`` may make batches: an op not known to hand on single
    records (``OpSpec.per_record``: a batching op, a map whose fn is not ``per_sample``, an
    ``iterable`` or ``dataset`` source, a plug-in op that does not say), or a node whose check
    failed (reported on its own)."""
    seen: set[str] = set()
    todo = list(graph.get(name, []))
    while todo:
        up = todo.pop()
        if up in seen:
            continue
        seen.add(up)
        plan = nodes.get(up)
        if plan is None or plan.params is None or not plan.op.passes_records(plan.params):
            return True
        todo.extend(graph.get(up, []))
    return False


def _graph_rules(nodes: dict[str, NodePlan], graph: dict[str, list[str]], resumable: bool,
                 errs: _Errors) -> None:
    """Rules across nodes: storage options the URL's filesystem takes, a collating op with a
    batching op above it, and each op's own ``graph_check``."""
    spec_graph = SpecGraph(nodes, graph, resumable)
    for plan in nodes.values():
        p = plan.params
        if p is None:
            continue
        url, options = getattr(p, "url", None), getattr(p, "storage_options", None)
        if isinstance(url, str) and options:
            from conveyor.storage import protocol_of, unknown_options

            for key, hint in unknown_options(protocol_of(url), options):
                errs.add(f"{protocol_of(url)} has no option '{key}'{hint}",
                         ("nodes", plan.name, "storage_options", key), key=True, node=plan.name,
                         op=plan.op.name, param="storage_options")
        if plan.op.collates and not _batched_before(plan.name, nodes, graph):
            errs.add(f"{plan.op.name} stacks the samples of a batch, but nothing before it makes "
                     f"batches: put a batch node above it, e.g. {{op: batch, size: 32}}",
                     ("nodes", plan.name), key=True, node=plan.name, op=plan.op.name)
        if plan.op.graph_check is not None:
            for problem in plan.op.graph_check(spec_graph, plan.name):
                at = nodes[problem.node]
                errs.add(problem.message, ("nodes", problem.node) + tuple(problem.at), key=problem.key,
                         node=problem.node, op=at.op.name, param=problem.param)

"""Whole-spec checks, all errors at once, each with ``file:line:col``, node and param.

``validate(doc, overrides)`` reads a parsed spec (with positions) and returns a ``Plan``: the
merged params, every node with its op, typed params and resolved inputs, and the output.
It never stops at the first problem: every mistake it can find is collected and raised
together as ``SpecErrors``. What it checks here: the spec's top-level keys; param overrides
(unknown key, wrong type); ``${param}`` references; inputs that are not defined; cycles;
nodes nothing consumes or that feed two; the output; and the top-level ``workers``
(conveyor/graphs/copies_check.py). Each node's op, params and inputs are checked in
conveyor/graphs/node_checks.py, the rules across nodes (an unordered map in a graph that
must resume exactly; a shuffle buffer placed after a decode; a collate with no batch above
it) in conveyor/graphs/graph_rules.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from conveyor.errors import SpecError, SpecErrors
from conveyor.graphs.copies_check import check_copies
from conveyor.graphs.even import MODES as EVEN_MODES
from conveyor.graphs.graph_rules import find_cycle, graph_rules
from conveyor.graphs.node_checks import (SECRET_PARAMS, Errors, check_params, env_unset_message,
                                         inputs_of, mentioned, op_of)
from conveyor.graphs.params import (SPEC_DIR, apply_overrides, builtin_params, did_you_mean, interpolate,
                                    redact_texts, referenced, required_problems, secret_texts, shape_problem,
                                    split_overrides)
from conveyor.graphs.registry import OpSpec, op_names
from conveyor.graphs.yaml_loader import Located

TOP_KEYS = ("params", "nodes", "output", "resumable", "workers", "even_batches", "watchdog", "description")
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
    errs = Errors(doc)
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
    required = required_problems(params, getattr(doc, "required", None))
    for key, message in required:
        errs.add(message, ("params", key), param=key)
    if required:  # a missing param would only come back as errors in every node naming it
        raise SpecErrors(errs.items)
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
        op = op_of(name, body, known, errs)
        if op is None:
            maybe_used.update(mentioned(body, previous))
            previous = name
            continue
        before = len(errs.items)
        inputs = inputs_of(name, body, op, previous, errs)
        inputs_ok = len(errs.items) == before
        if not inputs_ok:
            maybe_used.update(mentioned(body, previous))
        typed, raw = check_params(op, name, body, scope, errs)
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
    cycle = find_cycle(graph)
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
        graph_rules(nodes, graph, resumable, errs)
        copies = check_copies(data.get("workers"), nodes, graph, output, scope, errs, raw_nodes)

    seed = params.get("seed", 0)
    if errs.items:
        raise SpecErrors(errs.items)
    return Plan(doc.path, params, nodes, output, resumable, seed if isinstance(seed, int) else 0,
                copies, even, watchdog=float(watchdog), spec_dir=builtins[SPEC_DIR])




def _resolve_params(params: dict[str, Any], builtins: dict[str, Any], errs: Errors) -> dict[str, Any]:
    """Declared params with ``${env:...}`` and built-in references (``${spec_dir}``) replaced."""
    out = {}
    for key, value in params.items():
        try:
            out[key] = interpolate(value, builtins, partial=True)
        except KeyError as missing:
            errs.add(env_unset_message(missing.args[0]), ("params", key), param=key)
            out[key] = value
    return out


def _override_nodes(raw_nodes: dict[str, Any], overrides: dict[tuple[str, str], Any], errs: Errors,
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
        shape = shape_problem(value)
        if shape:  # --set 'batch.size=&a [*a]': refused before anything walks it
            errs.items.append(SpecError(f"override '{node}.{pname}': the value {shape}", errs.doc.path,
                                        where[0], where[1], node=node, param=pname))
            continue
        out[node] = {**out[node], pname: value}
    return out

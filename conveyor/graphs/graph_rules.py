"""The checks across a spec's nodes: cycles, and the rules that look at more than one node.

``find_cycle`` finds a loop of inputs. ``graph_rules`` runs, for every node that passed its
own checks, the rules that need its neighbours: the storage options its URL's filesystem
takes (and whether its package is installed), a collating op with a batching op above it (asked of each op's ``OpSpec``:
``collates``, ``per_record``), and the op's own ``graph_check`` (a map's fn rules, a
shuffle buffer after a decode, a padding multiple against a token budget).
"""

from __future__ import annotations

from typing import Any

from conveyor.graphs.node_checks import Errors
from conveyor.graphs.opspec import SpecGraph


def find_cycle(inputs: dict[str, list[str]]) -> list[str] | None:
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


def _batched_before(name: str, nodes: dict[str, Any], graph: dict[str, list[str]]) -> bool:
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


def graph_rules(nodes: dict[str, Any], graph: dict[str, list[str]], resumable: bool,
                errs: Errors) -> None:
    """Rules across nodes: storage options the URL's filesystem takes (and whether its package is installed), a collating op with a
    batching op above it, and each op's own ``graph_check``."""
    spec_graph = SpecGraph(nodes, graph, resumable)
    for plan in nodes.values():
        p = plan.params
        if p is None:
            continue
        url, options = getattr(p, "url", None), getattr(p, "storage_options", None)
        if isinstance(url, str) and "://" in url:
            from conveyor.storage import missing_package, protocol_of

            missing = missing_package(protocol_of(url))
            if missing:
                errs.add(missing, ("nodes", plan.name, "url"), node=plan.name, op=plan.op.name, param="url")
                continue
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

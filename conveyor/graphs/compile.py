"""Compile a checked ``Plan`` into torchdata nodes, in topological order.

Each built node is wrapped in a ``Counted`` node that counts the items it emits for
``loader.stats()`` without changing the state: ``Counted`` hands its inner node's state
through unchanged, so a state is the same with or without instrumentation.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, fields
from enum import Enum
from typing import Any

from torchdata.nodes import BaseNode

from conveyor.graphs.ops import BuildContext
from conveyor.graphs.validate import Plan
from conveyor.nodes.shard import dist_rank_world

SECRET_PARAMS = ("storage_options",)  # never in states, digests or `show` output


class Counted(BaseNode):
    """Pass-through that counts items; its state is its inner node's state."""

    def __init__(self, inner: BaseNode):
        super().__init__()
        self.inner = inner
        self.items = 0

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self.inner.reset(initial_state)
        self.items = 0

    def next(self):
        item = next(self.inner)
        self.items += 1
        return item

    def get_state(self) -> dict:
        return self.inner.state_dict()


def plain(value: Any) -> Any:
    """Params as plain JSON-able data (enums to their values, tuples to lists)."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    return value


def node_params(plan_params: Any) -> dict[str, Any]:
    """A node's params (defaults included) as plain data, secrets left out."""
    if plan_params is None:
        return {}
    return {f.name: plain(getattr(plan_params, f.name)) for f in fields(plan_params)
            if f.name not in SECRET_PARAMS}


def summary(plan: Plan) -> dict[str, Any]:
    """The compiled graph as plain data: per node its op, params and inputs; and the output."""
    return {
        "nodes": {n: {"op": p.op.name, "params": node_params(p.params), "inputs": list(p.inputs)}
                  for n, p in plan.nodes.items()},
        "output": plan.output,
    }


def digest(spec_summary: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(spec_summary, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class Compiled:
    """The built graph: nodes by name (wrapped for counting), in build order, and the output."""

    plan: Plan
    nodes: dict[str, Counted]
    order: list[str]
    rank: int
    world: int

    @property
    def root(self) -> Counted:
        return self.nodes[self.plan.output]


def topological(plan: Plan) -> list[str]:
    order: list[str] = []
    done: set[str] = set()

    def visit(n: str) -> None:
        if n in done:
            return
        for m in plan.nodes[n].inputs:
            visit(m)
        done.add(n)
        order.append(n)

    visit(plan.output)
    return order


def compile_plan(plan: Plan) -> Compiled:
    """Build every node the output depends on.

    Args:
        plan: a checked spec from ``validate``.
    """
    rank, world = dist_rank_world()
    built: dict[str, Counted] = {}
    order = topological(plan)
    for name in order:
        p = plan.nodes[name]
        ctx = BuildContext(name=name, op=p.op.name,
                           where=f"node '{name}' ({p.op.name}) from {plan.path}:{p.line}",
                           seed=plan.seed, rank=rank, world=world)
        node = p.op.build(p.params, [built[i] for i in p.inputs], ctx)
        built[name] = Counted(node)
    return Compiled(plan, built, order, rank, world)

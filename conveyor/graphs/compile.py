"""Compile a checked ``Plan`` into torchdata nodes, in topological order.

Each built node is wrapped in a ``Counted`` node (graphs/instrument.py) that counts the
items it emits and the time spent in it for ``loader.stats()`` without changing the state:
``Counted`` hands its inner node's state through unchanged, so a state is the same with or
without instrumentation. A node's params as plain data (``node_params``) are what a state
and ``conveyor show`` name; the graph's summary and digest in a state are graphs/state.py's.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any

from torchdata.nodes import BaseNode

from conveyor.errors import ConveyorError
from conveyor.graphs.instrument import Counted  # re-exported: compile.Counted
from conveyor.graphs.ops import BuildContext
from conveyor.graphs.validate import Plan
from conveyor.nodes import WorkerCopies, dist_rank_world

SECRET_PARAMS = ("storage_options",)
_HAND_LOCK = threading.RLock()  # CopyFactory.hand_listings: one listing for every worker thread  # never in states, digests or `show` output


def plain(value: Any) -> Any:
    """Params as plain data of exact built-in types (enums to their values, ``Fn`` and other
    str subclasses to ``str``, tuples to lists), so that ``torch.load`` reads them."""
    if isinstance(value, Enum):
        return plain(value.value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
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


@dataclass
class Compiled:
    """The built graph: nodes by name (wrapped for counting), in build order, and the output."""

    plan: Plan
    nodes: dict[str, Counted]
    order: list[str]
    rank: int
    world: int
    copied: list[str] = field(default_factory=list)  # built inside worker copies, not here

    @property
    def root(self) -> Counted:
        return self.nodes[self.plan.output]


def topological(plan: Plan, output: str | None = None) -> list[str]:
    """Names of the nodes ``output`` (default: the plan's) depends on, inputs first."""
    order: list[str] = []
    _visit(plan, output or plan.output, set(), order)
    return order


def _visit(plan: Plan, name: str, done: set[str], order: list[str]) -> None:
    """Add ``name``'s inputs, then ``name``, to ``order`` (a function, not a closure that calls
    itself: that makes a reference cycle, garbage for the collector on every compile)."""
    if name in done:
        return
    for m in plan.nodes[name].inputs:
        _visit(plan, m, done, order)
    done.add(name)
    order.append(name)


def slabbed_maps(plan: Plan, names: list[str]) -> dict[str, int]:
    """Maps whose only reader is a ``batch`` whose only reader is a ``collate``, all three
    built together (no process in between): map name → the batch size. Their thread
    workers write outputs into batch-shaped slabs that collate hands out without a copy.
    Asked of the ops: ``OpSpec.writes_rows`` (map), ``batch_rows`` (batch) and
    ``stacks_rows`` (collate)."""
    readers: dict[str, list[str]] = {n: [] for n in plan.nodes}
    for n, p in plan.nodes.items():
        for i in p.inputs:
            readers[i].append(n)
    here = set(names)
    out = {}
    for n in names:
        if not plan.nodes[n].op.writes_rows or n == plan.output or len(readers[n]) != 1:
            continue
        b = readers[n][0]
        rows = plan.nodes[b].op.batch_rows
        if rows is None or b == plan.output or len(readers[b]) != 1:
            continue
        c = readers[b][0]
        if plan.nodes[c].op.stacks_rows and {b, c} <= here:
            out[n] = rows(plan.nodes[b].params)
    return out


def _build(plan: Plan, names: list[str], rank: int, world: int, worker: int, workers: int,
           built: dict[str, BaseNode], listings: dict[str, dict] | None = None) -> dict[str, Counted]:
    slabs = slabbed_maps(plan, names)
    for name in names:
        p = plan.nodes[name]
        ctx = BuildContext(name=name, op=p.op.name,
                           where=f"node '{name}' ({p.op.name}) from {plan.path}:{p.line}",
                           seed=plan.seed, rank=rank, world=world, worker=worker, workers=workers,
                           slab=slabs.get(name, 0), listing=(listings or {}).get(name))
        try:
            node = p.op.build(p.params, [built[i] for i in p.inputs], ctx)
        except ConveyorError as exc:  # a cache folder that cannot be made, say: name the node
            exc.add_note(f"in {ctx.where}")
            raise
        ledger = getattr(node, "ledger", None)
        if ledger is not None:  # skips are recorded under the node's name (Loader.skipped)
            ledger.node = name
        built[name] = Counted(node, name)
    return built  # type: ignore[return-value]


@dataclass
class CopyFactory:
    """Builds copy ``w`` of the copied part of a graph (picklable: it travels to workers)."""

    plan: Plan
    names: list[str]
    until: str
    rank: int
    world: int
    copies: int

    listings: dict[str, dict] = field(default_factory=dict)  # made here once, handed to every copy

    def hand_listings(self) -> None:
        """List the copied listing nodes once, in this process (the copies' parent), so that the
        copies take the listing instead of each listing the source again (``listings``)."""
        with _HAND_LOCK:
            for name in self.names:
                p = self.plan.nodes[name]
                if not p.op.listing or p.inputs or name in self.listings:
                    continue
                ctx = BuildContext(name=name, op=p.op.name, where=f"node '{name}' ({p.op.name}) from "
                                   f"{self.plan.path}:{p.line}", seed=self.plan.seed, rank=self.rank,
                                   world=self.world)
                node = p.op.build(p.params, [], ctx)
                make = getattr(node, "listing", None)
                if not callable(make) or not getattr(node, "SHAREABLE", False):  # no listing to hand on
                    continue
                try:
                    listing = node.share(make) if node.share is not None else make()
                except ConveyorError as exc:
                    exc.add_note(f"in {ctx.where}")
                    raise
                self.listings[name] = listing

    def __getstate__(self) -> dict:  # to a worker process: with the listings made here
        self.hand_listings()
        return self.__dict__

    def __call__(self, w: int) -> tuple[BaseNode, dict[str, Counted]]:
        self.hand_listings()  # worker threads: the first lists, the others take it; processes: done
        built = _build(self.plan, self.names, self.rank, self.world, w, self.copies, {}, self.listings)
        return built[self.until], built


def compile_plan(plan: Plan) -> Compiled:
    """Build every node the output depends on.

    With graph-level ``workers`` (``plan.copies``), the nodes up to ``until`` are built in
    each worker copy instead, and one ``WorkerCopies`` node stands for ``until`` here.

    Args:
        plan: a checked spec from ``validate``.
    """
    rank, world = dist_rank_world()
    order = topological(plan)
    copies = getattr(plan, "copies", None)
    built: dict[str, BaseNode] = {}
    copied: list[str] = []
    if copies is not None and copies.count > 1:
        copied = topological(plan, copies.until)
        factory = CopyFactory(plan, copied, copies.until, rank, world, copies.count)
        merge = WorkerCopies(factory, copies=copies.count, method=copies.method,
                             mp_context=copies.mp_context, where=f"worker copies up to node '{copies.until}'",
                             address=getattr(copies, "address", None), timeout=getattr(copies, "timeout", None))
        built[copies.until] = Counted(merge, copies.until)
    main = [n for n in order if n not in copied]
    _build(plan, main, rank, world, 0, 1, built)
    return Compiled(plan, built, order, rank, world, copied)  # type: ignore[arg-type]

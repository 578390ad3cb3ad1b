"""length: how many batches an epoch yields, where the graph fixes it before iterating.

``len(loader)`` comes from here. Each op's ``OpSpec.length`` (conveyor/graphs/opspec.py) is a
rule giving the node's item count per epoch from its params, its inputs' counts and where it
runs (rank, world, worker copy). Sources count what they list (``list_files`` from
its listing, without reading a file); ``shard`` deals out as it does at run time (``equalize``
included); ``batch`` divides (``drop_last`` rounds down); ops that pass every item on keep the
count. A rule returns ``None`` where the count depends on the data (a filter, errors skipped
with ``on_error: skip``, records inside files, length buckets, random mixing) and
``epoch_length`` raises ``UnknownLength`` naming that node and why (``OpSpec.unknown_length``):
``len()`` never guesses. A plug-in op gives its rule the same way; an op with no rule is unknown.

With graph-level worker copies the copied part is counted once per copy (each copy cuts its
own batches) and the copies' counts are summed where they merge.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from conveyor.graphs.compile import topological
from conveyor.graphs.opspec import LengthRule, Where
from conveyor.graphs.ops import BuildContext

__all__ = ["UnknownLength", "Where", "epoch_length"]


class UnknownLength(Exception):
    """The graph does not fix its epoch length before iterating; says which node and why."""


def epoch_length(plan: Any, built: dict[str, Any], rank: int, world: int,
                 copies: tuple[int, str] | None = None, listings: dict[str, dict] | None = None) -> int:
    """Batches (items of the output node) one epoch of ``plan`` yields on ``rank``.

    Args:
        plan: a checked spec (``validate.Plan``).
        built: the nodes built in this process by name (their ``count()`` serves sources).
        rank: this rank.
        world: the number of ranks.
        copies: ``(count, until)`` when the graph runs up to ``until`` in worker copies.
        listings: listings made for copied nodes (``CopyFactory.listings``): counted from them.

    Raises:
        UnknownLength: a node makes the count depend on the data; names it.
    """
    _check_knowable(plan, rank, world)  # before any listing: a reader after it decides anyway
    return _Counts(plan, built, rank, world, copies, listings).count(plan.output, Where(rank, world), {})


class _Counts:
    """The counting of one ``epoch_length`` call: each source's count, asked once. (Methods, not
    closures that call themselves: their cells would make a reference cycle holding ``built``,
    the loader's nodes, until a full garbage collection.)"""

    def __init__(self, plan: Any, built: dict[str, Any], rank: int, world: int,
                 copies: tuple[int, str] | None, listings: dict[str, dict] | None):
        self.plan, self.built, self.rank, self.world = plan, built, rank, world
        self.copies, self.listings = copies, listings or {}
        self.sources: dict[str, int | None] = {}

    def source_count(self, name: str) -> int | None:
        if name not in self.sources:
            node = self.built.get(name)
            if node is None:  # built only inside the worker copies: build one here to count
                p = self.plan.nodes[name]
                ctx = BuildContext(name=name, op=p.op.name, where=f"node '{name}'", seed=self.plan.seed,
                                   rank=self.rank, world=self.world, listing=self.listings.get(name))
                node = p.op.build(p.params, [], ctx)
            count = getattr(node, "count", None)
            self.sources[name] = count() if callable(count) else None
        return self.sources[name]

    def count(self, name: str, where: Where, memo: dict[str, int]) -> int:
        if name in memo:
            return memo[name]
        copies = self.copies
        if copies is not None and name == copies[1] and where.workers == 1:
            n = sum(self.count(name, Where(self.rank, self.world, w, copies[0]), {}) for w in range(copies[0]))
        else:
            node = self.plan.nodes[name]
            inputs = [self.count(i, where, memo) for i in node.inputs]
            rule = node.op.length
            n = None if rule is None else rule(node.params, inputs, where, partial(self.source_count, name))
            if n is None:
                raise _unknown(name, node.op)
        memo[name] = n
        return n


def _unknown(name: str, op: Any) -> UnknownLength:
    rule: LengthRule | None = op.length
    why = op.unknown_length or ("has no length rule" if rule is None else "does not know its count before iterating")
    return UnknownLength(f"node '{name}' ({op.name}) {why}, so the number of batches is known only by iterating")


def _check_knowable(plan: Any, rank: int, world: int) -> None:
    """Raise for the first node (inputs first) whose rule cannot count, from params alone."""
    for name in topological(plan):
        node = plan.nodes[name]
        rule = node.op.length
        if rule is None or rule(node.params, [0] * len(node.inputs), Where(rank, world), lambda: 0) is None:
            raise _unknown(name, node.op)

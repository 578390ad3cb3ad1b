"""length: how many batches an epoch yields, where the graph fixes it before iterating.

``len(loader)`` comes from here. ``LENGTH`` is a table beside the op table (registry.py):
per op, a rule giving the node's item count per epoch from its params, its inputs' counts and
where it runs (rank, world, worker copy). Sources count what they list (``list_files`` from
its listing, without reading a file); ``shard`` deals out as it does at run time (``equalize``
included); ``batch`` divides (``drop_last`` rounds down); ops that pass every item on keep the
count. A rule returns ``None`` where the count depends on the data (a filter, errors skipped
with ``on_error: skip``, records inside files, length buckets, random mixing) and
``epoch_length`` raises ``UnknownLength`` naming that node: ``len()`` never guesses. An op
from a plug-in gives its rule as ``OpSpec.length``; an op with no rule is unknown.

With graph-level worker copies the copied part is counted once per copy (each copy cuts its
own batches) and the copies' counts are summed where they merge.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from conveyor.graphs.ops import BuildContext


class UnknownLength(Exception):
    """The graph does not fix its epoch length before iterating; says which node and why."""


@dataclass(frozen=True)
class Where:
    """Where a node runs, for its length rule."""

    rank: int
    world: int
    worker: int = 0
    workers: int = 1


# rule(params, input counts, where, count of the built source) -> items per epoch, or None
LengthRule = Callable[[Any, list[int], Where, Callable[[], "int | None"]], "int | None"]


def _value(x: Any) -> Any:
    return getattr(x, "value", x)


def _same(p: Any, n: list[int], where: Where, source: Callable[[], int | None]) -> int | None:
    return n[0]


def _unless_skipping(p: Any, n: list[int], where: Where, source: Callable[[], int | None]) -> int | None:
    return None if _value(getattr(p, "on_error", "raise")) == "skip" else n[0]


def _listed(p: Any, n: list[int], where: Where, source: Callable[[], int | None]) -> int | None:
    return source()


def _shard(p: Any, n: list[int], where: Where, source: Callable[[], int | None]) -> int | None:
    by = [_value(b) for b in p.by]
    rank, world = (where.rank if p.rank is None else p.rank,
                   where.world if p.world is None else p.world) if "rank" in by else (0, 1)
    worker, workers = (where.worker, where.workers) if "worker" in by else (0, 1)
    total, equalize = n[0], _value(p.equalize)
    if world == 1 or equalize == "none":
        end = total
    elif equalize == "drop":
        end = total // world * world
    else:  # repeat
        end = -(-total // world) * world
    slots = len(range(rank, end, world))  # this rank's items; its j-th goes to copy j % workers
    return len(range(worker, slots, workers))


def _batch(p: Any, n: list[int], where: Where, source: Callable[[], int | None]) -> int | None:
    return n[0] // p.size if p.drop_last else -(-n[0] // p.size)


def _mix(p: Any, n: list[int], where: Where, source: Callable[[], int | None]) -> int | None:
    if _value(p.stop) == "all" and all(w > 0 for w in p.weights):
        return sum(n)  # every input is drawn to its end
    return None


LENGTH: dict[str, LengthRule] = {
    "batch": _batch,
    "collate": _same,
    "dataset": _listed,
    "fetch": _unless_skipping,
    "iterable": _listed,
    "list_files": _listed,
    "list_lmdb": _listed,
    "map": _unless_skipping,
    "mix": _mix,
    "pad_collate": _same,
    "pin_memory": _same,
    "prefetch": _same,
    "read_lmdb": _unless_skipping,
    "shard": _shard,
    "shuffle_buffer": _same,
    "to_device": _same,
}

_WHY = {
    "filter": "drops the items its fn rejects",
    "read_jsonl": "yields as many records as its files hold",
    "read_tar": "yields as many samples as its shards hold",
    "read_parquet": "yields as many rows as its files hold",
    "iterable": "wraps an iterable that has no len()",
    "read_lmdb": "skips the keys that fail (on_error: skip)",
    "bucket_batch": "cuts batches by the items' lengths",
    "mix": "draws at random until an input ends (stop: first) or never ends (stop: forever)",
    "map": "skips the items that fail (on_error: skip)",
    "fetch": "skips the items that fail (on_error: skip)",
}


def _rule(op: Any) -> LengthRule | None:
    return getattr(op, "length", None) or LENGTH.get(op.name)


def epoch_length(plan: Any, built: dict[str, Any], rank: int, world: int,
                 copies: tuple[int, str] | None = None) -> int:
    """Batches (items of the output node) one epoch of ``plan`` yields on ``rank``.

    Args:
        plan: a checked spec (``validate.Plan``).
        built: the nodes built in this process by name (their ``count()`` serves sources).
        rank: this rank.
        world: the number of ranks.
        copies: ``(count, until)`` when the graph runs up to ``until`` in worker copies.

    Raises:
        UnknownLength: a node makes the count depend on the data; names it.
    """
    _check_knowable(plan, rank, world)  # before any listing: a reader after it decides anyway
    sources: dict[str, int | None] = {}

    def source_count(name: str) -> int | None:
        if name not in sources:
            node = built.get(name)
            if node is None:  # built only inside the worker copies: build one here to count
                p = plan.nodes[name]
                ctx = BuildContext(name=name, op=p.op.name, where=f"node '{name}'", seed=plan.seed,
                                   rank=rank, world=world)
                node = p.op.build(p.params, [], ctx)
            count = getattr(node, "count", None)
            sources[name] = count() if callable(count) else None
        return sources[name]

    def count(name: str, where: Where, memo: dict[str, int]) -> int:
        if name in memo:
            return memo[name]
        if copies is not None and name == copies[1] and where.workers == 1:
            n = sum(count(name, Where(rank, world, w, copies[0]), {}) for w in range(copies[0]))
        else:
            node = plan.nodes[name]
            inputs = [count(i, where, memo) for i in node.inputs]
            rule = _rule(node.op)
            n = None if rule is None else rule(node.params, inputs, where, lambda: source_count(name))
            if n is None:
                raise _unknown(name, node.op.name, rule)
        memo[name] = n
        return n

    return count(plan.output, Where(rank, world), {})


def _unknown(name: str, op: str, rule: LengthRule | None) -> UnknownLength:
    why = _WHY.get(op, "has no length rule" if rule is None else "does not know its count before iterating")
    return UnknownLength(f"node '{name}' ({op}) {why}, so the number of batches is known only by iterating")


def _check_knowable(plan: Any, rank: int, world: int) -> None:
    """Raise for the first node (inputs first) whose rule cannot count, from params alone."""
    order: list[str] = []

    def visit(name: str) -> None:
        if name not in order:
            for i in plan.nodes[name].inputs:
                visit(i)
            order.append(name)

    visit(plan.output)
    for name in order:
        node = plan.nodes[name]
        rule = _rule(node.op)
        if rule is None or rule(node.params, [0] * len(node.inputs), Where(rank, world), lambda: 0) is None:
            raise _unknown(name, node.op.name, rule)

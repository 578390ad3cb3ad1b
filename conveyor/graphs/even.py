"""Even batches across ranks: every rank of a DDP job ends an epoch after the same batch.

``shard``'s ``equalize`` gives each rank the same number of items where the graph shards. Nodes
after the shard can still make the counts differ by rank: a reader that expands files into
records, a filter, errors skipped with ``on_error: skip``, length buckets with a token
budget; and an ``iterable`` source may shard itself by rank with no ``shard`` in the graph. Then one rank runs out of batches first and the others wait in DDP's all-reduce for
ever. When the graph can do that (``uneven_nodes``) and torch.distributed runs with more than
one rank, the Loader asks the other ranks before it yields each batch (``Agreement``: one
all-reduce of one int, MIN, over gloo); when any rank has no batch left, every rank ends the
epoch there. What the other ranks had left is not read (the Loader counts the epochs cut in
``stats()["even_batches"]`` and logs it), and the state says the epoch ended, so a restore
starts the next one.

The spec's top-level ``even_batches`` chooses: ``auto`` (the default: agree when the graph can
yield uneven counts), ``always``, or ``never`` (you balance the ranks yourself, for example
with ``torch.distributed.algorithms.Join``). Ranks that agree must all iterate their loaders:
a loader read on one rank only (an evaluation on rank 0, say) needs ``even_batches: never``,
or it waits for the others at its first batch.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

MODES = ("auto", "always", "never")


def uneven_nodes(plan: Any) -> list[str]:
    """Nodes after a rank shard that can leave ranks with different counts, in graph order.

    A node counts when one of its inputs is (downstream of) a shard by rank and it may change
    how many items pass (its ``OpSpec.keeps_count``); a shard with ``equalize: none`` counts
    itself. Nodes upstream of every shard see the same items on every rank, so they cannot
    make the ranks differ, except a source that may shard itself by rank
    (``OpSpec.shards_itself``: an ``iterable``, the user's stream).
    """
    sharded: dict[str, bool] = {}

    def below_shard(name: str) -> bool:
        if name not in sharded:
            node = plan.nodes[name]
            sharded[name] = False  # guards a cycle; validate has refused those already
            sharded[name] = is_rank_shard(node) or any(below_shard(i) for i in node.inputs)
        return sharded[name]

    out = []
    for name, node in plan.nodes.items():
        if node.op.shards_itself:
            out.append(name)
        elif is_rank_shard(node):
            if not node.op.deal(node.params).even:
                out.append(name)
        elif any(below_shard(i) for i in node.inputs) and not node.op.keeps_counts_with(node.params):
            out.append(name)
    reach = reachable(plan)
    return [n for n in out if n in reach]


def is_rank_shard(node: Any) -> bool:
    """Whether the node deals its input out to the ranks (``OpSpec.deal``, by rank)."""
    return node.op.deal is not None and node.params is not None and node.op.deal(node.params).by_rank


def reachable(plan: Any) -> set[str]:
    """The nodes the output reads from, and the output."""
    seen, todo = set(), [plan.output]
    while todo:
        n = todo.pop()
        if n not in seen and n in plan.nodes:
            seen.add(n)
            todo.extend(plan.nodes[n].inputs)
    return seen


class Agreement:
    """Asks every rank, before each batch, whether it has one (an all-reduce MIN over gloo).

    Whether torch.distributed is initialised is looked at on the first batch, not when the
    loader is built: a job may build its loaders before ``init_process_group``. Without it the
    ranks cannot agree; that is said once and every batch passes.
    """

    def __init__(self, path: str = "?", uneven: list[str] | None = None) -> None:
        self.path = path
        self.uneven = list(uneven or [])
        self.active: bool | None = None  # None: not looked yet
        self._group: Any = None

    def _start(self) -> bool:
        try:
            import torch.distributed as dist

            self.active = dist.is_available() and dist.is_initialized()
        except ImportError:
            self.active = False
        if not self.active:
            log.warning("%s: several ranks (from RANK/WORLD_SIZE) but torch.distributed is not "
                        "initialised, so they cannot agree on each epoch's last batch%s; call "
                        "torch.distributed.init_process_group() before the first batch", self.path,
                        f" (nodes {', '.join(self.uneven)} can give them different counts)"
                        if self.uneven else "")
            return False
        backend = str(dist.get_backend())
        # every rank reaches its first batch, so every rank makes this group, in the same order
        self._group = None if "gloo" in backend else dist.new_group(backend="gloo")
        return True

    def all_have(self, have: bool) -> bool:
        if self.active is None:
            self._start()
        if not self.active:
            return have
        import torch
        import torch.distributed as dist

        flag = torch.tensor([1 if have else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self._group)
        return bool(flag.item())


def agreement_for(plan: Any, world: int) -> Agreement | None:
    """The Agreement a loader of ``plan`` needs in a job of ``world`` ranks, or None."""
    mode = getattr(plan, "even_batches", "auto")
    if world <= 1 or mode == "never":
        return None
    uneven = uneven_nodes(plan)
    if mode == "auto" and not uneven:
        return None
    return Agreement(plan.path, uneven)

"""Elastic resume: continue an epoch that was interrupted on another world size or number of
worker copies.

``Loader.load_state_dict`` hands this module the states it was given (``resume_plan``): where
they are those of *all* ranks of an old run of another world size or number of worker copies
(a list, or a mapping such as a distributed checkpoint gives back), for each old rank it walks
the graph from the output down to the ``shard``, each op translating what was consumed of
its output into what was consumed of its input (``OpSpec.elastic``, a ``Cursor`` from
``conveyor/nodes/_elastic.py``), and worker copies splitting the merge into its copies. At
the shard, a slot (old rank, copy) has consumed a prefix of its positions plus, after a
partly drained shuffle window, a few more named by their places in the window. Those,
over all old slots, form one *level* of a deal; the new shard deals the positions that no
old slot consumed to the new slots, evenly, as it deals a whole epoch (``equalize`` too),
and the next epochs are ordinary epochs of the new world.

A graph resumes elastically when the path from its output to its shard (the op whose
``OpSpec.deal`` deals by rank and worker) is made of ops with an ``elastic`` translation (map,
fetch, batch, collate, pad_collate, pin_memory, to_device, prefetch, shuffle_buffer; a plug-in
op declares its own) and the shard's input is a global order (no op above it with an
``OpSpec.not_global`` reason: list_files, read_jsonl or read_tar over an unsharded listing).
Anything else is a ``StateError`` naming the node that stops it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from conveyor.errors import ConveyorError, StateError
from conveyor.graphs.ops import BuildContext
from conveyor.graphs.registry import get_op, op_names
from conveyor.graphs.validate import Plan
from conveyor.nodes import Cursor, WorkerCopies, count_items, deal_end, encode_bits, remaining, slot_items

if TYPE_CHECKING:
    from conveyor.graphs.state import States

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class ElasticContext:
    """What an op's ``elastic`` translation may know: the old slot's build context, the epoch,
    and ``left_after(cursor)``: how many items follow an input cursor this epoch."""

    build: BuildContext
    epoch: int
    left_after: Callable[[Cursor], int]


def dcp_states(checkpoint_id: Any, key: str = "data") -> dict[str, Any]:
    """Every rank's loader state saved under ``key`` in a ``torch.distributed.checkpoint``, as
    one merged state: what ``load_state_dict`` takes to resume on another world size.

    A loader saved through DCP (``dcp.save({"data": loader, ...})``) stores each rank's entry
    under its own key; ``dcp.load`` with a loader of a new world asks only for the new ranks'
    keys, so an elastic resume reads them all with this instead. Under torchrun every rank
    calls it (DCP's load is collective when a process group is initialised).

    Args:
        checkpoint_id: the checkpoint folder given to ``dcp.save``.
        key: the key the loader was saved under.

    Example:
        >>> loader.load_state_dict(dcp_states("ckpt/dcp"))   # doctest: +SKIP
    """
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    meta = dcp.FileSystemReader(str(checkpoint_id)).read_metadata().state_dict_metadata
    prefix = key + "."
    entries = {k[len(prefix):]: "" for k in meta
               if k.startswith(prefix + "rank") and k[len(prefix) + 4:].isdigit()}
    if not entries:
        raise StateError(f"{checkpoint_id}: no loader state under '{key}' (its keys: "
                         f"{sorted({k.split('.', 1)[0] for k in meta})})")
    want = {key: {"format": 0, **entries}}
    dcp.load(want, checkpoint_id=str(checkpoint_id),
             no_dist=not (dist.is_available() and dist.is_initialized()))
    return want[key]


def complete(by_rank: dict[int, dict]) -> bool:
    """Whether ``by_rank`` holds every rank of one run."""
    worlds = {s.get("world") for s in by_rank.values()}
    return len(worlds) == 1 and sorted(by_rank) == list(range(worlds.pop() or 0))


def resume_plan(states: States, by_rank: dict[int, dict], strict: bool) -> dict[str, Any] | None:
    """What a loader does with the decoded rank states ``by_rank`` it was given.

    Where this rank's own state is there, from a run of this world and worker copies, None:
    the loader restores it as it is. Where instead ``by_rank`` is every rank of a run of
    another world size or number of copies, the plan of an elastic resume (``plan_resume``),
    each state checked to fit this graph first; else None (the loader's own check names what
    is missing).

    Args:
        states: the loader's graph, rank and world (``conveyor/graphs/state.py``).
        by_rank: the states given, decoded (``state.merged_rank_states``).
        strict: refuse params that change the data.

    Raises:
        StateError: a state does not fit, or the graph cannot resume elastically.
    """
    own = by_rank.get(states.rank)
    if own is not None and (own.get("world"), states.copies(own)) == (states.world, states.copies()):
        return None
    if not complete(by_rank):
        return None
    for one in by_rank.values():
        states.check_fits(one, strict, elastic=True)
    return plan_resume(states.plan, list(by_rank.values()))


def _where(plan: Plan, name: str) -> str:
    p = plan.nodes[name]
    return f"node '{name}' ({p.op.name}) from {plan.path}:{p.line}"


class _Walk:
    """Walks one old rank's graph state down to its shard."""

    def __init__(self, plan: Plan, epoch: int, rank: int, world: int, copies: int, until: str | None):
        self.plan, self.epoch, self.rank, self.world = plan, epoch, rank, world
        self.copies, self.until = copies, until
        self._totals: dict[str, int] = {}

    def _ctx(self, name: str, worker: int, workers: int) -> BuildContext:
        p = self.plan.nodes[name]
        return BuildContext(name=name, op=p.op.name, where=_where(self.plan, name), seed=self.plan.seed,
                            rank=self.rank, world=self.world, worker=worker, workers=workers)

    def slots(self, graph_state: Any) -> list[dict]:
        return self.walk(self.plan.output, Cursor(graph_state), 0, 1, False)

    def walk(self, name: str, cursor: Cursor, worker: int, workers: int, copied: bool) -> list[dict]:
        p = self.plan.nodes[name]
        if self.copies > 1 and name == self.until and not copied:
            try:
                per_copy = WorkerCopies.elastic_split(cursor, self.copies)
            except (ValueError, KeyError, TypeError, IndexError) as exc:
                raise StateError(f"{_where(self.plan, name)}: the worker copies' state does not fit "
                                 f"({exc})") from None
            out = []
            for w, c in enumerate(per_copy):
                out += self.walk(name, c, w, self.copies, True)
            return out
        ctx = self._ctx(name, worker, workers)
        if p.op.elastic is None:
            raise StateError(f"{_where(self.plan, name)} cannot be resumed on another world size or "
                             f"number of worker copies: it cannot name, in global terms, which items "
                             f"it consumed ({p.op.name}: {p.op.doc}). Elastic ops between the output and "
                             f"the shard: {', '.join(_elastic_ops())}")
        if p.op.deal is not None:
            return [self._dealt(name, cursor, ctx)]
        source = p.inputs[0]

        def left_after(c: Cursor) -> int:
            (slot,) = self.walk(source, c, worker, workers, copied)
            return slot["slot_total"] - slot["slot"][2]

        try:
            inner = p.op.elastic(p.params, ElasticContext(ctx, self.epoch, left_after), cursor)
        except StateError:
            raise
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise StateError(f"{_where(self.plan, name)} cannot be resumed elastically from this "
                             f"state: {exc}") from None
        return self.walk(source, inner, worker, workers, copied)

    def _dealt(self, name: str, cursor: Cursor, ctx: BuildContext) -> dict:
        """At the shard: what this old slot took of the deal (its ``elastic`` rule), its slot
        under ``settings``, its items counted when the old run did not count them."""
        p = self.plan.nodes[name]
        _check_global(self.plan, name)
        try:
            taken = p.op.elastic(p.params, ElasticContext(ctx, self.epoch, _no_input), cursor)
        except (KeyError, TypeError) as exc:
            raise StateError(f"{_where(self.plan, name)}: the state does not fit this shard ({exc})") from None
        slot = taken["settings"]
        if taken["total"] is None:  # this run did not count its items: count them now
            taken["total"] = self._total(name)
            m = len(remaining(taken["total"], taken["levels"]))
            end = deal_end(m, slot["world"], slot["equalize"])
            taken["slot_total"] = slot_items(end, slot["rank"], slot["world"], slot["worker"], slot["workers"])
        taken["at"] = name
        return taken

    def _total(self, shard: str) -> int:
        if shard not in self._totals:
            from conveyor.graphs.compile import _build, topological

            source = self.plan.nodes[shard].inputs[0]
            built = _build(self.plan, topological(self.plan, source), self.rank, self.world, 0, 1, {})
            try:
                self._totals[shard] = count_items(built[source])
            finally:
                for node in built.values():
                    close = getattr(getattr(node, "inner", node), "close", None)
                    if callable(close):
                        close()
        return self._totals[shard]


def _no_input(cursor: Cursor) -> int:
    raise ValueError("the shard is where the walk ends: nothing is counted below it")


def _elastic_ops() -> list[str]:
    """The ops that name what they consumed (the dealing op aside), for a message."""
    names = []
    for n in op_names():
        try:
            op = get_op(n)
        except ConveyorError:  # a registered op that cannot load names nothing here
            continue
        if op is not None and op.elastic is not None and op.deal is None:
            names.append(n)
    return names


def _check_global(plan: Plan, shard: str) -> None:
    """The shard's input must be the same order on every rank."""
    from conveyor.graphs.compile import topological

    for name in topological(plan, plan.nodes[shard].inputs[0]):
        why = plan.nodes[name].op.not_global
        if why:
            raise StateError(f"{_where(plan, name)} lies above {_where(plan, shard)} and cannot be resumed "
                             f"on another world size or number of worker copies: {why}, so what the old "
                             "ranks consumed cannot be dealt again to other ranks")


def plan_resume(plan: Plan, states: list[dict]) -> dict[str, Any]:
    """From the states of every rank of an old run: the epoch to continue and the deal for it.

    Returns:
        ``{"epoch": e, "deal": {"epoch": e, "levels": [...]}}``, or ``{"epoch": e, "deal": None}``
        when epoch ``e`` was over (the next one begins).

    Raises:
        StateError: states missing or repeated, from different epochs, or a graph that cannot
            be resumed elastically (naming the node).
    """
    worlds = {s.get("world") for s in states}
    if len(worlds) != 1:
        raise StateError(f"the states are from runs of different world sizes ({sorted(map(str, worlds))})")
    world = worlds.pop()
    ranks = sorted(s.get("rank") for s in states)
    if ranks != list(range(world)):
        raise StateError(f"elastic resume needs the state of every rank of the old run (world {world}), "
                         f"got ranks {ranks}")
    epochs = {s["epoch"] for s in states}
    if len(epochs) != 1:
        raise StateError(f"the ranks' states are from different epochs ({sorted(epochs)}): "
                         "take them at the same step")
    epoch = epochs.pop()
    if any(s.get("cut") for s in states):  # the ranks ended that epoch together
        return {"epoch": epoch, "deal": None}
    workers = states[0].get("workers") or {}
    copies, until = workers.get("copies", 1), workers.get("until")
    slots: list[dict] = []
    for s in sorted(states, key=lambda s: s["rank"]):
        slots += _Walk(plan, epoch, s["rank"], world, copies, until).slots(s["graph"])
    shards = {t["at"] for t in slots}
    if len(shards) != 1:
        raise StateError(f"elastic resume needs one shard on the way to the output, found {sorted(shards)}")
    shard = shards.pop()
    first = slots[0]
    if any(t["levels"] != first["levels"] or t["total"] != first["total"] for t in slots):
        raise StateError(f"{_where(plan, shard)}: the ranks' states disagree on the items of the epoch "
                         "(another listing, or states from different resumes)")
    settings = first["settings"]
    if settings["world"] != world:
        raise StateError(f"{_where(plan, shard)} deals to {settings['world']} ranks in the old run of "
                         f"{world}: only a shard by rank can be resumed on another world size")
    keys = sorted((t["settings"]["rank"], t["settings"]["worker"]) for t in slots)
    want = [(r, w) for r in range(world) for w in range(settings["workers"])]
    if keys != want:
        raise StateError(f"{_where(plan, shard)}: the old run's slots {keys} are not every (rank, copy) "
                         f"of {world} ranks x {settings['workers']} copies")
    level = {"world": world, "workers": settings["workers"], "equalize": settings["equalize"],
             "slots": [[t["settings"]["rank"], t["settings"]["worker"], t["slot"][2], encode_bits(t["slot"][3])]
                       for t in slots]}
    levels = first["levels"] + [level]
    left = len(remaining(first["total"], levels))
    log.info("elastic resume of epoch %d: %d ranks x %d copies consumed %d of %d items; %d left to deal",
             epoch, world, settings["workers"], first["total"] - left, first["total"], left)
    return {"epoch": epoch, "deal": {"epoch": epoch, "levels": levels} if left else None}

"""The loader's state format, and whether a saved state fits this graph.

A loader state is plain data that ``torch.load`` (weights_only), JSON and
``torch.distributed.checkpoint`` read as they are: ``{"format": 2, "rank<R>": "<JSON>"}``, one
entry per rank, so the states of several ranks saved under one key (DCP's global plan, a merged
dict) stay distinct and each rank loads its own. The JSON holds the rank's own state (format 1,
which conveyor once wrote bare and which still loads): its layout version, the spec's digest and
node params (``summary``: to name what differs when a state does not fit), the epoch, the
batches yielded in it, whether the ranks cut that epoch, the rank and world, the worker copies,
and the graph's own state. ``rank_states`` decodes any of these.

Paths under the spec's folder are kept as ``${spec_dir}/...``, so a checkout moved elsewhere has
the same digest; a state from before that loads too (its paths are compared as they would be
written now). A state whose spec differs from this one only in params that leave the data the
same (each op's ``OpSpec.safe_params``: workers, prefetch depth, retries...) loads under
``strict=True``.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import TYPE_CHECKING, Any

from conveyor.errors import StateError
from conveyor.graphs.compile import node_params
from conveyor.graphs.validate import Plan
from conveyor.nodes import state_shape as shape

if TYPE_CHECKING:
    from conveyor.graphs.registry import OpSpec

log = logging.getLogger(__name__)

STATE_FORMAT = 2  # {"format": 2, "rank<R>": JSON of the rank's state}
RANK_FORMAT = 1    # the layout of one rank's state (a format-1 state is one of these, bare)
# dcp.load({"data": loader}) gives each rank the entry of its own rank number only
_DCP_HINT = (" (from a torch.distributed.checkpoint folder, conveyor.dcp_states(folder) reads every "
             "rank's: loader.load_state_dict(conveyor.dcp_states(folder)))")


# one rank's state (format 1), checked before anything is compared or restored; the graph's own
# state is checked against its nodes' shapes by the loader (nodes/state_shape.py). "seed" (the
# graph's seed param) is missing from states written before it was recorded.
_NODE_SUMMARY = shape.Fields({"op": shape.Str(), "params": shape.Plain(dict), "inputs": shape.ListOf(shape.Str())})
_WORKERS = shape.Fields({"copies": shape.Int(min=1), "method": shape.Str(), "until": shape.Null(shape.Str())})
RANK_STATE_SHAPE = shape.Fields({
    "format": shape.Int(), "digest": shape.Str(), "spec": shape.MapOf(_NODE_SUMMARY),
    "workers": shape.Null(_WORKERS), "seed": shape.Int(min=None), "rank": shape.Int(), "world": shape.Int(min=1),
    "epoch": shape.Int(), "yielded": shape.Int(), "cut": shape.Bool(), "graph": shape.Plain(dict),
}, optional=("seed",))


def check_rank_state(state: Any, key: str) -> None:
    """Refuse a rank state (under ``key`` in the loader state) that is not of the shape this
    conveyor writes: another format, a key missing or unknown, a value of another type or out of
    bounds (``epoch: -1``, ``world: "1"``, ``graph: null``...).

    Raises:
        StateError: naming the key and the value.
    """
    at = shape.At(None, (key,))
    if not isinstance(state, dict):
        raise at.fail(state, "a conveyor rank state (a dict)")
    if "format" in state and state["format"] != RANK_FORMAT:
        raise StateError(f"rank state format {state['format']!r} is not supported (this conveyor "
                         f"writes format {RANK_FORMAT})")
    RANK_STATE_SHAPE.check(state, at)
    if state["rank"] >= state["world"]:
        raise at.key("rank").fail(state["rank"], f"a rank < world ({state['world']})")


def is_safe_param(op: OpSpec, param: str) -> bool:
    """Whether a change of ``op``'s param ``param`` leaves the data exactly the same (only speed
    or memory differ), so that a state from before the change loads under ``strict=True``: what the
    op declares in its ``OpSpec.safe_params`` (nothing, for an op that declares none)."""
    return param in op.safe_params


def safe_with(op: OpSpec, params: Any, param: str, saved: Any, now: Any) -> bool:
    """Whether this change of ``param`` (``saved`` -> ``now``) leaves the data the same given the
    node's other params (``OpSpec.safe_change``: map's ``batch`` for a ``batch_invariant`` fn)."""
    return op.safe_change is not None and bool(op.safe_change(params, param, saved, now))


# ----- the spec as states name it ---------------------------------------------------------

def with_spec_dir(value: Any, spec_dir: str) -> Any:
    """Plain ``value`` with every string that starts with the folder ``spec_dir`` written as
    ``${spec_dir}`` and the rest, so that a checkout moved elsewhere has the same summary
    (and a state taken in one place loads in the other)."""
    if isinstance(value, str):
        if spec_dir not in ("", "/") and (value == spec_dir or value.startswith(spec_dir + "/")):
            return "${spec_dir}" + value[len(spec_dir):]
        return value
    if isinstance(value, list):
        return [with_spec_dir(v, spec_dir) for v in value]
    if isinstance(value, dict):
        return {k: with_spec_dir(v, spec_dir) for k, v in value.items()}
    return value


def summary(plan: Plan) -> dict[str, Any]:
    """The compiled graph as plain data: per node its op, params (paths under the spec's folder
    as ``${spec_dir}/...``) and inputs; and the output."""
    copies = getattr(plan, "copies", None)
    spec_dir = getattr(plan, "spec_dir", "")
    return {
        "nodes": {n: {"op": p.op.name, "params": with_spec_dir(node_params(p.params), spec_dir),
                      "inputs": list(p.inputs)}
                  for n, p in plan.nodes.items()},
        "output": plan.output,
        "workers": None if copies is None else {"copies": copies.count, "method": copies.method,
                                                "until": copies.until},
        "seed": plan.seed,  # the graph's seed param: every node's seed left out is this one
    }


def digest(spec_summary: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(spec_summary, sort_keys=True).encode()).hexdigest()[:16]


# ----- reading states ----------------------------------------------------------------------

def rank_key(rank: int) -> str:
    """The key of rank ``rank``'s entry in a loader state."""
    return f"rank{rank}"


def rank_states(state: Any) -> dict[int, dict[str, Any]]:
    """Each rank's own state (decoded) in a loader state, by rank.

    Takes a state from ``Loader.state_dict()`` (format 2), several ranks' states merged into
    one dict, or a bare rank state (format 1, as conveyor wrote before).

    Raises:
        StateError: ``state`` is not a conveyor loader state, or an entry cannot be read.
    """
    if not isinstance(state, dict) or "format" not in state:
        raise StateError("not a conveyor loader state (expected a dict from Loader.state_dict())")
    if type(state["format"]) is not int:
        raise StateError(f"state format {state['format']!r} is not supported (this conveyor "
                         f"writes format {STATE_FORMAT})")
    if state["format"] == RANK_FORMAT and "graph" in state:
        check_rank_state(state, "state")
        return {state["rank"]: state}
    if state["format"] != STATE_FORMAT:
        raise StateError(f"state format {state['format']} is not supported (this conveyor "
                         f"writes format {STATE_FORMAT})")
    out = {}
    for key, value in state.items():
        if not (isinstance(key, str) and key.startswith("rank") and key[4:].isdigit()):
            continue  # (other keys: what a checkpoint merged into the same dict)
        try:
            one = json.loads(value)
        except (TypeError, ValueError) as exc:
            raise StateError(f"state entry '{key}' is not a conveyor rank state: {exc}") from None
        if not isinstance(one, dict) or "graph" not in one:
            raise StateError(f"state entry '{key}' is not a conveyor rank state")
        check_rank_state(one, key)
        if one["rank"] != int(key[4:]):
            raise StateError(f"state {key} > rank: expected {int(key[4:])} (the rank of its entry), "
                             f"got {one['rank']!r}")
        out[int(key[4:])] = one
    return out


def merged_rank_states(states: Any) -> dict[int, dict]:
    """Every rank's state in ``states`` (a loader state, several merged into one dict, or a list
    or tuple of them), decoded, by rank."""
    if not isinstance(states, (list, tuple)):
        return rank_states(states)
    out: dict[int, dict] = {}
    for one in states:
        for rank, state in rank_states(one).items():
            if rank in out and out[rank] != state:
                raise StateError(f"two different states for rank {rank}")
            out[rank] = state
    return out


def copies_of(workers: dict[str, Any] | None) -> int:
    """The worker copies of a state's (or a summary's) ``workers``."""
    return (workers or {}).get("copies", 1)


class States:
    """This graph's states: writes its rank's, and checks that a saved one fits it.

    Args:
        plan: the checked spec the loader runs.
        rank: this process's rank in the graph's world.
        world: the number of ranks the graph was built for.
    """

    def __init__(self, plan: Plan, rank: int, world: int):
        self.plan, self.rank, self.world = plan, rank, world
        self.summary = summary(plan)
        self.digest = digest(self.summary)

    def rank_state(self, epoch: int, yielded: int, cut: bool, graph: Any) -> dict[str, Any]:
        """This rank's own state (format 1), as plain data."""
        return {
            "format": RANK_FORMAT,
            "digest": self.digest,
            "spec": self.summary["nodes"],
            "workers": self.summary["workers"],
            "seed": self.summary["seed"],
            "rank": self.rank,
            "world": self.world,
            "epoch": epoch,
            "yielded": yielded,
            "cut": cut,
            "graph": graph,
        }

    def encode(self, rank_state: dict[str, Any]) -> dict[str, Any]:
        """The loader state (format 2) holding ``rank_state`` under this rank's key."""
        return {"format": STATE_FORMAT, rank_key(self.rank): json.dumps(rank_state, separators=(",", ":"))}

    def copies(self, state: dict[str, Any] | None = None) -> int:
        """The worker copies of ``state``, or of this graph."""
        return copies_of(self.summary["workers"] if state is None else state.get("workers"))

    def own(self, by_rank: dict[int, dict[str, Any]]) -> dict[str, Any]:
        """This rank's entry of the decoded states."""
        own = by_rank.get(self.rank)
        if own is None and len(by_rank) == 1:
            own = next(iter(by_rank.values()))  # one rank's state: check_fits names the mismatch
        if own is None:
            raise StateError(f"the state holds rank(s) {sorted(by_rank)}, this is rank {self.rank} of "
                             f"world {self.world}: load each rank's own state with the same world "
                             "size, or the states of every rank of the old run to resume elastically"
                             f"{_DCP_HINT}")
        return own

    def check_fits(self, state: dict[str, Any], strict: bool, elastic: bool = False) -> None:
        """Refuse a rank state from another format, rank, world, worker copies or graph.

        With ``elastic``, the state is one of every rank's of another world or copies. Params
        that change the data refuse it under ``strict`` (else they are logged as warnings).

        Raises:
            StateError: naming what does not fit.
        """
        if state.get("format") != RANK_FORMAT:
            raise StateError(f"rank state format {state.get('format')} is not supported (this conveyor "
                             f"writes format {RANK_FORMAT})")
        if not elastic and (state.get("rank"), state.get("world")) != (self.rank, self.world):
            one_rank = state.get("world") == self.world > 1  # a checkpoint one rank wrote
            raise StateError(f"state was saved by rank {state.get('rank')} of world {state.get('world')}, "
                             f"this is rank {self.rank} of world {self.world}: load each rank's "
                             "own state with the same world size, or the states of every rank of the "
                             f"old run to resume elastically{_DCP_HINT}"
                             + ("; Lightning writes rank 0's checkpoint only: add "
                                "conveyor.lightning.ExactResume() to the trainer's callbacks to keep "
                                "every rank's state in it (the HF Trainer: conveyor.hf.ExactResume; "
                                "accelerate's save_state: register conveyor.hf.EveryRank(loader))"
                                if one_rank else ""))
        saved_w, now_w = state.get("workers") or {}, self.summary["workers"] or {}
        saved_until = saved_w.get("until") if saved_w.get("copies", 1) > 1 else None
        now_until = now_w.get("until") if now_w.get("copies", 1) > 1 else None
        if elastic and saved_until and now_until and saved_until != now_until:
            raise StateError(f"state was taken with worker copies up to '{saved_until}', this graph "
                             f"runs them up to '{now_until}'")
        if not elastic and (saved_w.get("copies", 1), saved_w.get("until")) != (now_w.get("copies", 1),
                                                                                 now_w.get("until")):
            raise StateError(f"state was taken with {saved_w.get('copies', 1)} worker copies up to "
                             f"'{saved_w.get('until')}', this graph runs {now_w.get('copies', 1)} up to "
                             f"'{now_w.get('until')}': load the states of every rank of the old run to "
                             "resume with other copies (elastic)")
        if state.get("digest") != self.digest:
            self.compare(state.get("spec") or {}, strict, state.get("seed"), elastic=elastic)

    def compare(self, saved: dict[str, Any], strict: bool, saved_seed: int | None = None,
                elastic: bool = False) -> None:
        """Compare a saved spec summary's nodes (and the graph's seed, where the state records
        it) with this graph's: another graph is refused; params that change the data are
        refused under ``strict``; a change safe only with the node's other params
        (``OpSpec.safe_change``) is refused by an elastic resume; every difference is logged."""
        now = self.summary["nodes"]
        structural = []
        for n in saved:
            if n not in now:
                structural.append(f"node '{n}' is in the saved spec but not in this one")
        for n in now:
            if n not in saved:
                structural.append(f"node '{n}' is in this spec but not in the saved one")
            elif saved[n]["op"] != now[n]["op"] or saved[n].get("inputs") != now[n]["inputs"]:
                structural.append(f"node '{n}' is {saved[n]['op']} <- {saved[n].get('inputs')} in the "
                                  f"saved spec, {now[n]['op']} <- {now[n]['inputs']} here")
        if structural:
            raise StateError("the state is from a different graph: " + "; ".join(structural))
        diffs = []
        if saved_seed is not None and saved_seed != self.summary["seed"]:  # every node's default seed
            diffs.append((False, f"the graph's seed (param 'seed'): saved {saved_seed!r}, now "
                                 f"{self.summary['seed']!r} (breaks exactness: the batches will differ)"))
        spec_dir = self.plan.spec_dir  # a state from before paths were kept as ${spec_dir}/...
        for n, node in now.items():
            old = saved[n]["params"]
            planned = self.plan.nodes[n]
            for p in sorted(set(old) | set(node["params"])):
                was, is_now = old.get(p), node["params"].get(p)
                if with_spec_dir(was, spec_dir) == is_now:
                    continue
                what = f"node '{n}' param '{p}': saved {was!r}, now {is_now!r}"
                safe = is_safe_param(planned.op, p)
                if not safe and safe_with(planned.op, planned.params, p, was, is_now):
                    if elastic:  # its elastic cursor counts by the param of now
                        raise StateError(f"{what}: an elastic resume counts what the node consumed by its "
                                         f"'{p}' of now, so it needs the saved one; resume with {p}: {was!r}, "
                                         "then change it")
                    safe = True
                diffs.append((safe, what + (" (safe: the data stay the same)" if safe else
                                            " (breaks exactness: the batches will differ)")))
        breaking = [d for safe, d in diffs if not safe]
        if strict and breaking:
            raise StateError("the state is from a spec with other params: " + "; ".join(breaking)
                             + ". Pass strict=False to load it anyway")
        for safe, d in diffs:
            (log.info if safe else log.warning)("loading a state across a spec change: %s", d)

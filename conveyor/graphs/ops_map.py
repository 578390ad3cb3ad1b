"""The ops that call a user's fn per item, as the compiler sees them: ``map`` and ``filter``.

Same shape as ``conveyor.graphs.ops``: a frozen params dataclass, a build function, and the
facts the compiler asks (see conveyor/graphs/opspec.py). Their rules across the graph
(``graph_check``) are the fn's own: ``check_args`` and ``per_sample``, attributes the fn
declares (conveyor/graphs/fn_args.py), and for a map, what resuming and worker processes need.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

from torchdata.nodes import BaseNode

from conveyor.graphs.copies_check import start_methods
from conveyor.graphs.fn_args import batch_invariant, check_args, per_sample
from conveyor.graphs.opspec import Problem, SpecGraph, count_unless_skipping
from conveyor.graphs.ops import BuildContext, Method, OnError
from conveyor.graphs.params import did_you_mean
from conveyor.graphs.registry import Fn, OpSpec, param, resolve_fn
from conveyor.nodes import Cursor, Filter, Map, MapBatches, PerWorker, wants_rng


@dataclass(frozen=True)
class MapParams:
    fn: Fn = param(doc="module:attr, called as fn(item, **args); a class is made once per worker "
                       "with init, then called per item")
    args: dict = param(factory=dict, doc="keyword arguments for each call, checked against fn's signature")
    init: dict | None = param(None, doc="when fn is a class: keyword arguments for its constructor")
    workers: int = param(0, min=0, max=1024, doc="0 = inline")
    method: Method = param(Method.thread,
                           doc="thread (Pillow and torch release the GIL) | process (pure-Python fns)")
    on_error: OnError = param(OnError.raise_,
                              doc="raise: the error, with the node named; skip: count and drop the item")
    seed: int | None = param(None, doc="default: the graph's seed param (else 0)")
    ordered: bool = param(True, doc="false: unordered results, not resumable")
    mp_context: str | None = param(None, doc="spawn | fork | forkserver, for method: process")
    snapshot_every: int = param(16, min=1, doc="input state taken every N items (restore re-reads <= N)")
    batch: int | None = param(None, min=1, doc="items per call: fn takes a list and returns a list "
                                               "(cheap items, batch tokenizers)")
    timeout: float | None = param(None, doc="with method: process, seconds to wait for a result before a "
                                           "WorkerError naming the workers (DataLoader's timeout); null: no limit")


def _map_fn(p: MapParams | FilterParams) -> Any:
    """``fn``, or for a class a ``PerWorker`` that makes one instance per worker thread/process."""
    fn = resolve_fn(p.fn)
    return PerWorker(fn, p.init) if isinstance(fn, type) else fn


def _check_map(p: MapParams, n_inputs: int) -> list[tuple[str, str]]:
    """``fn``'s signature against ``args`` and ``init``; with ``batch``, no per-sample
    randomness (the fn's own ``check_args`` rules run in validate.py)."""
    from conveyor.graphs.fn_check import check_call

    errors = check_call(p.fn, p.args, p.init)
    try:
        fn = resolve_fn(p.fn)
    except ValueError:  # reported as the fn param's error
        return errors
    if p.batch is not None and wants_rng(fn):
        errors.append(("batch", f"{p.fn} takes an rng or a generator, which a batch map cannot give "
                                "(a list has no single sample index): remove batch"))
    return errors


def _build_map(p: MapParams, inputs: list[BaseNode], ctx: BuildContext) -> BaseNode:
    if p.batch is not None:
        return MapBatches(inputs[0], fn=_map_fn(p), size=p.batch, args=p.args, workers=p.workers,
                          method=p.method.value, on_error=p.on_error.value, where=ctx.where,
                          seed=ctx.seed_for(p.seed), rank=ctx.rank, mp_context=p.mp_context,
                          snapshot_every=p.snapshot_every, ordered=p.ordered, timeout=p.timeout)
    return Map(inputs[0], fn=_map_fn(p), args=p.args, workers=p.workers, method=p.method.value,
               on_error=p.on_error.value, seed=ctx.seed_for(p.seed), rank=ctx.rank, where=ctx.where,
               mp_context=p.mp_context, snapshot_every=p.snapshot_every, ordered=p.ordered,
               slab=ctx.slab, timeout=p.timeout)


@dataclass(frozen=True)
class FilterParams:
    fn: Fn = param(doc="module:attr predicate, fn(item, **args) -> bool; a class is made once with init")
    args: dict = param(factory=dict, doc="keyword arguments for each call, checked against fn's signature")
    init: dict | None = param(None, doc="when fn is a class: keyword arguments for its constructor")


def _check_filter(p: FilterParams, n_inputs: int) -> list[tuple[str, str]]:
    from conveyor.graphs.fn_check import check_call

    return check_call(p.fn, p.args, p.init, randomness=False)


def _build_filter(p: FilterParams, inputs: list[BaseNode], ctx: BuildContext) -> BaseNode:
    return Filter(inputs[0], fn=_map_fn(p), args=p.args, where=ctx.where)


def _elastic_map(p: MapParams, ctx: Any, cursor: Cursor) -> Cursor:
    if not p.ordered:
        raise ValueError("ordered: false emits items in the order they finish, which no state records")
    if p.batch is not None:
        return MapBatches.elastic_input(cursor, p.batch)
    return Map.elastic_input(cursor)


def _map_safe_change(p: MapParams, name: str, saved: Any, now: Any) -> bool:
    """batch, from one size to another, where the fn declares batch_invariant."""
    return (name == "batch" and all(isinstance(v, int) and not isinstance(v, bool) for v in (saved, now))
            and batch_invariant(resolve_fn(p.fn)))


def _fn_rules(graph: SpecGraph, name: str) -> list[Problem]:
    """The fn's own rules (its ``check_args``) over the node's ``args``."""
    p = graph.nodes[name].params
    return [Problem(name, f"arg '{arg}': {message}", ("args", arg), "args")
            for arg, message in check_args(p.fn, resolve_fn(p.fn), p.args)]


def _batching_above(graph: SpecGraph, name: str) -> str | None:
    """The batching or collating node (``OpSpec.batches``, ``collates``) whose batches reach ``name`` through nodes that
    only pass items on (``per_record``), or None where none surely does (no batch above, or
    a node between that may change what an item is: a map whose fn is not ``per_sample``)."""
    seen: set[str] = set()
    todo = list(graph.inputs.get(name, []))
    while todo:
        up = todo.pop()
        plan = graph.nodes.get(up)
        if up in seen or plan is None or plan.params is None:
            continue
        seen.add(up)
        if plan.op.batches or plan.op.collates:  # lists of records, or a batch stacked into one
            return up
        if plan.op.passes_records(plan.params):
            todo.extend(graph.inputs.get(up, []))
    return None


def _graph_check_map(graph: SpecGraph, name: str) -> list[Problem]:
    """The fn's rules; a fn of one record (``per_sample``) after a batch; an unordered map in a
    graph that must resume exactly; the start method and, for worker processes, a fn that pickles."""
    p = graph.nodes[name].params
    problems = _fn_rules(graph, name)
    batching = _batching_above(graph, name) if p.batch is None and per_sample(resolve_fn(p.fn)) else None
    if batching is not None:
        batch_op = graph.nodes[batching].op.name
        problems.append(Problem(name, f"fn {p.fn} takes one record, but node '{batching}' ({batch_op}) above "
                                      f"it hands on batches, not records: put this map before the "
                                      f"{batch_op} node", ("fn",), "fn"))
    if not p.ordered and graph.resumable:
        problems.append(Problem(name, "an unordered map cannot resume exactly (its output order depends on "
                                      "timing); set ordered: true, or declare 'resumable: false' for the graph",
                                ("ordered",), "ordered"))
    if p.mp_context is not None and p.mp_context not in start_methods():
        problems.append(Problem(name, f"expected one of {'|'.join(start_methods())} (the start methods of this "
                                      f"platform), got {p.mp_context!r}" + did_you_mean(p.mp_context, start_methods()),
                                ("mp_context",), "mp_context"))
    if p.timeout is not None and (not p.timeout > 0 or p.timeout == float("inf")):
        problems.append(Problem(name, f"expected a positive number of seconds (or null: no limit), got {p.timeout!r}",
                                ("timeout",), "timeout"))
    elif p.timeout is not None and (p.method.value != "process" or p.workers == 0):
        problems.append(Problem(name, "timeout bounds the wait for worker processes: it needs method: process "
                                      "and workers >= 1 (a thread stuck in fn cannot be stopped; the watchdog "
                                      "names it)", ("timeout",), "timeout"))
    if p.method.value == "process" and p.workers > 0:
        try:
            pickle.dumps(resolve_fn(p.fn))
        except Exception as exc:
            problems.append(Problem(name, f"method: process sends fn to worker processes, but {p.fn!r} cannot be "
                                          f"pickled ({type(exc).__name__}); define it at module level or use "
                                          "method: thread", ("fn",), "fn"))
    return problems


def _per_record(p: MapParams) -> bool:
    """A map hands on single records when its fn declares ``per_sample`` (one sample in, one out)."""
    return per_sample(resolve_fn(p.fn))


MAP = OpSpec("map", MapParams, _build_map, "one", "fn over items, in order, in threads or processes; "
             "elastic (not with ordered: false)", _check_map, elastic=_elastic_map,
             length=count_unless_skipping, unknown_length="skips the items that fail (on_error: skip)",
             keeps_count="unless_skipping", per_record=_per_record, writes_rows=True,
             safe_params=frozenset({"workers", "method", "mp_context", "snapshot_every", "timeout"}),
             safe_change=_map_safe_change, graph_check=_graph_check_map,
             items_in='any items', items_out='what fn returns for each',
             example='decode: {op: map, fn: conveyor.image:train_transform, args: {size: 224}, workers: 4}')
FILTER = OpSpec("filter", FilterParams, _build_filter, "one", "drop items where fn is false; not elastic below a "
                "shard (which items it kept is known only by running fn)", _check_filter,
                unknown_length="drops the items its fn rejects", per_record=True, graph_check=_fn_rules,
                items_in='any items', items_out='the items fn keeps (the rest are counted as filtered)',
                example='keep: {op: filter, fn: mypkg.rules:long_enough, args: {min_len: 16}}')

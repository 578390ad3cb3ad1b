"""The built-in ops as the compiler sees them: a params dataclass and a build function each.

This is the one place that knows both the spec's words and the nodes' constructors. A build
function receives the checked params, its input nodes and a ``BuildContext`` (node name,
where it is in the spec, the graph's seed, rank and world) and returns a ``BaseNode``.
A ``seed`` left out of a node means the graph's seed (the spec param ``seed``, else 0).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from torchdata.nodes import BaseNode

from conveyor.graphs.registry import Fn, OpSpec, param, resolve_fn
from conveyor.nodes import (Batch, Collate, Cursor, Filter, ListFiles, Map, MapBatches, Mix, PerWorker, PinMemory,
                            Prefetch, Shard, ShuffleBuffer, ToDevice, suffixes, wants_rng, weights_problem)


@dataclass(frozen=True)
class BuildContext:
    """What a build function may know about the graph around its node."""

    name: str
    op: str
    where: str
    seed: int
    rank: int
    world: int
    worker: int = 0
    workers: int = 1
    slab: int = 0  # a map feeding batch → collate: the batch size (compile.slabbed_maps)

    def seed_for(self, seed: int | None) -> int:
        return self.seed if seed is None else seed


class KeyLabel(str, enum.Enum):
    """Where a listed name's class comes from, for listings of keys (list_lmdb)."""
    parent_dir = "parent_dir"


class Label(str, enum.Enum):
    """... and for listings of files (list_files), which may also take ImageFolder's rule."""
    parent_dir = "parent_dir"
    top_dir = "top_dir"


class ShardBy(str, enum.Enum):
    rank = "rank"
    worker = "worker"


class Method(str, enum.Enum):
    thread = "thread"
    process = "process"


class OnError(str, enum.Enum):
    raise_ = "raise"
    skip = "skip"


class Stop(str, enum.Enum):
    all = "all"
    first = "first"
    forever = "forever"


@dataclass(frozen=True)
class ListFilesParams:
    url: str = param(doc="fsspec glob: local path, file://, s3://...")
    extensions: list[str] | None = param(None, doc="keep only names ending in one of these, any case "
                                                   "([.jpg, .jpeg, .png])")
    label: Label | None = param(None, doc="parent_dir: class index from the parent folder; top_dir: "
                                          "from the first folder below the url's fixed part "
                                          "(ImageFolder's root/<class>/**)")
    shuffle: bool = param(False, doc="permute the whole listing each epoch")
    seed: int | None = param(None, doc="default: the graph's seed param (else 0)")
    storage_options: dict | None = param(None, doc="fsspec options (endpoint_url, ...); never logged")


def _check_list_files(p: ListFilesParams, n_inputs: int) -> list[tuple[str, str]]:
    if p.extensions is None:
        return []
    try:
        suffixes(p.extensions)
    except ValueError:
        return [("extensions", f"expected a non-empty list of file extensions such as [.jpg, .png], "
                               f"got {p.extensions!r}")]
    return []


def _build_list_files(p: ListFilesParams, inputs: list[BaseNode], ctx: BuildContext) -> BaseNode:
    return ListFiles(url=p.url, label=p.label.value if p.label else None, shuffle=p.shuffle,
                     seed=ctx.seed_for(p.seed), storage_options=p.storage_options,
                     extensions=p.extensions, where=ctx.where)


class Equalize(str, enum.Enum):
    repeat = "repeat"
    drop = "drop"
    none = "none"


def _all_by() -> list[ShardBy]:
    return [ShardBy.rank, ShardBy.worker]


@dataclass(frozen=True)
class ShardParams:
    by: list[ShardBy] = param(factory=_all_by, doc="rank and/or worker")
    rank: int | None = param(None, min=0, doc="default: torch.distributed, else $RANK, else 0")
    world: int | None = param(None, min=1, doc="default: torch.distributed, else $WORLD_SIZE, else 1")
    equalize: Equalize = param(Equalize.repeat, doc="repeat | drop | none: same item count per rank")


def shard_slot(p: ShardParams, ctx: BuildContext) -> dict[str, Any]:
    """The shard's rank, world, worker, workers and equalize in the graph ``ctx`` describes."""
    by_rank = ShardBy.rank in p.by
    by_worker = ShardBy.worker in p.by
    return {"rank": (ctx.rank if p.rank is None else p.rank) if by_rank else 0,
            "world": (ctx.world if p.world is None else p.world) if by_rank else 1,
            "worker": ctx.worker if by_worker else 0, "workers": ctx.workers if by_worker else 1,
            "equalize": p.equalize.value}


def _build_shard(p: ShardParams, inputs: list[BaseNode], ctx: BuildContext) -> BaseNode:
    return Shard(inputs[0], **shard_slot(p, ctx))


@dataclass(frozen=True)
class ShuffleBufferParams:
    size: int = param(min=1, doc="items per shuffle window")
    seed: int | None = param(None, doc="default: the graph's seed param (else 0)")


def _build_shuffle(p: ShuffleBufferParams, inputs: list[BaseNode], ctx: BuildContext) -> BaseNode:
    return ShuffleBuffer(inputs[0], size=p.size, seed=ctx.seed_for(p.seed), rank=ctx.rank)


@dataclass(frozen=True)
class MapParams:
    fn: Fn = param(doc="module:attr, called as fn(item, **args); a class is made once per worker "
                       "with init, then called per item")
    args: dict = param(factory=dict, doc="keyword arguments for each call, checked against fn's signature")
    init: dict | None = param(None, doc="when fn is a class: keyword arguments for its constructor")
    workers: int = param(0, min=0, doc="0 = inline")
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
                          snapshot_every=p.snapshot_every, ordered=p.ordered)
    return Map(inputs[0], fn=_map_fn(p), args=p.args, workers=p.workers, method=p.method.value,
               on_error=p.on_error.value, seed=ctx.seed_for(p.seed), rank=ctx.rank, where=ctx.where,
               mp_context=p.mp_context, snapshot_every=p.snapshot_every, ordered=p.ordered,
               slab=ctx.slab)


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


@dataclass(frozen=True)
class BatchParams:
    size: int = param(min=1, doc="items per batch")
    drop_last: bool = param(False, doc="drop the last, shorter batch of each epoch")


def _build_batch(p: BatchParams, inputs: list[BaseNode], ctx: BuildContext) -> BaseNode:
    return Batch(inputs[0], size=p.size, drop_last=p.drop_last)


@dataclass(frozen=True)
class NoParams:
    pass


def _build_collate(p: NoParams, inputs: list[BaseNode], ctx: BuildContext) -> BaseNode:
    return Collate(inputs[0], where=ctx.where)


@dataclass(frozen=True)
class PinMemoryParams:
    enabled: bool | None = param(None, doc="null: pin when CUDA is available")


def _build_pin(p: PinMemoryParams, inputs: list[BaseNode], ctx: BuildContext) -> BaseNode:
    return PinMemory(inputs[0], enabled=p.enabled)


@dataclass(frozen=True)
class PrefetchParams:
    depth: int = param(2, min=1, doc="items made ahead")
    snapshot_every: int = param(1, min=1, doc="input state taken every N items (restore re-reads <= N)")


def _build_prefetch(p: PrefetchParams, inputs: list[BaseNode], ctx: BuildContext) -> BaseNode:
    return Prefetch(inputs[0], depth=p.depth, snapshot_every=p.snapshot_every)


@dataclass(frozen=True)
class ToDeviceParams:
    device: str = param("cuda", doc="cuda, cuda:N; passes through without CUDA")
    non_blocking: bool = param(True, doc="asynchronous copies (from pinned memory)")


def _build_to_device(p: ToDeviceParams, inputs: list[BaseNode], ctx: BuildContext) -> BaseNode:
    return ToDevice(inputs[0], device=p.device, non_blocking=p.non_blocking)


@dataclass(frozen=True)
class MixParams:
    weights: list[float] = param(doc="one weight per input")
    stop: Stop = param(Stop.all, doc="all: until every input ends | first: at the first end | "
                                     "forever: restart ended inputs")
    seed: int | None = param(None, doc="default: the graph's seed param (else 0)")


def _build_mix(p: MixParams, inputs: list[BaseNode], ctx: BuildContext) -> BaseNode:
    return Mix(inputs, weights=p.weights, stop=p.stop.value, seed=ctx.seed_for(p.seed))


def _check_mix(p: MixParams, n_inputs: int) -> list[tuple[str, str]]:
    errors = []
    if len(p.weights) != n_inputs:
        errors.append(("weights", f"expected one weight per input ({n_inputs}), got {len(p.weights)}"))
    problem = weights_problem(p.weights)
    if problem:
        errors.append(("weights", problem))
    return errors


# Elastic resume (conveyor/graphs/elastic.py): from what was consumed of an op's output, what
# was consumed of its input. `ctx` holds the old slot's BuildContext (`build`) and `epoch`.
def elastic_through(p: Any, ctx: Any, cursor: Cursor) -> Cursor:
    """One item in, one out, the input's state nested under ``source``."""
    return cursor.through()


def _elastic_shuffle(p: ShuffleBufferParams, ctx: Any, cursor: Cursor) -> Cursor:
    return ShuffleBuffer.elastic_input(cursor, size=p.size, seed=ctx.build.seed_for(p.seed),
                                       epoch=ctx.epoch, rank=ctx.build.rank, left_after=ctx.left_after)


def _elastic_map(p: MapParams, ctx: Any, cursor: Cursor) -> Cursor:
    if not p.ordered:
        raise ValueError("ordered: false emits items in the order they finish, which no state records")
    if p.batch is not None:
        return MapBatches.elastic_input(cursor, p.batch)
    return Map.elastic_input(cursor)


def _elastic_batch(p: BatchParams, ctx: Any, cursor: Cursor) -> Cursor:
    return Batch.elastic_input(cursor, size=p.size)


def _elastic_prefetch(p: PrefetchParams, ctx: Any, cursor: Cursor) -> Cursor:
    return Prefetch.elastic_input(cursor)


LIST_FILES = OpSpec("list_files", ListFilesParams, _build_list_files, "none",
                    "files matching a glob, sorted, as {path, label, index}; a global order "
                    "(elastic above a shard)", check=_check_list_files,
                    items_in='', items_out='{path, label, index} per file, sorted by path',
                    example='files: {op: list_files, url: "${root}/*/*.JPEG", label: parent_dir, shuffle: true}')
SHARD = OpSpec("shard", ShardParams, _build_shard, "one", "keep this rank's share; elastic: re-deals what an "
               "interrupted epoch left to a new world size or number of copies",
               items_in='any items', items_out="the same items: this rank's share (and this worker copy's)",
               example='shard: {op: shard, by: [rank, worker]}')
SHUFFLE_BUFFER = OpSpec("shuffle_buffer", ShuffleBufferParams, _build_shuffle, "one",
                        "shuffle within windows of `size` items; elastic below the shard (names what "
                        "a partly drained window emitted), not above it (its order is per rank)",
                        elastic=_elastic_shuffle,
                        items_in='any items (small records: shuffle before decoding)',
                        items_out='the same items, shuffled within windows',
                        example='shuffle: {op: shuffle_buffer, size: 10000}')
MAP = OpSpec("map", MapParams, _build_map, "one", "fn over items, in order, in threads or processes; "
             "elastic (not with ordered: false)", _check_map, elastic=_elastic_map,
             items_in='any items', items_out='what fn returns for each',
             example='decode: {op: map, fn: conveyor.image:train_transform, args: {size: 224}, workers: 4}')
FILTER = OpSpec("filter", FilterParams, _build_filter, "one", "drop items where fn is false; not elastic below a "
                "shard (which items it kept is known only by running fn)", _check_filter,
                items_in='any items', items_out='the items fn keeps (the rest are counted as filtered)',
                example='keep: {op: filter, fn: mypkg.rules:long_enough, args: {min_len: 16}}')
BATCH = OpSpec("batch", BatchParams, _build_batch, "one", "lists of `size` items; elastic", elastic=_elastic_batch,
               items_in='any items',
               items_out='lists of size items (the last may be shorter unless drop_last)',
               example='batch: {op: batch, size: 32, drop_last: true}')
COLLATE = OpSpec("collate", NoParams, _build_collate, "one", "stack samples (default_collate); elastic",
                 elastic=elastic_through,
                 items_in='lists of samples (after batch)',
                 items_out='a batch: tensors stacked, dicts and tuples field by field',
                 example='collate: {op: collate}')
PIN_MEMORY = OpSpec("pin_memory", PinMemoryParams, _build_pin, "one", "page-locked memory on CUDA; elastic",
                    elastic=elastic_through,
                    items_in='batches', items_out='the same batches, in page-locked memory on CUDA',
                    example='pin: {op: pin_memory}')
PREFETCH = OpSpec("prefetch", PrefetchParams, _build_prefetch, "one", "background thread, bounded queue; elastic",
                  elastic=_elastic_prefetch,
                  items_in='any items', items_out='the same items, made ahead in a background thread',
                  example='out: {op: prefetch, depth: 4}')
TO_DEVICE = OpSpec("to_device", ToDeviceParams, _build_to_device, "one",
                   "copy batches to a GPU on a side stream, one ahead; elastic",
                   elastic=elastic_through,
                   items_in='batches', items_out='the same batches on the device',
                   example='gpu: {op: to_device, device: cuda}')
MIX = OpSpec("mix", MixParams, _build_mix, "many", "weighted sampling over inputs; not elastic below a "
             "shard (its draws depend on every input's length)", _check_mix,
             items_in='several streams (input: [a, b])',
             items_out='their items, interleaved at random by weight',
             example='mixed: {op: mix, input: [cats, dogs], weights: [0.5, 0.5], stop: first}')

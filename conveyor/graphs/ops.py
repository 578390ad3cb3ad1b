"""The built-in ops as the compiler sees them: a params dataclass, a build function and the
facts the compiler asks (``OpSpec``, conveyor/graphs/opspec.py) each.

This module and its siblings (``ops_map``, ``ops_text``, ``ops_storage``, ``ops_tables``,
``ops_data``) are the one place that knows both the spec's words and the nodes'
constructors. A build function receives the checked params, its input nodes and a
``BuildContext`` (node name, where it is in the spec, the graph's seed, rank and world) and
returns a ``BaseNode``. A ``seed`` left out of a node means the graph's seed (the spec param
``seed``, else 0).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from torchdata.nodes import BaseNode

from conveyor.graphs.fn_args import heavy_output
from conveyor.graphs.listings import listing_sharer, shares
from conveyor.graphs.opspec import Deal, Problem, SpecGraph, Where, listed_count, same_count
from conveyor.graphs.registry import OpSpec, param, resolve_fn
from conveyor.nodes import (Batch, Collate, Cursor, ListFiles, Mix, PinMemory, Prefetch, Shard,
                            ShuffleBuffer, ToDevice, suffixes, weights_problem)


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
    listing: dict | None = None  # a listing made for this node elsewhere (worker copies' parent)

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


class ShareListing(str, enum.Enum):
    """Who lists under torch.distributed: ``auto`` (rank 0 for remote URLs, each rank for local
    paths, which may be other disks on other nodes), ``rank0`` or ``each``."""
    auto = "auto"
    rank0 = "rank0"
    each = "each"


@dataclass(frozen=True)
class ListFilesParams:
    url: str | None = param(None, doc="fsspec glob: local path, file://, s3://... (or give manifest)")
    manifest: str | None = param(None, doc="instead of url: a manifest written by conveyor index, "
                                           "read with one request")
    extensions: list[str] | None = param(None, doc="keep only names ending in one of these, any case "
                                                   "([.jpg, .jpeg, .png])")
    label: Label | None = param(None, doc="parent_dir: class index from the parent folder; top_dir: "
                                          "from the first folder below the url's fixed part "
                                          "(ImageFolder's root/<class>/**)")
    shuffle: bool = param(False, doc="permute the whole listing each epoch")
    seed: int | None = param(None, doc="default: the graph's seed param (else 0)")
    storage_options: dict | None = param(None, doc="fsspec options (endpoint_url, ...); never logged")
    share: ShareListing = param(ShareListing.auto, doc="under torch.distributed, rank0: rank 0 lists and "
                                                       "the others read its listing from the store; each: "
                                                       "every rank lists; auto: rank0 for remote URLs")
    share_timeout: float = param(1800.0, doc="seconds the other ranks wait for rank 0's listing")


_GLOB_CHARS = "*?["


def root_only(url: str) -> bool:
    """Whether a listing of ``url`` would start at the root of its filesystem or store: empty
    text, or an absolute path or a ``protocol://`` URL whose folders before the first glob
    character name nothing (``/``, ``/*/**``, ``/d*/x``, ``file:///``, ``s3://``, ``s3://*``, ``memory://``).
    A relative glob (``*.txt``) starts at the current folder and is not root-only."""
    text = url.strip()
    if not text:
        return True
    protocol, sep, rest = text.partition("://")
    if not sep:
        if not text.startswith("/"):
            return False
        rest = text
    cut = min((rest.find(c) for c in _GLOB_CHARS if c in rest), default=len(rest))
    fixed = rest[:cut].rpartition("/")[0] if cut < len(rest) else rest
    return not fixed.strip("/").strip()


def _check_list_files(p: ListFilesParams, n_inputs: int) -> list[tuple[str, str]]:
    if (p.url is None) == (p.manifest is None):
        what = "missing" if p.url is None else "given with manifest"
        return [("url", f"{what}; list_files takes url (fsspec glob: local path, file://, s3://...) or "
                        "manifest (written by conveyor index), one of them")]
    if p.manifest is not None and (p.label is not None or p.extensions is not None):
        return [("manifest", "a manifest holds its labels and was filtered when written: give label and "
                             "extensions to conveyor index, not here")]
    if not p.share_timeout > 0:
        return [("share_timeout", f"expected a number of seconds > 0, got {p.share_timeout!r}")]
    if p.url is not None and root_only(p.url):
        return [("url", f"expected a folder or glob below the root of a filesystem or bucket, got "
                        f"{p.url!r}: an empty or root-only URL ('', '/', '/*/**', 'file:///', 's3://', "
                        f"'s3://*') would list everything the store holds")]
    if p.extensions is None:
        return []
    try:
        suffixes(p.extensions)
    except ValueError:
        return [("extensions", f"expected a non-empty list of file extensions such as [.jpg, .png], "
                               f"got {p.extensions!r}")]
    return []


def _build_list_files(p: ListFilesParams, inputs: list[BaseNode], ctx: BuildContext) -> BaseNode:
    share = None
    if ctx.listing is not None:  # made once by the parent of the worker copies
        made = ctx.listing
        share = lambda make: made  # noqa: E731
    elif p.url is not None and ctx.world > 1 and shares(p.share.value, p.url):
        share = listing_sharer(p.url, rank=ctx.rank, world=ctx.world, timeout=p.share_timeout)
    return ListFiles(url=p.url, manifest=p.manifest, label=p.label.value if p.label else None,
                     shuffle=p.shuffle, seed=ctx.seed_for(p.seed), storage_options=p.storage_options,
                     extensions=p.extensions, where=ctx.where, share=share)


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


def _deal_shard(p: ShardParams) -> Deal:
    return Deal(by_rank=ShardBy.rank in p.by, by_worker=ShardBy.worker in p.by,
                even=p.equalize is not Equalize.none)


def _length_shard(p: ShardParams, n: list[int], where: Where, source: Any) -> int | None:
    """Deals out as the shard does at run time, ``equalize`` included."""
    by_rank, by_worker = ShardBy.rank in p.by, ShardBy.worker in p.by
    rank, world = (where.rank if p.rank is None else p.rank,
                   where.world if p.world is None else p.world) if by_rank else (0, 1)
    worker, workers = (where.worker, where.workers) if by_worker else (0, 1)
    total = n[0]
    if world == 1 or p.equalize is Equalize.none:
        end = total
    elif p.equalize is Equalize.drop:
        end = total // world * world
    else:  # repeat
        end = -(-total // world) * world
    slots = len(range(rank, end, world))  # this rank's items; its j-th goes to copy j % workers
    return len(range(worker, slots, workers))


@dataclass(frozen=True)
class ShuffleBufferParams:
    size: int = param(min=1, doc="items per shuffle window")
    seed: int | None = param(None, doc="default: the graph's seed param (else 0)")


def _build_shuffle(p: ShuffleBufferParams, inputs: list[BaseNode], ctx: BuildContext) -> BaseNode:
    return ShuffleBuffer(inputs[0], size=p.size, seed=ctx.seed_for(p.seed), rank=ctx.rank)


SHUFFLE_AFTER_HEAVY_LIMIT = 64  # a shuffle window bigger than this after a decode is refused


def _graph_check_shuffle(graph: SpecGraph, name: str) -> list[Problem]:
    """A big window after a map whose fn makes large decoded samples (``heavy_output``)."""
    p = graph.nodes[name].params
    if p.size <= SHUFFLE_AFTER_HEAVY_LIMIT:
        return []
    for up in graph.upstream(name):
        up_plan = graph.nodes.get(up)
        if up_plan is None or up_plan.params is None or up_plan.op.name != "map":
            continue
        if heavy_output(resolve_fn(up_plan.params.fn)):
            return [Problem(name, f"a shuffle buffer of {p.size} items after '{up}' ({up_plan.params.fn}) holds "
                                  "decoded samples: memory grows with the buffer and a restore re-decodes a "
                                  "whole window; shuffle the small records before decoding (move this node "
                                  f"above '{up}')", ("size",), "size")]
    return []


@dataclass(frozen=True)
class BatchParams:
    size: int = param(min=1, max=1_000_000, doc="items per batch")
    drop_last: bool = param(False, doc="drop the last, shorter batch of each epoch")


def _build_batch(p: BatchParams, inputs: list[BaseNode], ctx: BuildContext) -> BaseNode:
    return Batch(inputs[0], size=p.size, drop_last=p.drop_last)


def _batch_size(p: BatchParams) -> int:
    return p.size


def _length_batch(p: BatchParams, n: list[int], where: Where, source: Any) -> int | None:
    return n[0] // p.size if p.drop_last else -(-n[0] // p.size)


@dataclass(frozen=True)
class NoParams:
    pass


@dataclass(frozen=True)
class CollateParams:
    as_tuple: list[str] | None = param(None, doc="hand each batch on as a tuple of these fields, in this "
                                                 "order (`[image, label]`: `for images, target in loader`); "
                                                 "null: the dict")


def _check_collate(p: CollateParams, n_inputs: int) -> list[tuple[Any, str]]:
    if p.as_tuple is None:
        return []
    if not p.as_tuple:
        return [("as_tuple", "as_tuple needs at least one field name (or null for the dict)")]
    for i, name in enumerate(p.as_tuple):
        if not isinstance(name, str) or not name:
            return [(("as_tuple", i), f"as_tuple holds field names, got {name!r}")]
        if p.as_tuple.index(name) != i:
            return [(("as_tuple", i), f"field '{name}' is named twice in as_tuple")]
    return []


def _build_collate(p: CollateParams, inputs: list[BaseNode], ctx: BuildContext) -> BaseNode:
    return Collate(inputs[0], where=ctx.where, as_tuple=p.as_tuple)


@dataclass(frozen=True)
class PinMemoryParams:
    enabled: bool | None = param(None, doc="null: pin when CUDA is available")


def _build_pin(p: PinMemoryParams, inputs: list[BaseNode], ctx: BuildContext) -> BaseNode:
    return PinMemory(inputs[0], enabled=p.enabled)


@dataclass(frozen=True)
class PrefetchParams:
    depth: int = param(2, min=1, max=100_000, doc="items made ahead")
    snapshot_every: int = param(1, min=1, doc="input state taken every N items (restore re-reads <= N)")
    adapt: bool = param(True, doc="make items in the caller's thread while it comes straight back for each "
                                  "(no time to overlap); false: the thread always")


def _build_prefetch(p: PrefetchParams, inputs: list[BaseNode], ctx: BuildContext) -> BaseNode:
    return Prefetch(inputs[0], depth=p.depth, snapshot_every=p.snapshot_every, adapt=p.adapt)


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


def _length_mix(p: MixParams, n: list[int], where: Where, source: Any) -> int | None:
    if p.stop is Stop.all and all(w > 0 for w in p.weights):
        return sum(n)  # every input is drawn to its end
    return None


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


def _elastic_shard(p: ShardParams, ctx: Any, cursor: Cursor) -> dict[str, Any]:
    """What the old slot took of the deal (``Shard.elastic_taken``), its slot under ``settings``."""
    slot = shard_slot(p, ctx.build)
    taken = Shard.elastic_taken(cursor, **slot)
    taken["settings"] = slot
    return taken


def _elastic_batch(p: BatchParams, ctx: Any, cursor: Cursor) -> Cursor:
    return Batch.elastic_input(cursor, size=p.size)


def _elastic_prefetch(p: PrefetchParams, ctx: Any, cursor: Cursor) -> Cursor:
    return Prefetch.elastic_input(cursor)


def _reads_from_url(p: ListFilesParams) -> list[str]:
    return [u for u in (p.url, p.manifest) if u]


LIST_FILES = OpSpec("list_files", ListFilesParams, _build_list_files, "none",
                    "files matching a glob, sorted, as {path, label, index}; a global order "
                    "(elastic above a shard)", check=_check_list_files,
                    length=listed_count, listing=True, per_record=True, reads_from=_reads_from_url,
                    safe_params=frozenset({"share", "share_timeout"}),  # who lists, not what is listed
                    items_in='', items_out='{path, label, index} per file, sorted by path',
                    example='files: {op: list_files, url: "${root}/*/*.JPEG", label: parent_dir, shuffle: true}')
SHARD = OpSpec("shard", ShardParams, _build_shard, "one", "keep this rank's share; elastic: re-deals what an "
               "interrupted epoch left to a new world size or number of copies",
               length=_length_shard, elastic=_elastic_shard, deal=_deal_shard, per_record=True,
               not_global="the shard's input is then one rank's share",
               items_in='any items', items_out="the same items: this rank's share (and this worker copy's)",
               example='shard: {op: shard, by: [rank, worker]}')
SHUFFLE_BUFFER = OpSpec("shuffle_buffer", ShuffleBufferParams, _build_shuffle, "one",
                        "shuffle within windows of `size` items; elastic below the shard (names what "
                        "a partly drained window emitted), not above it (its order is per rank)",
                        elastic=_elastic_shuffle, length=same_count, keeps_count="always", per_record=True,
                        not_global="its windows are permuted per rank", graph_check=_graph_check_shuffle,
                        items_in='any items (small records: shuffle before decoding)',
                        items_out='the same items, shuffled within windows',
                        example='shuffle: {op: shuffle_buffer, size: 10000}')
BATCH = OpSpec("batch", BatchParams, _build_batch, "one", "lists of `size` items; elastic", elastic=_elastic_batch,
               length=_length_batch, keeps_count="always", batches=True, batch_rows=_batch_size,
               items_in='any items',
               items_out='lists of size items (the last may be shorter unless drop_last)',
               example='batch: {op: batch, size: 32, drop_last: true}')
COLLATE = OpSpec("collate", CollateParams, _build_collate, "one", "stack samples (default_collate); elastic",
                 _check_collate, elastic=elastic_through, length=same_count, keeps_count="always", collates=True,
                 stacks_rows=True,
                 items_in='lists of samples (after batch)',
                 items_out='a batch: tensors stacked, dicts and tuples field by field; with as_tuple, a '
                           'tuple of those fields',
                 example='collate: {op: collate, as_tuple: [image, label]}')
PIN_MEMORY = OpSpec("pin_memory", PinMemoryParams, _build_pin, "one", "page-locked memory on CUDA; elastic",
                    elastic=elastic_through, length=same_count, keeps_count="always", per_record=True,
                    pass_through=True, safe_params=frozenset({"enabled"}),
                    items_in='batches', items_out='the same batches, in page-locked memory on CUDA',
                    example='pin: {op: pin_memory}')
PREFETCH = OpSpec("prefetch", PrefetchParams, _build_prefetch, "one", "background thread, bounded queue; elastic",
                  elastic=_elastic_prefetch, length=same_count, keeps_count="always", per_record=True,
                  pass_through=True, safe_params=frozenset({"depth", "snapshot_every", "adapt"}),
                  items_in='any items', items_out='the same items, made ahead in a background thread (inline for a consumer that never waits elsewhere)',
                  example='out: {op: prefetch, depth: 4}')
TO_DEVICE = OpSpec("to_device", ToDeviceParams, _build_to_device, "one",
                   "copy batches to a GPU on a side stream, one ahead; elastic",
                   elastic=elastic_through, length=same_count, keeps_count="always", per_record=True,
                   pass_through=True, safe_params=frozenset({"device", "non_blocking"}),
                   items_in='batches', items_out='the same batches on the device',
                   example='gpu: {op: to_device, device: cuda}')
MIX = OpSpec("mix", MixParams, _build_mix, "many", "weighted sampling over inputs; not elastic below a "
             "shard (its draws depend on every input's length)", _check_mix,
             length=_length_mix, per_record=True, not_global="its draws depend on where each input stands",
             unknown_length="draws at random until an input ends (stop: first) or never ends (stop: forever)",
             items_in='several streams (input: [a, b])',
             items_out='their items, interleaved at random by weight',
             example='mixed: {op: mix, input: [cats, dogs], weights: [0.5, 0.5], stop: first}')

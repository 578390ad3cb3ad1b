"""The sequence ops as the compiler sees them: read_jsonl, bucket_batch, pad_collate.

Same shape as ``conveyor.graphs.ops``: a frozen params dataclass, enums for choices, an
optional ``check`` for rules across params, and a build function ``(params, inputs, ctx)``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from torchdata.nodes import BaseNode

from conveyor.graphs.opspec import Problem, SpecGraph, same_count
from conveyor.graphs.ops import BuildContext, OnError, elastic_through
from conveyor.graphs.registry import Fn, OpSpec, param, resolve_fn
from conveyor.nodes import DEFAULT_POOL, BucketBatch, PadCollate, ReadJsonl, check_dtype, encoding_problem


class LineFormat(str, enum.Enum):
    jsonl = "jsonl"
    lines = "lines"


class Overflow(str, enum.Enum):
    raise_ = "raise"
    skip = "skip"
    truncate = "truncate"
    own_bucket = "own_bucket"


class Side(str, enum.Enum):
    right = "right"
    left = "left"


# ----- read_jsonl -----------------------------------------------------------------------
@dataclass(frozen=True)
class ReadJsonlParams:
    format: LineFormat = param(LineFormat.jsonl, doc="jsonl: a JSON object per line; lines: plain text")
    field: str | None = param("text", doc="field every record needs, non-empty (null: no check)")
    on_error: OnError = param(OnError.raise_, doc="raise: SampleError naming file:line; skip: count it")
    encoding: str = param("utf-8", doc="the files' text encoding")
    storage_options: dict | None = param(None, doc="fsspec options (endpoint_url, ...); never logged")


def _build_read_jsonl(p: ReadJsonlParams, inputs: list[BaseNode], ctx: BuildContext) -> BaseNode:
    return ReadJsonl(inputs[0], format=p.format.value, field=p.field, on_error=p.on_error.value,
                     encoding=p.encoding, storage_options=p.storage_options, where=ctx.where)


def _check_read_jsonl(p: ReadJsonlParams, n_inputs: int) -> list[tuple[str, str]]:
    errors = []
    if p.field is not None and not p.field:
        errors.append(("field", "expected a field name or null, got an empty string"))
    problem = encoding_problem(p.encoding)
    if problem:
        errors.append(("encoding", problem))
    return errors


# ----- bucket_batch ---------------------------------------------------------------------
@dataclass(frozen=True)
class BucketBatchParams:
    boundaries: list[int] | str = param(doc="increasing upper bounds of the buckets, or auto")
    batch_sizes: list[int] | None = param(None, doc="items per batch, one per bucket")
    max_tokens: int | None = param(None, min=1, doc="budget: batch size x padded length")
    length: str | None = param(None, doc="field whose len() is the length (default input_ids)")
    length_fn: Fn | None = param(None, doc="module:attr, fn(item) -> int, instead of length")
    pad_to_multiple_of: int | None = param(None, min=1, doc="padded length the budget assumes")
    pool: int = param(DEFAULT_POOL, min=1, doc="batches' worth per bucket sorted together")
    shuffle: bool = param(True, doc="shuffle the batches of each pool")
    drop_remainder: bool = param(False, doc="drop each bucket's last, partial batch at epoch end")
    overflow: Overflow | None = param(None, doc="raise|skip|truncate|own_bucket; default: own_bucket "
                                                "with auto boundaries, else raise")
    empty: OnError = param(OnError.raise_, doc="items of length 0 (empty documents): raise, or skip (counted)")
    auto_buckets: int = param(8, min=1, doc="buckets that boundaries: auto makes")
    auto_sample: int = param(1000, min=1, doc="items boundaries: auto looks at")
    max_pending: int | None = param(None, min=1, doc="most input items a restore replays")
    seed: int | None = param(None, doc="default: the graph's seed param (else 0)")


def _build_bucket_batch(p: BucketBatchParams, inputs: list[BaseNode], ctx: BuildContext) -> BaseNode:
    length = resolve_fn(p.length_fn) if p.length_fn is not None else (p.length or "input_ids")
    return BucketBatch(inputs[0], length=length, boundaries=p.boundaries, batch_sizes=p.batch_sizes,
                       max_tokens=p.max_tokens, pad_to_multiple_of=p.pad_to_multiple_of, pool=p.pool,
                       shuffle=p.shuffle, drop_remainder=p.drop_remainder,
                       overflow=p.overflow.value if p.overflow else None, empty=p.empty.value,
                       auto_buckets=p.auto_buckets,
                       auto_sample=p.auto_sample, max_pending=p.max_pending, seed=ctx.seed_for(p.seed),
                       rank=ctx.rank, where=ctx.where)


def _check_bucket_batch(p: BucketBatchParams, n_inputs: int) -> list[tuple[str, str]]:
    errors: list[tuple[str, str]] = []
    auto = p.boundaries == "auto"
    if isinstance(p.boundaries, str) and not auto:
        errors.append(("boundaries", f"expected a list of increasing positive ints or 'auto', got {p.boundaries!r}"))
    elif not auto:
        b = p.boundaries
        if not b or any(x <= 0 for x in b) or any(x >= y for x, y in zip(b, b[1:])):
            errors.append(("boundaries", f"expected increasing positive ints, got {b}"))
    if (p.batch_sizes is None) == (p.max_tokens is None):
        errors.append(("max_tokens" if p.batch_sizes is None else "batch_sizes",
                       "give exactly one of batch_sizes (per bucket) and max_tokens (a budget)"))
    overflow = p.overflow or (Overflow.own_bucket if auto else Overflow.raise_)
    if p.batch_sizes is not None:
        if auto:
            errors.append(("batch_sizes", "boundaries: auto decides the number of buckets at run time; "
                                          "use max_tokens with it"))
        elif not isinstance(p.boundaries, str):
            want = len(p.boundaries) + (overflow == Overflow.own_bucket)
            if len(p.batch_sizes) != want:
                errors.append(("batch_sizes", f"expected {want} sizes (one per bucket"
                               + (", the last for the overflow bucket" if overflow == Overflow.own_bucket else "")
                               + f"), got {len(p.batch_sizes)}"))
        if any(s <= 0 for s in p.batch_sizes):
            errors.append(("batch_sizes", f"expected positive ints, got {p.batch_sizes}"))
    if p.length is not None and p.length_fn is not None:
        errors.append(("length_fn", "give length (a field) or length_fn, not both"))
    if overflow == Overflow.truncate and p.length_fn is not None:
        errors.append(("overflow", "truncate cuts the length field, so it needs length (a field), not "
                                   "length_fn; or truncate in the tokenizer (max_length)"))
    if p.max_tokens is not None and not auto and not isinstance(p.boundaries, str) and p.boundaries:
        top = p.boundaries[-1]
        m = p.pad_to_multiple_of or 1
        if -(-top // m) * m > p.max_tokens:
            errors.append(("max_tokens", f"the last boundary {top} (padded to a multiple of {m}) is over "
                                         f"the budget {p.max_tokens}: its items would be batches of one"))
    return errors


# ----- pad_collate ----------------------------------------------------------------------
@dataclass(frozen=True)
class PadCollateParams:
    fields: list[str | int] | None = param(None, doc="fields (or tuple positions) to pad; default: "
                                                     "every 1-D sequence field")
    pad_value: int | float | dict = param(0, doc="a number, or a mapping field -> number")
    side: Side = param(Side.right, doc="right | left: where the padding goes")
    pad_to_multiple_of: int | None = param(None, min=1,
                                           doc="pad lengths up to a multiple of N (tensor cores like 8)")
    dtype: str | None = param(None, doc="the padded fields' dtype (int64, int32, ..., float32); default: "
                                        "the samples' (narrow token ids widen here, in the padding copy)")


def _build_pad_collate(p: PadCollateParams, inputs: list[BaseNode], ctx: BuildContext) -> BaseNode:
    return PadCollate(inputs[0], fields=p.fields, pad_value=p.pad_value, side=p.side.value,
                      pad_to_multiple_of=p.pad_to_multiple_of, dtype=p.dtype, where=ctx.where)


def _check_pad_collate(p: PadCollateParams, n_inputs: int) -> list[tuple[str, str]]:
    errors = []
    if p.fields is not None and not p.fields:
        errors.append(("fields", "expected at least one field, or leave it out to pad every sequence"))
    if isinstance(p.pad_value, dict):
        bad = {k: v for k, v in p.pad_value.items()
               if isinstance(v, bool) or not isinstance(v, (int, float))}
        if bad:
            errors.append(("pad_value", f"expected numbers per field, got {bad}"))
        if p.fields is not None:
            extra = [k for k in p.pad_value if k not in p.fields]
            if extra:
                errors.append(("pad_value", f"pad values for fields that are not padded: {extra}"))
    if not errors:
        try:
            check_dtype(p.dtype, p.pad_value)
        except ValueError as exc:
            errors.append(("dtype", str(exc)))
    return errors


def _graph_check_pad_collate(graph: SpecGraph, name: str) -> list[Problem]:
    """A bucket_batch with a token budget feeding this pad_collate padding to a multiple (through
    nodes that pass batches on as they are) must assume a padded length at least this one's,
    else batches come out over ``max_tokens``: its multiple must be one of this one's."""
    m = graph.nodes[name].params.pad_to_multiple_of or 1
    if m <= 1:
        return []
    at = name
    while len(graph.inputs.get(at, [])) == 1:
        up = graph.nodes.get(graph.inputs[at][0])
        if up is None or up.params is None:
            return []
        if up.op.name == "bucket_batch":
            assumed = up.params.pad_to_multiple_of or 1
            if up.params.max_tokens is None or not assumed % m:
                return []
            return [Problem(up.name, f"'{name}' (pad_collate) pads to a multiple of {m}, but this budget assumes "
                                     f"{'no padding beyond the longest' if assumed == 1 else f'a multiple of {assumed}'}: "
                                     f"batches would come out over max_tokens {up.params.max_tokens}; set "
                                     f"pad_to_multiple_of: {m} here, as pad_collate has it",
                            ("pad_to_multiple_of",) if up.params.pad_to_multiple_of else ("max_tokens",),
                            "pad_to_multiple_of")]
        if not up.op.pass_through:
            return []
        at = up.name
    return []


READ_JSONL = OpSpec("read_jsonl", ReadJsonlParams, _build_read_jsonl, "one",
                    "records of JSONL / text-line files, resumable mid-file; elastic above a shard "
                    "(a global order), not below one (a file partly read)", _check_read_jsonl,
                    unknown_length="yields as many records as its files hold", per_record=True,
                    items_in='file records {path, ...} (list_files)',
                    items_out='one dict per line (format: lines: {text})',
                    example='records: {op: read_jsonl, field: text}')
BUCKET_BATCH = OpSpec("bucket_batch", BucketBatchParams, _build_bucket_batch, "one",
                      "batches of similar lengths from sorted per-bucket pools; not elastic (which "
                      "items its pools emitted is known only by rebuilding them)", _check_bucket_batch,
                      unknown_length="cuts batches by the items' lengths", batches=True,
                      items_in='samples with a length field (input_ids)',
                      items_out='lists of samples of similar lengths',
                      example='buckets: {op: bucket_batch, boundaries: [64, 128, 256, 512], max_tokens: 8192}')
PAD_COLLATE = OpSpec("pad_collate", PadCollateParams, _build_pad_collate, "one",
                     "pad sequences to the batch's longest; adds lengths and attention_mask; elastic",
                     _check_pad_collate, elastic=elastic_through, length=same_count, keeps_count="always",
                     collates=True, graph_check=_graph_check_pad_collate,
                     items_in='lists of samples with sequence fields',
                     items_out='a batch: padded tensors plus lengths and attention_mask',
                     example='pad: {op: pad_collate, fields: [input_ids], pad_value: 0}')

"""The packing op as the compiler sees it: pack_tokens (conveyor/nodes/pack_tokens.py).

Same shape as ``conveyor.graphs.ops``: a frozen params dataclass, enums for choices, a
``check`` for the rules across params, a build function ``(params, inputs, ctx)``, and every
fact the compiler asks declared on the ``OpSpec``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from torchdata.nodes import BaseNode

from conveyor.graphs.ops import BuildContext, OnError
from conveyor.graphs.registry import OpSpec, param
from conveyor.nodes import PackTokens
from conveyor.nodes.pack_tokens import check_args


class Algorithm(str, enum.Enum):
    first_fit = "first_fit"
    best_fit = "best_fit"


class PackOverflow(str, enum.Enum):
    split = "split"
    truncate = "truncate"
    skip = "skip"


class IdType(str, enum.Enum):
    int64 = "int64"
    int32 = "int32"
    int16 = "int16"
    uint8 = "uint8"


@dataclass(frozen=True)
class PackTokensParams:
    seq_len: int = param(min=1, max=1 << 24, doc="tokens per row")
    field: str = param("input_ids", doc="the token field of each record")
    algorithm: Algorithm = param(Algorithm.best_fit, doc="first_fit | best_fit (least padding)")
    pool: int = param(1000, min=1, doc="documents packed together (more: less padding, longer restore)")
    overflow: PackOverflow = param(PackOverflow.split, doc="a document over seq_len: split into pieces, "
                                                           "truncate, or skip (counted)")
    empty: OnError = param(OnError.raise_, doc="a document of no tokens: raise, or skip (counted)")
    max_docs: int | None = param(None, min=1, doc="documents per row at most (null: no limit); "
                                                  "cu_seqlens has min(max_docs + 1, seq_len) + 1 entries")
    pad_id: int = param(0, doc="the id after a row's last document")
    ignore_index: int = param(-100, doc="the label of padding (and of first tokens, with mask_first)")
    mask_first: bool = param(True, doc="ignore_index on each document's first label (no learning "
                                       "across a boundary)")
    dtype: IdType = param(IdType.int64, doc="input_ids' dtype; an id it cannot hold is an error")
    shuffle: bool = param(True, doc="emit each pool's rows in an order from (seed, epoch, pool)")
    seed: int | None = param(None, doc="default: the graph's seed param (else 0)")
    batch_size: int | None = param(None, min=1, doc="null: rows one by one (a batch and a collate after it); "
                                                    "else batches of this many rows, collated ([batch_size, "
                                                    "seq_len] tensors): the same batches, much faster")
    drop_last: bool = param(False, doc="with batch_size: drop the epoch's last batch when it is short")


def _check_pack(p: PackTokensParams, n_inputs: int) -> list[tuple[str, str]]:
    bad = check_args(seq_len=p.seq_len, algorithm=p.algorithm.value, pool=p.pool, overflow=p.overflow.value,
                     empty=p.empty.value, max_docs=p.max_docs, pad_id=p.pad_id, dtype=p.dtype.value,
                     mask_first=p.mask_first, batch_size=p.batch_size)
    if p.max_docs is not None and p.max_docs > p.seq_len:
        bad.append(("max_docs", f"max_docs={p.max_docs} is over seq_len={p.seq_len}: a row cannot hold "
                                "more documents than tokens"))
    return bad


def _build_pack(p: PackTokensParams, inputs: list[BaseNode], ctx: BuildContext) -> BaseNode:
    return PackTokens(inputs[0], seq_len=p.seq_len, field=p.field, algorithm=p.algorithm.value, pool=p.pool,
                      overflow=p.overflow.value, empty=p.empty.value, max_docs=p.max_docs, pad_id=p.pad_id,
                      ignore_index=p.ignore_index, mask_first=p.mask_first, dtype=p.dtype.value,
                      shuffle=p.shuffle, seed=ctx.seed_for(p.seed), batch_size=p.batch_size,
                      drop_last=p.drop_last, where=ctx.where)


def _per_row(p: PackTokensParams) -> bool:
    return p.batch_size is None


PACK_TOKENS = OpSpec(
    "pack_tokens", PackTokensParams, _build_pack, "one",
    "pack whole documents into rows of seq_len tokens (first_fit | best_fit over a pool), with "
    "position_ids, segment_ids, cu_seqlens and labels; not elastic below a shard (which documents "
    "its rows hold is known only by packing the pool again), a global order above one",
    _check_pack,
    unknown_length="makes as many rows as the documents' lengths fill",
    keeps_count="never", per_record=_per_row, batches=False, elastic=None, not_global="",
    safe_params=frozenset(),
    items_in="records with a token field (input_ids: a tokenizer's map before it)",
    items_out="rows {input_ids, labels, position_ids, segment_ids, cu_seqlens, num_docs, num_tokens} "
              "of seq_len tokens; with batch_size, batches of them collated",
    example="pack: {op: pack_tokens, seq_len: 2048, algorithm: best_fit, pool: 1000}")

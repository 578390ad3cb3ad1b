"""The ops reading datasets already converted to other loaders' formats: ``list_mds``,
``list_litdata`` and ``read_samples``.

MosaicML Streaming's MDS folders (MDSWriter's ``out``) and LitData's ``optimize()`` output are
read as they are, local or through fsspec (``s3://``), with no dependency on either library:
the listing comes from the dataset's own ``index.json`` (so ``len(loader)`` is known without
reading a shard), ``shard`` deals the samples to ranks and worker copies, and ``read_samples``
reads and decodes each sample. Resume is the listing's: exact, and elastic above a shard.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchdata.nodes import BaseNode

from conveyor.graphs.opspec import count_unless_skipping, listed_count
from conveyor.graphs.ops import BuildContext, OnError, elastic_through
from conveyor.graphs.registry import OpSpec, param
from conveyor.storage import RetryPolicy


@dataclass(frozen=True)
class ListSamplesParams:
    url: str = param(doc="the dataset's folder (holding index.json): local path, file://, s3://...")
    shuffle: bool = param(False, doc="permute the whole listing each epoch")
    seed: int | None = param(None, doc="default: the graph's seed param (else 0)")
    storage_options: dict | None = param(None, doc="fsspec options (endpoint_url, ...); never logged")


def _build_list(kind: str, p: ListSamplesParams, ctx: BuildContext) -> BaseNode:
    from conveyor.nodes import ListLitdata, ListMds

    cls = ListMds if kind == "mds" else ListLitdata
    return cls(url=p.url, shuffle=p.shuffle, seed=ctx.seed_for(p.seed), storage_options=p.storage_options,
               where=ctx.where)


def _build_list_mds(p: ListSamplesParams, inputs: list[BaseNode], ctx: BuildContext) -> BaseNode:
    return _build_list("mds", p, ctx)


def _build_list_litdata(p: ListSamplesParams, inputs: list[BaseNode], ctx: BuildContext) -> BaseNode:
    return _build_list("litdata", p, ctx)


@dataclass(frozen=True)
class ReadSamplesParams:
    on_error: OnError = param(OnError.raise_, doc="skip: count and drop the samples of a shard that does not "
                                                  "match its index or is cut short")
    allow_pickle: bool = param(False, doc="accept pkl (MDS) and pickle (LitData) fields: unpickling runs "
                                          "code from the file")
    keep: int = param(2, min=1, doc="decompressed pieces kept in memory: whole compressed shards, framed-zstd frames or Arrow tables")
    attempts: int = param(5, min=1, doc="tries per request; only transient errors are retried")
    timeout: float = param(30.0, doc="seconds a request may take (then it is retried)")
    storage_options: dict | None = param(None, doc="fsspec options (endpoint_url, ...); never logged")


def _check_read(p: ReadSamplesParams, n_inputs: int) -> list[tuple[str, str]]:
    if not p.timeout > 0:
        return [("timeout", f"expected a number of seconds > 0, got {p.timeout!r}")]
    return []


def _build_read_samples(p: ReadSamplesParams, inputs: list[BaseNode], ctx: BuildContext) -> BaseNode:
    from conveyor.nodes import ReadSamples

    return ReadSamples(inputs[0], on_error=p.on_error.value, storage_options=p.storage_options,
                       policy=RetryPolicy(attempts=p.attempts, timeout=p.timeout), keep=p.keep,
                       allow_pickle=p.allow_pickle, where=ctx.where)


def _reads_from_url(p: ListSamplesParams) -> list[str]:
    return [p.url]


LIST_MDS = OpSpec("list_mds", ListSamplesParams, _build_list_mds, "none",
                  "samples of a MosaicML Streaming (MDS) dataset, from its index.json, as {mds, shard, pos, "
                  "index}; a global order (elastic above a shard)", length=listed_count, listing=True, reads_from=_reads_from_url,
                  per_record=True, items_in='', items_out='{mds, shard, pos, index} per sample, in index order',
                  example='samples: {op: list_mds, url: "s3://bucket/mds/train", shuffle: true}')
LIST_LITDATA = OpSpec("list_litdata", ListSamplesParams, _build_list_litdata, "none",
                      "samples of a LitData optimize() dataset, from its index.json, as {litdata, shard, pos, "
                      "index}; a global order (elastic above a shard)", length=listed_count, listing=True, reads_from=_reads_from_url,
                      per_record=True, items_in='',
                      items_out='{litdata, shard, pos, index} per sample, in index order',
                      example='samples: {op: list_litdata, url: "${root}/optimized", shuffle: true}')
READ_SAMPLES = OpSpec("read_samples", ReadSamplesParams, _build_read_samples, "one",
                      "each MDS or LitData sample record's fields, read from its shard and decoded (images "
                      "as encoded bytes); elastic", _check_read, elastic=elastic_through,
                      length=count_unless_skipping, unknown_length="skips the samples of bad shards "
                                                                   "(on_error: skip)",
                      keeps_count="unless_skipping", per_record=True,
                      safe_params=frozenset({"attempts", "timeout"}),
                      items_in='sample records (list_mds, list_litdata)',
                      items_out="the dataset's fields (MDS columns, LitData dict keys), __url__ and index",
                      example='decoded: {op: read_samples}')

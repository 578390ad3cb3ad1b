"""The table-format ops as the compiler sees them: read_parquet, list_lmdb, read_lmdb.

Same shape as ``conveyor.graphs.ops``: a frozen params dataclass and a build function each.
pyarrow and lmdb are optional (``pip install 'conveyor[parquet]'`` / ``'conveyor[lmdb]'``);
a spec using one of these ops without its package is a spec error saying what to install.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from torchdata.nodes import BaseNode

from conveyor.graphs.opspec import count_unless_skipping, listed_count
from conveyor.graphs.ops import BuildContext, KeyLabel, OnError, elastic_through
from conveyor.graphs.registry import OpSpec, param


def _needs(module: str, extra: str) -> list[tuple[str, str]]:
    if importlib.util.find_spec(module) is None:
        return [("op", f"needs the {module} package: pip install 'conveyor[{extra}]'")]
    return []


# ----- read_parquet -----------------------------------------------------------------------
@dataclass(frozen=True)
class ReadParquetParams:
    columns: list[str] | None = param(None, doc="the columns to read (default: all)")
    batch_rows: int = param(1024, min=1, doc="rows turned into Python dicts at a time (memory only)")
    on_error: OnError = param(OnError.raise_, doc="raise: SampleError naming file and row group; skip: count")
    storage_options: dict | None = param(None, doc="fsspec options (endpoint_url, ...); never logged")
    schema: dict | None = param(None, doc="{column: type} every file must match (int64, float64, string...); "
                                          "default: the first file's. A file that differs: an error naming "
                                          "file and column, or skipped and counted (on_error: skip)")


def _build_read_parquet(p: ReadParquetParams, inputs: list[BaseNode], ctx: BuildContext) -> BaseNode:
    from conveyor.nodes import ReadParquet

    return ReadParquet(inputs[0], columns=p.columns, batch_rows=p.batch_rows, on_error=p.on_error.value,
                       storage_options=p.storage_options, where=ctx.where, schema=p.schema)


def _check_read_parquet(p: ReadParquetParams, n_inputs: int) -> list[tuple[str, str]]:
    out = _needs("pyarrow", "parquet")
    if p.columns is not None and (not p.columns or len(set(p.columns)) != len(p.columns)
                                  or not all(p.columns)):
        out.append(("columns", f"expected distinct, non-empty column names, got {p.columns!r}"))
    if p.schema is not None and not out:
        from conveyor.nodes import parquet_schema

        try:
            parquet_schema(p.schema)
        except ValueError as exc:
            out.append(("schema", str(exc)))
    return out


# ----- list_lmdb / read_lmdb --------------------------------------------------------------
@dataclass(frozen=True)
class ListLmdbParams:
    path: str = param(doc="the LMDB environment (its folder), on local disk")
    prefix: str | None = param(None, doc="only keys starting with this")
    start: str | None = param(None, doc="the first key (inclusive)")
    stop: str | None = param(None, doc="the key to stop before (exclusive)")
    label: KeyLabel | None = param(None, doc="parent_dir: class index from the key's parent 'folder'")
    shuffle: bool = param(False, doc="permute the whole listing each epoch")
    seed: int | None = param(None, doc="default: the graph's seed param (else 0)")


def _build_list_lmdb(p: ListLmdbParams, inputs: list[BaseNode], ctx: BuildContext) -> BaseNode:
    from conveyor.nodes import ListLmdb

    return ListLmdb(path=p.path, prefix=p.prefix, start=p.start, stop=p.stop,
                    label=p.label.value if p.label else None, shuffle=p.shuffle, seed=ctx.seed_for(p.seed))


def _check_list_lmdb(p: ListLmdbParams, n_inputs: int) -> list[tuple[str, str]]:
    out = _needs("lmdb", "lmdb")
    if "://" in p.path and not p.path.startswith("file://"):
        out.append(("path", f"LMDB is read from local disk only, got {p.path!r}"))
    if p.start is not None and p.stop is not None and p.start >= p.stop:
        out.append(("stop", f"expected a key after start {p.start!r}, got {p.stop!r}"))
    return out


@dataclass(frozen=True)
class ReadLmdbParams:
    out: str = param("bytes", doc="the field the value's bytes go to")
    on_error: OnError = param(OnError.raise_, doc="raise: SampleError naming the key; skip: count it")


def _check_read_lmdb(p: ReadLmdbParams, n_inputs: int) -> list[tuple[str, str]]:
    return _needs("lmdb", "lmdb")


def _build_read_lmdb(p: ReadLmdbParams, inputs: list[BaseNode], ctx: BuildContext) -> BaseNode:
    from conveyor.nodes import ReadLmdb

    return ReadLmdb(inputs[0], out=p.out, on_error=p.on_error.value)


READ_PARQUET = OpSpec("read_parquet", ReadParquetParams, _build_read_parquet, "one",
                      "rows of Parquet files (pyarrow), by row group, resumable mid-file; elastic above a "
                      "shard (a global order), not below one (a file partly read)", _check_read_parquet,
                      unknown_length="yields as many rows as its files hold", per_record=True,
                      items_in='file records {path, ...} (list_files)',
                      items_out='one dict per row, by column',
                      example='rows: {op: read_parquet, columns: [text, label]}')
def _reads_from_path(p: ListLmdbParams) -> list[str]:
    return [p.path]


LIST_LMDB = OpSpec("list_lmdb", ListLmdbParams, _build_list_lmdb, "none",
                   "keys of a local LMDB environment in key order, as {lmdb, key, label, index}; a "
                   "global order (elastic above a shard)", _check_list_lmdb,
                   length=listed_count, listing=True, per_record=True, reads_from=_reads_from_path,
                   items_in='', items_out='{lmdb, key, label, index} per key, in key order',
                   example='keys: {op: list_lmdb, path: "${root}/train.lmdb", shuffle: true}')
READ_LMDB = OpSpec("read_lmdb", ReadLmdbParams, _build_read_lmdb, "one",
                   "each key record's value from its LMDB environment, lock-free readers; elastic",
                   _check_read_lmdb, elastic=elastic_through, length=count_unless_skipping,
                   unknown_length="skips the keys that fail (on_error: skip)", per_record=True,
                   items_in='key records (list_lmdb)',
                   items_out="the same records with the value's bytes under out",
                   example='values: {op: read_lmdb}')

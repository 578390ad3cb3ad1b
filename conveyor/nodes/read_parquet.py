"""read_parquet: stream the rows of Parquet files, row group by row group, file after file.

The input is a stream of file records from ``list_files`` (``{"path", "index", ...}``). Each
file is opened with pyarrow (local paths directly, any other fsspec URL through fsspec:
``s3://``, ``gs://``...) and read one row group at a time, in slices of ``batch_rows`` rows,
so memory holds one slice of Python rows and one row group's decoded columns, never the
file. Every row is a dict of its columns (``columns`` reads only those) plus its provenance:
``file`` (the path), ``row`` (0-based, in the file) and ``index``, a stable sample id made of
the file's ``index`` and the row (``file_index * 2**32 + row``). A column of the same name is
replaced, as ``read_jsonl`` does with a line's own keys. This is how Hugging Face datasets
are stored.

A file that is not Parquet, or lacks a column asked for, raises ``SampleError`` naming the
file with ``on_error="raise"``; with ``on_error="skip"`` the whole file is skipped and
counted (``skipped_files``). So does a file whose schema differs from the one expected: the
``schema`` given (``{column: type}``, pyarrow's type names: ``int64``, ``float64``,
``string``...), else the first file's of the epoch: a column of another type (ids that became
floats or strings), a column missing, or, when ``columns`` does not choose what is read, a
column more (rows that would gain a field); a column of nulls only (pyarrow's ``null``
type, an empty file's) goes with any type. The error names the file, the column and the
file the schema came from. The expected schema is part of the state, so a restored run checks
against the same one. A row group that fails to decode is named by file and row group,
or skipped with its rows counted (``skipped``).

Remote files are read through ``conveyor.storage``: the footer and each column chunk one
ranged request, retried on transient failures (a 503, a reset, a server gone for a moment).
A read that outlives its attempts, or a file deleted since the listing, is a ``SampleError``
naming the file (skipped and counted like a bad file with ``on_error="skip"``); a missing
bucket or denied access is a ``SourceError``, always raised, never a skipped file.

The state is the input's state before the current file, whether a file is open, the row
group and the row in it: a restore re-reads that one file record, opens the file and decodes
only the row group it stopped in (never the rows of the groups before it).
"""

from __future__ import annotations

import json
import logging
from typing import Any, Iterator

from torchdata.nodes import BaseNode

from conveyor.errors import SampleError, SourceError, StateError
from conveyor.nodes._skips import LEDGER_KEY, SkipLedger, log_skip
from conveyor.storage import RetryPolicy, Storage
from conveyor.nodes.state_shape import Bool, Child, Fields, Int, LEDGER_SHAPE, Str

log = logging.getLogger(__name__)

ON_ERROR = ("raise", "skip")
ROW_BITS = 32


def _pyarrow() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:  # pragma: no cover - pyarrow is in the parquet and test extras
        raise SampleError("read_parquet needs pyarrow: pip install 'conveyor[parquet]'") from exc
    return pq


def parquet_schema(schema: Any) -> dict[str, str]:
    """``{column: type}`` with each type as pyarrow names it (``float64`` is ``double``,
    ``str`` is ``string``); a type that is no alias (``list<item: int64>``) is kept as written.

    Raises:
        ValueError: not a mapping of column names to type names.
    """
    if not isinstance(schema, dict) or not schema:
        raise ValueError(f"schema={schema!r} must be a non-empty mapping of column names to type names")
    import pyarrow as pa

    out = {}
    for name, kind in schema.items():
        if not isinstance(name, str) or not name or not isinstance(kind, str) or not kind:
            raise ValueError(f"schema: expected column: type-name pairs, got {name!r}: {kind!r}")
        try:
            out[name] = str(pa.type_for_alias(kind))
        except ValueError:
            if "<" not in kind and "[" not in kind:
                raise ValueError(f"schema: column {name!r}: {kind!r} is not a pyarrow type name (int64, "
                                 "float64, string, bool, binary, timestamp[ms], list<item: int64>...)") from None
            out[name] = kind
    return out


class ReadParquet(BaseNode[dict]):
    """Yield the rows of each Parquet file named by the input's ``path`` fields, in order.

    Args:
        source: a stream of file records (``{"path", "index", ...}``), e.g. ``ListFiles``.
        columns: the columns to read (``None``: all).
        schema: ``{column: type}`` every file must match (pyarrow type names or aliases:
            ``int64``, ``float64``, ``string``); ``None``: the first file's, each epoch.
        batch_rows: rows decoded into Python at a time (memory, not semantics).
        on_error: ``"raise"`` (``SampleError`` naming the file and row group) or ``"skip"``.
        storage_options: passed to fsspec for non-local URLs; never logged.
        where: text for error notes (the node and spec line).
        policy: the retry policy of remote reads.

    Example:
        >>> import pyarrow as pa, pyarrow.parquet as pq, tempfile, os
        >>> from torchdata.nodes import IterableWrapper
        >>> path = os.path.join(tempfile.mkdtemp(), "a.parquet")
        >>> pq.write_table(pa.table({"text": ["hi", "yo"]}), path)
        >>> [r["text"] for r in ReadParquet(IterableWrapper([{"path": path, "index": 0}]))]
        ['hi', 'yo']
    """

    SOURCE_KEY = "source"
    OPEN_KEY = "open"
    GROUP_KEY = "row_group"
    ROW_KEY = "row"
    SKIPPED_KEY = "skipped"
    SKIPPED_FILES_KEY = "skipped_files"
    FILES_KEY = "files"
    SCHEMA_KEY = "schema"
    SCHEMA_FROM_KEY = "schema_from"
    STATE_SHAPE = Fields({SOURCE_KEY: Child(), OPEN_KEY: Bool(), GROUP_KEY: Int(), ROW_KEY: Int(), SKIPPED_KEY: Int(),
                          SKIPPED_FILES_KEY: Int(), FILES_KEY: Int(), LEDGER_KEY: LEDGER_SHAPE,
                          SCHEMA_KEY: Str(), SCHEMA_FROM_KEY: Str()},
                         optional=(LEDGER_KEY, SCHEMA_KEY, SCHEMA_FROM_KEY))

    def __init__(self, source: BaseNode, *, columns: list[str] | None = None, batch_rows: int = 1024,
                 on_error: str = "raise", storage_options: dict[str, Any] | None = None,
                 where: str | None = None, policy: RetryPolicy | None = None,
                 schema: dict[str, str] | None = None):
        super().__init__()
        if on_error not in ON_ERROR:
            raise ValueError(f"{on_error=} must be one of {ON_ERROR}")
        if batch_rows < 1:
            raise ValueError(f"{batch_rows=} must be >= 1")
        if columns is not None and (not columns or not all(isinstance(c, str) and c for c in columns)):
            raise ValueError(f"{columns=} must be a non-empty list of column names or None")
        self.source = source
        self.columns = list(columns) if columns is not None else None
        self.given_schema = parquet_schema(schema) if schema is not None else None
        self._schema: dict[str, str] | None = self.given_schema
        self._schema_from: str | None = None  # the file the expected schema came from (None: given)
        self.batch_rows = batch_rows
        self.on_error = on_error
        self.storage_options = storage_options
        self.storage = Storage(storage_options=storage_options, policy=policy)
        self.where = where or "read_parquet"
        self.skipped = self.skipped_files = self.files = 0
        self.ledger = SkipLedger()
        self._file_state: dict | None = None
        self._file: dict | None = None
        self._pf: Any = None
        self._fh: Any = None
        self._starts: list[int] = []   # the file's first row of each row group
        self._group = 0
        self._row = 0                  # rows of the current group already emitted
        self._rows: list[dict] = []
        self._i = 0
        self._batches: Iterator[Any] | None = None

    # ----- stats and closing --------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        return {"files": self.files, "skipped": self.skipped, "skipped_files": self.skipped_files}

    def close(self) -> None:
        self._close_file()
        self.storage.close()

    def _close_file(self) -> None:
        self._batches = None
        self._pf = None
        if self._fh is not None:
            try:
                self._fh.close()
            finally:
                self._fh = None

    # ----- opening ------------------------------------------------------------------------
    def _open(self, record: Any) -> bool:
        """Open ``record``'s file; False when it was skipped (on_error: skip)."""
        path = record.get("path") if isinstance(record, dict) else None
        if not isinstance(path, str):
            raise self._error(f"read_parquet expects file records with a 'path' (from list_files), got {record!r}")
        pq = _pyarrow()
        self._file = record
        try:
            if "://" in path and not path.startswith("file://"):
                self._fh = self.storage.open_random(path)
                self._pf = pq.ParquetFile(self._fh)
            else:
                self._pf = pq.ParquetFile(path.removeprefix("file://"))
        except SourceError as exc:  # a missing bucket, denied access: not one bad file
            self._close_file()
            exc.add_note(f"in {self.where}")
            raise
        except SampleError as exc:  # from conveyor.storage: gone since the listing, retries spent
            self._close_file()
            return self._bad_file(f"cannot read it ({exc})")
        except (OSError, ValueError) as exc:  # ArrowInvalid is a ValueError; a missing file an OSError
            self._close_file()
            return self._bad_file(f"cannot read it as Parquet ({type(exc).__name__}: {exc})")
        names = self._pf.schema_arrow.names
        missing = [c for c in self.columns or () if c not in names]
        if missing:
            self._close_file()
            return self._bad_file(f"no column {', '.join(map(repr, missing))} (it has: {', '.join(names)})")
        why = self._schema_differs(record["path"])
        if why:
            self._close_file()
            return self._bad_file(why)
        meta = self._pf.metadata
        self._starts, n = [], 0
        for g in range(meta.num_row_groups):
            self._starts.append(n)
            n += meta.row_group(g).num_rows
        return True

    def _schema_differs(self, path: str) -> str | None:
        """Why this file's schema is not the one expected, naming the column; None when it is
        (the first file of an epoch, with no schema given, is: its schema is the one expected)."""
        arrow = self._pf.schema_arrow
        names = arrow.names
        read = self.columns if self.columns is not None else names
        if self._schema is None:
            self._schema = {n: str(arrow.field(n).type) for n in read}
            self._schema_from = path
            return None
        whose = "the spec's schema" if self._schema_from is None else f"the first file ({self._schema_from})"
        for name, expected in self._schema.items():
            if name not in names:
                return f"no column {name!r}, which {whose} has as {expected} (it has: {', '.join(names)})"
            got = str(arrow.field(name).type)
            if got == "null" or got == expected:  # a column of nulls only (an empty file's): any type's
                continue
            if expected == "null" and self._schema_from is not None:  # the first file's held nulls only
                self._schema[name] = got
                continue
            return f"column {name!r} is {got}, where {whose} has {expected}"
        if self.columns is None:
            extra = [n for n in names if n not in self._schema]
            if extra:
                return (f"column {extra[0]!r} is not in {whose} (its columns: {', '.join(self._schema)}); "
                        "name the columns to read with columns: [...] to leave others out")
        return None

    def _error(self, message: str) -> SampleError:
        """A ``SampleError`` with a note naming the node (the spec's node and line in a graph)."""
        exc = SampleError(message)
        exc.add_note(f"in {self.where}")
        return exc

    def _bad_file(self, why: str) -> bool:
        where = self._file["path"]  # type: ignore[index]
        if self.on_error == "raise":
            raise self._error(f"read_parquet: {where}: {why} (set on_error: skip to count and skip bad files)")
        self.skipped_files += 1
        self.ledger.add(where, "SampleError", why)
        log_skip(log, self.skipped + self.skipped_files, f"read_parquet: skipped {where}: {why}")
        return False

    def _load_group(self, skip: int) -> bool:
        """Start row group ``self._group`` with its first ``skip`` rows left out; False when it
        was skipped as undecodable (on_error: skip)."""
        self._rows, self._i = [], 0
        self._batches = self._pf.iter_batches(batch_size=self.batch_rows, row_groups=[self._group],
                                              columns=self.columns, use_threads=False)
        try:
            while skip > 0:
                batch = next(self._batches, None)
                if batch is None:
                    break
                if batch.num_rows <= skip:
                    skip -= batch.num_rows
                    continue
                self._rows, self._i = batch.slice(skip).to_pylist(), 0
                skip = 0
        except (OSError, ValueError, SampleError) as exc:
            return self._bad_group(exc)
        return True

    def _bad_group(self, exc: Exception) -> bool:
        if isinstance(exc, SourceError):  # a missing bucket, denied access: not one bad group
            exc.add_note(f"in {self.where}")
            raise exc
        where = f"{self._file['path']} row group {self._group}"  # type: ignore[index]
        why = (f"cannot read it ({exc})" if isinstance(exc, SampleError)
               else f"cannot decode ({type(exc).__name__}: {exc})")
        if self.on_error == "raise":
            raise self._error(f"read_parquet: {where}: {why}") from exc
        rows = self._pf.metadata.row_group(self._group).num_rows - self._row
        self.skipped += rows
        self.ledger.add(f"{where} ({rows} rows)", exc, why)
        log_skip(log, self.skipped + self.skipped_files, f"read_parquet: skipped {rows} rows of {where}: {why}")
        self._batches, self._rows, self._i = None, [], 0
        return False

    # ----- iteration ----------------------------------------------------------------------
    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self._close_file()
        self._file, self._rows, self._i = None, [], 0
        if initial_state is None:
            self.source.reset()
            self._file_state = self.source.state_dict()
            self._group = self._row = 0
            self.skipped = self.skipped_files = self.files = 0
            self._schema, self._schema_from = self.given_schema, None
            return
        self._file_state = initial_state[self.SOURCE_KEY]
        self.source.reset(self._file_state)
        self.skipped = initial_state[self.SKIPPED_KEY]
        self.skipped_files = initial_state[self.SKIPPED_FILES_KEY]
        self.files = initial_state[self.FILES_KEY]
        self.ledger.load(initial_state.get(LEDGER_KEY))
        if self.given_schema is not None:
            self._schema, self._schema_from = self.given_schema, None
        else:  # a state of an earlier release has none: the next file's is the one expected
            text = initial_state.get(self.SCHEMA_KEY) or ""
            try:
                self._schema = json.loads(text) if text else None
            except ValueError as exc:
                raise StateError(f"{self.where}: the state's '{self.SCHEMA_KEY}' is not the JSON of a "
                                 f"schema: {text[:80]!r}") from exc
            if self._schema is not None and not isinstance(self._schema, dict):
                raise StateError(f"{self.where}: the state's '{self.SCHEMA_KEY}' is not a schema: {text[:80]!r}")
            self._schema_from = initial_state.get(self.SCHEMA_FROM_KEY) or None
        self._group, self._row = initial_state[self.GROUP_KEY], initial_state[self.ROW_KEY]
        if initial_state[self.OPEN_KEY]:
            if not self._open(next(self.source)):
                raise self._error(f"read_parquet: {self._file['path']} can no longer be read where the "  # type: ignore[index]
                                  "state was taken")
            if self._group < len(self._starts):
                self._load_group(self._row)

    def _next_file(self) -> None:
        self._close_file()
        self._file = None
        self._file_state = self.source.state_dict()  # after this file's record

    def next(self) -> dict:
        while True:
            if self._i < len(self._rows):
                row = self._rows[self._i]
                self._i += 1
                return self._emit(row)
            if self._pf is None:
                record = next(self.source)  # StopIteration ends the stream
                self.files += 1
                self._group = self._row = 0
                if not self._open(record):
                    self._next_file()
                    continue
                if self._starts:
                    self._load_group(0)
                continue
            if self._batches is not None:
                try:
                    batch = next(self._batches, None)
                except (OSError, ValueError, SampleError) as exc:
                    self._bad_group(exc)
                    batch = None
                if batch is not None:
                    self._rows, self._i = batch.to_pylist(), 0
                    continue
            self._group += 1
            self._row = 0
            if self._group >= len(self._starts):
                self._next_file()
                continue
            self._load_group(0)

    def _emit(self, row: dict) -> dict:
        file = self._file  # type: ignore[assignment]
        at = self._starts[self._group] + self._row
        self._row += 1
        row["file"] = file["path"]
        row["row"] = at
        row["index"] = (int(file.get("index", 0)) << ROW_BITS) + at
        return row

    def get_state(self) -> dict:
        return {self.SOURCE_KEY: self._file_state, self.OPEN_KEY: self._pf is not None,
                self.GROUP_KEY: self._group, self.ROW_KEY: self._row, self.SKIPPED_KEY: self.skipped,
                self.SKIPPED_FILES_KEY: self.skipped_files, self.FILES_KEY: self.files,
                LEDGER_KEY: self.ledger.state(),
                # the expected schema as JSON text ("" before the first file), its file ("" if given)
                self.SCHEMA_KEY: json.dumps(self._schema) if self._schema is not None else "",
                self.SCHEMA_FROM_KEY: self._schema_from or ""}

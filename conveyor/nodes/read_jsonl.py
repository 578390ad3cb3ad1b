"""read_jsonl: stream the records of line files (JSON Lines or plain text), file after file.

The input is a stream of file records from ``list_files`` (``{"path", "label", "index"}``).
Each file is opened with fsspec (any URL: local, ``file://``, ``s3://``...) and read line by
line: a JSON object per line (``format="jsonl"``) or one ``{"text": line}`` per line
(``format="lines"``). Every record gets its provenance: ``file`` (the path), ``line``
(1-based) and ``index``, a stable sample id made of the file's ``index`` and the line
(``file_index * 2**32 + line - 1``); a file record's ``label`` other than -1 is added when
the line has no ``label`` of its own. A line's own ``file``, ``line`` or ``index`` keys are
replaced.

Bad lines (not UTF-8, not JSON, not an object, no ``field``, an empty or non-string
``field``) raise ``SampleError`` naming ``file:line`` with ``on_error="raise"``, or are
skipped and counted in ``stats()["skipped"]`` with ``on_error="skip"`` (the first few are
logged). Blank (whitespace-only) lines hold no record and are passed over, as pandas, pyarrow
and the ndjson spec do (a line keeps its number: ``index`` has a gap there); a UTF-8 byte order
mark starting a file (Windows tools write one) is not part of its first line.

Files ending in ``.gz``, ``.bz2``, ``.xz``, ``.zip`` (and ``.zst`` or ``.lz4`` where the
``zstandard`` or ``lz4`` package is installed) are decompressed on the fly (fsspec's
``compression="infer"``); offsets then count decompressed bytes. A ``.zip`` must hold one file
(folder entries aside): an archive of several is an error. So is a file whose name asks for a
codec that is not installed, whose first bytes are a compressed stream its name does not
announce, that is a tar archive (``.tar.gz``), or that is UTF-16 text (its byte order mark says
so): read as text, each was a screen of bad lines, or records mixed with bad lines. A file that
cannot be read to its end (a truncated or corrupt ``.gz``, a failed read) is an error naming it
and the last line read, or with ``on_error="skip"`` the rest of the file is skipped and counted.

Remote files (``s3://``, any fsspec URL) are read through ``conveyor.storage``, front to back
in blocks, a few ahead (a ``.zip`` by random access: its directory is at its end), each request
with the retry policy: a transient failure (a 503, a reset, a server gone for a moment) is
retried with backoff; one that outlives its attempts, or a missing object, is a ``SampleError``
naming the file (and the line reached), a missing bucket or denied access a ``SourceError``,
each with the node's note, never a bare botocore or aiohttp traceback.

What a file and a line must be (the compression and encoding checks, a ``.zip``'s one file,
a line's record or why it is bad) is in ``_line_files.py``; this module reads the files.

The state is the input's state before the current file, whether a file is open, and the
byte offset and line number in it. A restore re-reads that one file record from the input,
opens the file and seeks to the offset: it never replays the file's earlier lines.

Speed (records cost microseconds, so per-line Python is the cost): files are read in blocks
of ``BLOCK`` bytes and split into lines at once, and JSON is parsed by ``orjson`` when it is
installed (~6x faster than the standard library here), straight from the line's bytes: a list
of records asked for at once (``next_many``) is parsed in one C-level loop over its lines
(``map``), then checked and given its provenance in one Python loop, and a plain local file is
opened with ``open`` (fsspec's open cost ~50x as much, per file). A line orjson refuses goes
through the standard library the old way (with the lines around it, one by one), so what is
accepted and what each error says do not depend on orjson — with one difference: orjson reads
an integer wider than 64 bits as a float. A line nested too deep for the standard library
(``RecursionError``; orjson would take it, so records holding a list or a dict whose line has
``NESTED`` brackets or more go to the standard library; a record of scalars is one level deep
whatever brackets its strings hold) and a text field holding a lone surrogate (``"\\ud800"``,
which no tokenizer can encode) are bad lines like any other.
"""

from __future__ import annotations

import codecs
import io
import logging
from itertools import chain, repeat
from operator import setitem
from typing import Any

import fsspec
from fsspec.utils import infer_compression
from torchdata.nodes import BaseNode

from conveyor.errors import ConveyorError, SampleError
from conveyor._line_files import (BLOCK, READ_ERRORS, compression_problem, encoding_problem, first_block_problem,
                                  open_zip, parse_line)
from conveyor.nodes._skips import LEDGER_KEY, SkipLedger, log_skip
from conveyor.storage import RetryPolicy, Storage, is_local, redact
from conveyor.nodes.state_shape import Bool, Child, Fields, Int, LEDGER_SHAPE

try:  # a faster parser where installed; the standard library decides about what it refuses
    from orjson import loads as _fast_loads
except ImportError:  # pragma: no cover - orjson is a dependency, but stay usable without it
    _fast_loads = None

log = logging.getLogger(__name__)

NESTED = 256     # lines with this many brackets are parsed by the standard library (see _fast_record)
FORMATS = ("jsonl", "lines")
ON_ERROR = ("raise", "skip")
LINE_BITS = 32
_NONES = [None] * 1024
_FLAT = frozenset((str, int, float, bool, type(None)))  # a record of these values is one level deep


class ReadJsonl(BaseNode[dict]):
    """Yield the records of each file named by the input's ``path`` fields, in order.

    Args:
        source: a stream of file records (``{"path", "index", ...}``), e.g. ``ListFiles``.
        format: ``"jsonl"`` (a JSON object per line) or ``"lines"`` (plain text lines).
        field: the text field every record must have, non-empty (``None``: no check; with
            ``format="lines"`` it names the field the line goes into, default ``"text"``).
        on_error: ``"raise"`` (``SampleError`` naming file and line) or ``"skip"`` (counted).
        encoding: the files' text encoding.
        storage_options: passed to fsspec (endpoint, credentials); never logged.
        where: text for error notes (the node and spec line).
        policy: the retry policy of remote reads.

    Example:
        >>> from torchdata.nodes import IterableWrapper
        >>> import tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "a.jsonl")
        >>> _ = open(path, "w").write('{"text": "hi"}\\n{"text": "yo"}\\n')
        >>> [r["text"] for r in ReadJsonl(IterableWrapper([{"path": path, "index": 0}]))]
        ['hi', 'yo']
    """

    SOURCE_KEY = "source"
    OPEN_KEY = "open"
    OFFSET_KEY = "offset"
    LINE_KEY = "line"
    SKIPPED_KEY = "skipped"
    FILES_KEY = "files"
    STATE_SHAPE = Fields({SOURCE_KEY: Child(), OPEN_KEY: Bool(), OFFSET_KEY: Int(), LINE_KEY: Int(), SKIPPED_KEY: Int(),
                          FILES_KEY: Int(), LEDGER_KEY: LEDGER_SHAPE}, optional=(LEDGER_KEY,))

    def __init__(self, source: BaseNode, *, format: str = "jsonl", field: str | None = "text",
                 on_error: str = "raise", encoding: str = "utf-8",
                 storage_options: dict[str, Any] | None = None, where: str | None = None,
                 policy: RetryPolicy | None = None):
        super().__init__()
        if format not in FORMATS:
            raise ValueError(f"{format=} must be one of {FORMATS}")
        if on_error not in ON_ERROR:
            raise ValueError(f"{on_error=} must be one of {ON_ERROR}")
        if field is not None and (not isinstance(field, str) or not field):
            raise ValueError(f"{field=} must be a non-empty string or None")
        problem = encoding_problem(encoding)
        if problem:
            raise ValueError(f"{encoding=}: {problem}")
        self.source = source
        self.format = format
        self.field = field
        self.on_error = on_error
        self.encoding = encoding
        self.storage_options = storage_options
        self.where = where or "read_jsonl"
        self.storage = Storage(storage_options=storage_options, policy=policy)
        self.skipped = 0
        self.ledger = SkipLedger()
        self.files = 0
        self._file_state: dict | None = None  # input state before the open file's record
        self._file: dict | None = None         # the open file's record
        self._fh: Any = None
        self._raw: Any = None  # a remote file's reader, under a decompressor
        self._offset = 0
        self._line = 0
        self._lines: list[bytes] = []  # lines of the current block, each with its b"\n"
        self._li = 0                   # the next of them
        self._tail: list[bytes] = []   # the pieces of a line the blocks cut, completed by a later block
        self._path = ""                # the open file's path
        self._base = 0                 # the open file's index << LINE_BITS
        self._label = -1               # the open file's label
        self._sniff = False            # the next block is a file's first: check its first bytes
        self._fast = format == "jsonl" and _fast_loads is not None  # parse with orjson first
        self._utf8 = codecs.lookup(encoding).name == "utf-8"  # orjson takes the bytes

    # ----- stats and closing --------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        return {"files": self.files, "skipped": self.skipped}

    def close(self) -> None:
        self._close_file()
        self.storage.close()

    def _close_file(self) -> None:
        self._lines, self._li, self._tail = [], 0, []
        fh, raw, self._fh, self._raw = self._fh, self._raw, None, None
        try:
            if fh is not None:
                fh.close()
        finally:
            if raw is not None:
                raw.close()

    # ----- iteration ----------------------------------------------------------------------
    def _open(self, record: dict, offset: int, *, count: bool = True) -> None:
        path = record.get("path") if isinstance(record, dict) else None
        if not isinstance(path, str):
            raise self._error(f"read_jsonl expects file records with a 'path' (from list_files), got {record!r}")
        problem = compression_problem(path)
        if problem:
            raise self._error(f"read_jsonl: cannot read {path}: {problem}")
        try:
            if not is_local(path):
                self._fh = self._open_remote(path, offset)
            elif infer_compression(path) == "zip":
                self._fh = open_zip(path, fsspec.open(path, "rb", **(self.storage_options or {})).open(), self._error)
            elif ("://" not in path and not path.startswith("~") and not self.storage_options
                  and infer_compression(path) is None):
                self._fh = open(path, "rb")  # a plain local file: fsspec's open cost ~50x this, per file
            else:
                self._fh = fsspec.open(path, "rb", compression="infer", **(self.storage_options or {})).open()
            if offset:
                self._fh.seek(offset)
        except ConveyorError as exc:  # from conveyor.storage: it names the URL
            self._close_file()
            exc.add_note(f"in {self.where}")
            raise
        except READ_ERRORS as exc:
            self._close_file()
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"{type(exc).__name__}: {exc}"
            raise self._error(f"read_jsonl: cannot open {self._redact(path)}: {self._redact(why)}") from exc
        self._sniff = not offset  # (_block: a compressed stream its name hides? a tar archive?)
        self._file = record
        self._offset = offset
        self._path = path
        self._base = int(record.get("index", 0)) << LINE_BITS
        self._label = record.get("label", -1)
        self.files += count

    def _open_remote(self, path: str, offset: int) -> Any:
        """A remote file through ``conveyor.storage`` (retried block reads), decompressed when
        its name says so (then the offset counts decompressed bytes: it is sought after)."""
        from fsspec.compression import compr

        codec = infer_compression(path)
        if codec == "zip":  # read from its end first (the central directory): random access
            return open_zip(path, self.storage.open_random(path), self._error)
        self._raw = self.storage.open_sequential(path, offset=0 if codec else offset)
        return compr[codec](self._raw, mode="rb") if codec else self._raw

    def _redact(self, text: str) -> str:
        return redact(text, self.storage_options)

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self._close_file()
        self._file = None
        if initial_state is None:
            self.source.reset()
            self._file_state = self.source.state_dict()
            self._offset = self._line = 0
            self.skipped = self.files = 0
            return
        self._file_state = initial_state[self.SOURCE_KEY]
        self.source.reset(self._file_state)
        self.skipped = initial_state[self.SKIPPED_KEY]
        self.ledger.load(initial_state.get(LEDGER_KEY))
        self.files = initial_state[self.FILES_KEY]
        self._line = initial_state[self.LINE_KEY]
        self._offset = 0
        if initial_state[self.OPEN_KEY]:
            self._open(next(self.source), initial_state[self.OFFSET_KEY], count=False)

    def _block(self) -> bool:
        """Read the next block's lines (each with its b"\\n"); False at the end of the file (or
        where it cannot be read further, on_error: skip)."""
        try:
            data = self._fh.read(BLOCK)
        except ConveyorError as exc:  # from conveyor.storage: it names the URL
            exc.add_note(f"in {self.where}, reading {self._redact(self._path)} from line {self._line + 1}")
            raise
        except READ_ERRORS as exc:
            self._unreadable(exc)
            self._tail = []  # the start of a line the file ends in the middle of: skipped with the rest
            return False
        if self._sniff:  # the first block of a file (no seek: an HTTP stream cannot)
            self._sniff = False
            problem = first_block_problem(self._path, data, self._utf8)
            if problem:
                self._close_file()
                raise self._error(f"read_jsonl: cannot read {self._path}: {problem}")
        if not data:
            if not self._tail:
                return False
            self._lines, self._li, self._tail = [b"".join(self._tail)], 0, []  # a last line without b"\\n"
            return True
        if b"\n" not in data:  # a line longer than a block: its pieces are joined once, when it ends
            self._tail.append(data)  # (adding each block to the line so far was quadratic: 49 s for 200 MB)
            self._lines, self._li = [], 0
            return True
        if self._tail:
            self._tail.append(data)
            data = b"".join(self._tail)
        # readlines finds each b"\n" with memchr, ~3x faster than split's byte loop (~0.1 us a
        # line); each line keeps its b"\n", which orjson and parse_line take as whitespace
        lines = io.BytesIO(data).readlines()
        last = lines[-1]
        self._tail = [lines.pop()] if last[-1:] != b"\n" else []  # the start of a line the block cut
        self._lines, self._li = lines, 0
        return True

    def next(self) -> dict:
        return self.next_many(1)[0]

    def next_many(self, n: int) -> list[dict]:
        """Up to ``n`` records, from one block of lines at most (nodes/capabilities.py)."""
        while True:
            out = self._from_block(n)
            if out:
                return out  # else every line left in the block was skipped

    def _from_block(self, n: int) -> list[dict]:
        while self._li >= len(self._lines):
            if self._fh is None:
                self._open(next(self.source), 0)  # StopIteration ends the stream
                self._line = 0
            elif not self._block():
                self._close_file()
                self._file = None
                self._file_state = self.source.state_dict()  # after this file's record
        lines, li = self._lines, self._li
        end = min(len(lines), li + n)
        if self._fast and self._utf8 and end - li > 1:
            got = self._fast_chunk(lines, li, end)
            if got is not None:
                return got
        out: list[dict] = []
        offset, line = self._offset, self._line
        path, base, label = self._path, self._base - 1, self._label
        fast, fast_record = self._fast, self._fast_record
        try:
            while li < end:
                raw = lines[li]
                lines[li] = None  # type: ignore[call-overload]  # let it go
                li += 1
                offset += len(raw)
                line += 1
                record = None
                if fast and (len(raw) < NESTED or raw.count(b"[") + raw.count(b"{") < NESTED):  # (_fast_record)
                    record = fast_record(raw)
                if record is None:
                    self._li, self._offset, self._line = li, offset, line  # where a bad line's error points
                    record, why = parse_line(raw, encoding=self.encoding, format=self.format, field=self.field,
                                             first=line == 1)
                    if record is None:
                        if why is not None:
                            self._bad(why)
                        continue
                record["file"] = path
                record["line"] = line
                record["index"] = base + line
                if label != -1 and "label" not in record:
                    record["label"] = label
                out.append(record)
        finally:
            self._li, self._offset, self._line = li, offset, line
        return out

    def _fast_chunk(self, lines: list, li: int, end: int) -> list[dict] | None:
        """The records of ``lines[li:end]`` parsed by orjson in a C-level loop (``map``), checked
        and given their provenance, the node moved past them; None (nothing moved) where any of
        them needs the line-by-line path: a line orjson refuses (a blank one, a byte order mark,
        bad JSON), a record that is not a dict or lacks a good ``field``, one holding a list or
        a dict whose line has ``NESTED`` brackets or more. Each record is what that path would
        give for its line: a record of scalar values is one level deep whatever its text holds
        (its brackets are in strings), so it needs no count of them (which was a fifth of the
        node's instructions)."""
        chunk = lines[li:end]
        try:
            records = list(map(_fast_loads, chunk))  # type: ignore[arg-type]
        except ValueError:  # orjson.JSONDecodeError: that line, and those around it, one by one
            return None
        try:  # (dict.values refuses a record that is not a dict: no pass of its own for that)
            flat = _FLAT.issuperset(map(type, chain.from_iterable(map(dict.values, records))))
        except TypeError:
            return None
        if not flat:
            for record, raw in zip(records, chunk):  # some hold a list or a dict: how deep? (_fast_record)
                if not _FLAT.issuperset(map(type, record.values())) and len(raw) >= NESTED and (
                        raw.count(b"[") + raw.count(b"{") >= NESTED):
                    return None
        field = self.field
        if field is not None:
            values = list(map(dict.get, records, repeat(field)))
            try:  # (str.isspace refuses a value that is not a str)
                if not all(values) or any(map(str.isspace, values)):
                    return None
            except TypeError:
                return None
        # the provenance, in C-level passes (a Python loop over the records was a third of the node)
        k = len(records)
        first = self._line + 1
        any(map(setitem, records, repeat("file"), repeat(self._path)))
        any(map(setitem, records, repeat("line"), range(first, first + k)))
        start = self._base - 1 + first
        any(map(setitem, records, repeat("index"), range(start, start + k)))
        label = self._label
        if label != -1:
            for record in records:
                if "label" not in record:
                    record["label"] = label
        line = first + k - 1
        k = end - li
        lines[li:end] = _NONES[:k] if k <= len(_NONES) else [None] * k  # let them go
        self._li, self._line = end, line
        self._offset += sum(map(len, chunk))
        return records

    def _fast_record(self, raw: bytes) -> dict | None:
        """The record, parsed by orjson and checked; None: let ``parse_line`` decide (and say why).
        Lines with ``NESTED`` brackets or more are left to ``parse_line``: deep enough, perhaps,
        for the standard library to refuse what orjson takes."""
        try:
            record = _fast_loads(raw if self._utf8 else raw.decode(self.encoding))  # type: ignore[misc]
        except ValueError:  # orjson.JSONDecodeError, UnicodeDecodeError
            return None
        if type(record) is not dict:
            return None
        field = self.field
        if field is not None:
            value = record.get(field)
            if type(value) is not str or not value or value.isspace():
                return None
        return record

    def _error(self, message: str) -> SampleError:
        """A ``SampleError`` with a note naming the node (the spec's node and line in a graph)."""
        exc = SampleError(message)
        exc.add_note(f"in {self.where}")
        return exc

    def _bad(self, why: str) -> None:
        where = f"{self._file['path']}:{self._line}"  # type: ignore[index]
        if self.on_error == "raise":
            raise self._error(f"{where}: {why} (set on_error: skip to count and skip bad lines)")
        self.skipped += 1
        self.ledger.add(where, "SampleError", why)
        log_skip(log, self.skipped, f"read_jsonl: skipped {where}: {why}")

    def _unreadable(self, exc: BaseException) -> None:
        """The open file fails to read past line ``self._line`` (truncated, corrupt, a failed
        read): an error naming it, or the rest of the file skipped and counted."""
        path, after = self._path, f"after line {self._line}" if self._line else "at its start"
        why = f"cannot read it {after} ({type(exc).__name__}: {exc})"
        if self.on_error == "raise":
            raise self._error(f"read_jsonl: {path}: {why} (set on_error: skip to count and skip "
                              "the rest of such a file)") from exc
        self.skipped += 1
        self.ledger.add(f"{path}:{self._line + 1}", type(exc).__name__, f"{why}; the rest of the file skipped")
        log_skip(log, self.skipped, f"read_jsonl: skipped the rest of {path}: {why}")

    def get_state(self) -> dict:
        return {self.SOURCE_KEY: self._file_state, self.OPEN_KEY: self._fh is not None,
                self.OFFSET_KEY: self._offset, self.LINE_KEY: self._line, self.SKIPPED_KEY: self.skipped,
                self.FILES_KEY: self.files, LEDGER_KEY: self.ledger.state()}

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

Files ending in ``.gz``, ``.bz2``, ``.zst``... are decompressed on the fly (fsspec's
``compression="infer"``); offsets then count decompressed bytes.

Remote files (``s3://``, any fsspec URL) are read through ``conveyor.storage``, front to back
in blocks, a few ahead, each request with the retry policy: a transient failure (a 503, a
reset, a server gone for a moment) is retried with backoff; one that outlives its attempts, or
a missing object, is a ``SampleError`` naming the file (and the line reached), a missing
bucket or denied access a ``SourceError``, each with the node's note, never a bare botocore
or aiohttp traceback. A file that cannot be read to its end (a ``.gz`` cut short) says so too.

The state is the input's state before the current file, whether a file is open, and the
byte offset and line number in it. A restore re-reads that one file record from the input,
opens the file and seeks to the offset: it never replays the file's earlier lines.

Speed (records cost microseconds, so per-line Python is the cost): files are read in blocks
of ``BLOCK`` bytes and split into lines at once, and JSON is parsed by ``orjson`` when it is
installed (~6x faster than the standard library here), straight from the line's bytes. A line
orjson refuses goes through the standard library the old way, so what is accepted and what
each error says do not depend on orjson — with one difference: orjson reads an integer wider
than 64 bits as a float. A line nested too deep for the standard library (``RecursionError``;
orjson would take it, so lines with ``NESTED`` brackets or more go to the standard library)
and a text field holding a lone surrogate (``"\\ud800"``, which no tokenizer can encode) are
bad lines like any other.
"""

from __future__ import annotations

import codecs
import json
import logging
from typing import Any

import fsspec
from torchdata.nodes import BaseNode

from conveyor.errors import ConveyorError, SampleError
from conveyor.nodes._skips import LEDGER_KEY, SkipLedger, log_skip
from conveyor.storage import RetryPolicy, Storage, is_local, redact

try:  # a faster parser where installed; the standard library decides about what it refuses
    from orjson import loads as _fast_loads
except ImportError:  # pragma: no cover - orjson is a dependency, but stay usable without it
    _fast_loads = None

log = logging.getLogger(__name__)

BLOCK = 1 << 20  # bytes read at a time
NESTED = 256     # lines with this many brackets are parsed by the standard library (see _fast_record)
FORMATS = ("jsonl", "lines")
ON_ERROR = ("raise", "skip")
LINE_BITS = 32


def encoding_problem(encoding: Any) -> str | None:
    """Why files in ``encoding`` cannot be read line by line here, or ``None``. Lines are cut at
    the byte ``\\n``, so the encoding must be one Python knows that writes ASCII as ASCII (UTF-8,
    Latin-1, cp1252...): UTF-16 or UTF-32 text read that way failed from its second line on, and
    an unknown name was a LookupError at the first line."""
    if not isinstance(encoding, str) or not encoding:
        return f"expected an encoding name, got {encoding!r}"
    try:
        codecs.lookup(encoding)
    except LookupError:
        return f"unknown encoding {encoding!r}"
    probe = b'{"text": "a"}\n'
    try:
        same = probe.decode(encoding) == probe.decode("ascii")
    except (UnicodeDecodeError, LookupError, ValueError, TypeError):  # LookupError: not a text codec
        same = False
    if not same:
        return (f"encoding {encoding!r} does not read ASCII bytes as ASCII text (UTF-16 and UTF-32 do "
                "not, nor do codecs that are not text encodings), so lines cannot be cut at the newline "
                "byte; convert the files to UTF-8")
    return None


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
        self.storage = Storage(storage_options=storage_options, policy=policy)
        self.where = where or "read_jsonl"
        self.skipped = 0
        self.ledger = SkipLedger()
        self.files = 0
        self._file_state: dict | None = None  # input state before the open file's record
        self._file: dict | None = None         # the open file's record
        self._fh: Any = None
        self._raw: Any = None  # a remote file's reader, under a decompressor
        self._offset = 0
        self._line = 0
        self._lines: list[bytes] = []  # lines of the current block, without their b"\n"
        self._li = 0                   # the next of them
        self._nl = 1                   # 1: they had a b"\n" (0: the file's last line had none)
        self._tail = b""               # a line the block cut, completed by the next block
        self._path = ""                # the open file's path
        self._base = 0                 # the open file's index << LINE_BITS
        self._label = -1               # the open file's label
        self._fast = format == "jsonl" and _fast_loads is not None  # parse with orjson first
        self._utf8 = encoding.lower().replace("_", "-") in ("utf-8", "utf8")  # orjson takes the bytes

    # ----- stats and closing --------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        return {"files": self.files, "skipped": self.skipped}

    def close(self) -> None:
        self._close_file()
        self.storage.close()

    def _close_file(self) -> None:
        self._lines, self._li, self._tail = [], 0, b""
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
        try:
            if is_local(path):
                self._fh = fsspec.open(path, "rb", compression="infer", **(self.storage_options or {})).open()
            else:
                self._fh = self._open_remote(path, offset)
            if offset:
                self._fh.seek(offset)
        except ConveyorError as exc:  # from conveyor.storage: it names the URL
            self._close_file()
            exc.add_note(f"in {self.where}")
            raise
        except (OSError, EOFError) as exc:
            self._close_file()
            raise self._error(f"read_jsonl: cannot open {self._redact(path)}: "
                              f"{self._redact(str(exc.strerror or exc))}") from exc
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
        from fsspec.utils import infer_compression

        codec = infer_compression(path)
        if codec == "zip":  # read from its end first (the central directory): random access
            self._raw = self.storage.open_random(path)
        else:
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
        """Read the next block's lines (without their b"\\n"); False at the end of the file."""
        try:
            data = self._fh.read(BLOCK)
        except ConveyorError as exc:  # from conveyor.storage: it names the URL
            exc.add_note(f"in {self.where}, reading {self._redact(self._path)} from line {self._line + 1}")
            raise
        except (OSError, EOFError) as exc:  # a .gz cut short, a disk error
            raise self._error(f"read_jsonl: {self._redact(self._path)}: cannot read on from line "
                              f"{self._line + 1} ({type(exc).__name__}: {self._redact(str(exc))})") from exc
        if not data:
            if not self._tail:
                return False
            self._lines, self._li, self._tail = [self._tail], 0, b""  # a last line without b"\\n"
            self._nl = 0
            return True
        lines = (self._tail + data).split(b"\n")
        self._tail = lines.pop()  # after the last b"\n": the start of a line (or b"")
        self._lines, self._li, self._nl = lines, 0, 1
        return True

    def next(self) -> dict:
        return self.next_many(1)[0]

    def next_many(self, n: int) -> list[dict]:
        """Up to ``n`` records, from one block of lines at most (nodes/_chunks.py)."""
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
        out: list[dict] = []
        lines, li, nl = self._lines, self._li, self._nl
        end = min(len(lines), li + n)
        offset, line = self._offset, self._line
        path, base, label = self._path, self._base - 1, self._label
        fast, fast_record = self._fast, self._fast_record
        try:
            while li < end:
                raw = lines[li]
                lines[li] = None  # type: ignore[call-overload]  # let it go
                li += 1
                offset += len(raw) + nl
                line += 1
                record = None
                if fast and (len(raw) < NESTED or raw.count(b"[") + raw.count(b"{") < NESTED):  # (_fast_record)
                    record = fast_record(raw)
                if record is None:
                    self._li, self._offset, self._line = li, offset, line  # where _parse's error points
                    record = self._parse(raw)
                    if record is None:
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

    def _fast_record(self, raw: bytes) -> dict | None:
        """The record, parsed by orjson and checked; None: let ``_parse`` decide (and say why).
        Lines with ``NESTED`` brackets or more are left to ``_parse``: deep enough, perhaps,
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

    def _parse(self, raw: bytes) -> dict | None:
        """The record of a line the fast path did not take, or None (a blank line, or a bad one,
        counted)."""
        try:
            text = raw.decode(self.encoding)
        except UnicodeDecodeError as exc:
            self._bad(f"not {self.encoding} text ({exc.reason} at byte {exc.start})")
            return None
        text = text.rstrip("\r\n")
        if self._line == 1 and text.startswith("\ufeff"):
            text = text[1:]  # a byte order mark, as Windows tools begin UTF-8 files with
        if not text.strip():
            return None  # a blank line holds no record (pandas, pyarrow and ndjson skip them too)
        if self.format == "lines":
            record: Any = {self.field or "text": text}
        else:
            try:
                record = json.loads(text)
            except json.JSONDecodeError as exc:
                self._bad(f"not JSON ({exc.msg} at column {exc.colno})")
                return None
            except RecursionError:
                self._bad("not JSON this reader can take (nested too deep)")
                return None
            if not isinstance(record, dict):
                self._bad(f"expected a JSON object, got {type(record).__name__}")
                return None
        if self.field is not None:
            value = record.get(self.field)
            if value is None:
                self._bad(f"field {self.field!r} is null" if self.field in record else f"no field {self.field!r}")
                return None
            if not isinstance(value, str):
                self._bad(f"field {self.field!r} is {type(value).__name__}, expected a string")
                return None
            if not value.strip():
                self._bad(f"field {self.field!r} is empty")
                return None
            if not value.isascii():
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError as exc:
                    self._bad(f"field {self.field!r} is not valid Unicode ({exc.reason} at character {exc.start})")
                    return None
        return record

    def get_state(self) -> dict:
        return {self.SOURCE_KEY: self._file_state, self.OPEN_KEY: self._fh is not None,
                self.OFFSET_KEY: self._offset, self.LINE_KEY: self._line, self.SKIPPED_KEY: self.skipped,
                self.FILES_KEY: self.files, LEDGER_KEY: self.ledger.state()}

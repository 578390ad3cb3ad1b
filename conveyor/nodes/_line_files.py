"""Line files as ``read_jsonl`` takes them: which it cannot read as their names say, how a
``.zip`` is opened, and what one line holds.

``compression_problem`` and ``encoding_problem`` say why a file (or an encoding) cannot be
read line by line before a screen of bad lines would; ``open_zip`` opens the one file of a
``.zip``; ``parse_line`` turns a line's bytes into a record, or says why it is a bad line
(the standard library's way: what orjson refuses, ``read_jsonl`` hands to it).
"""

from __future__ import annotations

import codecs
import json
import lzma
import zlib
from typing import Any, Callable

from fsspec.utils import infer_compression

# what reading a file can raise: OSError (a failed read, BadGzipFile), EOFError (a truncated
# .gz/.bz2/.xz), zlib.error and lzma.LZMAError (corrupt data)
READ_ERRORS: tuple[type[BaseException], ...] = (OSError, EOFError, zlib.error, lzma.LZMAError)
try:
    from zstandard import ZstdError as _ZstdError
    READ_ERRORS += (_ZstdError,)
except ImportError:
    pass
# name suffixes of compressions fsspec infers only where a package is installed
_CODEC_PACKAGES = {"zst": ("zstd", "zstandard"), "lz4": ("lz4", "lz4")}
# first bytes of compressed streams, for a file whose name announces none
_MAGIC = ((b"\x1f\x8b", "gzip", ".gz"), (b"BZh", "bz2", ".bz2"), (b"\xfd7zXZ\x00", "xz", ".xz"),
          (b"\x28\xb5\x2f\xfd", "zstd", ".zst"), (b"PK\x03\x04", "zip", ".zip"),
          (b"\x04\x22\x4d\x18", "lz4", ".lz4"))


def compression_problem(path: str, head: bytes | None = None) -> str | None:
    """Why ``path`` cannot be read as its name says, or ``None``: its suffix names a compression
    whose package is not installed, or (given its first bytes ``head``) it is a compressed stream
    that its name does not announce. fsspec infers compression from the name alone, and read as
    text either file was a bad line per block of binary.

    Example:
        >>> compression_problem("a.jsonl", b"\\x1f\\x8b\\x08\\x00")
        'it is gzip-compressed but its name does not end in .gz (compression is inferred from the name); rename it'
    """
    if infer_compression(path) is not None:
        return None
    suffix = path.rsplit("/", 1)[-1].rpartition(".")[2].lower()
    if suffix in _CODEC_PACKAGES:
        codec, package = _CODEC_PACKAGES[suffix]
        return f"{codec}-compressed files need the {package} package: pip install {package}"
    if head:
        for magic, codec, ext in _MAGIC:
            if head.startswith(magic) and (codec != "bz2" or head[4:8] == b"1AY&"):  # BZh9, then a block
                return (f"it is {codec}-compressed but its name does not end in {ext} (compression is "
                        "inferred from the name); rename it")
    return None


def field_names(record: dict, most: int = 8) -> str:
    """A record's field names, for an error: the first ``most`` of them."""
    names = [str(k) for k in record]
    return ", ".join(names[:most]) + (f", ... ({len(names)} in all)" if len(names) > most else "") if names else "none"


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


def open_zip(path: str, raw: Any, error: Callable[[str], Exception]) -> Any:
    """The one file in the zip archive ``raw`` (open, at ``path``), open; closing it closes
    ``raw``. fsspec reads the first entry of a .zip, and nothing after it: of several
    files, the first only; of a folder entry and its file (``zip -r`` puts the folder
    first), nothing. ``error(message)`` makes the exception for an archive that will not do."""
    import zipfile

    try:
        archive = zipfile.ZipFile(raw)
    except zipfile.BadZipFile as exc:
        raw.close()
        raise error(f"read_jsonl: cannot read {path}: not a zip archive ({exc})") from None
    names = [i.filename for i in archive.infolist() if not i.is_dir()]
    if len(names) != 1:
        archive.close()
        raw.close()
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        raise error(f"read_jsonl: {path} is a zip archive of {len(names)} files"
                    + (f" ({shown})" if names else "") + "; a .zip is read as one compressed "
                    "file, so unzip it and list its files")
    member = archive.open(names[0])
    close = member.close

    def close_all() -> None:
        try:
            close()
        finally:
            archive.close()
            raw.close()

    member.close = close_all  # type: ignore[method-assign]
    return member


def parse_line(raw: bytes, *, encoding: str, format: str, field: str | None,
               first: bool) -> tuple[dict | None, str | None]:
    """The record of one line (without its ``\\n``) the fast path did not take: ``(record,
    None)``; ``(None, None)`` for a blank line; ``(None, why)`` for a bad one. ``first``: the
    file's first line (it may start with a byte order mark)."""
    try:
        text = raw.decode(encoding)
    except UnicodeDecodeError as exc:
        return None, f"not {encoding} text ({exc.reason} at byte {exc.start})"
    text = text.rstrip("\r\n")
    if first and text.startswith("\ufeff"):
        text = text[1:]  # a byte order mark, as Windows tools begin UTF-8 files with
    if not text.strip():
        return None, None  # a blank line holds no record (pandas, pyarrow and ndjson skip them too)
    if format == "lines":
        record: Any = {field or "text": text}
    else:
        try:
            record = json.loads(text)
        except json.JSONDecodeError as exc:
            return None, f"not JSON ({exc.msg} at column {exc.colno})"
        except RecursionError:
            return None, "not JSON this reader can take (nested too deep)"
        if not isinstance(record, dict):
            return None, f"expected a JSON object, got {type(record).__name__}"
    if field is not None:
        value = record.get(field)
        if value is None:
            return None, (f"field {field!r} is null" if field in record else
                          f"no field {field!r} (it has: {field_names(record)}; the field param names it)")
        if not isinstance(value, str):
            return None, f"field {field!r} is {type(value).__name__}, expected a string"
        if not value.strip():
            return None, f"field {field!r} is empty"
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                return None, f"field {field!r} is not valid Unicode ({exc.reason} at character {exc.start})"
    return record, None

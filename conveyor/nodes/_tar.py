"""The tar format as ``read_tar`` reads it: headers, members grouped into samples, checks.

Read front to back from a block reader (``tell``/``seek``/``read``), one header ahead; no
member is buffered beyond the sample being built. Anything malformed is a ``SampleError``
naming the shard and the byte offset: a header that fails its checksum, a pax extended header
whose records do not parse (a record length of 0 or ``zz`` would otherwise loop forever or
raise a bare ``ValueError``), a member cut short, and a shard that ends without the
end-of-archive marker (two zero blocks) — which is how a shard truncated between samples, or
a zero-byte shard, shows itself, or one with more than zeros after that marker (a second
archive joined on with ``cat``).
"""

from __future__ import annotations

import re
import tarfile
from typing import Any

from conveyor.errors import SampleError

BLOCK = 512
_PADDING = 64 << 10  # bytes after an end-of-archive marker checked to be zeros (tar pads to 10 kB)
# the key: the path up to the base name's first dot; a base name starting with a dot (a hidden
# file, macOS tar's ._NAME AppleDouble members) matches nothing, in a folder or not
_KEY_EXT = re.compile(r"^((?:.*/)?[^./][^./]*)\.([^/]*)$")
_NAME_TYPES = (tarfile.GNUTYPE_LONGNAME, tarfile.XHDTYPE, tarfile.SOLARIS_XHDTYPE)


def pax_path(data: bytes) -> str | None:
    """The ``path`` record of a pax extended header, if any.

    Raises:
        ValueError: a record that does not parse (its length not a number, too short to hold
            its own length field, past the end of the header, or not ended by a newline).
    """
    pos, path = 0, None
    while pos < len(data):
        space = data.find(b" ", pos, pos + 24)
        head = data[pos:space] if space > pos else b""
        if not head.isdigit():
            shown = data[pos:space] if space > pos else data[pos:pos + 8]
            raise ValueError(f"record length {bytes(shown)!r} at byte {pos} of the header is not a number")
        length = int(head)
        end = pos + length
        if length < len(head) + 3 or end > len(data) or data[end - 1:end] != b"\n":
            raise ValueError(f"record length {length} at byte {pos} of the header does not fit "
                             f"its {len(data)} bytes")
        key, eq, value = data[space + 1:end - 1].partition(b"=")
        if not eq:
            raise ValueError(f"record at byte {pos} of the header has no '='")
        if key == b"path":
            path = value.decode("utf-8", "surrogateescape")
        pos = end
    return path


def sample_problem(sample: dict[str, Any], fields: list[tuple[str, ...]],
                   links: dict[str, str] | None = None) -> str | None:
    """What makes ``sample`` unusable (a member that is a link, none of a required field's
    alternatives, a ``cls`` that is not a number), or None; turns ``cls`` into an int."""
    if links:
        return (f"{'; '.join(links.values())}: read_tar reads regular members only (make the tar "
                "with tar --hard-dereference or -h, or with conveyor pack)")
    for alternatives in fields:
        if not any(f in sample for f in alternatives):
            have = sorted(k for k in sample if not k.startswith("__") and k != "index")
            wanted = f"no {' or '.join('.' + f for f in alternatives)} member (it has " \
                     f"{', '.join('.' + f for f in have) or 'none'})"
            dotted = next((k for k in have if any(k.endswith("." + f) for f in alternatives)), None)
            if dotted is not None:  # photo.2019.jpg: the field is 2019.jpg
                return (f"{wanted}: the key is the name up to its first dot, so a .{dotted} member "
                        f"is field {dotted!r}; name the members KEY.FIELD, with no other dot (as "
                        "conveyor pack does)")
            # plain `tar cf DIR` stores a folder in the file system's order, not by name
            return (f"{wanted}: a sample is the members next to each other with its key; if the "
                    "shard holds one further on, make the shard with tar --sort=name, or conveyor pack")
    cls = sample.get("cls")
    if isinstance(cls, bytes):
        try:
            sample["cls"] = int(cls.decode("ascii").strip())
        except (UnicodeDecodeError, ValueError):
            return f"cls {cls[:32]!r} is not a class number"
    return None


class _Member:
    __slots__ = ("offset", "name", "size", "link")

    def __init__(self, offset: int, name: str, size: int, link: str | None = None):
        self.offset, self.name, self.size = offset, name, size
        self.link = link  # a hard or symbolic link member: what it says, else None


# what a compressed shard starts with: the reason its first header does not parse
_COMPRESSED = ((b"\x1f\x8b", "gzip"), (b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"),
               (b"\x28\xb5\x2f\xfd", "zstd"))


class OpenTar:
    """One open tar shard (a file, not the ``shard`` node): members grouped into samples, one
    header read ahead.

    Args:
        reader: a block reader positioned at ``offset``.
        url: the shard's URL, for messages.
        offset: where the next sample's first header starts.
    """

    def __init__(self, reader: Any, url: str, offset: int):
        self.reader = reader
        self.url = url
        self.offset = offset  # where the next sample's first header starts
        self._peek: _Member | None = None
        self.done = False
        self.pending: SampleError | None = None  # met after the sample just returned
        self.links: dict[str, str] = {}  # the returned sample's link members: field -> what it links to

    def _end_of_archive(self, off: int) -> None:
        """After a zero block at ``off``: the second zero block must follow, then only the zero
        padding of the last record (up to ``_PADDING`` bytes of it are looked at)."""
        second = self.reader.read(BLOCK)
        if second != bytes(BLOCK):
            raise SampleError(f"{self.url}: a lone zero block at byte {off} (the end-of-archive "
                              "marker is two): the shard is truncated or corrupt")
        at = off + 2 * BLOCK
        while at < off + _PADDING:
            block = self.reader.read(BLOCK)
            if not block:
                return
            if block.strip(b"\0"):  # `cat a.tar b.tar`: tar itself reads b only with --ignore-zeros
                raise SampleError(f"{self.url}: more data at byte {at}, after the end-of-archive "
                                  f"marker at byte {off}: archives joined into one file (cat a.tar "
                                  "b.tar)? read_tar reads one archive a shard, as tar does; write "
                                  "the samples into one archive (tar -A joins them)")
            at += len(block)

    def _compressed(self, buf: bytes, off: int) -> None:
        """A first block that is no tar header: say so if it starts a compressed stream."""
        packed = next((name for magic, name in _COMPRESSED if buf.startswith(magic)), None)
        if off == 0 and packed:
            raise SampleError(f"{self.url}: a {packed}-compressed file, not a tar archive: read_tar "
                              "reads uncompressed tar shards (decompress them, or write them with "
                              "conveyor pack)")

    def _member(self) -> _Member | None:
        r = self.reader
        start = r.tell()
        long_name = None
        while True:
            off = r.tell()
            buf = r.read(BLOCK)
            if not buf:
                raise SampleError(f"{self.url}: ends at byte {off} without the end-of-archive marker "
                                  f"(two zero blocks): the shard is {'empty' if off == 0 else 'truncated'}")
            if len(buf) < BLOCK:
                self._compressed(buf, off)
                raise SampleError(f"{self.url}: truncated tar header at byte {off}")
            if buf == bytes(BLOCK):
                self._end_of_archive(off)
                return None
            try:
                info = tarfile.TarInfo.frombuf(buf, "utf-8", "surrogateescape")
            except tarfile.HeaderError as exc:
                self._compressed(buf, off)
                raise SampleError(f"{self.url}: not a tar archive, or corrupt at byte {off} "
                                  f"({exc})") from exc
            padded = -(-info.size // BLOCK) * BLOCK
            if info.type in _NAME_TYPES:
                data = r.read(padded)[:info.size]
                if len(data) < info.size:
                    raise SampleError(f"{self.url}: truncated extended header at byte {off}")
                if info.type == tarfile.GNUTYPE_LONGNAME:
                    long_name = data.rstrip(b"\0").decode("utf-8", "surrogateescape")
                    continue
                try:
                    long_name = pax_path(data) or long_name
                except ValueError as exc:
                    raise SampleError(f"{self.url}: malformed pax extended header at byte {off} "
                                      f"({exc})") from exc
                continue
            if info.islnk() or info.issym():  # its sample cannot be read whole: said there
                r.seek(r.tell() + padded)
                kind = "hard" if info.islnk() else "symbolic"
                return _Member(start, long_name or info.name, 0, f"a {kind} link to {info.linkname!r}")
            if not info.isreg():  # directories, global headers: not samples
                r.seek(r.tell() + padded)
                long_name = None
                start = r.tell()
                continue
            return _Member(start, long_name or info.name, info.size)

    def _data(self, m: _Member) -> bytes:
        data = self.reader.read(m.size)
        if len(data) < m.size:
            raise SampleError(f"{self.url}: truncated member {m.name!r} ({len(data)} of {m.size} bytes)")
        self.reader.seek(self.reader.tell() + (-m.size % BLOCK))
        return data

    def sample(self) -> dict[str, Any] | None:
        """The next sample (``{"__key__", field: bytes...}``), or None at the end of the shard.

        A sample read whole before a bad header is returned first; the error comes with the
        next call (and is ``pending`` meanwhile: the sample may lack what that header held).
        """
        if self.pending is not None:
            raise self.pending
        if self.done:
            return None
        if self._peek is None:
            self._peek = self._member()
        sample: dict[str, Any] = {}
        self.links = {}
        key = None
        while self._peek is not None:
            m = self._peek
            match = _KEY_EXT.match(m.name)
            if match is None:  # no field (or a hidden file): not part of any sample
                self.reader.seek(self.reader.tell() + -(-m.size // BLOCK) * BLOCK)
                self._peek = self._member()
                continue
            k, ext = match.group(1), match.group(2).lower()
            if key is None:
                key = k
            elif k != key:
                break
            if ext in sample or ext in self.links:
                raise SampleError(f"{self.url}: sample {key!r} has two {ext!r} members")
            if m.link is None:
                sample[ext] = self._data(m)
            else:
                self.links[ext] = f"its .{ext} member is {m.link}"
            at = self.reader.tell()
            try:
                self._peek = self._member()
            except SampleError as exc:
                self.pending, self.offset = exc, at
                sample["__key__"] = key
                return sample
        if key is None:
            self.done = True
            return None
        self.offset = self._peek.offset if self._peek is not None else self.reader.tell()
        self.done = self._peek is None
        sample["__key__"] = key
        return sample

    def close(self) -> None:
        self.reader.close()

"""Listing object storage and local folders: ``glob`` for ``list_files`` and ``conveyor pack``.

One recursive listing under a glob's fixed prefix (on S3 a flat, paginated listing: one request
per 1000 keys, not one per folder), matched against the pattern; a pattern one level below it
(``root/*.tar``) lists only that folder's own entries. Local folders are walked with their
symbolic links followed, as torchvision's ``ImageFolder`` follows them. Unlike fsspec's
``glob``, a folder that fails to list is an error, never silently left out; folder markers
(empty objects named ``prefix/``) are folders, not files.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any, Protocol

from fsspec.utils import glob_translate

from conveyor.errors import SampleError, SourceError
from conveyor.storage._errors import NOT_FOUND, classify, redact
from conveyor.storage._filesystems import is_local

log = logging.getLogger("conveyor.storage")  # the package's name: its modules are private


class _Lister(Protocol):
    """What a listing asks of its ``Storage``: the filesystem of a URL, and calls on it with
    the retry policy."""

    options: dict[str, Any]

    def resolve(self, url: str) -> tuple[Any, str]: ...

    def call(self, url: str, sync_name: str, *args: Any, name: str | None = None,
             timeout: float | None = -1.0, **kwargs: Any) -> Any: ...


def _local_files(root: str, depth: int | None = None, special: list[str] | None = None) -> list[str]:
    """Every file below the local folder ``root`` (at most ``depth`` folders down: 1 is the
    files in ``root``; None: all), symlinked folders followed as ImageFolder's
    ``os.walk(followlinks=True)`` follows them (fsspec's listing takes a link to a folder for
    a file and lists nothing below it); a link back to a folder it is inside is not followed
    again (what is below it is listed already), so a link loop ends. A folder that cannot be
    read is a ``SourceError`` naming it. What is neither a file nor a folder (a named pipe, a
    socket, a device: opening a pipe waits for a writer for ever) is left out, and added to
    ``special`` where given."""
    if not os.path.isdir(root):
        return []  # no such folder: the caller says so
    out: list[str] = []
    broken: list[str] = []
    st = os.stat(root)
    stack = [(root, frozenset({(st.st_dev, st.st_ino)}))]  # a folder and the real folders it is in
    while stack:
        folder, inside = stack.pop()
        if depth is not None and len(inside) > depth:
            continue  # deeper than the pattern reaches
        try:
            entries = list(os.scandir(folder))
        except OSError as exc:
            raise SourceError(f"cannot list {folder}: {exc.strerror or exc}") from exc
        for entry in entries:
            try:
                is_dir = entry.is_dir()  # through a link
            except OSError:
                is_dir = False
            if not is_dir:
                try:
                    regular = entry.is_file()  # through a link
                except OSError:
                    regular = False
                if regular or not os.path.exists(entry.path):
                    out.append(entry.path)  # a file, a link to one, or a broken link (its read says so)
                    if not regular:
                        broken.append(entry.path)
                elif special is not None:
                    special.append(entry.path)
                continue
            try:
                st = os.stat(entry.path)
            except OSError as exc:  # gone since, or a link to a folder this user cannot reach
                raise SourceError(f"cannot list {entry.path}: {exc.strerror or exc}") from exc
            if (st.st_dev, st.st_ino) not in inside:
                stack.append((entry.path, inside | {(st.st_dev, st.st_ino)}))
    if broken:  # a link to a class folder that moved would otherwise just not match */**
        log.warning("listing %s: %d broken symbolic link(s), e.g. %s", root, len(broken), min(broken))
    return out


_ONE_CHAR_SET = re.compile(r"\[([^!^])\]")  # [[] is "[", []] is "]", [x] is "x": no wildcard


def fixed_part(path: str) -> tuple[str, bool]:
    """The text ``path`` matches literally before its first wildcard (``*``, ``?``, a set of
    characters), and whether it has one. A one-character set is that character: ``run[[]1]``
    is the folder ``run[1]``, so that an escaped name still lists from its own folder."""
    out, i = [], 0
    while i < len(path):
        c = path[i]
        if c in "*?":
            return "".join(out), True
        if c == "[":
            one = _ONE_CHAR_SET.match(path, i)
            if one is None:
                return "".join(out), True
            out.append(one.group(1))
            i = one.end()
            continue
        out.append(c)
        i += 1
    return "".join(out), False


def single_slashes(url: str) -> str:
    """``url`` with each run of ``/`` in its path made one (``root/`` + ``/*/*``, from a root
    given with a trailing slash): a listing never returns such paths, so a glob that has them
    would match nothing. The ``//`` after a protocol stays."""
    head, sep, path = url.rpartition("://")
    return head + sep + re.sub(r"(?<=.)/{2,}", "/", path)


def is_folder_marker(path: str) -> bool:
    """Whether a listed object is a folder marker (a key ending in ``/``), not a file."""
    return path.endswith("/")



def _walks(fs: Any) -> bool:
    """Whether ``fs.find`` is fsspec's generic one, built on ``walk`` (which takes ``on_error``)."""
    from fsspec.asyn import AsyncFileSystem
    from fsspec.spec import AbstractFileSystem

    if getattr(fs, "async_impl", False):
        return type(fs)._find is AsyncFileSystem._find
    return type(fs).find is AbstractFileSystem.find


def _full_url(fs: Any, path: str, like: str) -> str:
    if is_local(like):
        return path
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return path if "://" in path else f"{protocol}://{path}"



def glob_root(storage: _Lister, url: str) -> str:
    """The part of the glob ``url`` before its first wildcard, up to a ``/``, in the form
    ``glob`` gives its matches: every match starts with it and a ``/``."""
    fs, path = storage.resolve(single_slashes(url))
    fixed, wild = fixed_part(path)
    root = fixed.rsplit("/", 1)[0] if wild else fixed
    return _full_url(fs, root.rstrip("/"), url)


def glob(storage: _Lister, url: str, *, folder_markers: bool = False,
         infos: dict[str, dict] | None = None) -> list[str]:
    """Files matching ``url`` (a glob: ``*``, ``?``, ``[...]``, ``**``), sorted, as full URLs
    (plain paths when local).

    Object storage has folder markers, empty objects named ``prefix/`` (the AWS console's
    "Create folder", and many sync tools, make them); s3fs lists them as files. They are
    folders, not files: left out, or with ``folder_markers`` kept in the list, ending in
    ``/`` (``is_folder_marker``), for a caller that counts folders (empty class folders).

    One recursive listing under the glob's fixed prefix (on S3 a flat, paginated listing:
    one request per 1000 keys, not one per folder), matched against the pattern; a pattern
    one level below it (``root/*.tar``) lists only that folder's own entries. Unlike
    fsspec's ``glob``, a folder that fails to list is an error (retried when transient),
    never silently left out.

    ``infos``, when given, is filled with what the listing said of each match (full URL to
    fsspec's info: ``size``, and on S3 ``ETag``), at no extra request.

    Raises:
        SourceError: nothing matches (naming the URL, and a missing bucket or folder).
    """
    url = single_slashes(url)
    fs, path = storage.resolve(url)
    fixed, wild = fixed_part(path)
    if not wild:
        try:
            info = storage.call(_full_url(fs, fixed, url), "info")
        except SampleError as exc:
            if exc.__cause__ is None or classify(exc.__cause__) != NOT_FOUND:
                raise SourceError(str(exc)) from exc.__cause__
            info = {"type": "directory"}  # nothing there: said below
        files = [fixed] if info.get("type") != "directory" else []
        if files and infos is not None:
            infos[_full_url(fs, fixed, url)] = info
    else:
        root = fixed.rsplit("/", 1)[0] if "/" in fixed else ""
        root_url = url[:len(url) - len(path)] + root if not is_local(url) else root
        try:
            pattern = re.compile(glob_translate(path))
        except ValueError as exc:  # fsspec: "'**' can only be an entire path component"
            raise SourceError(f"{url}: not a glob pattern ({exc})") from None
        if is_local(url):
            # as deep below root as the pattern's /s reach (an escape adds none), or any depth
            depth = None if "**" in path else path.count("/") - root.count("/")
            special: list[str] = []
            files = sorted(p for p in _local_files(root or "/", depth, special) if pattern.match(p))
            special = sorted(p for p in special if pattern.match(p))
            if special:
                log.warning("listing %s: %d match(es) left out that are not files (a named pipe, a socket "
                            "or a device), e.g. %s", url, len(special), special[0])
        else:
            kwargs: dict[str, Any] = {"detail": True}
            if _walks(fs):
                kwargs["on_error"] = "raise"  # fsspec's walk leaves failed folders out by default
            try:
                # a listing is a request per 1000 keys: each has the socket timeouts, the
                # whole has none (a big bucket takes long)
                if "**" not in path and path.count("/") - root.count("/") == 1:
                    # root/*.tar: the one folder's own entries (a delimited listing), not
                    # every key of the tree below it (shards beside 1.28M loose images)
                    listed = storage.call(root_url or url, "ls", name=url, timeout=None, detail=True)
                    found = {info["name"]: info for info in listed}
                else:
                    found = storage.call(root_url or url, "find", name=url, timeout=None, **kwargs)
            except SampleError as exc:  # listing a folder is not about one sample
                if exc.__cause__ is None or classify(exc.__cause__) != NOT_FOUND:
                    raise SourceError(str(exc)) from exc.__cause__
                found = {}  # no such folder: said below
            files = sorted(p for p, info in found.items()
                           if info.get("type") != "directory" and pattern.match(p)
                           and (folder_markers or not is_folder_marker(p)))
            if infos is not None:
                infos.update((_full_url(fs, p, url), found[p]) for p in files)
    if any(not is_folder_marker(p) for p in files):
        return [_full_url(fs, p, url) for p in files]
    # the folder the pattern lists from (a URL without wildcards: that URL), never cut
    # into its "proto://bucket" (s3://bucket named "s3:/" as what does not exist)
    head, sep, rest = url.rpartition("://")
    folder = re.split(r"[*?\[]", rest, maxsplit=1)[0]
    if wild and "/" in folder:
        folder = folder.rsplit("/", 1)[0]
    root = head + sep + folder.rstrip("/") if folder.strip("/") else url
    try:
        exists = bool(storage.call(root, "exists"))
    except SourceError:
        raise
    except Exception:  # only for a better message; the listing itself said nothing matched
        exists = True
    where = f" ({redact(root, storage.options)} does not exist)" if not exists else ""
    brackets = ("; '[' in a path starts a set of characters to match: write '[[]' for a "
                "'[' in a folder's name") if "[" in path else ""
    raise SourceError(f"no file matches {redact(url, storage.options)!r}{where}; check the "
                      f"path, the glob and the bucket{brackets}")

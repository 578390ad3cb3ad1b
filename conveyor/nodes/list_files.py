"""list_files: a sorted, deterministic listing of files as small records.

Globs any fsspec URL (local paths, ``file://``, ``s3://``...), sorts the matches, and
yields ``{"path", "label", "index"}`` records: ``index`` is the file's place in the sorted
listing (a stable sample id), ``label`` the class index when ``label="parent_dir"``
(class folders mapped to 0..K-1 in sorted order, as torchvision's ImageFolder does).
With ``shuffle=True`` the whole listing is permuted every epoch from (seed, epoch): a
global shuffle for free, since the state is only a position.

The state is that position, with the listing's file count and a digest of its paths: a
state restored into a listing that changed since (a file added, removed or renamed) would
repeat or skip files, so it is refused with a ``StateError`` saying what changed.

A listing can be made once and reused: ``conveyor index URL > manifest.json`` writes a
manifest (``write_manifest``: the paths, labels, sizes and ETags, the count and the digest)
that ``ListFiles(manifest=...)`` reads with one GET instead of listing; and ``share``, a hook
that ``graphs/`` fills under torch.distributed, lets rank 0 list and hand the listing to the
other ranks (``share(make)`` returns the listing as plain data, calling ``make`` or not).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
from collections import Counter
from typing import Any, Callable

from torchdata.nodes import BaseNode

from conveyor.errors import SampleError, SourceError, StateError
from conveyor.nodes._rng import derive_seed
from conveyor.storage import Storage, fixed_part, is_folder_marker
from conveyor.nodes.state_shape import Fields, Int, Str

log = logging.getLogger(__name__)

MANIFEST_FORMAT = 1
Share = Callable[[Callable[[], dict]], dict]  # share(make) -> the listing as plain data

LABEL_CHOICES = (None, "parent_dir", "top_dir")
SPLIT_NAMES = frozenset({"train", "val", "valid", "validation", "test", "eval"})  # not class names


def _glob(url: str, storage_options: dict[str, Any] | None,
          infos: dict[str, dict] | None = None) -> tuple[str, list[str]]:
    """The fixed part of ``url`` before its wildcards (``Storage.glob_root``) and the sorted
    matches of ``url`` (a folder: every file below it; object storage's folder markers, which
    end in ``/``, included), listed through ``conveyor.storage``:
    transient errors are retried, a folder that fails to list is an error (fsspec's glob
    silently leaves it out), a missing bucket or an empty match is a ``SourceError`` naming
    the URL."""
    storage = Storage(storage_options=storage_options)
    try:
        pattern = url
        literal, wild = fixed_part(url)
        if not wild and storage.call(literal, "isdir"):
            pattern = url.rstrip("/") + "/**"  # a folder: every file below it
        return storage.glob_root(pattern), storage.glob(pattern, folder_markers=True, infos=infos)
    finally:
        storage.close()


def below(path: str, root: str) -> str | None:
    """The part of ``path`` below the folder ``root`` (``a/b.jpg``), or None outside it."""
    return path[len(root) + 1:] if root and path.startswith(root + "/") else None


def _classes_by(label: str | None, root: str, url: str) -> Callable[[str], str] | None:
    """What names a path's class: its parent folder, or the first folder below ``root``."""
    if label == "parent_dir":
        return lambda p: p.rstrip("/").rsplit("/", 2)[-2]
    if label != "top_dir":
        return None

    def top(p: str) -> str:
        head, slash, _ = (below(p, root) or "").partition("/")
        if not slash:
            raise SourceError(f"list_files: {p!r} is not in a folder below {root!r}, the part of "
                              f"{url!r} before its wildcards: label top_dir takes that folder as the class")
        return head

    return top


def _class_folders(root: str, found: list[str]) -> set[str]:
    """The visible folders right below ``root``: those the listing passed through (on object
    storage an empty one too when it has a folder marker, ``root/<class>/``), and on the local
    disk every one there, empty or not."""
    names = {rel.split("/", 1)[0] for rel in (below(p, root) for p in found) if rel and "/" in rel}
    if os.path.isdir(root):
        names.update(e.name for e in os.scandir(root) if e.is_dir())
    return {n for n in names if not n.startswith(".")}


def number_classes(root: str, names: list[str], found: list[str], who: str = "list_files") -> dict[str, int]:
    """Class numbers as ``ImageFolder`` gives them to ``root/<class>/**``: every visible class
    folder (``_class_folders`` of ``found``, the listing before any filter) in sorted order,
    ``names`` (the classes of the files kept) among them, and a warning naming the folders
    that hold no file kept, whose numbers stay free. ``list_files(label: top_dir)`` and
    ``conveyor pack`` number with this, so shards and folders of one tree agree."""
    folders = set(names) | _class_folders(root, found)
    empty = sorted(folders - set(names))
    if empty:
        log.warning("%s: class folder(s) under %r with no file listed, their labels kept free: %s",
                    who, root, ", ".join(empty[:5]) + (" ..." if len(empty) > 5 else ""))
    return {n: i for i, n in enumerate(sorted(folders))}


def suffixes(extensions: list[str]) -> tuple[str, ...]:
    """``[".JPG", "png"]`` as ``(".jpg", ".png")``: lower case, each with its dot."""
    if isinstance(extensions, str) or not extensions or not all(isinstance(e, str) and e.strip(".")
                                                                for e in extensions):
        raise ValueError(f"{extensions=} must be a non-empty list of file extensions, e.g. ['.jpg', '.png']")
    return tuple("." + e.lower().lstrip(".") for e in extensions)


def _hidden(path: str, root: str) -> bool:
    """Whether the file, or a folder it is in below ``root``, is hidden (``._x.jpg``: macOS's
    resource forks; ``.ipynb_checkpoints/``: Jupyter's copies)."""
    rel = below(path, root) or path.rsplit("/", 1)[-1]
    return any(part.startswith(".") for part in rel.split("/"))


def asks_hidden(url: str) -> bool:
    """Whether a part of ``url`` from its first wildcard on starts with a dot (``root/.*.jsonl``):
    as in the shell and Python's ``glob``, only such a pattern lists hidden names."""
    parts = url.split("/")
    first = next((i for i, part in enumerate(parts) if any(c in part for c in "*?[")), len(parts))
    return any(part.startswith(".") for part in parts[first:])


def _visible(paths: list[str], root: str, url: str) -> list[str]:
    """The paths that are not hidden (``_hidden``); what is left out is named in a warning, or
    in a ``SourceError`` when nothing is left."""
    kept = [p for p in paths if not _hidden(p, root)]
    if len(kept) < len(paths):
        example = min(set(paths) - set(kept))
        if not kept:
            raise SourceError(f"list_files: {len(paths)} files match {url!r} but every one is hidden "
                              f"or in a hidden folder (e.g. {example}); a pattern lists hidden names "
                              "only where it starts with a dot itself (root/.*.jsonl), and a label "
                              "needs visible files")
        log.warning("list_files: %d of the %d files matching %r are left out, hidden or in a hidden "
                    "folder, e.g. %s (as in the shell, a pattern lists hidden names only where it "
                    "starts with a dot itself; labels are for visible files and folders)",
                    len(paths) - len(kept), len(paths), url, example)
    return kept


def with_suffix(paths: list[str], ends: tuple[str, ...] | None, url: str, who: str = "list_files",
                hint: str = "", root: str = "") -> list[str]:
    """The paths whose name ends in one of ``ends`` (lower case; the names in any case; None:
    any extension) and are not hidden (``_hidden``: the file or a folder below ``root``).
    What is left out is named: in a warning, or in a ``SourceError`` when nothing is kept."""
    kept: list[str] = []
    left: Counter = Counter()  # what is left out: "hidden" or the extension
    for p in paths:
        name = p.rstrip("/").rsplit("/", 1)[-1]
        ext = os.path.splitext(name)[1].lower()
        if _hidden(p, root):
            left["hidden"] += 1
        elif name.lower().endswith(ends) if ends is not None else ext:
            kept.append(p)
        else:
            left[ext or "(none)"] += 1
    if not left:
        return kept
    seen = ", ".join(f"{ext} ({n})" for ext, n in left.most_common(5))
    wanted = f"ending in {' '.join(ends)}" if ends is not None else "with an extension"
    if not kept:
        raise SourceError(f"{who}: {len(paths)} files match {url!r} but none is a visible file "
                          f"{wanted} (found: {seen}){hint}")
    log.warning("%s: %d of the %d files matching %r are left out, hidden or not %s (%s)",
                who, len(paths) - len(kept), len(paths), url, wanted, seen)
    return kept


def _digest(paths: list[str]) -> str:
    """A short digest of the listing, over the paths below their common folder (so that the
    same files under another root, e.g. copied to ``s3://``, give the same digest)."""
    first, last = min(paths), max(paths)
    n = next((i for i, (a, b) in enumerate(zip(first, last)) if a != b), len(first))
    common = first[:first.rfind("/", 0, n) + 1]
    names = "\n".join(p[len(common):] for p in paths)
    return hashlib.sha256(names.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def write_manifest(url: str, *, extensions: list[str] | None = None, label: str | None = None,
                   storage_options: dict[str, Any] | None = None) -> dict:
    """A manifest of what ``ListFiles(url=url, extensions=..., label=...)`` lists, as plain
    data (``conveyor index`` writes it as JSON): the sorted paths, their labels, the classes,
    the count and the digest (as a state holds them), and the sizes and ETags the listing
    gave at no extra request (S3: both; the local disk: sizes). One listing is made."""
    node = ListFiles(url=url, extensions=extensions, label=label, storage_options=storage_options)
    infos: dict[str, dict] = {}
    paths, records = node._list(infos)
    sizes = []
    for p in paths:
        size = infos.get(p, {}).get("size")
        if size is None and os.path.isfile(p):
            size = os.path.getsize(p)
        sizes.append(size)
    etags = [str(infos.get(p, {}).get("ETag") or "").strip('"') or None for p in paths]
    out = {"format": MANIFEST_FORMAT, "written_by": "conveyor index", "url": url, "label": label,
           "extensions": list(node.extensions) if node.extensions else None, "count": len(paths),
           "digest": _digest(paths), "classes": node.classes, "paths": paths,
           "labels": [r["label"] for r in records]}
    if any(x is not None for x in sizes):
        out["sizes"] = sizes
    if any(etags):
        out["etags"] = etags
    return out


def read_manifest(manifest: str, storage_options: dict[str, Any] | None = None) -> dict:
    """The listing a manifest holds (``ListFiles.listing()``'s plain data, with ``manifest``
    naming it), read with one request; a manifest that cannot be read, is not one, or does
    not add up is a ``SourceError`` naming it."""
    storage = Storage(storage_options=storage_options)
    again = "; write it with: conveyor index URL > manifest.json"
    try:
        raw = storage.read(manifest)
    except (SourceError, SampleError) as exc:
        raise SourceError(f"manifest {manifest}: cannot read it ({exc}){again}") from exc
    finally:
        storage.close()
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise SourceError(f"manifest {manifest}: not JSON ({exc}){again}") from exc
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT or not isinstance(data.get("paths"), list):
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise SourceError(f"manifest {manifest}: not a conveyor manifest of format {MANIFEST_FORMAT} "
                          f"(format: {got!r}){again}")
    paths = data["paths"]
    n = len(paths)
    lists = {k: data.get(k) for k in ("labels", "sizes", "etags") if data.get(k) is not None}
    bad = [k for k, v in lists.items() if not isinstance(v, list) or len(v) != n]
    if not paths or data.get("count") != n or bad or "labels" not in lists:
        raise SourceError(f"manifest {manifest}: says {data.get('count')!r} files, holds {n} paths"
                          + (f" and other numbers of {', '.join(bad)}" if bad else "")
                          + f": it was cut short or edited; re-run conveyor index")
    return {"paths": paths, "labels": lists["labels"], "classes": data.get("classes") or [],
            "sizes": lists.get("sizes"), "etags": lists.get("etags"), "digest": data.get("digest"),
            "manifest": manifest}


def changed_since_manifest(record: dict, size: int | None, etag: str | None, gone: bool = False) -> str | None:
    """What a reader found of a record listed by a manifest (``ListFiles(manifest=...)``) that
    no longer matches it (gone, another size or ETag), as the text of an error naming the
    manifest and the object; None when the record is not from a manifest or still matches."""
    manifest = record.get("manifest")
    if not manifest:
        return None
    if gone:
        what = "is gone"
    elif record.get("size") is not None and size is not None and size != record["size"]:
        what = f"is {size} bytes, the manifest says {record['size']}"
    elif record.get("etag") and etag and etag.strip('"') != record["etag"]:
        what = f"has ETag {etag.strip(chr(34))}, the manifest says {record['etag']}"
    else:
        return None
    return (f"{record.get('path')}, listed in the manifest {manifest}, {what}: the data changed "
            "since the manifest was written; re-run conveyor index to write it again")


class ListFiles(BaseNode[dict]):
    """Yield one record per file matched by ``url``, sorted by path.

    Args:
        url: a glob, e.g. ``data/train/*/*.JPEG`` or ``s3://bucket/train/*/*.JPEG``; a folder
            without a glob lists every file below it.
        extensions: keep only the matches whose name ends in one of these, in any case
            (``[".jpg", ".jpeg", ".png"]`` takes ``a.JPG`` and ``b.jpeg``), as torchvision's
            ``ImageFolder`` does, and not hidden (a ``.`` name, or in a ``.`` folder below the
            url's fixed part); what is left out is named in a warning. None keeps every match.
        label: ``None``; ``"parent_dir"`` (class index from the parent folder's name); or
            ``"top_dir"`` (from the first folder below the url's part before its wildcards, as
            ``ImageFolder`` numbers ``root/<class>/**``: images in subfolders of a class folder
            are that class's, and every visible class folder has its number, listed files or
            not, with a warning: train and val agree when a val folder is empty). With a
            label, hidden files and folders are always left out: a ``.ipynb_checkpoints``
            folder is no class. Without one, they are left out (with a warning) unless a part
            of the pattern from its first wildcard on starts with a dot (``root/.*.jsonl``), as
            in the shell: macOS's ``._a.jsonl`` beside ``a.jsonl`` is no data.
        shuffle: permute the listing each epoch, seeded by (seed, epoch).
        seed: the shuffle's seed.
        storage_options: passed to fsspec (endpoint, credentials); never logged.
        where: text for error notes (the node and spec line): a listing that fails (no such
            bucket, no credentials, nothing matches) names the node it was for.

        manifest: instead of ``url``, a manifest written by ``conveyor index`` (a path or a
            URL), read with one request: its records also carry ``size``, ``etag`` (where
            the listing gave them) and ``manifest``, so that readers can tell an object that
            changed since from the one indexed.
        share: ``share(make) -> listing``: who makes the listing (``make()``, the plain data
            of ``listing()``) and hands it on; None lists here. ``graphs/`` gives one under
            torch.distributed (rank 0 lists, the others read it from the store).

    Example:
        >>> node = ListFiles(url="examples/data/numbers/*.txt")
        >>> next(node)["index"]
        0
    """

    POS_KEY = "pos"
    COUNT_KEY = "count"
    DIGEST_KEY = "digest"
    STATE_SHAPE = Fields({POS_KEY: Int(at_most=COUNT_KEY), COUNT_KEY: Int(), DIGEST_KEY: Str()},
                         optional=(COUNT_KEY, DIGEST_KEY))
    OP, UNIT, NAMES = "list_files", "file", "paths"  # how messages name the op and its items
    SHAREABLE = True  # its listing may be made elsewhere (rank 0, the copies' parent) and handed on

    def __init__(self, *, url: str | None = None, label: str | None = None, shuffle: bool = False,
                 seed: int = 0, storage_options: dict[str, Any] | None = None,
                 extensions: list[str] | None = None, where: str | None = None,
                 manifest: str | None = None, share: Share | None = None):
        super().__init__()
        if label not in LABEL_CHOICES:
            raise ValueError(f"{label=} must be one of {LABEL_CHOICES}")
        if (url is None) == (manifest is None):
            raise ValueError(f"give url or manifest, one of them (got {url=}, {manifest=})")
        if manifest is not None and (label is not None or extensions is not None):
            raise ValueError(f"a manifest ({manifest!r}) holds its labels and was filtered when written: "
                             f"give label and extensions to conveyor index, not with manifest (got "
                             f"{label=}, {extensions=})")
        if share is not None and not callable(share):
            raise ValueError(f"{share=} must be a callable share(make) -> listing, or None")
        self.url = url if url is not None else manifest
        self.manifest = manifest
        self.share = share
        self.extensions = None if extensions is None else suffixes(extensions)
        self.label = label
        self.shuffle = shuffle
        self.seed = seed
        self.storage_options = storage_options
        self.where = where
        self.epoch = 0
        self._records: list[dict] | None = None
        self._order: list[int] = []
        self._pos = 0
        self._digest = ""

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def records(self) -> list[dict]:
        """The listing (made once, then kept: a listing of object storage costs requests;
        with ``share``, made by whoever ``share`` says and handed to the others)."""
        if self._records is None:
            try:
                listing = self.share(self.listing) if self.share is not None else self.listing()
                self._adopt(listing)
            except SourceError as exc:
                if self.where:
                    exc.add_note(f"in {self.where}")
                raise
        return self._records  # type: ignore[return-value]

    def listing(self) -> dict:
        """The listing as plain data (JSON): ``{"paths", "labels", "classes"}`` and, from a
        manifest, ``sizes``, ``etags`` and ``manifest``. Lists (or reads the manifest) each call."""
        if self.manifest is not None:
            return read_manifest(self.manifest, self.storage_options)
        names, records = self._list()
        out = {"paths": names, "labels": [r.get("label", -1) for r in records], "classes": self.classes}
        if type(self)._list is not ListFiles._list:  # a listing of other records (list_lmdb's)
            out["records"] = records
        return out

    def _adopt(self, listing: dict) -> None:
        """Take ``listing`` (``listing()``'s plain data, perhaps made by another rank)."""
        paths, labels = listing["paths"], listing["labels"]
        if not paths or ("records" not in listing and len(labels) != len(paths)):
            raise SourceError(f"{self.OP} {self.url!r}: a listing of {len(paths)} paths with "
                              f"{len(labels)} labels")
        self.classes = list(listing.get("classes", []))
        self._digest = _digest(paths)
        extra = [k for k in ("size", "etag") if listing.get(k + "s")]
        self._records = listing.get("records") or [{"path": p, "label": labels[i], "index": i}
                                                   for i, p in enumerate(paths)]
        if listing.get("manifest"):
            if listing.get("digest") not in (None, self._digest):
                raise SourceError(f"manifest {listing['manifest']}: its digest {listing['digest']} is not "
                                  f"that of its paths ({self._digest}): the file was edited or cut short; "
                                  "re-run conveyor index")
            for k in extra:
                for r, v in zip(self._records, listing[k + "s"]):
                    r[k] = v
            for r in self._records:
                r["manifest"] = listing["manifest"]

    def _list(self, infos: dict[str, dict] | None = None) -> tuple[list[str], list[dict]]:
        """(the sorted paths, their records); sets ``classes``; ``infos`` as ``Storage.glob``'s."""
        root, found = _glob(self.url, self.storage_options, infos)
        paths = [p for p in found if not is_folder_marker(p)]  # markers: only for the class census
        if not paths:
            raise SourceError(f"list_files: no file matches {self.url!r} (check the path and the glob)")
        if self.extensions is not None:
            paths = with_suffix(paths, self.extensions, self.url, hint="; set extensions to take them",
                                root=root)
        elif self.label is not None or not asks_hidden(self.url):
            # macOS's ._a.jsonl and a .ipynb_checkpoints folder are no data (and no class)
            paths = _visible(paths, root, self.url)
        class_of = _classes_by(self.label, root, self.url)
        names = [class_of(p) for p in paths] if class_of else []
        if self.label == "top_dir":  # numbered as ImageFolder numbers them, listed files or not
            classes = number_classes(root, names, found)
        else:
            classes = {n: i for i, n in enumerate(sorted(set(names)))}
        records = [{"path": p, "label": classes[names[i]] if names else -1, "index": i}
                   for i, p in enumerate(paths)]
        self.classes = sorted(classes, key=classes.__getitem__)
        splits = sorted(c for c in classes if c.lower() in SPLIT_NAMES)
        if splits:  # root/train/<class>/x.jpg listed as root/*/**: the splits became the classes
            log.warning("%s: the classes found under %r include %s, which look like split names, not "
                        "classes: the root is probably one level too high (point it at %s)",
                        self.where or "list_files", root, ", ".join(repr(c) for c in splits),
                        f"{root.rstrip('/')}/{splits[0]}")
        log.debug("list_files: %d files, %d classes", len(paths), len(classes))
        return paths, records

    def count(self) -> int:
        """Items per epoch (known from the listing, without reading any file)."""
        return len(self.records())

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        n = len(self.records())
        self._order = list(range(n))
        if self.shuffle:
            random.Random(derive_seed(self.seed, self.epoch)).shuffle(self._order)
        self._pos = 0
        if initial_state is not None:
            self._check(initial_state, n)
            self._pos = initial_state[self.POS_KEY]

    def _check(self, state: dict, n: int) -> None:
        """Refuse a state whose position does not fit this listing any more."""
        count, digest, pos = state.get(self.COUNT_KEY), state.get(self.DIGEST_KEY), state[self.POS_KEY]
        me, unit = f"{self.OP} {self.url!r}", self.UNIT
        if count is not None and count != n:
            raise StateError(f"{me}: the state was taken over {count} {unit}s, the "
                             f"listing now has {n} ({'added' if n > count else 'removed'}: "
                             f"{abs(n - count)}); resuming at {unit} {pos} would repeat or skip {unit}s")
        if digest is not None and digest != self._digest:
            raise StateError(f"{me}: the listing changed since the state was taken "
                             f"(same count, {n}, but other {self.NAMES}: a {unit} was renamed or replaced); "
                             f"resuming at {unit} {pos} would repeat or skip {unit}s")
        if not isinstance(pos, int) or not 0 <= pos <= n:
            raise StateError(f"{me}: the state is at {unit} {pos!r}, "
                             f"the listing has {n} {unit}s")

    def next(self) -> dict:
        if self._pos >= len(self._order):
            raise StopIteration
        record = self._records[self._order[self._pos]]  # type: ignore[index]
        self._pos += 1
        return dict(record)

    def get_state(self) -> dict:
        return {self.POS_KEY: self._pos, self.COUNT_KEY: len(self._order),
                self.DIGEST_KEY: self._digest}

    @classmethod
    def listings_in(cls, state: Any) -> list[tuple[int, str]]:
        """(count, digest) of every listing whose state is in ``state`` (a graph's, nested:
        worker copies' too), in the order found."""
        keys = {cls.POS_KEY, cls.COUNT_KEY, cls.DIGEST_KEY}
        found, todo = [], [state]
        while todo:
            x = todo.pop()
            if isinstance(x, dict):
                if set(x) == keys and isinstance(x[cls.COUNT_KEY], int):
                    if x[cls.DIGEST_KEY]:  # "" before the listing is made
                        found.append((x[cls.COUNT_KEY], x[cls.DIGEST_KEY]))
                else:
                    todo.extend(reversed(list(x.values())))
            elif isinstance(x, list):
                todo.extend(reversed(x))
        return found

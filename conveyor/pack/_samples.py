"""What ``conveyor pack`` packs: the samples of an ImageNet-layout folder, and their bytes read
in order with many reads in flight. Both writers (tar shards, LMDB) take them from here.

``SRC`` is ``<class>/**/<image>`` (local or any fsspec URL): every visible file with an
extension, or with ``extensions`` only those (any case), a warning naming what is left out;
classes are the visible folder names in sorted order, numbered from 0 as
``list_files(label: top_dir)`` and torchvision's ``ImageFolder`` number them (a class folder
with nothing to pack keeps its number, with a warning, so that the labels agree with the same
tree read as a folder). A sample's key is the path below ``SRC`` up to the name's first dot
(``<class>/<name>``: WebDataset's rule; names need only be unique within a folder).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Iterator

from conveyor.errors import ConveyorError
from conveyor.nodes import below, number_classes, suffixes, with_suffix
from conveyor.storage import Storage, is_folder_marker, redact

_EXT = {"jpeg": "jpg", "jpg": "jpg"}


@dataclass(frozen=True)
class Sample:
    """One image to pack: where it is, its key (``<class>/<stem>``), extension and class number."""

    url: str
    key: str
    ext: str
    label: int


def join_url(root: str, name: str) -> str:
    return root.rstrip("/") + "/" + name


def list_samples(storage: Storage, src: str,
                 extensions: list[str] | None = None) -> tuple[list[Sample], list[str]]:
    """The files under ``src/<class>/`` (subfolders included, as ``ImageFolder`` takes them)
    with one of ``extensions`` (None: any), in sorted order, and the sorted class names."""
    pattern = join_url(src, "*/**")
    ends = None if extensions is None else suffixes(extensions)
    root = storage.glob_root(pattern)
    found = storage.glob(pattern, folder_markers=True)  # markers: only for the class census
    files = with_suffix([u for u in found if not is_folder_marker(u)], ends, redact(pattern), who="pack", root=root)
    rel = [below(u, root) for u in files]  # <class>/.../<name>.<ext>
    # every class folder numbered, empty or not, as list_files(label: top_dir) numbers them:
    # shards of train/ and a val/ folder read with list_files must give one class one label
    number = number_classes(root, [r.split("/", 1)[0] for r in rel], found, who="pack")
    classes = sorted(number, key=number.__getitem__)
    samples, seen = [], {}
    for url, path in zip(files, rel):
        folder, _, base = path.rpartition("/")
        stem, _, ext = base.partition(".")  # with_suffix kept only names with an extension
        # the key is the path below SRC up to the name's first dot (WebDataset's rule), so that
        # 0001.jpg in every class folder (Caltech-101's layout) gives samples of their own
        key = f"{folder}/{stem}"
        if key in seen:
            raise ConveyorError(f"pack: {redact(url)} and {redact(seen[key])} would share the key "
                                f"{key!r}; file names in a folder (before the first dot) must be unique")
        seen[key] = url
        ext = ext.rsplit(".", 1)[-1].lower()
        samples.append(Sample(url, key, _EXT.get(ext, ext), number[path.split("/", 1)[0]]))
    return samples, classes


def ordered_reads(storage: Storage, samples: list[Sample], concurrency: int) -> Iterator[tuple[Sample, bytes]]:
    """``(sample, bytes)`` in order, ``concurrency`` reads in flight."""
    window: collections.deque = collections.deque()
    it = iter(samples)
    while True:
        while len(window) < concurrency:
            s = next(it, None)
            if s is None:
                break
            window.append((s, storage.submit(s.url)))
        if not window:
            return
        s, fut = window.popleft()
        yield s, fut.result()


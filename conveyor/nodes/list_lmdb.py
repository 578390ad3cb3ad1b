"""list_lmdb: the keys of an LMDB environment, in key order, as small records.

Like ``list_files`` for a folder: the keys (all, those under a ``prefix``, or those in the
range ``start <= key < stop``) are listed once, with LMDB's cursor and no values, and each
becomes ``{"lmdb": path, "key", "label", "index"}``; ``index`` is the key's place in the
listing (a stable sample id) and ``label`` the class index of the key's parent "folder" when
``label="parent_dir"`` (keys written as ``class/name``, as ``conveyor pack --format lmdb``
writes them; classes numbered in sorted order). With ``shuffle=True`` the listing is
permuted every epoch from (seed, epoch). Values are read by ``read_lmdb`` after ``shard`` and
``shuffle_buffer``, so a rank reads only its own share.

It is a ``ListFiles`` whose listing comes from LMDB, so its state and checks are list_files':
a position, the listing's length and a digest of its keys; a restore against an environment
whose keys changed is a ``StateError``, not a silent repeat or loss.
"""

from __future__ import annotations

from conveyor.errors import SourceError
from conveyor.nodes._lmdb import key_text, open_env
from conveyor.nodes.list_files import ListFiles


def _parent(key: str | bytes) -> str:
    text = key if isinstance(key, str) else key.decode("utf-8", "replace")
    parts = text.rstrip("/").rsplit("/", 2)
    return parts[-2] if len(parts) > 1 else ""


class ListLmdb(ListFiles):
    """Yield one record per key of the environment at ``path``, in key order.

    Args:
        path: the environment's folder (or its data file), on local disk.
        prefix: only keys starting with it.
        start: the first key (inclusive).
        stop: the key to stop before (exclusive).
        label: ``None`` or ``"parent_dir"``.
        shuffle: permute the listing each epoch, seeded by (seed, epoch).
        seed: the shuffle's seed.

    Example:
        >>> node = ListLmdb(path="/data/imagenet.lmdb", label="parent_dir")   # doctest: +SKIP
        >>> next(node)
        {'lmdb': '/data/imagenet.lmdb', 'key': 'n01440764/x.JPEG', 'label': 0, 'index': 0}
    """

    OP, UNIT, NAMES = "list_lmdb", "key", "keys"
    SHAREABLE = False  # a cursor over a local file: no requests to save, each copy reads its own

    def __init__(self, *, path: str, prefix: str | None = None, start: str | None = None,
                 stop: str | None = None, label: str | None = None, shuffle: bool = False, seed: int = 0):
        if label == "top_dir":
            raise ValueError(f"{label=}: list_lmdb takes None or 'parent_dir'")
        if start is not None and stop is not None and start >= stop:
            raise ValueError(f"{start=} must come before {stop=}")
        super().__init__(url=path, label=label, shuffle=shuffle, seed=seed)
        self.path, self.prefix, self.start, self.stop = path, prefix, start, stop

    def _list(self) -> tuple[list[str], list[dict]]:
        """(the keys as text, their records), read with a cursor and no values; sets ``classes``."""
        keys = []
        prefix = self.prefix.encode() if self.prefix else b""
        first = max(prefix, self.start.encode()) if self.start else prefix
        stop = self.stop.encode() if self.stop is not None else None
        with open_env(self.path).begin(buffers=False) as txn:
            cur = txn.cursor()
            found = cur.set_range(first) if first else cur.first()
            if found:
                for key in cur.iternext(keys=True, values=False):
                    if (prefix and not key.startswith(prefix)) or (stop is not None and key >= stop):
                        break
                    keys.append(key)
        if not keys:
            what = " and ".join(x for x in (f"prefix {self.prefix!r}" if self.prefix else "",
                                            f"range [{self.start!r}, {self.stop!r})"
                                            if self.start or self.stop else "") if x) or "any key"
            raise SourceError(f"list_lmdb: {self.path!r} has no key matching {what}")
        texts = [key_text(k) for k in keys]
        classes: dict[str, int] = {}
        if self.label == "parent_dir":
            classes = {n: i for i, n in enumerate(sorted({_parent(k) for k in texts}))}
        records = [{"lmdb": self.path, "key": k, "label": classes[_parent(k)] if classes else -1, "index": i}
                   for i, k in enumerate(texts)]
        self.classes = sorted(classes, key=classes.__getitem__)
        return [k if isinstance(k, str) else k.decode("utf-8", "surrogateescape") for k in texts], records

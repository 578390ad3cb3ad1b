"""``conveyor pack SRC DST --format lmdb``: write an ImageNet-layout folder into one LMDB.

Each image is stored under the key ``<class>/<file name>`` with the file's bytes as they are,
in sorted order, so ``list_lmdb(label: parent_dir)`` numbers the classes as ``list_files``
and torchvision's ``ImageFolder`` do, and ``read_lmdb`` gives ``{"bytes", "label", ...}`` for
``conveyor.image``'s functions. The environment holds the images only: its key count is the
sample count.

The environment is written to ``DST.tmp-<pid>`` next to ``DST`` and renamed when complete,
so a half-written one never stands under ``DST``. LMDB is read from local disk only; ``DST``
must be a local folder (``SRC`` may be any fsspec URL).
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from conveyor.errors import ConveyorError
from conveyor.pack._samples import list_samples, ordered_reads
from conveyor.storage import RetryPolicy, Storage, is_local, redact

COMMIT_EVERY = 512  # images per write transaction


def _key(sample: Any, name: str, cls: str) -> bytes:
    """``<class>/<name>``: one level, so that list_lmdb's parent_dir is the class; an image in
    a subfolder of its class folder is ``<class>/<sub>_<name>``."""
    inner = sample.key.split("/")[1:-1]  # the subfolders below the class folder
    return "/".join((cls, "_".join((*inner, name)))).encode("utf-8")


def pack_lmdb(src: str, dst: str, *, concurrency: int = 16, overwrite: bool = False,
              retry: RetryPolicy | None = None, transform: Any = None,
              extensions: list[str] | None = None) -> dict[str, Any]:
    """Write ``src/<class>/<image>`` into an LMDB environment at ``dst``.

    Args:
        src: ImageNet-layout folder, local or any fsspec URL.
        dst: the environment's folder, local.
        concurrency: source reads in flight.
        overwrite: replace an environment already at ``dst``.
        retry: the retry policy of the reads of ``src`` (default: ``RetryPolicy()``).
        transform: ``transform(bytes, name) -> bytes`` applied to each image (a resize).
        extensions: pack only files ending in one of these, any case (None: any extension).

    Returns:
        ``{"samples", "bytes", "classes", "path"}``.

    Raises:
        ConveyorError: ``dst`` is not local, exists (without ``overwrite``), or ``src`` has no image.
    """
    from conveyor.nodes import lmdb_module

    lmdb = lmdb_module()
    if not is_local(dst):
        raise ConveyorError(f"pack --format lmdb writes to local disk only, got {redact(dst)}")
    dst = dst.removeprefix("file://")
    if os.path.exists(dst) and not overwrite:
        raise ConveyorError(f"pack: {dst} exists; pass --overwrite to replace it")
    storage = Storage(policy=retry)  # reads SRC
    try:
        samples, classes = list_samples(storage, src, extensions)
        if not samples:
            raise ConveyorError(f"pack: no images under {redact(src)}/<class>/")
        sizes = [storage.call(s.url, "size") for s in samples]
        tmp = f"{dst.rstrip('/')}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        env = lmdb.open(tmp, map_size=max(1 << 26, int(sum(sizes) * 1.5) + (len(samples) << 12)),
                        subdir=True, metasync=False, sync=False)
        total = 0
        try:
            txn = env.begin(write=True)
            for i, (s, data) in enumerate(ordered_reads(storage, samples, concurrency)):
                name = s.url.rsplit("/", 1)[-1]
                if transform is not None:
                    data = transform(data, name)
                key = _key(s, name, classes[s.label])
                if not txn.put(key, data, overwrite=False):
                    raise ConveyorError(f"pack: {redact(s.url)} would be stored under the key "
                                        f"{key.decode()!r} of another image")
                total += len(data)
                if (i + 1) % COMMIT_EVERY == 0:
                    txn.commit()
                    txn = env.begin(write=True)
            txn.commit()
            env.sync(True)
        finally:
            env.close()
        if os.path.exists(dst):
            shutil.rmtree(dst)
        os.replace(tmp, dst)
        return {"samples": len(samples), "bytes": total, "classes": classes, "path": dst}
    finally:
        storage.close()

"""Bring your own Dataset: open it once per process, and read its items in map workers.

``op: dataset`` (``conveyor/nodes/dataset.py``) turns a map-style dataset (anything with
``__len__`` and ``__getitem__``: a torch ``Dataset``, a Hugging Face ``datasets.Dataset``, a
list) into a stream of small index records, ``{"index": i, "dataset": handle}``, that are
shuffled, sampled and sharded like listed files. The items themselves are read by a map:

```yaml
nodes:
  samples: {op: dataset, dataset: mypkg.data:Cifar, args: {root: "${spec_dir}/cifar"}, sampler: shuffle}
  shard:   {op: shard}
  load:    {op: map, fn: conveyor.dataset:getitem, workers: 4}    # __getitem__ in 4 threads
  batch:   {op: batch, size: 64}
  collate: {op: collate}
```

so ``__getitem__`` runs in the map's workers (threads, or processes with ``method: process``),
never serially in one thread, and follows the map's ``on_error``. The handle in each record is
small (the ``module:attr`` and its ``args``): a process that has not opened the dataset yet
opens it on first use, once, and keeps it (``open_dataset``).
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

from conveyor._refs import resolve_attr
from conveyor.errors import SampleError

log = logging.getLogger(__name__)

_OPEN: dict[str, Any] = {}  # key -> dataset, one per process
_LOCK = threading.Lock()


def _key(ref: str, args: dict[str, Any]) -> str:
    return ref + json.dumps(args, sort_keys=True, default=repr)


def open_dataset(ref: str, args: dict[str, Any] | None = None) -> Any:
    """The dataset ``ref(**args)`` (``ref`` is ``module:attr``, a class or a factory; a
    non-callable attribute is used as it is), made once per process and then reused.

    Raises:
        ValueError: ``ref`` cannot be imported, or calling it failed (with why).
    """
    args = dict(args or {})
    key = _key(ref, args)
    with _LOCK:
        if key in _OPEN:
            return _OPEN[key]
        target = resolve_attr(ref)
        if callable(target) and not _is_dataset(target):
            try:
                dataset = target(**args)
            except Exception as exc:
                raise ValueError(f"{ref}(**{args!r}) failed: {type(exc).__name__}: {exc}") from exc
        elif args:
            raise ValueError(f"{ref!r} is a {type(target).__name__}, not a class or factory: it takes no args")
        else:
            dataset = target
        _OPEN[key] = dataset
        return dataset


def _is_dataset(obj: Any) -> bool:
    """An instance that is already a dataset (not a class): has ``__len__`` and ``__getitem__``."""
    return not isinstance(obj, type) and hasattr(obj, "__len__") and hasattr(obj, "__getitem__")


def check_dataset(dataset: Any, ref: str) -> str | None:
    """Why ``dataset`` cannot be read by index, or ``None`` when it can."""
    missing = [m for m in ("__len__", "__getitem__") if not hasattr(dataset, m)]
    if missing:
        return (f"{ref} gave an object of type {type(dataset).__name__}, which has no "
                f"{' or '.join(missing)}: op: dataset reads map-style datasets (for a stream, use op: iterable)")
    try:
        n = len(dataset)
    except Exception as exc:
        return f"len() of {ref}'s dataset failed: {type(exc).__name__}: {exc}"
    if n == 0:
        return f"{ref}'s dataset is empty (len() is 0)"
    return None


class DatasetHandle:
    """What a record carries to name its dataset: ``module:attr`` and its ``args``, or (built
    in Python, without a spec) the dataset object itself, which then travels by pickling.

    Args:
        ref: ``module:attr`` of the dataset, its class or its factory.
        args: keyword arguments for the class or factory.
        obj: a dataset object instead of ``ref``.

    Example:
        >>> DatasetHandle(obj=[10, 20, 30]).get()[1]
        20
    """

    __slots__ = ("ref", "args", "obj")

    def __init__(self, ref: str | None = None, args: dict[str, Any] | None = None, *, obj: Any = None):
        if (ref is None) == (obj is None):
            raise ValueError("give a dataset's ref ('module:attr') or the dataset object, not both")
        self.ref = ref
        self.args = dict(args or {})
        self.obj = obj

    def get(self) -> Any:
        """The dataset, opened in this process on first use."""
        return self.obj if self.obj is not None else open_dataset(self.ref, self.args)  # type: ignore[arg-type]

    def __getstate__(self) -> tuple:
        return self.ref, self.args, self.obj

    def __setstate__(self, state: tuple) -> None:
        self.ref, self.args, self.obj = state

    def __repr__(self) -> str:
        return f"DatasetHandle({self.ref or type(self.obj).__name__})"


def getitem(record: dict[str, Any]) -> Any:
    """``dataset[record["index"]]`` for a record of ``op: dataset``: the map fn that reads items.

    A dict item keeps the record's ``index`` (unless it has a field of that name itself), as
    every other source's records do: the batch says which items it holds, and an error about a
    sample names it. An item of another type (a tuple, a tensor) is returned as it is.
    An error in ``__getitem__`` keeps its type and gains a note naming the dataset and index,
    so the map's ``on_error`` applies to it (raise, or skip and count).

    Example:
        >>> getitem({"index": 2, "dataset": DatasetHandle(obj="abc")})
        'c'
        >>> getitem({"index": 1, "dataset": DatasetHandle(obj=[{"x": 5}, {"x": 6}])})
        {'x': 6, 'index': 1}
    """
    handle = record.get("dataset") if isinstance(record, dict) else None
    if not isinstance(handle, DatasetHandle):
        raise SampleError("conveyor.dataset:getitem reads the records of op: dataset ({'index', "
                          f"'dataset'}}), got {type(record).__name__}: put it after an op: dataset node")
    index = record["index"]
    try:
        item = handle.get()[index]
    except Exception as exc:
        exc.add_note(f"reading item {index} of {handle.ref or type(handle.obj).__name__}")
        raise
    if isinstance(item, dict) and "index" not in item:
        item = {**item, "index": index}
    return item

"""Bring-your-own-data ops as the compiler sees them: ``dataset`` and ``iterable``.

``iterable`` is not made when the spec is checked (a stream may open connections): its
``module:attr`` must import, and ``args`` must bind to the factory's signature.

``dataset`` opens a map-style dataset when the spec is checked (once per process: the build
reuses it), so a dataset that cannot be made, has no ``__len__``/``__getitem__``, or weights
that do not fit it (wrong length, negative, NaN, all zero) are spec errors with the spec's
file:line, not failures at the first batch.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import Any

from torchdata.nodes import BaseNode

from conveyor.dataset import DatasetHandle, check_dataset, open_dataset
from conveyor.graphs.fn_check import at_param, bind_problems
from conveyor.graphs.opspec import listed_count
from conveyor.graphs.ops import BuildContext
from conveyor.graphs.registry import OpSpec, param, resolve_attr
from conveyor.nodes import DatasetSampler, IterableSource, Synthetic, bad_weight


class Sampler(str, enum.Enum):
    sequential = "sequential"
    shuffle = "shuffle"
    weighted = "weighted"


@dataclass(frozen=True)
class DatasetParams:
    dataset: str = param(doc="module:attr: a Dataset class or factory (called once per process with "
                             "args), or a dataset object; anything with __len__ and __getitem__")
    args: dict = param(factory=dict, doc="keyword arguments for the class or factory")
    sampler: Sampler = param(Sampler.sequential, doc="sequential | shuffle (per epoch, from seed) | "
                                                     "weighted (per-item weights)")
    weights: list[float] | str | None = param(None, doc="sampler: weighted: one weight >= 0 per item, or "
                                                        "module:attr of fn(dataset) -> weights")
    num_samples: int | None = param(None, min=1, doc="indexes drawn per epoch (default: the dataset's length)")
    replacement: bool = param(True, doc="weighted: draw with replacement (WeightedRandomSampler's rule)")
    seed: int | None = param(None, doc="the sampler's seed (default: the graph's seed)")


def _weights(p: DatasetParams, dataset: Any) -> list[float] | None:
    """The weights as a list of floats (``weights: module:attr`` is called with the dataset)."""
    if p.weights is None or isinstance(p.weights, list):
        return p.weights
    source = resolve_attr(p.weights)
    value = source(dataset) if callable(source) else source
    if hasattr(value, "tolist"):  # a tensor or an array
        value = value.tolist()
    return [float(w) if isinstance(w, (int, float)) and not isinstance(w, bool) else w for w in value]


def _check_dataset(p: DatasetParams, n_inputs: int) -> list[tuple[Any, str]]:
    errors: list[tuple[Any, str]] = []
    try:
        target = resolve_attr(p.dataset)
    except ValueError as exc:
        return [("dataset", str(exc))]
    if isinstance(target, type) or (callable(target) and not hasattr(target, "__getitem__")):
        errors += at_param("args", bind_problems(target, p.args, item=False, what=p.dataset))
        if errors:
            return errors
    try:
        dataset = open_dataset(p.dataset, p.args)
    except ValueError as exc:
        return [("dataset", str(exc))]
    problem = check_dataset(dataset, p.dataset)
    if problem:
        return [("dataset", problem)]
    n = len(dataset)
    if (p.weights is not None) != (p.sampler is Sampler.weighted):
        which = "weights" if p.weights is not None else "sampler"
        return [(which, "weights go with sampler: weighted, and it needs them")]
    if p.weights is None:
        return []
    try:
        weights = _weights(p, dataset)
    except Exception as exc:
        return [("weights", f"{p.weights}: {type(exc).__name__}: {exc}")]
    found = bad_weight(weights, n)  # type: ignore[arg-type]
    if found is not None:
        index, problem = found
        at = ("weights", index) if index is not None and isinstance(p.weights, list) else "weights"
        return [(at, problem)]
    positive = sum(1 for w in weights if w > 0)  # type: ignore[union-attr]
    if not p.replacement and (p.num_samples or n) > positive:
        return [("num_samples", f"{p.num_samples or n} draws without replacement need as many items "
                                f"of weight > 0; there are {positive}")]
    return []


def _build_dataset(p: DatasetParams, inputs: list[BaseNode], ctx: BuildContext) -> BaseNode:
    handle = DatasetHandle(p.dataset, p.args)
    return DatasetSampler(handle, sampler=p.sampler.value, seed=ctx.seed_for(p.seed),
                          weights=_weights(p, handle.get()), num_samples=p.num_samples,
                          replacement=p.replacement)


DATASET = OpSpec("dataset", DatasetParams, _build_dataset, "none",
                 "indexes of a map-style Dataset (torch, Hugging Face, any __len__/__getitem__), "
                 "sampled per epoch; read them with map fn: conveyor.dataset:getitem; a global order (elastic "
                 "above a shard)", _check_dataset, length=listed_count,
                 items_in='',
                 items_out="{index, dataset} per draw; map fn conveyor.dataset:getitem turns it into "
                           "dataset[index]",
                 example='samples: {op: dataset, dataset: mypkg.data:Cifar, args: {root: "${spec_dir}/cifar"}, '
                         "sampler: shuffle}")


@dataclass(frozen=True)
class IterableParams:
    iterable: str = param(doc="module:attr: an IterableDataset class, a factory returning any iterable "
                              "(a generator function is called each epoch), or an iterable object")
    args: dict = param(factory=dict, doc="keyword arguments for the class or factory")


def _make_iterable(ref: str, args: dict[str, Any]) -> Any:
    target = resolve_attr(ref)
    return target(**args) if callable(target) and not hasattr(target, "__iter__") or isinstance(target, type) \
        else target


def _check_iterable(p: IterableParams, n_inputs: int) -> list[tuple[str, str]]:
    try:
        target = resolve_attr(p.iterable)
    except ValueError as exc:
        return [("iterable", str(exc))]
    if isinstance(target, type) or (callable(target) and not hasattr(target, "__iter__")):
        return at_param("args", bind_problems(target, p.args, item=False, what=p.iterable))
    if not hasattr(target, "__iter__"):
        return [("iterable", f"{p.iterable} is an object of type {type(target).__name__}: neither iterable "
                             "nor a class or factory")]
    if p.args:
        return [("args", f"{p.iterable} is an iterable object, not a class or factory: it takes no args")]
    return []


def _build_iterable(p: IterableParams, inputs: list[BaseNode], ctx: BuildContext) -> BaseNode:
    return IterableSource(functools.partial(_make_iterable, p.iterable, p.args), name=p.iterable,
                          where=ctx.where)


ITERABLE = OpSpec("iterable", IterableParams, _build_iterable, "none",
                  "items of an IterableDataset (torch, Hugging Face) or any iterable; resumed through its "
                  "state_dict when it has one, else by re-reading and skipping; not elastic (no positions to "
                  "deal again)", _check_iterable, length=listed_count,
                  unknown_length="wraps an iterable that has no len()", shards_itself=True,
                  not_global="an iterable has no positions: nothing says it yields the same items in the same "
                             "order again (it may shard itself by rank)",
                  items_in='', items_out="the iterable's items, as it yields them",
                  example='stream: {op: iterable, iterable: mypkg.data:make_stream, args: {split: train}}')


class SyntheticDtype(str, enum.Enum):
    uint8 = "uint8"
    float32 = "float32"


@dataclass(frozen=True)
class SyntheticParams:
    count: int = param(1000, min=1, max=2 ** 48, doc="records per epoch")
    shape: list[int] = param(factory=lambda: [3, 224, 224], doc="the image's [C, H, W]")
    classes: int = param(1000, min=1, doc="labels are 0 .. classes-1")
    dtype: SyntheticDtype = param(SyntheticDtype.uint8, doc="uint8 (0..255, as decoded) | float32 "
                                                            "(standard normal, as normalised)")
    seed: int | None = param(None, doc="pixels and labels derive from it and the index (default: the "
                                       "graph's seed)")


def _check_synthetic(p: SyntheticParams, n_inputs: int) -> list[tuple[Any, str]]:
    if len(p.shape) != 3 or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in p.shape):
        return [("shape", f"shape={p.shape!r} must be [C, H, W], three ints > 0")]
    if p.shape[0] * p.shape[1] * p.shape[2] > _IMAGE_MAX:
        return [("shape", f"shape={p.shape!r} is more than {_IMAGE_MAX} values an image (an image that size "
                          "would not fit in memory)")]
    return []


_IMAGE_MAX = 1 << 30  # values in one synthetic image: past it one record is gigabytes


def _build_synthetic(p: SyntheticParams, inputs: list[BaseNode], ctx: BuildContext) -> BaseNode:
    return Synthetic(count=p.count, shape=list(p.shape), classes=p.classes, dtype=p.dtype.value,
                     seed=ctx.seed_for(p.seed))


SYNTHETIC = OpSpec("synthetic", SyntheticParams, _build_synthetic, "none",
                   "made-up image records (FakeData, a script's --dummy): measure the model without data; "
                   "a global order (elastic above a shard)", _check_synthetic, length=listed_count,
                   per_record=True, items_in="",
                   items_out='{image: [C,H,W] uint8 or float32, label, index}, record i the same every time',
                   example="fake: {op: synthetic, count: 10000, shape: [3, 224, 224], classes: 1000}")

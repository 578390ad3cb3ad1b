"""collate: turn a list of samples into a batch with torch's ``default_collate`` rules.

Tensors and numpy arrays are stacked, numbers become tensors, dicts and tuples are collated
field by field, strings stay lists. Stateless.

CPU tensors of one shape are stacked by numpy, on the calling thread, not by ``torch.stack``:
collate runs in a loader thread (prefetch's), and a torch op over a batch of images fans out
to OpenMP threads there, a team per calling thread, whose spinning takes the cores the decode
threads need (imagenet.yaml on a busy 2-core machine: 33 against 160 images/s). The batch is
the same tensor either way.

A ``Collate`` node stacks into numpy arrays it keeps (``_workers/batch_slabs.Buffers``) and
hands each batch out as a tensor over one (``torch.from_numpy``). An array is written again
only when nothing refers to it any more: every tensor, view or storage made from a batch holds
a reference to its array, so the array's reference count says when the trainer has let the
batch and all its views go. A new 4.8 MB batch of images (imagenet.yaml, batch 32) had cost
~1,200 page faults of fresh memory, ~45 us per image of the loader's own thread, as much as
the copy itself. ``default_collate`` (the function) keeps nothing.

``as_tuple=["image", "label"]`` hands each batch on as ``(images, labels)``, the shape a classic
training script unpacks (``for images, target in loader``); the other fields (``index``) are
left out of it. The state is the same either way.

A batch whose samples a threaded map wrote into consecutive rows of one slab
(``_workers/batch_slabs.py``: ``map → batch → collate`` in a spec) is those rows, handed out
without a copy.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch.utils.data._utils.collate import collate, collate_tensor_fn, default_collate_fn_map
from torchdata.nodes import BaseNode

from conveyor.errors import SampleError
from conveyor.nodes._workers.batch_slabs import Buffers, plain_tensor, slab_batch
from conveyor.nodes.state_shape import Child, Fields


def _stack_tensors(batch: list[torch.Tensor], *, collate_fn_map: Any = None,
                   buffers: Buffers | None = None) -> torch.Tensor:
    """``torch.stack(batch)`` for plain CPU tensors of one shape and dtype, done by numpy (one
    thread, GIL released while copying), into an array of ``buffers`` when given, or no copy
    at all when the samples are consecutive rows of a map's slab; anything else goes to
    torch's own rule."""
    elem = batch[0]
    # (not in DataLoader workers: their batches go through shared memory)
    here = plain_tensor(elem) and torch.utils.data.get_worker_info() is None
    if here:
        rows = slab_batch(batch)  # checks every sample
        if rows is not None:
            return rows
    plain = (
        here
        and all(type(t) is torch.Tensor and t.shape == elem.shape and t.dtype == elem.dtype
                and t.device == elem.device and not t.requires_grad for t in batch)
    )
    if plain:
        try:
            arrays = [t.numpy() for t in batch]
        except (TypeError, RuntimeError):  # a dtype numpy lacks (bfloat16, ...), conj bits
            pass
        else:
            if buffers is None:
                out = torch.empty((len(batch), *elem.shape), dtype=elem.dtype)
                np.stack(arrays, out=out.numpy())
                return out
            into = buffers.get((len(batch), *arrays[0].shape), arrays[0].dtype)
            np.stack(arrays, out=into)
            out = torch.from_numpy(into)
            if out.dtype == elem.dtype:
                return out
    return collate_tensor_fn(batch, collate_fn_map=collate_fn_map)


_COLLATE_MAP = {**default_collate_fn_map, torch.Tensor: _stack_tensors}


def default_collate(batch: Any) -> Any:
    """torch's ``default_collate``, with tensors stacked by :func:`_stack_tensors`."""
    return collate(batch, collate_fn_map=_COLLATE_MAP)


def _named(sample: Any, i: int) -> str:
    if isinstance(sample, Mapping) and "file" in sample and "line" in sample:
        return f"sample {i} ({sample['file']}:{sample['line']})"
    if isinstance(sample, Mapping) and "file" in sample and "row" in sample:
        return f"sample {i} ({sample['file']} row {sample['row']})"
    if isinstance(sample, Mapping) and "index" in sample:
        return f"sample {i} (index {sample['index']})"
    return f"sample {i}"


def _none_in(value: Any, path: str, depth: int = 0) -> str | None:
    """The path of the first ``None`` inside ``value`` (dict fields, tuple/list positions)."""
    if value is None:
        return path or "the sample"
    if depth > 8:
        return None
    if isinstance(value, Mapping):
        for k, v in value.items():
            found = _none_in(v, f"{path}.{k}" if path else str(k), depth + 1)
            if found:
                return found
    elif isinstance(value, (tuple, list)):
        for j, v in enumerate(value):
            found = _none_in(v, f"{path}[{j}]", depth + 1)
            if found:
                return found
    return None


def none_field(samples: Sequence[Any]) -> str | None:
    """A sentence naming the first field that is ``None`` in a sample of the batch, if one is
    (what torch's collate fails on as "found <class 'NoneType'>", naming neither).

    Example:
        >>> none_field([{"x": 1, "label": 0}, {"x": 2, "label": None, "index": 7}])
        "field 'label' is None in sample 1 (index 7)"
    """
    for i, s in enumerate(samples):
        found = _none_in(s, "")
        if found:
            what = "the sample" if found == "the sample" else f"field '{found}'"
            return f"{what} is None in {_named(s, i)}"
    return None


def same_fields(samples: Sequence[Any]) -> None:
    """Raise ValueError naming the first sample whose fields are not the first sample's.

    A field that only some dict samples of a batch have (a ``label`` only one mixed source
    carries) fails with a bare KeyError in a collate that goes by the first sample's keys, or,
    when the first sample lacks it, is dropped from the batch without a word.
    """
    first = samples[0]
    keys = first.keys()
    for i, s in enumerate(samples):
        if not isinstance(s, Mapping):
            raise ValueError(f"{_named(s, i)} of the batch is a {type(s).__name__}, the first is a dict: "
                             "every sample of a batch must be a dict with the same fields")
        if s.keys() != keys:
            lacks = [k for k in keys if k not in s]
            extra = [k for k in s if k not in keys]
            raise ValueError(
                f"{_named(s, i)} of the batch " + " and ".join(
                    part for part in (f"lacks fields {lacks}" if lacks else "",
                                      f"has fields {extra} that the first does not" if extra else "") if part)
                + f" ({_named(first, 0)} has {list(keys)}): every sample of a batch needs the same "
                "fields; give inputs that are mixed the same fields (a map that adds or drops them)")


def check_fields(samples: Sequence[Mapping]) -> None:
    """The cheap half of :func:`same_fields`, for a batch whose first sample is a dict: samples
    with as many fields as the first can differ only in a field the first has, which a collate
    going by the first's keys finds missing (and then calls :func:`same_fields`)."""
    try:
        sizes = len(set(map(len, samples)))
    except TypeError:  # a sample with no len(): not a dict
        sizes = 2
    if sizes > 1:
        same_fields(samples)


class Collate(BaseNode):
    """Apply ``default_collate`` to each list the input yields.

    Args:
        source: yields lists of samples (a ``Batcher``).
        where: names the node in messages.
        as_tuple: hand each batch on as the tuple of these fields of the dict batch, in order.

    Example:
        >>> from torchdata.nodes import IterableWrapper
        >>> next(Collate(IterableWrapper([[{"x": 1}, {"x": 2}]])))["x"].tolist()
        [1, 2]
    """

    SOURCE_KEY = "source"
    STATE_SHAPE = Fields({SOURCE_KEY: Child()})

    def __init__(self, source: BaseNode, *, where: str | None = None, as_tuple: Sequence[str] | None = None):
        super().__init__()
        if as_tuple is not None and (isinstance(as_tuple, str) or not as_tuple
                                     or not all(isinstance(k, str) for k in as_tuple)):
            raise ValueError(f"{as_tuple=} must be a non-empty list of field names, or None")
        self.source = source
        self.where = where or "collate"
        self.as_tuple = None if as_tuple is None else tuple(as_tuple)
        self._map = {**_COLLATE_MAP, torch.Tensor: functools.partial(_stack_tensors, buffers=Buffers())}

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self.source.reset(None if initial_state is None else initial_state[self.SOURCE_KEY])

    def next(self):
        batch = next(self.source)
        if isinstance(batch, Mapping):  # one sample, not a list of them: torch's collate fails on batch[0]
            exc = SampleError(f"collate takes a batch (a list of samples), got one sample (fields: "
                              f"{', '.join(map(str, list(batch)[:8]))}): put a batch node above it")
            exc.add_note(f"in {self.where}")
            raise exc
        dicts = isinstance(batch, Sequence) and bool(batch) and isinstance(batch[0], Mapping)
        try:
            if dicts:
                check_fields(batch)
            out = collate(batch, collate_fn_map=self._map)
        except KeyError as exc:  # same number of fields, one of them another: say which sample
            if dicts:
                same_fields(batch)
            exc.add_note(f"in {self.where}: samples of one batch must have the same fields")
            raise
        except Exception as exc:
            none = none_field(batch) if isinstance(batch, Sequence) else None
            if none:
                exc.add_note(f"in {self.where}: {none}: collate cannot batch a None; give the field a "
                             "value (a map), or leave the sample out (a filter)")
            else:
                exc.add_note(f"in {self.where}: samples of one batch must have the same shapes and "
                             "fields (use pad_collate for variable lengths)")
            raise
        return out if self.as_tuple is None else self._tuple(out)

    def _tuple(self, out: Any) -> tuple:
        """The batch's ``as_tuple`` fields, in that order (``for images, target in loader``)."""
        if not isinstance(out, Mapping):
            raise SampleError(f"in {self.where}: as_tuple={list(self.as_tuple)} takes fields of dict samples; "
                             f"the batch is a {type(out).__name__}")
        missing = [k for k in self.as_tuple if k not in out]
        if missing:
            raise SampleError(f"in {self.where}: as_tuple names fields {missing} that the samples do not have; "
                             f"they have {list(out)}")
        return tuple(out[k] for k in self.as_tuple)

    def get_state(self) -> dict:
        return {self.SOURCE_KEY: self.source.state_dict()}

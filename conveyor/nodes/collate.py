"""collate: turn a list of samples into a batch with torch's ``default_collate`` rules.

Tensors and numpy arrays are stacked, numbers become tensors, dicts and tuples are collated
field by field, strings stay lists. Stateless.

CPU tensors of one shape are stacked by numpy, on the calling thread, not by ``torch.stack``:
collate runs in a loader thread (prefetch's), and a torch op over a batch of images fans out
to OpenMP threads there, a team per calling thread, whose spinning takes the cores the decode
threads need (imagenet.yaml on a busy 2-core machine: 33 against 160 images/s). The batch is
the same tensor either way.

A ``Collate`` node stacks into numpy arrays it keeps (``_slabs.Buffers``) and hands each batch out
as a tensor over one (``torch.from_numpy``). An array is written again only when nothing
refers to it any more: every tensor, view or storage made from a batch holds a reference to
its array, so the array's reference count says when the trainer has let the batch and all its
views go. A new 4.8 MB batch of images (imagenet.yaml, batch 32) had cost ~1,200 page faults
of fresh memory, ~45 us per image of the loader's own thread, as much as the copy itself.
``default_collate`` (the function) keeps nothing.

A batch whose samples a threaded map wrote into consecutive rows of one slab (``_slabs``:
``map → batch → collate`` in a spec) is those rows, handed out without a copy.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch
from torch.utils.data._utils.collate import collate, collate_tensor_fn, default_collate_fn_map
from torchdata.nodes import BaseNode

from conveyor.nodes._slabs import Buffers, plain_tensor, slab_batch


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


class Collate(BaseNode):
    """Apply ``default_collate`` to each list the input yields.

    Example:
        >>> from torchdata.nodes import IterableWrapper
        >>> next(Collate(IterableWrapper([[{"x": 1}, {"x": 2}]])))["x"].tolist()
        [1, 2]
    """

    SOURCE_KEY = "source"

    def __init__(self, source: BaseNode, *, where: str | None = None):
        super().__init__()
        self.source = source
        self.where = where or "collate"
        self._map = {**_COLLATE_MAP, torch.Tensor: functools.partial(_stack_tensors, buffers=Buffers())}

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self.source.reset(None if initial_state is None else initial_state[self.SOURCE_KEY])

    def next(self):
        batch = next(self.source)
        try:
            return collate(batch, collate_fn_map=self._map)
        except Exception as exc:
            exc.add_note(f"in {self.where}: samples of one batch must have the same shapes and "
                         "fields (use pad_collate for variable lengths)")
            raise

    def get_state(self) -> dict:
        return {self.SOURCE_KEY: self.source.state_dict()}

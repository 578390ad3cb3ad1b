"""to_device: copy each batch to a GPU on a side CUDA stream, one batch ahead.

The well-known "data prefetcher" pattern: while the trainer computes on batch k, the copy
of batch k+1 runs on a separate stream with ``non_blocking=True`` (from pinned memory, put a
``pin_memory`` node before this one), so the copy overlaps compute. Before a batch is handed
out, the consumer's stream waits for the copy and every tensor is marked as used by it
(``record_stream``), so the caching allocator never reuses its memory too early.

Without CUDA (or with a ``cpu`` device) the node passes batches through and logs once why.
The state is the input's state before the batch held ahead, so nothing is lost on resume.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torchdata.nodes import BaseNode
from conveyor.nodes.state_shape import Child, Fields

log = logging.getLogger(__name__)
_told = False


def _map_tensors(fn: Any, obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: _map_tensors(fn, v) for k, v in obj.items()}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_map_tensors(fn, v) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_tensors(fn, v) for v in obj)
    return obj


class ToDevice(BaseNode):
    """Move batches to ``device``, copying the next one while the current one is used.

    Args:
        source: the input stream (ideally pinned batches).
        device: e.g. ``"cuda"``, ``"cuda:1"``; ``"cpu"`` passes through.
        non_blocking: asynchronous copies (they only overlap from pinned memory).

    Example:
        >>> from torchdata.nodes import IterableWrapper
        >>> next(ToDevice(IterableWrapper([torch.ones(2)]), device="cpu")).device.type
        'cpu'
    """

    SOURCE_KEY = "source"
    STATE_SHAPE = Fields({SOURCE_KEY: Child()})

    def __init__(self, source: BaseNode, *, device: str = "cuda", non_blocking: bool = True):
        super().__init__()
        self.source = source
        self.device = torch.device(device)
        self.non_blocking = non_blocking
        self.active = self.device.type == "cuda" and torch.cuda.is_available()
        global _told
        if not self.active and self.device.type == "cuda" and not _told:
            _told = True
            log.info("to_device: CUDA is not available, so batches stay on the CPU")
        self._stream = torch.cuda.Stream(device=self.device) if self.active else None
        self._ahead: Any = None
        self._has_ahead = False
        self._state_before_ahead: dict | None = None

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self.source.reset(None if initial_state is None else initial_state[self.SOURCE_KEY])
        self._ahead, self._has_ahead, self._state_before_ahead = None, False, None

    def _copy_next(self) -> None:
        self._state_before_ahead = self.source.state_dict()
        try:
            batch = next(self.source)
        except StopIteration:
            self._ahead, self._has_ahead = None, False
            return
        with torch.cuda.stream(self._stream):
            self._ahead = _map_tensors(
                lambda t: t.to(self.device, non_blocking=self.non_blocking), batch)
        self._has_ahead = True

    def next(self):
        if not self.active:
            return next(self.source)
        if not self._has_ahead:
            self._copy_next()
            if not self._has_ahead:
                raise StopIteration
        batch = self._ahead
        current = torch.cuda.current_stream(self.device)
        current.wait_stream(self._stream)
        _map_tensors(lambda t: t.record_stream(current), batch)
        self._copy_next()  # start the next copy while the caller works on this batch
        return batch

    def get_state(self) -> dict:
        if self._has_ahead:
            return {self.SOURCE_KEY: self._state_before_ahead}
        return {self.SOURCE_KEY: self.source.state_dict()}

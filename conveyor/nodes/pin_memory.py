"""pin_memory: copy batches into page-locked host memory, so host-to-GPU copies can overlap.

Pinning happens in the thread that pulls from this node (put a ``prefetch`` after it, as the
bundled specs do, and the pinning runs in the prefetch thread). On a machine without CUDA
page-locked memory buys nothing, so the node passes items through and logs once why. The
state is the input's state, the same shape with or without a GPU, so a checkpoint moves
between machines.
"""

from __future__ import annotations

import logging

import torch
from torch.utils.data._utils.pin_memory import pin_memory as _pin
from torchdata.nodes import BaseNode
from conveyor.nodes.state_shape import Child, Fields

log = logging.getLogger(__name__)
_told = False


def cuda_available() -> bool:
    return torch.cuda.is_available()


class PinMemory(BaseNode):
    """Pin tensors (in dicts, lists, tuples) of each item when CUDA is present; else pass through.

    Args:
        source: the input stream.
        enabled: ``None`` pins when CUDA is available; ``False`` never pins.

    Example:
        >>> from torchdata.nodes import IterableWrapper
        >>> next(PinMemory(IterableWrapper([torch.zeros(2)]))).shape
        torch.Size([2])
    """

    SOURCE_KEY = "source"
    STATE_SHAPE = Fields({SOURCE_KEY: Child()})

    def __init__(self, source: BaseNode, *, enabled: bool | None = None):
        super().__init__()
        self.source = source
        self.active = cuda_available() if enabled is None else bool(enabled and cuda_available())
        global _told
        if not self.active and enabled is not False and not _told:
            _told = True
            log.info("pin_memory: CUDA is not available, so batches pass through unpinned "
                     "(page-locked memory only speeds up copies to a GPU)")

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self.source.reset(None if initial_state is None else initial_state[self.SOURCE_KEY])

    def next(self):
        item = next(self.source)
        return _pin(item) if self.active else item

    def get_state(self) -> dict:
        return {self.SOURCE_KEY: self.source.state_dict()}

"""A transform class as a map fn: constructed once per worker, then called per item.

``fn: mypkg.aug:RandomErase`` with ``init: {p: 0.5}`` makes ``RandomErase(p=0.5)`` once in each
thread (or process) that runs the map, and calls it per item as ``instance(item, **args)``.
The instance is never shared between threads, so a transform may keep scratch state; it is
never pickled either (a process builds its own on first use), so it may hold what does not
pickle. ``rng`` and ``generator`` parameters of ``__call__`` are given per sample by the map,
as they are to functions.
"""

from __future__ import annotations

import inspect
import threading
from typing import Any


class PerWorker:
    """Call ``cls(**init)(item, ...)``, with one instance of ``cls`` per thread.

    Args:
        cls: the transform class; its instances are callable.
        init: keyword arguments for its constructor.

    Example:
        >>> class Scale:
        ...     def __init__(self, k): self.k = k
        ...     def __call__(self, x): return x * self.k
        >>> PerWorker(Scale, {"k": 3})(2)
        6
    """

    def __init__(self, cls: type, init: dict[str, Any] | None = None):
        self.cls = cls
        self.init = dict(init or {})
        self._local = threading.local()
        self.made = 0  # instances made by this copy (in this process)

    @property
    def __signature__(self) -> inspect.Signature:
        """The signature of ``cls.__call__`` without ``self``: what the map passes per item."""
        sig = inspect.signature(self.cls.__call__)
        params = list(sig.parameters.values())[1:]
        return sig.replace(parameters=params)

    @property
    def __name__(self) -> str:
        return self.cls.__name__

    def instance(self) -> Any:
        """This thread's instance, made on first use."""
        inst = getattr(self._local, "inst", None)
        if inst is None:
            inst = self._local.inst = self.cls(**self.init)
            self.made += 1
        return inst

    def __call__(self, item: Any, **kwargs: Any) -> Any:
        return self.instance()(item, **kwargs)

    def __getstate__(self) -> dict:
        return {"cls": self.cls, "init": self.init}

    def __setstate__(self, state: dict) -> None:
        self.cls, self.init = state["cls"], state["init"]
        self._local = threading.local()
        self.made = 0

    def __repr__(self) -> str:
        return f"PerWorker({self.cls.__module__}.{self.cls.__qualname__}, init={self.init!r})"

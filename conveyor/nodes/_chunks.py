"""Items in lists between nodes of one thread: ``next_many`` and ``take``.

A text record costs a few microseconds of real work, and every node it crosses adds a
``next()`` call or three (the node's, ``BaseNode.__next__``'s, the instrumentation's): on the
text graph the hops were a large share of a record's cost. So a node may also offer
``next_many(n)``: up to ``n`` of its next items as a list (at least one; ``StopIteration``
only when none are left), exactly the items ``n`` calls of ``next()`` would give, and its
state afterwards is the state after those items. It may return fewer than ``n`` where that
is cheaper (the end of a block of lines, of a shuffle window, of a mapped list). A node that
pulls many items at a time (a shuffle filling its window, a batch map gathering a list, a
length bucketer) pulls them with ``take``, which uses ``next_many`` where the input has it
and plain ``next()`` where it does not.
"""

from __future__ import annotations

from typing import Any, Callable


def take(source: Any, n: int) -> list:
    """Up to ``n`` (at least one) next items of ``source``; ``StopIteration`` if it has none.

    Example:
        >>> from torchdata.nodes import IterableWrapper
        >>> it = IterableWrapper(range(5))
        >>> take(it, 3), take(it, 3)
        ([0, 1, 2], [3, 4])
    """
    many = getattr(source, "next_many", None)
    if many is not None:
        return many(n)
    return pull(source.__next__, n)


def pull(fetch: Callable[[], Any], n: int) -> list:
    """Up to ``n`` results of ``fetch()`` (at least one), stopping at its ``StopIteration``."""
    items: list = []
    append = items.append
    try:
        for _ in range(n):
            append(fetch())
    except StopIteration:
        if not items:
            raise
    return items


def take_exactly(source: Any, n: int) -> list:
    """``n`` next items of ``source``, fewer only where it ends (``[]`` if it has none)."""
    items: list = []
    while len(items) < n:
        try:
            items += take(source, n - len(items))
        except StopIteration:
            break
    return items

"""What a node may offer beyond torchdata's ``reset``/``next``/``get_state``, declared in one place.

torchdata's ``BaseNode`` has three methods; conveyor's nodes add optional ones, and whoever
drives a graph (the Loader, the worker copies, the compiler, the watchdog) asks for them
through this module instead of guessing attribute names:

=============  ==============================================  ==================================
protocol       member                                          asked by
=============  ==============================================  ==================================
``Epochs``     ``set_epoch(epoch)``                            the Loader, each worker copy
``Deals``      ``set_deal(deal)``                              elastic resume (``shard``)
``Stats``      ``stats() -> dict``                             ``Loader.stats()``
``Closes``     ``close()``: its threads, processes, files      ``Loader.close()``
``Ledgered``   ``ledger``: a ``SkipLedger``                    ``Loader.skipped()``
``Counts``     ``count() -> int | None``: items this epoch     ``len(loader)``, ``shard``
``ManyAtOnce`` ``next_many(n) -> list`` (see ``take``)         nodes that pull many items
``IdsAtOnce``  ``next_ids(n)``, ``ids_ready()``                nodes that take ids in bulk
``RowsAtOnce`` ``next_rows()``, ``rows_ready()``              nodes that pad ids in bulk
``Watched``    ``waiting_on() -> str | None``                  the watchdog
``Lingers``    ``lingering() -> list[Thread]``                 ``Loader.close()`` joins them
``Elastic``    ``elastic_input(cursor, **params) -> Cursor``   elastic resume (``graphs/elastic``)
``Wraps``      ``inner``, the node it wraps; ``items`` passed  all of the above, through a wrapper
=============  ==============================================  ==================================

Each is a ``typing.Protocol`` (``isinstance(node, Stats)`` works). ``isinstance`` on a
protocol takes microseconds, so ``has`` caches the answer per class (every member here is a
method, or an attribute every instance of a class that has it sets in ``__init__``), and the
accessors below (``set_epoch``, ``stats``, ``ledger`` ...) are what callers use.

``next_many(n)``: a text record costs a few microseconds of real work, and every node it
crosses adds a ``next()`` call or three; so a node may also give up to ``n`` of its next items
as a list (at least one; ``StopIteration`` only when none are left), exactly the items ``n``
calls of ``next()`` would give, its state afterwards the state after those items. It may
return fewer than ``n`` where that is cheaper (the end of a block of lines, of a shuffle
window, of a mapped list). A node that pulls many items at a time pulls them with ``take``,
which uses ``next_many`` where the input has it and plain ``next()`` where it does not.

``next_ids(n)``: a node whose items are records of token ids (a batch tokenizer's ``map``)
may give up to ``n`` of them as one ``IdsBlock`` (every record's ids in one buffer, the records
made only if asked: ``conveyor/_id_blocks.py``), where ``ids_ready()`` says it can now; the
same items as ``next_many``, its state afterwards the same. A node that takes ids in bulk
(``pack_tokens``) asks with ``take_ids`` and takes the records with ``take`` otherwise.

``next_rows()``: a node whose items are batches (lists) of such records (``bucket_batch``) may
give the next one as ``IdsRows`` (the records' items and each one's ids, the records made only
if asked: ``conveyor/_id_blocks.py``) where ``rows_ready()`` says it may, and the records
otherwise: the same batch as ``next()``, its state afterwards the same. ``pad_collate`` asks
with ``take_rows``.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Protocol, runtime_checkable

from conveyor.nodes._elastic import Cursor
from conveyor.nodes._skips import SkipLedger


@runtime_checkable
class Epochs(Protocol):
    def set_epoch(self, epoch: int) -> None: ...


@runtime_checkable
class Deals(Protocol):
    def set_deal(self, deal: dict | None) -> None: ...


@runtime_checkable
class Stats(Protocol):
    def stats(self) -> dict: ...


@runtime_checkable
class Closes(Protocol):
    def close(self) -> None: ...


@runtime_checkable
class Ledgered(Protocol):
    ledger: SkipLedger


@runtime_checkable
class Counts(Protocol):
    def count(self) -> int | None: ...


@runtime_checkable
class ManyAtOnce(Protocol):
    def next_many(self, n: int) -> list: ...


@runtime_checkable
class IdsAtOnce(Protocol):
    def ids_ready(self) -> bool: ...
    def next_ids(self, n: int) -> Any: ...


@runtime_checkable
class RowsAtOnce(Protocol):
    def rows_ready(self) -> bool: ...
    def next_rows(self) -> Any: ...


@runtime_checkable
class Watched(Protocol):
    def waiting_on(self) -> str | None: ...


@runtime_checkable
class Lingers(Protocol):
    def lingering(self) -> list[threading.Thread]: ...


@runtime_checkable
class Elastic(Protocol):
    @staticmethod
    def elastic_input(cursor: Cursor, **params: Any) -> Cursor: ...


@runtime_checkable
class Wraps(Protocol):
    inner: Any
    items: int


_HAS: dict[tuple[type, type], bool] = {}


def has(node: Any, capability: type) -> bool:
    """Whether ``node`` offers ``capability`` (a protocol above), cached per class:
    ``isinstance`` on a protocol costs microseconds, this a dict look-up."""
    key = (type(node), capability)
    got = _HAS.get(key)
    if got is None:
        got = _HAS[key] = isinstance(node, capability)
    return got


def unwrap(node: Any) -> Any:
    """The node a wrapper (``Wraps``: the graph's instrumentation) wraps, else ``node``."""
    return node.inner if has(node, Wraps) else node


def set_epoch(node: Any, epoch: int) -> None:
    """Tell ``node`` the epoch, if it keeps one (``Epochs``)."""
    if has(node, Epochs):
        node.set_epoch(epoch)


def set_deal(node: Any, deal: dict | None) -> None:
    """Give ``node`` an elastic deal, if it takes one (``Deals``)."""
    if has(node, Deals):
        node.set_deal(deal)


def stats(node: Any) -> dict:
    """``node``'s own counters (``Stats``), or ``{}``."""
    return node.stats() if has(node, Stats) else {}


def close(node: Any) -> None:
    """Stop what ``node`` started (``Closes``), if anything."""
    if has(node, Closes):
        node.close()


def ledger(node: Any) -> SkipLedger | None:
    """``node``'s skip ledger (``Ledgered``), or None."""
    got = getattr(node, "ledger", None)  # (an attribute: not cached per class)
    return got if isinstance(got, SkipLedger) else None


def count(node: Any) -> int | None:
    """Items ``node`` yields this epoch where it knows that cheaply (``Counts``), else None."""
    return node.count() if has(node, Counts) else None


def waiting_on(node: Any) -> str | None:
    """What ``node``'s workers are doing now, in words (``Watched``), or None."""
    return node.waiting_on() if has(node, Watched) else None


def lingering(node: Any) -> list[threading.Thread]:
    """Threads ``node`` asked to stop that are still busy (``Lingers``)."""
    return node.lingering() if has(node, Lingers) else []


def take(source: Any, n: int) -> list:
    """Up to ``n`` (at least one) next items of ``source``; ``StopIteration`` if it has none.

    Example:
        >>> from torchdata.nodes import IterableWrapper
        >>> it = IterableWrapper(range(5))
        >>> take(it, 3), take(it, 3)
        ([0, 1, 2], [3, 4])
    """
    if has(source, ManyAtOnce):
        return source.next_many(n)
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


def take_ids(source: Any, n: int) -> Any:
    """Up to ``n`` next items of ``source`` as one ``IdsBlock`` (``conveyor/_id_blocks.py``)
    where it gives them so now (a batch tokenizer's map, inline, between its lists), an empty
    one where it took a list its fn would not give so (its items then come from ``take``), or
    None: take them with ``take``. ``StopIteration`` if it has none."""
    if has(source, IdsAtOnce) and source.ids_ready():
        return source.next_ids(n)
    return None


def take_rows(source: Any) -> Any:
    """The next batch of ``source``: as ``IdsRows`` (``conveyor/_id_blocks.py``) where it gives
    it so (``RowsAtOnce``: a bucket_batch whose pool holds a block's rows), else as ``next``
    gives it. ``StopIteration`` if it has none."""
    if has(source, RowsAtOnce) and source.rows_ready():
        return source.next_rows()
    return next(source)


def take_exactly(source: Any, n: int) -> list:
    """``n`` next items of ``source``, fewer only where it ends (``[]`` if it has none)."""
    items: list = []
    while len(items) < n:
        try:
            items += take(source, n - len(items))
        except StopIteration:
            break
    return items

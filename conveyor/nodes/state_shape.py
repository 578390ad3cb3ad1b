"""The shape of a node's state, declared next to its keys, and one check that walks a state.

A state that is not what its node wrote (a key missing, ``pos: 1.5``, ``window: -1``, a
count as a string, ``null`` for a nested state) must not restore into repeated or missing
items, nor fail as a ``KeyError`` or ``TypeError`` deep inside a reset. So each node class
declares the shape of its own state as ``STATE_SHAPE`` (a ``Fields`` of its state keys, each a
small shape: ``Int(min=0)``, ``Bool()``, ``Child("source")`` for its input's state...) and
``check_state(node, state)`` walks a whole graph's state against the nodes' shapes *before*
anything is reset, raising a ``StateError`` that names the key path and the value:

    state rank0 > graph > shuffle > pos: expected an int >= 0, got -1

The walk follows ``Child``/``Children`` into the input nodes (through a wrapper such as the
graph's instrumentation, ``capabilities.Wraps``, named after the spec's node where the caller
gives names); a node that declares no shape (a plug-in, a torchdata node) is not looked into.
A key that a node does not declare is an error too: a state from another node, another
version or an edit, whose meaning this code would drop (a resume that silently ignores part of
a state is not exact). Keys that states of earlier releases lack are declared ``optional``.

Example:
    >>> shape = Fields({"pos": Int(), "wrapped": Bool()})
    >>> shape.check({"pos": 3, "wrapped": False}, At(None, ("shard",)))   # fits: nothing happens
    >>> shape.check({"pos": -1, "wrapped": False}, At(None, ("shard",)))
    Traceback (most recent call last):
    conveyor.errors.StateError: state shard > pos: expected an int >= 0, got -1
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable

from conveyor.errors import StateError
from conveyor.nodes import capabilities as cap

_SHOWN = 80  # characters of a bad value shown in the message


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else text[:_SHOWN - 3] + "..."


@dataclass(frozen=True)
class At:
    """Where the walk stands: the node whose state is being checked, the key path to it, and
    the names of the graph's nodes (by ``id`` of the node or its wrapper)."""

    node: Any
    path: tuple[str, ...] = ()
    names: dict[int, str] = field(default_factory=dict)
    top: tuple[str, ...] = ()  # the path before the first node (``rank0 > graph``)

    def key(self, key: Any) -> "At":
        return At(self.node, self.path + (str(key),), self.names, self.top)

    def fail(self, value: Any, expected: str) -> StateError:
        where = " > ".join(self.path) or "(the whole state)"
        return StateError(f"state {where}: expected {expected}, got {_show(value)}")


class Shape:
    """One value's expected shape."""

    def check(self, value: Any, at: At) -> None:
        raise NotImplementedError

    def __or__(self, other: "Shape") -> "Shape":
        return OneOf((self, other))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Int(Shape):
    """An int (not a bool) in ``[min, max]``; ``at_most`` names a sibling key bounding it,
    ``under`` an attribute of the node (an int, or a list whose length) it must be less than."""

    min: int | None = 0
    max: int | None = None
    at_most: str | None = None
    under: str | None = None

    def check(self, value: Any, at: At) -> None:
        if not _is_int(value) or (self.min is not None and value < self.min) or \
                (self.max is not None and value > self.max):
            bounds = [f">= {self.min}" if self.min is not None else "",
                      f"<= {self.max}" if self.max is not None else ""]
            raise at.fail(value, " ".join(["an int", " and ".join(b for b in bounds if b)]).strip())
        if self.under is not None and at.node is not None:
            top = getattr(at.node, self.under)
            top = top if _is_int(top) else len(top)
            if value >= top:
                raise at.fail(value, f"an int < {self.under} ({top})")


@dataclass(frozen=True)
class Real(Shape):
    """A finite number (int or float, not a bool), ``>= min`` where given."""

    min: float | None = None

    def check(self, value: Any, at: At) -> None:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or (self.min is not None and value < self.min):
            raise at.fail(value, "a finite number" + (f" >= {self.min}" if self.min is not None else ""))


@dataclass(frozen=True)
class Bool(Shape):
    def check(self, value: Any, at: At) -> None:
        if not isinstance(value, bool):
            raise at.fail(value, "true or false")


@dataclass(frozen=True)
class Str(Shape):
    def check(self, value: Any, at: At) -> None:
        if not isinstance(value, str):
            raise at.fail(value, "a string")


@dataclass(frozen=True)
class Null(Shape):
    """None, or ``shape``."""

    shape: Shape

    def check(self, value: Any, at: At) -> None:
        if value is not None:
            self.shape.check(value, at)


@dataclass(frozen=True)
class OneOf(Shape):
    """The first of ``shapes`` that fits (``Int() | Str()``)."""

    shapes: tuple[Shape, ...]

    def check(self, value: Any, at: At) -> None:
        errors = []
        for shape in self.shapes:
            try:
                shape.check(value, at)
                return
            except StateError as exc:  # kept without its traceback, whose frames hold this list (a
                errors.append(exc.with_traceback(None))  # cycle through every node of the graph)
        raise errors[0] if len(errors) == 1 else at.fail(value, " or ".join(
            str(e).split(": expected ", 1)[-1].rsplit(", got ", 1)[0] for e in errors))


def _plain(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, str)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


@dataclass(frozen=True)
class Plain(Shape):
    """Any plain data (what JSON holds, finite numbers) of ``kind`` (dict, list...) where given:
    a state the node hands on as it is (a plug-in's, a dataset's ``state_dict``)."""

    kind: type | None = None

    def check(self, value: Any, at: At) -> None:
        if (self.kind is not None and not isinstance(value, self.kind)) or not _plain(value):
            raise at.fail(value, f"a {self.kind.__name__} of plain data" if self.kind else "plain data")


@dataclass(frozen=True)
class ListOf(Shape):
    """A list of ``item``; ``length`` names an attribute of the node (an int, or a list whose
    length it must have)."""

    item: Shape
    length: str | None = None

    def check(self, value: Any, at: At) -> None:
        if not isinstance(value, (list, tuple)):
            raise at.fail(value, "a list")
        if self.length is not None and at.node is not None:
            want = getattr(at.node, self.length)
            want = want if _is_int(want) else len(want)
            if len(value) != want:
                raise at.fail(value, f"a list of {want} items")
        for i, v in enumerate(value):
            self.item.check(v, at.key(i))


@dataclass(frozen=True)
class MapOf(Shape):
    """A dict of string keys to ``value``."""

    value: Shape

    def check(self, value: Any, at: At) -> None:
        if not isinstance(value, dict):
            raise at.fail(value, "a dict")
        for k, v in value.items():
            if not isinstance(k, str):
                raise at.key(_show(k)).fail(k, "a string key")
            self.value.check(v, at.key(k))


@dataclass(frozen=True)
class Fields(Shape):
    """A dict with exactly the keys ``keys`` (those in ``optional`` may be missing: states of
    earlier releases lack them), each of its shape."""

    keys: dict[str, Shape]
    optional: frozenset[str] = frozenset()

    def __init__(self, keys: dict[str, Shape], optional: Iterable[str] = ()):
        object.__setattr__(self, "keys", dict(keys))
        object.__setattr__(self, "optional", frozenset(optional))

    def check(self, value: Any, at: At) -> None:
        if not isinstance(value, dict):
            raise at.fail(value, "a dict with the keys " + ", ".join(sorted(self.keys)))
        for k in value:
            if k not in self.keys:
                raise at.key(k).fail(value[k], "no such key (this state's keys: "
                                     + ", ".join(sorted(self.keys)) + ")")
        for k in self.keys:
            if k not in value and k not in self.optional:
                raise at.fail(value, f"the key '{k}' (missing)")
        for k, shape in self.keys.items():
            if k not in value:
                continue
            shape.check(value[k], at.key(k))
            bound = getattr(shape, "at_most", None)
            if bound is not None and _is_int(value.get(bound)) and value[k] > value[bound]:
                raise at.key(k).fail(value[k], f"an int <= {bound} ({value[bound]})")


@dataclass(frozen=True)
class Child(Shape):
    """The state of the node's input ``attr`` (``source``): checked against that node's shape.
    A nested state is a dict (``None`` only where ``nullable``: an input not started)."""

    attr: str = "source"
    nullable: bool = False

    def check(self, value: Any, at: At) -> None:
        if value is None and self.nullable:
            return
        _walk(getattr(at.node, self.attr), value, at)


@dataclass(frozen=True)
class Children(Shape):
    """A list of the states of the node's inputs ``attr`` (a list of nodes), one each."""

    attr: str

    def check(self, value: Any, at: At) -> None:
        nodes = getattr(at.node, self.attr)
        if not isinstance(value, (list, tuple)) or len(value) != len(nodes):
            raise at.fail(value, f"a list of {len(nodes)} input states")
        for i, (node, v) in enumerate(zip(nodes, value)):
            _walk(node, v, at.key(i))


@dataclass(frozen=True)
class Same(Shape):
    """The node's state is its input ``attr``'s, as it is (a pass-through)."""

    attr: str = "source"

    def check(self, value: Any, at: At) -> None:
        _walk(getattr(at.node, self.attr), value, At(getattr(at.node, self.attr), at.path, at.names, at.top))


def _walk(node: Any, state: Any, at: At) -> None:
    while cap.has(node, cap.Wraps):  # the graph's instrumentation: the spec's node name
        name = at.names.get(id(node))
        if name is not None:
            at = At(node, at.top + (name,), at.names, at.top)
        node = node.inner
    shape = getattr(type(node), "STATE_SHAPE", None)
    if shape is None:  # a node that declares no shape (a plug-in, torchdata's): its own business
        return
    if isinstance(shape, Same):
        shape.check(state, At(node, at.path, at.names, at.top))
        return
    shape.check(state, At(node, at.path or (type(node).__name__,), at.names, at.top))


def check_state(node: Any, state: Any, path: tuple[str, ...] = (), names: dict[int, str] | None = None) -> None:
    """Check ``state`` against the shapes ``node`` and the inputs below it declare, before any
    of them is reset with it.

    Args:
        node: the graph's output node (or any node).
        state: what ``node.state_dict()`` gave, after any round trip.
        path: the key path of ``state`` in what holds it (``("rank0", "graph")``), for messages.
        names: the spec's name of each node, by ``id`` of the node (or of its wrapper).

    Raises:
        StateError: naming the key path and the value that does not fit.
    """
    _walk(node, state, At(node, tuple(path), dict(names or {}), tuple(path)))


LEDGER_SHAPE = Null(Fields({"node": Null(Str()), "count": Int(),
                            "entries": ListOf(ListOf(Plain()))}))  # a skip ledger (nodes/_skips.py)
STATS_SHAPE = MapOf(Real() | ListOf(Real()))  # a node's counters: numbers, or lists of them

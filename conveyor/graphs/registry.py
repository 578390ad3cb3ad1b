"""The table of ops: op name -> its ``OpSpec`` (params dataclass, build function, and every
fact the compiler asks about the op: see conveyor/graphs/opspec.py).

One table, read lazily: ``_BUILTIN`` maps each built-in op to ``module:attr`` of its
``OpSpec``, imported the first time the op is looked up. Third-party packages add ops
through the ``conveyor.ops`` entry-point group (each entry point loads an ``OpSpec``; one that
fails to import is a warning naming it, and every other op keeps working), or at
run time through ``register``, which refuses to overwrite an existing op unless asked
(``clobber=True``). Params are frozen dataclasses; their field types (``int``, ``float``,
``bool``, ``str``, ``Fn``, ``list[...]``, ``dict``, enums, ``X | None``) are what the
validator checks, and ``param(min=...)`` adds bounds.
"""

from __future__ import annotations

import enum
import importlib
import logging
import typing
from importlib import metadata
from typing import Any, Callable

from conveyor._refs import resolve_attr
from conveyor.errors import ConveyorError
from conveyor.graphs.opspec import Fn, Inputs, OpSpec, param  # noqa: F401 - re-exported: plug-ins import them here

log = logging.getLogger(__name__)

_BUILTIN: dict[str, str] = {
    "batch": "conveyor.graphs.ops:BATCH",
    "bucket_batch": "conveyor.graphs.ops_text:BUCKET_BATCH",
    "collate": "conveyor.graphs.ops:COLLATE",
    "dataset": "conveyor.graphs.ops_data:DATASET",
    "fetch": "conveyor.graphs.ops_storage:FETCH",
    "filter": "conveyor.graphs.ops_map:FILTER",
    "iterable": "conveyor.graphs.ops_data:ITERABLE",
    "list_files": "conveyor.graphs.ops:LIST_FILES",
    "list_litdata": "conveyor.graphs.ops_formats:LIST_LITDATA",
    "list_lmdb": "conveyor.graphs.ops_tables:LIST_LMDB",
    "list_mds": "conveyor.graphs.ops_formats:LIST_MDS",
    "map": "conveyor.graphs.ops_map:MAP",
    "mix": "conveyor.graphs.ops:MIX",
    "pack_tokens": "conveyor.graphs.ops_pack:PACK_TOKENS",
    "pad_collate": "conveyor.graphs.ops_text:PAD_COLLATE",
    "pin_memory": "conveyor.graphs.ops:PIN_MEMORY",
    "prefetch": "conveyor.graphs.ops:PREFETCH",
    "read_jsonl": "conveyor.graphs.ops_text:READ_JSONL",
    "read_lmdb": "conveyor.graphs.ops_tables:READ_LMDB",
    "read_parquet": "conveyor.graphs.ops_tables:READ_PARQUET",
    "read_samples": "conveyor.graphs.ops_formats:READ_SAMPLES",
    "read_tar": "conveyor.graphs.ops_storage:READ_TAR",
    "shard": "conveyor.graphs.ops:SHARD",
    "shuffle_buffer": "conveyor.graphs.ops:SHUFFLE_BUFFER",
    "synthetic": "conveyor.graphs.ops_data:SYNTHETIC",
    "to_device": "conveyor.graphs.ops:TO_DEVICE",
}
_EXTRA: dict[str, OpSpec] = {}
_LOADED: dict[str, OpSpec] = {}
_ENTRY_POINTS_READ = False


def _load_ref(ref: str) -> Any:
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def _read_entry_points() -> None:
    global _ENTRY_POINTS_READ
    if _ENTRY_POINTS_READ:
        return
    _ENTRY_POINTS_READ = True
    for ep in metadata.entry_points(group="conveyor.ops"):
        if ep.name in _BUILTIN or ep.name in _EXTRA:
            log.warning("conveyor.ops plugin '%s' (%s) is ignored: an op of that name exists already",
                        ep.name, ep.value)
            continue  # a plug-in never silently replaces an op
        try:
            spec = ep.load()
        except Exception as exc:  # a broken plug-in costs its own op, never the others
            log.warning("conveyor.ops plugin '%s' (%s) failed to load, so op '%s' is not available: "
                        "%s: %s", ep.name, ep.value, ep.name, type(exc).__name__, exc)
            continue
        if isinstance(spec, OpSpec):
            _EXTRA[ep.name] = spec
        else:
            log.warning("conveyor.ops plugin '%s' (%s) is ignored: it loads a %s, not an OpSpec",
                        ep.name, ep.value, type(spec).__name__)


def register(spec: OpSpec, *, clobber: bool = False) -> None:
    """Add an op at run time.

    Raises:
        ConveyorError: if the name is taken and ``clobber`` is false.
    """
    if not clobber and (spec.name in _BUILTIN or spec.name in _EXTRA):
        raise ConveyorError(f"op '{spec.name}' is already registered; pass clobber=True to replace it")
    _EXTRA[spec.name] = spec
    _LOADED.pop(spec.name, None)


def builtin_op_names() -> list[str]:
    """The ops that ship with conveyor, sorted (no plug-ins)."""
    return sorted(_BUILTIN)


def op_names() -> list[str]:
    """Every known op, sorted."""
    _read_entry_points()
    return sorted(set(_BUILTIN) | set(_EXTRA))


def is_builtin(name: str) -> bool:
    """Whether ``name`` is one of conveyor's own ops (not a plug-in's)."""
    return name in _BUILTIN and name not in _EXTRA


def get_op(name: str) -> OpSpec | None:
    """The ``OpSpec`` for ``name``, or ``None`` if no such op exists."""
    if name in _LOADED:
        return _LOADED[name]
    _read_entry_points()
    if name in _EXTRA:
        spec = _EXTRA[name]
    elif name in _BUILTIN:
        try:
            spec = _load_ref(_BUILTIN[name])
        except (ImportError, AttributeError) as exc:
            raise ConveyorError(f"op '{name}' is registered as {_BUILTIN[name]} but cannot be "
                                f"loaded: {exc}") from exc
    else:
        return None
    _LOADED[name] = spec
    return spec


def resolve_fn(ref: Any) -> Callable:
    """Import the callable named ``module:attr`` (``attr`` may be dotted).

    Raises:
        ValueError: with what went wrong (bad form, module missing, attribute missing).
    """
    if callable(ref):
        return ref
    obj = resolve_attr(ref)
    if not callable(obj):
        raise ValueError(f"{ref!r} is not callable")
    return obj


def describe(hint: Any) -> str:
    """A short human name for a type hint (``int``, ``list of str``, ``one of a|b``)."""
    origin = typing.get_origin(hint)
    if hint is Fn:
        return "a callable 'module:attr'"
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return "one of " + "|".join(str(m.value) for m in hint)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return " or ".join(describe(a) for a in args) + " or null"
    if origin is list:
        (inner,) = typing.get_args(hint) or (Any,)
        return f"a list of {describe(inner)}"
    if origin is dict or hint is dict:
        return "a mapping"
    if hint is Any:
        return "any value"
    return {int: "an int", float: "a number", bool: "a bool (true/false)", str: "a string"}.get(
        hint, getattr(hint, "__name__", str(hint)))


def coerce(hint: Any, value: Any) -> Any:
    """Check ``value`` against ``hint`` and return it in the param's type.

    Raises:
        TypeError: with the expected type, when the value does not fit.
    """
    origin = typing.get_origin(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is type(None):
                continue
            try:
                return coerce(a, value)
            except TypeError:
                pass
        raise TypeError(describe(hint))
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            return hint(value)
        except ValueError:
            raise TypeError(describe(hint)) from None
    if hint is Fn:
        if not isinstance(value, str):
            raise TypeError(describe(hint))
        return Fn(value)
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise TypeError(describe(hint))
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise TypeError(describe(hint))
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise TypeError(describe(hint))
    if hint is str:
        if isinstance(value, str):
            return value
        raise TypeError(describe(hint))
    if origin is list:
        (inner,) = typing.get_args(hint) or (Any,)
        if not isinstance(value, list):
            raise TypeError(describe(hint))
        try:
            return [coerce(inner, v) for v in value]
        except TypeError:
            raise TypeError(describe(hint)) from None
    if origin is dict or hint is dict:
        if isinstance(value, dict):
            return value
        raise TypeError(describe(hint))
    raise TypeError(f"unsupported param type {hint!r}")  # a bug in an OpSpec, not in the spec

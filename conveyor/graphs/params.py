"""Spec params: ``${name}`` interpolation and typed overrides.

A spec declares ``params:`` with defaults. Overrides come as keyword arguments
(``load_graph(path, batch_size=64)``, already typed) or as ``--set k=v`` strings from the
command line, whose values are read as YAML scalars (``64`` is an int, ``true`` a bool,
``[1, 2]`` a list). An override must name a declared param and fit its type.

Inside node params, a string that is exactly ``${name}`` becomes the param's value with its
type; ``${name}`` inside a longer string is replaced by its text.
"""

from __future__ import annotations

import difflib
import re
from typing import Any, Iterable, Mapping

import yaml

from conveyor.errors import SpecError

_REF = re.compile(r"\$\{([^}]*)\}")
_NUMBER = re.compile(r"[-+]?(\d[\d_]*\.?[\d_]*|\.\d[\d_]*)([eE][-+]?\d+)?")


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest choice, or an empty string."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def parse_set(pairs: Iterable[str], declared: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Turn ``["batch_size=64", "root=s3://b/x"]`` into typed values.

    Each value is read as YAML (``64`` an int, ``0.5`` and ``1e-3`` floats, ``true`` a bool,
    ``[1, 2]`` a list, ``{a: 1}`` a mapping); anything else, dates and ``a: b`` included, stays
    text. Only the first ``=`` splits, so ``filter=x=1`` sets ``filter`` to ``"x=1"``.

    Args:
        pairs: ``key=value`` strings, as given to ``--set``.
        declared: the spec's ``params:``; a param whose default is a string then keeps the text
            as written (``--set tag=007`` gives ``"007"``, not the int 7).

    Raises:
        ValueError: for an item without ``=`` or without a key.

    Example:
        >>> parse_set(["batch_size=64", "lr=1e-3", "root=s3://b/x", "flip=true"])
        {'batch_size': 64, 'lr': 0.001, 'root': 's3://b/x', 'flip': True}
    """
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key, text = key.strip(), raw.strip()
        if not sep or not key:
            raise ValueError(f"--set expects key=value, got {pair!r}")
        try:
            value = yaml.safe_load(text) if text else ""
        except yaml.YAMLError:
            value = text
        if isinstance(value, str) and value == text and _NUMBER.fullmatch(text):
            try:
                value = float(text)  # YAML 1.1 reads 1e-3 (no dot) as a string
            except ValueError:
                pass
        elif isinstance(value, dict) and not text.startswith("{"):
            value = text  # "a: b" is text here, not a mapping
        elif not isinstance(value, (str, bool, int, float, list, dict, type(None))):
            value = text  # dates and timestamps stay as written
        if declared is not None and isinstance(declared.get(key), str) and \
                isinstance(value, (bool, int, float)):
            value = text
        out[key] = value
    return out


def _type_name(value: Any) -> str:
    return {bool: "bool", int: "int", float: "float", str: "string", list: "list", tuple: "list",
            dict: "mapping", type(None): "null"}.get(type(value), type(value).__name__)


def _article(name: str) -> str:
    return ("an " if name[0] in "aeiou" else "a ") + name


def _fits(default: Any, value: Any) -> bool:
    if default is None or value is None:
        return True
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(default, bool) and isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    if isinstance(default, int):
        return isinstance(value, int)
    if isinstance(default, (list, tuple)):
        return isinstance(value, (list, tuple))
    return isinstance(value, type(default))


def apply_overrides(
    declared: Mapping[str, Any], overrides: Mapping[str, Any], *, where: tuple[str, int, int]
) -> tuple[dict[str, Any], list[SpecError]]:
    """Merge ``overrides`` into ``declared`` params, checking names and types.

    Args:
        declared: the spec's ``params:`` with their defaults.
        overrides: typed values from keyword arguments or ``--set``.
        where: (path, line, col) of the spec's ``params:`` block, for error positions.

    Returns:
        The merged params and the errors found (unknown key, wrong type).
    """
    path, line, col = where
    merged = dict(declared)
    errors: list[SpecError] = []
    for key, value in overrides.items():
        if key not in declared:
            errors.append(SpecError(
                "unknown override: the spec declares no such param" + did_you_mean(key, declared)
                + f"; declared: {', '.join(sorted(declared)) or 'none'}", path, line, col, param=key))
            continue
        if not _fits(declared[key], value):
            errors.append(SpecError(
                f"override expects {_article(_type_name(declared[key]))} (like the default "
                f"{declared[key]!r}), got {_type_name(value)} {value!r}", path, line, col, param=key))
            continue
        merged[key] = float(value) if isinstance(declared[key], float) else value
    return merged, errors


def interpolate(value: Any, params: Mapping[str, Any]) -> Any:
    """Replace ``${name}`` references in ``value`` (recursively through lists and dicts).

    Raises:
        KeyError: naming the first undefined param (the caller adds the position).
    """
    if isinstance(value, str):
        whole = _REF.fullmatch(value.strip())
        if whole:
            name = whole.group(1).strip()
            if name not in params:
                raise KeyError(name)
            return params[name]

        def sub(match: re.Match[str]) -> str:
            name = match.group(1).strip()
            if name not in params:
                raise KeyError(name)
            return str(params[name])

        return _REF.sub(sub, value)
    if isinstance(value, list):
        return [interpolate(v, params) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v, params) for k, v in value.items()}
    return value

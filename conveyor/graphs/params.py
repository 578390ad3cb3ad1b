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


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest choice, or an empty string."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def parse_set(pairs: Iterable[str]) -> dict[str, Any]:
    """Turn ``["batch_size=64", "root=s3://b/x"]`` into typed values.

    Raises:
        ValueError: for an item without ``=``.
    """
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set expects key=value, got {pair!r}")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        out[key.strip()] = value
    return out


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


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
                f"unknown override '{key}': the spec declares no such param"
                + did_you_mean(key, declared) + f"; declared: {', '.join(sorted(declared)) or 'none'}",
                path, line, col, param=key))
            continue
        if not _fits(declared[key], value):
            errors.append(SpecError(
                f"override expects {_type_name(declared[key])} (like the default "
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

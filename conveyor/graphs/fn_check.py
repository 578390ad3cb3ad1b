"""Bind a spec's ``args`` (and ``init``) to the signature of the callable they go to.

A typo in a map's ``args`` used to surface at run time as a ``TypeError`` from the first
item. Here the keys are bound to ``fn``'s signature when the spec is checked: an unknown key
(with a did-you-mean), a required argument left out, or an argument the map passes itself
(``rng``, ``generator``) is a spec error naming the node and the param.

``fn`` may be a function (called ``fn(item, **args)``) or a class: then ``init`` goes to its
constructor and ``args`` to its ``__call__`` (see ``conveyor/nodes/_configured.py``).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from conveyor.graphs.params import did_you_mean

PASSED_BY_MAP = ("rng", "generator")  # arguments the map gives fn itself, per sample


def _signature(fn: Callable) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # builtins and C extensions may have none: nothing to check
        return None


def bind_problems(fn: Callable, args: dict[str, Any], *, item: bool, what: str) -> list[str]:
    """What is wrong with calling ``fn([item,] **args)``; empty when the call binds.

    Args:
        fn: the callable (for a class, its constructor is checked).
        args: the keyword arguments the spec gives.
        item: ``fn`` also receives the item as its first positional argument.
        what: how to name ``fn`` in messages (``'mymod:resize'``).
    """
    sig = _signature(fn)
    if sig is None:
        return []
    params = sig.parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    problems = []
    given = dict(args)
    if item:
        for name in PASSED_BY_MAP:
            if name in args:
                problems.append(f"'{name}' is given by the map itself (per sample); remove it from args")
                given.pop(name)
            elif name in params:
                given[name] = None
    names = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if not takes_any:
        for key in given:
            if key not in params or params[key].kind is inspect.Parameter.POSITIONAL_ONLY:
                shown = [n for n in names if not (item and n == names[0])]
                hint = did_you_mean(key, shown) or f"; it takes: {', '.join(shown) or 'no keyword arguments'}"
                problems.append(f"{what} has no argument '{key}'{hint}")
    if problems:
        return problems
    try:
        sig.bind(*([object()] if item else []), **given)
    except TypeError as exc:
        problems.append(f"{what}: {exc}")
    return problems

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

PASSED_BY_MAP = ("rng", "generator", "into")  # arguments the map gives fn itself, per sample


def _signature(fn: Callable) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # builtins and C extensions may have none: nothing to check
        return None


def bind_problems(fn: Callable, args: dict[str, Any], *, item: bool, what: str,
                  passed: bool = True) -> list[tuple[str | None, str]]:
    """What is wrong with calling ``fn([item,] **args)``, as ``(key, message)`` (``key`` the
    argument at fault, or ``None``); empty when the call binds.

    Args:
        fn: the callable (for a class, its constructor is checked).
        args: the keyword arguments the spec gives.
        item: ``fn`` also receives the item as its first positional argument.
        what: how to name ``fn`` in messages (``'mymod:resize'``).
        passed: with ``item``, the caller passes ``rng``/``generator`` when ``fn`` takes them.
    """
    sig = _signature(fn)
    if sig is None:
        return []
    params = sig.parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    problems = []
    given = dict(args)
    if item and passed:
        for name in PASSED_BY_MAP:
            if name in args:
                problems.append((name, f"'{name}' is given by the map itself (per sample); remove it from args"))
                given.pop(name)
            elif name in params:
                given[name] = None
    names = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if not takes_any:
        for key in given:
            if key not in params or params[key].kind is inspect.Parameter.POSITIONAL_ONLY:
                shown = [n for n in names if not (item and n == names[0])]
                hint = did_you_mean(key, shown) or f"; it takes: {', '.join(shown) or 'no keyword arguments'}"
                problems.append((key, f"{what} has no argument '{key}'{hint}"))
    if problems:
        return problems
    try:
        sig.bind(*([object()] if item else []), **given)
    except TypeError as exc:
        problems.append((None, f"{what}: {exc}"))
    return problems


def at_param(param: str, problems: list[tuple[str | None, str]]) -> list[tuple[Any, str]]:
    """``bind_problems`` as the validator's ``(param or (param, key), message)``: a problem with
    one argument points at its key."""
    return [((param, key) if key is not None else param, message) for key, message in problems]


def check_call(ref: str, args: dict[str, Any], init: dict[str, Any] | None, *,
               randomness: bool = True) -> list[tuple[Any, str]]:
    """A map's (or filter's) ``fn``, ``args`` and ``init`` checked together, as
    ``[(param, message)]`` for the validator.

    Args:
        ref: ``fn`` as written (``module:attr``), already known to import.
        args: keyword arguments for each call.
        init: keyword arguments for the constructor, when ``fn`` is a class.
        randomness: the op passes ``rng``/``generator`` (map does, filter does not).
    """
    from conveyor.graphs.registry import resolve_fn

    fn = resolve_fn(ref)
    errors: list[tuple[str, str]] = []
    if isinstance(fn, type):
        call = next((vars(k)["__call__"] for k in fn.__mro__ if "__call__" in vars(k)), None)
        if call is None:
            return [("fn", f"{ref} is a class whose instances are not callable (no __call__)")]
        errors += at_param("init", bind_problems(fn, init or {}, item=False, what=f"{ref}()"))
        try:
            sig = inspect.signature(call)
            bound = sig.replace(parameters=list(sig.parameters.values())[1:])
        except (TypeError, ValueError):
            return errors

        def shaped(item: Any, **kw: Any) -> None: ...
        shaped.__signature__ = bound  # type: ignore[attr-defined]
        errors += at_param("args", bind_problems(shaped, args, item=True, what=f"{ref}.__call__",
                                            passed=randomness))
        return errors
    if init:
        errors.append(("init", f"init goes to a class's constructor, but {ref} is a "
                               f"{type(fn).__name__}, not a class"))
    errors += at_param("args", bind_problems(fn, args, item=True, what=ref, passed=randomness))
    return errors


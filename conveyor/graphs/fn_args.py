"""A ``fn``'s ``args`` checked when the spec is checked, not at the first sample.

``--set image_size=-5`` reaches ``conveyor.image:train_transform`` as ``args: {size: -5}``;
the fn itself refuses it with a ``ValueError``, but only once the graph runs. Here the spec
checker asks the fn's own rules first, so the mistake is a ``SpecError`` naming the node, the
arg and its ``file:line:col``.

A fn declares its rules as an attribute ``check_args(args) -> [(arg, message), ...]`` (an
empty list when all is well). conveyor's built-in fns get theirs from ``_BUILTIN`` below, which
calls the very helpers the fns use, so the rule and the check cannot drift apart; an arg the
table does not know is left to the fn (and to the signature check).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

Problems = list[tuple[str, str]]


def _first_error(check: Callable[[], Any]) -> str | None:
    try:
        check()
    except (ValueError, TypeError) as exc:
        return str(exc)
    return None


def _image_checks(args: Mapping[str, Any], *, resize: bool) -> Problems:
    from conveyor import image

    problems: Problems = []
    size = args.get("size", 224)
    message = _first_error(lambda: image._size_hw(size, "size"))
    if message:
        problems.append(("size", message))
    for name in ("scale", "ratio"):
        if name in args and not resize:
            message = _first_error(lambda: image._range(args[name], name))
            if message:
                problems.append((name, message))
    if resize and "resize" in args and not problems:
        r, (h, w) = args["resize"], image._size_hw(size, "size")
        if isinstance(r, bool) or not isinstance(r, int) or r < max(h, w):
            problems.append(("resize", f"resize={r!r} must be an int >= the larger side of size={size!r}"))
    return problems


def _decode_checks(args: Mapping[str, Any]) -> Problems:
    mode = args.get("mode", "RGB")
    return [] if mode in ("RGB", "L", "RGBA") else [("mode", f"mode={mode!r} must be one of 'RGB', 'L', 'RGBA'")]


def _max_length_checks(args: Mapping[str, Any], specials: int) -> Problems:
    from conveyor import text

    if "max_length" not in args:
        return []
    message = _first_error(lambda: text._check_max_length(args["max_length"], specials))
    return [("max_length", message)] if message else []


def _byte_dtype_checks(args: Mapping[str, Any]) -> Problems:
    from conveyor import text

    if "dtype" not in args:
        return []
    message = _first_error(lambda: text._byte_dtype(
        args["dtype"], bool(args.get("add_bos")), bool(args.get("add_eos")),
        args.get("bos_id", text.BOS_ID), args.get("eos_id", text.EOS_ID)))
    return [("dtype", message)] if message else []


_BUILTIN: dict[str, Callable[[Mapping[str, Any]], Problems]] = {
    "conveyor.image:train_transform": lambda a: _image_checks(a, resize=False),
    "conveyor.image:eval_transform": lambda a: _image_checks(a, resize=True),
    "conveyor.image:decode": _decode_checks,
    "conveyor.text:byte_tokenize": lambda a: _max_length_checks(
        a, bool(a.get("add_bos")) + bool(a.get("add_eos"))) + _byte_dtype_checks(a),
    "conveyor.text:vocab_tokenize": lambda a: _max_length_checks(
        a, (a.get("bos") is not None) + (a.get("eos") is not None)),
}


def check_args(ref: str, fn: Callable, args: Mapping[str, Any]) -> Problems:
    """What is wrong with ``args`` for ``fn`` (named ``ref``), by the fn's own rules.

    Args:
        ref: the fn as the spec names it, ``module:attr``.
        fn: the imported callable.
        args: the node's ``args``, params already filled in.

    Returns:
        ``(arg, message)`` pairs; empty when the fn declares no rules or all hold.

    Example:
        >>> import conveyor.image as image
        >>> check_args("conveyor.image:train_transform", image.train_transform, {"size": -5})
        [('size', 'size=-5 must be positive ints')]
    """
    rule = getattr(fn, "check_args", None) or _BUILTIN.get(str(ref))
    if rule is None or not isinstance(args, Mapping):
        return []
    try:
        return [(str(a), str(m)) for a, m in rule(args)]
    except (ValueError, TypeError) as exc:  # a rule that cannot read the args says so
        return [("args", str(exc))]

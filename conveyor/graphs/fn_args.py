"""What a ``fn`` declares about itself, asked when the spec is checked, not at the first sample.

``--set image_size=-5`` reaches ``conveyor.image:train_transform`` as ``args: {size: -5}``;
the fn itself refuses it with a ``ValueError``, but only once the graph runs. Here the spec
checker asks the fn's own rules first, so the mistake is a ``SpecError`` naming the node, the
arg and its ``file:line:col``.

A fn (a function, or a class a map makes once per worker) carries its rules as attributes.
conveyor's own fns (``conveyor.image``, ``conveyor.text``, ``conveyor.files``) declare them;
a user's fn may declare any of them too, and a fn without them works exactly as before:

- ``check_args(args) -> [(arg, message), ...]``: what is wrong with the node's ``args``
  (an empty list when all is well). conveyor's fns check with the very helpers they run
  with, so the rule and the fn cannot drift apart; an arg a rule does not know is left to
  the fn (and to the signature check, conveyor/graphs/fn_check.py).
- ``per_sample = True``: one sample in, one sample out (never a list of samples), so a
  ``collate`` after its map still needs a ``batch`` between (else: the fn may hand on
  batches of its own, and the spec is not refused for a collate with no batch above it).
- ``heavy_output = True``: its outputs are large decoded samples (images), so a big
  ``shuffle_buffer`` after it is refused (shuffle the small records before decoding).
- ``batch_invariant = True``: given a list (``map`` with ``batch: N``), each result depends
  on its own item alone, never on the others or on the list's length; so ``batch`` changes
  only the speed, and a state saved with another ``batch`` still loads under ``strict=True``
  (not by an elastic resume, which counts the map's lists by the ``batch`` of now).

What a map passes a fn itself, ``rng``, ``generator`` and ``into``, is found from the fn's
signature (a parameter of that name), not declared.

Example:
    >>> def my_fn(item, *, scale=1.0):
    ...     return item
    >>> my_fn.check_args = lambda args: [("scale", "must be > 0")] if args.get("scale", 1) <= 0 else []
    >>> my_fn.per_sample = True
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

Problems = list[tuple[str, str]]


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
    rule = getattr(fn, "check_args", None)
    if rule is None or not isinstance(args, Mapping):
        return []
    try:
        return [(str(a), str(m)) for a, m in rule(args)]
    except (ValueError, TypeError) as exc:  # a rule that cannot read the args says so
        return [("args", str(exc))]


def per_sample(fn: Any) -> bool:
    """Whether ``fn`` declares that it maps one sample to one sample (``fn.per_sample``)."""
    return getattr(fn, "per_sample", False) is True


def batch_invariant(fn: Any) -> bool:
    """Whether ``fn`` declares that its results for a list do not depend on how the items are
    batched (``fn.batch_invariant``)."""
    return getattr(fn, "batch_invariant", False) is True


def heavy_output(fn: Any) -> bool:
    """Whether ``fn`` declares that its outputs are large decoded samples (``fn.heavy_output``)."""
    return bool(getattr(fn, "heavy_output", False))

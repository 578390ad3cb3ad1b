"""What a spec's ``module:attr`` names, imported: a map's ``fn``, ``op: dataset``'s dataset, a
sampler's weights. The compiler resolves them when it checks a spec, and ``conveyor.dataset``
in each worker process that opens a dataset, so this sits below both."""

from __future__ import annotations

import importlib
from typing import Any

from conveyor.errors import did_you_mean


def resolve_attr(ref: Any) -> Any:
    """Import what ``module:attr`` names (``attr`` may be dotted), callable or not.

    Raises:
        ValueError: with what went wrong (bad form, module missing, attribute missing).
    """
    if not isinstance(ref, str) or ":" not in ref:
        raise ValueError(f"expected a callable named 'module:attr', got {ref!r}")
    module_name, _, attr = ref.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import module '{module_name}' for {ref!r}: {exc}") from None
    except Exception as exc:  # the module exists but fails while importing (a bug in user code)
        raise ValueError(f"importing module '{module_name}' for {ref!r} failed: "
                         f"{type(exc).__name__}: {exc}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(obj) if not n.startswith("_")]
            raise ValueError(f"module '{module_name}' has no attribute '{attr}'" + did_you_mean(part, names))
        obj = getattr(obj, part)
    return obj

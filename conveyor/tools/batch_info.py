"""batch_info: a batch's structure as text lines (keys, shapes, dtypes, value ranges).

``conveyor show SPEC --batch`` prints this for ``loader.peek()``; it is also handy in a
notebook: ``print("\\n".join(describe_batch(loader.peek())))``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def _range(t: torch.Tensor) -> str:
    if t.numel() == 0:
        return "empty"
    if t.dtype == torch.bool:
        return f"{int(t.sum())} true of {t.numel()}"
    if t.is_complex():
        return "complex"
    lo, hi = t.min().item(), t.max().item()
    if t.is_floating_point():
        return f"min {lo:.4g}  max {hi:.4g}  mean {t.double().mean().item():.4g}"
    return f"min {lo}  max {hi}"


def _leaf(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        t = value.detach()
        where = "" if t.device.type == "cpu" else f"  on {t.device}"
        return f"tensor {str(t.dtype).removeprefix('torch.')} {list(t.shape)}  {_range(t.cpu())}{where}"
    if isinstance(value, np.ndarray):
        return f"ndarray {value.dtype} {list(value.shape)}  " + (
            _range(torch.from_numpy(np.ascontiguousarray(value))) if value.dtype.kind in "biuf" else "")
    if isinstance(value, (list, tuple)):
        kinds = sorted({type(v).__name__ for v in value})
        return f"{type(value).__name__} of {len(value)} {'/'.join(kinds) or 'items'}"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def describe_batch(batch: Any, prefix: str = "") -> list[str]:
    """One line per leaf of ``batch``: its path (``image``, ``meta.path``, ``[0]``) and what it is.

    Args:
        batch: a batch as a loader yields it (dicts, lists or tuples of tensors, arrays, values).
        prefix: the path of ``batch`` itself inside a bigger structure.

    Example:
        >>> describe_batch({"x": torch.arange(4)})
        ['x  tensor int64 [4]  min 0  max 3']
    """
    if isinstance(batch, dict):
        out = []
        for k, v in batch.items():
            out += describe_batch(v, f"{prefix}.{k}" if prefix else str(k))
        return out
    if isinstance(batch, (list, tuple)) and any(isinstance(v, (dict, list, tuple, torch.Tensor))
                                                for v in batch):
        out = []
        for i, v in enumerate(batch):
            out += describe_batch(v, f"{prefix}[{i}]")
        return out
    return [f"{prefix or '(batch)'}  {_leaf(batch)}"]

"""``conveyor tune``: sweep spec params, print the throughput curve, pick the knee.

    conveyor tune specs/imagenet.yaml --param workers=1,2,4,8 [--param other=a,b] [--seconds 5]

Every combination of the given values (any param the spec declares) runs in this process,
one after the other: a fresh loader, a warm-up, then at least ``seconds`` of measurement,
extended (up to twice as long) while the two halves of the window disagree by more than
10 %. The pick is the knee of the curve: the cheapest setting whose throughput is within
5 % of the best one measured, where a setting is cheaper when its values come earlier in
the lists given (list them from cheap to dear: fewer workers, shallower queues). It is
printed as ``--set`` arguments, and can be written as a params file for ``--params``.

Example:
    >>> grid = parse_grid(["workers=1,2,4"], {"workers": 2})
    >>> grid
    {'workers': [1, 2, 4]}
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from conveyor.bench import drive
from conveyor.graphs.api import check_spec
from conveyor.graphs.compile import compile_plan
from conveyor.graphs.loader import Loader
from conveyor.graphs.params import did_you_mean, parse_set
from conveyor.graphs.yaml_loader import Located

TOLERANCE = 0.05  # the knee: the cheapest setting within 5 % of the best


@dataclass
class Point:
    """One measured setting."""

    params: dict[str, Any]
    cost: tuple[int, ...]      # the values' positions in their lists: lower is cheaper
    samples_per_s: float
    batches_per_s: float
    seconds: float


def parse_grid(specs: Sequence[str], declared: Mapping[str, Any]) -> dict[str, list[Any]]:
    """``["workers=1,2,4"]`` -> ``{"workers": [1, 2, 4]}``, typed like ``--set`` values.

    Raises:
        ValueError: a malformed item, a param the spec does not declare, or a repeated one.
    """
    grid: dict[str, list[Any]] = {}
    for item in specs:
        key, sep, values = item.partition("=")
        key = key.strip()
        if not sep or not key or not values.strip():
            raise ValueError(f"--param expects name=v1,v2,..., got {item!r}")
        if key not in declared:
            raise ValueError(f"--param {key}: the spec declares no such param{did_you_mean(key, declared)}; "
                             f"declared: {', '.join(sorted(declared)) or 'none'}")
        if key in grid:
            raise ValueError(f"--param {key} is given twice")
        grid[key] = [parse_set([f"{key}={v}"], declared)[key] for v in values.split(",")]
    return grid


def settings(grid: Mapping[str, list[Any]]) -> list[tuple[dict[str, Any], tuple[int, ...]]]:
    """Every combination, with its cost (positions in the lists)."""
    keys = list(grid)
    out = []
    for idx in itertools.product(*(range(len(grid[k])) for k in keys)):
        out.append(({k: grid[k][i] for k, i in zip(keys, idx)}, tuple(idx)))
    return out


def knee(points: Sequence[Point], tolerance: float = TOLERANCE) -> Point:
    """The cheapest point within ``tolerance`` of the best throughput."""
    best = max(p.samples_per_s for p in points)
    good = [p for p in points if p.samples_per_s >= (1 - tolerance) * best]
    return min(good, key=lambda p: (sum(p.cost), p.cost, -p.samples_per_s))


def sweep(doc: Located, grid: Mapping[str, list[Any]], *, base: Mapping[str, Any] | None = None,
          seconds: float = 5.0, warmup: float | None = None,
          progress: Callable[[Point], None] | None = None) -> list[Point]:
    """Measure every setting of ``grid`` (over ``base`` overrides), one loader at a time.

    Args:
        doc: the spec, read once.
        grid: param -> values, as from ``parse_grid``.
        base: other overrides (``--set``), kept for every point.
        seconds: measured seconds per point (at least; see the module docstring).
        warmup: seconds before measuring (default: a quarter of ``seconds``, at most 2).
        progress: called with each point as it is measured.

    Raises:
        SpecErrors: a setting makes the spec invalid (checked for all settings before running).
    """
    warmup = min(2.0, seconds / 4) if warmup is None else warmup
    plans = [(check_spec(doc, {**(base or {}), **params}), params, cost) for params, cost in settings(grid)]
    points = []
    for plan, params, cost in plans:
        with Loader(compile_plan(plan)) as loader:
            d = drive(loader, seconds=seconds, warmup=warmup, max_seconds=2 * seconds, stable=0.10)
        point = Point(params, cost, d.samples_per_s, d.batches / d.seconds if d.seconds else 0.0, d.seconds)
        points.append(point)
        if progress is not None:
            progress(point)
    return points


def set_args(params: Mapping[str, Any]) -> str:
    """``--set k=v`` arguments for the shell (values written as YAML flow scalars)."""
    return " ".join(f"--set {k}={_scalar(v)}" for k, v in params.items())


def _scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)) or v is None:
        return json.dumps(v)
    if isinstance(v, str):
        return v if v and all(ch.isalnum() or ch in "-_./:" for ch in v) else json.dumps(v)
    return json.dumps(v)


def format_curve(points: Sequence[Point], pick: Point) -> str:
    """The sweep as a table with a bar per point; the pick and the best are marked."""
    best = max(points, key=lambda p: p.samples_per_s)
    keys = list(points[0].params) if points else []
    cells = [[", ".join(f"{k}={_scalar(p.params[k])}" for k in keys), f"{p.samples_per_s:,.1f}",
              f"{p.batches_per_s:,.2f}", f"{100 * p.samples_per_s / best.samples_per_s:.0f} %"
              if best.samples_per_s else "-"] for p in points]
    w = [max(len(h), *(len(c[i]) for c in cells)) for i, h in
         enumerate(["setting", "samples/s", "batches/s", "of best"])]
    lines = [f"{'setting':<{w[0]}}  {'samples/s':>{w[1]}}  {'batches/s':>{w[2]}}  {'of best':>{w[3]}}"]
    for p, c in zip(points, cells):
        bar = "#" * round(30 * p.samples_per_s / best.samples_per_s) if best.samples_per_s else ""
        mark = "  <- pick" if p is pick else ("  <- best" if p is best else "")
        lines.append(f"{c[0]:<{w[0]}}  {c[1]:>{w[1]}}  {c[2]:>{w[2]}}  {c[3]:>{w[3]}}  {bar}{mark}")
    return "\n".join(lines)


def params_yaml(params: Mapping[str, Any], header: str) -> str:
    """A params file (``--params FILE``): a YAML mapping with a comment saying where it came from."""
    lines = [f"# {line}" for line in header.splitlines()]
    lines += [f"{k}: {json.dumps(v)}" for k, v in params.items()]  # JSON is YAML, typed as given
    return "\n".join(lines) + "\n"

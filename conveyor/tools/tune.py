"""``conveyor tune``: sweep spec params, measure each setting in rounds, pick the knee.

    conveyor tune specs/imagenet.yaml --param workers=1,2,4 [--rounds 3] [--seconds 2]
                                      [--plot tune.svg] [--report report.html] [--write FILE]

Every combination of the given values (any param the spec declares) is measured in
``rounds`` alternating rounds: round 1 measures the settings in the order given, round 2 in
reverse, and so on, each time from a fresh loader (a warm-up, then ``seconds`` measured), so
a machine that slows down or speeds up during the sweep weighs on every setting alike.

A setting's figure is the median of its rounds, and its spread is the range the rounds
covered. The pick is the knee of the curve: the cheapest setting as good as the best one,
where *as good* means a median within ``TOLERANCE`` (5 %) of the best median, and a setting
is cheaper when its values come earlier in the lists given (list them from cheap to dear:
fewer workers, shallower queues). A pick is named only when every other setting is as good
or clearly worse (all its rounds below the best's): when a setting's median is below but its
rounds overlap the best's, the noise is larger than the difference, and the sweep says so
instead of naming a winner: measure more rounds, longer, or on a quieter machine.

Example:
    >>> grid = parse_grid(["workers=1,2,4"], {"workers": 2})
    >>> grid
    {'workers': [1, 2, 4]}
"""

from __future__ import annotations

import itertools
import json
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from conveyor.graphs.api import check_spec
from conveyor.graphs.params import did_you_mean, parse_set
from conveyor.graphs.validate import Plan
from conveyor.graphs.yaml_loader import Located

TOLERANCE = 0.05  # the knee: the cheapest setting within 5 % of the best median

# what one measurement gives: samples/s, batches/s, seconds measured
Measure = Callable[[Plan, Mapping[str, Any]], tuple[float, float, float]]


@dataclass
class Point:
    """One setting and its measured rounds.

    Attributes:
        params: the swept params' values.
        cost: the values' positions in their lists (lower is cheaper).
        rates: samples/s, one per round.
        batch_rates: batches/s, one per round.
        seconds: measured seconds, all rounds together.
    """

    params: dict[str, Any]
    cost: tuple[int, ...]
    rates: list[float] = field(default_factory=list)
    batch_rates: list[float] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def samples_per_s(self) -> float:
        """The median of the rounds."""
        return statistics.median(self.rates) if self.rates else 0.0

    @property
    def batches_per_s(self) -> float:
        return statistics.median(self.batch_rates) if self.batch_rates else 0.0

    @property
    def low(self) -> float:
        return min(self.rates) if self.rates else 0.0

    @property
    def high(self) -> float:
        return max(self.rates) if self.rates else 0.0

    @property
    def spread(self) -> float | None:
        """Half the range of the rounds, as a fraction of the median (None: one round)."""
        if len(self.rates) < 2 or self.samples_per_s <= 0:
            return None
        return (self.high - self.low) / 2 / self.samples_per_s

    def label(self) -> str:
        return ", ".join(f"{k}={_scalar(v)}" for k, v in self.params.items())


@dataclass
class Verdict:
    """What the sweep concludes.

    Attributes:
        best: the setting with the highest median.
        pick: the cheapest setting as good as the best; None when the noise hides the answer.
        tied: settings cheaper than the pick (or than the best) that the noise cannot tell
            apart from the best; empty when the pick is clear.
        sentence: the conclusion in words.
    """

    best: Point
    pick: Point | None
    tied: list[Point]
    sentence: str


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


def _cheaper(p: Point) -> tuple:
    return (sum(p.cost), p.cost)


def decide(points: Sequence[Point], tolerance: float = TOLERANCE) -> Verdict:
    """The knee of the curve, or the admission that the noise hides it.

    A setting is *as good as the best* when its median is within ``tolerance`` of the best
    median, and *clearly worse* when all its rounds are below all the best's rounds. The
    pick is the cheapest setting as good as the best, and it is only named when every other
    setting is one or the other: a setting below the best by its median whose rounds overlap
    the best's might be as good or better, so the sweep cannot tell and names no winner.
    """
    if not points:
        raise ValueError("no points to decide between")
    best = max(points, key=lambda p: (p.samples_per_s, [-c for c in _cheaper(p)[1]]))
    floor = (1 - tolerance) * best.samples_per_s
    good = [p for p in points if p.samples_per_s >= floor]
    pick = min(good, key=_cheaper)
    tied = sorted((p for p in points if p not in good and len(p.rates) > 1 and len(best.rates) > 1
                   and p.high >= best.low), key=_cheaper)
    share = pick.samples_per_s / best.samples_per_s if best.samples_per_s else 0.0
    if tied:
        gap = 1 - tied[0].samples_per_s / best.samples_per_s if best.samples_per_s else 0.0
        noise = max(s for s in (tied[0].spread, best.spread) if s is not None)
        return Verdict(best, None, tied, (
            f"no pick: {tied[0].label()} measured {gap:.0%} below the best ({best.label()}), but the rounds "
            f"vary by up to ±{noise:.0%} and overlap, so the two cannot be told apart; measure more rounds "
            "(--rounds), longer (--seconds) or on a quieter machine"))
    if len(best.rates) < 2:
        return Verdict(best, pick, [], (
            f"pick: {pick.label()} ({share:.0%} of the best; one round, so the noise is unknown: "
            "use --rounds 3 to see it)"))
    return Verdict(best, pick, [], f"pick: {pick.label()}, the cheapest setting within {tolerance:.0%} of "
                   f"the best ({share:.0%} of the best)")


def knee(points: Sequence[Point], tolerance: float = TOLERANCE) -> Point:
    """The cheapest point within ``tolerance`` of the best median, whatever the noise."""
    best = max(p.samples_per_s for p in points)
    return min((p for p in points if p.samples_per_s >= (1 - tolerance) * best), key=_cheaper)


def measure_loader(seconds: float, warmup: float) -> Measure:
    """The real measurement: a fresh loader, a warm-up, then at least ``seconds``."""
    def measure(plan: Plan, params: Mapping[str, Any]) -> tuple[float, float, float]:
        from conveyor.tools.measure import drive
        from conveyor.graphs.compile import compile_plan
        from conveyor.graphs.loader import Loader

        with Loader(compile_plan(plan)) as loader:
            d = drive(loader, seconds=seconds, warmup=warmup, max_seconds=2 * seconds, stable=0.10)
        return d.samples_per_s, (d.batches / d.seconds if d.seconds else 0.0), d.seconds

    return measure


def sweep(doc: Located, grid: Mapping[str, list[Any]], *, base: Mapping[str, Any] | None = None,
          seconds: float = 2.0, warmup: float | None = None, rounds: int = 3,
          measure: Measure | None = None,
          progress: Callable[[Point, int], None] | None = None) -> list[Point]:
    """Measure every setting of ``grid`` (over ``base`` overrides) in alternating rounds.

    Args:
        doc: the spec, read once.
        grid: param -> values, as from ``parse_grid``.
        base: other overrides (``--set``), kept for every point.
        seconds: measured seconds per setting and round (at least; see ``drive``).
        warmup: seconds before measuring (default: a quarter of ``seconds``, at most 2).
        rounds: how many times each setting is measured; odd rounds go in reverse order.
        measure: ``(plan, params) -> (samples/s, batches/s, seconds)``; default: a fresh
            loader each time (``measure_loader``). Tests plant rates here.
        progress: called with the point and the round (from 1) after each measurement.

    Raises:
        SpecErrors: a setting makes the spec invalid (checked for all settings before running).
        ValueError: ``rounds`` < 1.
    """
    if rounds < 1:
        raise ValueError(f"{rounds=} must be >= 1")
    warmup = min(2.0, seconds / 4) if warmup is None else warmup
    measure = measure or measure_loader(seconds, warmup)
    plans = [(check_spec(doc, {**(base or {}), **params}), Point(params, cost))
             for params, cost in settings(grid)]
    for r in range(rounds):
        for plan, point in (plans if r % 2 == 0 else reversed(plans)):
            rate, batch_rate, secs = measure(plan, point.params)
            point.rates.append(rate)
            point.batch_rates.append(batch_rate)
            point.seconds += secs
            if progress is not None:
                progress(point, r + 1)
    return [p for _, p in plans]


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


def format_curve(points: Sequence[Point], verdict: Verdict) -> str:
    """The sweep as a table: median, spread and a bar per point; pick, best and ties marked."""
    best = verdict.best
    top = best.samples_per_s
    cells = [[p.label(), f"{p.samples_per_s:,.1f}",
              "-" if p.spread is None else f"±{100 * p.spread:.0f} %",
              f"{p.batches_per_s:,.2f}", f"{100 * p.samples_per_s / top:.0f} %" if top else "-"]
             for p in points]
    head = ["setting", "samples/s", "spread", "batches/s", "of best"]
    w = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w[0]) if i == 0 else h.rjust(w[i]) for i, h in enumerate(head))]
    for p, c in zip(points, cells):
        bar = "#" * round(30 * p.samples_per_s / top) if top else ""
        mark = ("  <- pick" if p is verdict.pick else "  <- best" if p is best
                else "  <- within the noise of the best" if p in verdict.tied else "")
        lines.append("  ".join(x.ljust(w[0]) if i == 0 else x.rjust(w[i]) for i, x in enumerate(c))
                     + f"  {bar}{mark}")
    return "\n".join(lines)


def params_yaml(params: Mapping[str, Any], header: str) -> str:
    """A params file (``--params FILE``): a YAML mapping with a comment saying where it came from."""
    lines = [f"# {line}" for line in header.splitlines()]
    lines += [f"{k}: {json.dumps(v)}" for k, v in params.items()]  # JSON is YAML, typed as given
    return "\n".join(lines) + "\n"

"""Which node limits a graph, and a sentence saying so, from each node's figures.

The limiting node is the busiest one, relative to the threads it has: in a pipeline every
stage but the slowest waits part of the time, so the stage that is busy nearly all the time
sets the pace. A trainer simulated with ``step_time`` can be the limit itself.
"""

from __future__ import annotations

from typing import Any

from conveyor.graphs.stats import node_perf
from conveyor.graphs.loader import Loader
from conveyor.tools.measure import counted_nodes
from conveyor.tools.tables import pct


def node_rows(loader: Loader, raws: dict[str, dict], wall: float) -> dict[str, dict[str, Any]]:
    """Per node: op, items over ``wall`` seconds, the perf figures (instrument.node_perf) and
    ``unit``: what one of its items is, ``"batches"`` from a batching op on, else ``"items"``."""
    counted = counted_nodes(loader)
    plan = loader._c.plan
    perf = node_perf(counted, {n: plan.nodes[n].inputs for n in counted}, raws, wall)
    rows: dict[str, dict[str, Any]] = {}
    for name in loader._c.order:
        node = plan.nodes[name]
        batched = node.op.batches or any(rows.get(i, {}).get("unit") == "batches" for i in node.inputs)
        row: dict[str, Any] = {"op": node.op.name, "items": None, "perf": None,
                               "unit": "batches" if batched else "items"}
        if name in counted:
            row["items"] = raws[name].get("items", 0)
            row["perf"] = perf.get(name)
        rows[name] = row
    return rows


def find_bottleneck(rows: dict[str, dict[str, Any]], wall: float, *, trainer_busy: float | None = None,
                    step_time: float = 0.0, data_wait: float | None = None,
                    starts: float | None = None) -> tuple[str | None, str]:
    """The node (or ``"trainer"``) that limits the graph, and a sentence saying so.

    The limit is the busiest stage, relative to its threads: a node, or the trainer. A node
    whose work runs out of sight (process workers, worker copies) is named when its
    consumer waits on it most of the time while it hardly waits on its inputs. When nothing
    is busy half the time, nothing is named, and the sentence says where the time went.

    Args:
        rows: per node ``{"op", "perf"}`` as from ``node_rows`` or ``Loader.stats()["nodes"]``.
        wall: the seconds the figures cover.
        trainer_busy: share of the time a simulated trainer spent on its steps.
        step_time: that trainer's seconds per batch (for the sentence).
        data_wait: share of the time the trainer (or the loop) waited for data.
        starts: share of the time spent starting epochs (``iter()`` to the first batch).
    """
    def label(name: str) -> str:
        row = rows[name]
        runs = (row.get("perf") or {}).get("runs")
        return f"{name} ({row['op']}{', ' + runs if runs else ''})"

    known = [(p["busy"], name) for name, row in rows.items()
             if (p := row.get("perf")) and p.get("busy") is not None]
    best_busy, best = max(known) if known else (0.0, None)
    # the nodes that share one thread (not a map's workers) add up to that thread's load
    # (less their reset work, which ran in the thread that started the epoch)
    threads: dict[str, list[tuple[float, str]]] = {}
    for busy, name in known:
        p = rows[name]["perf"]
        if p.get("thread") and p.get("threads", 1) == 1 and wall > 0:
            own = max(0.0, busy - (p.get("reset_s") or 0.0) / wall)
            threads.setdefault(p["thread"], []).append((own, name))
    load = {t: min(1.0, sum(b for b, _ in members)) for t, members in threads.items()}  # past 1: noise
    busiest = max(load, key=lambda t: load[t]) if load else None
    best_thread = load[rows[best]["perf"]["thread"]] if best and rows[best]["perf"].get("thread") in load else 0.0
    restarts = f"; epoch starts (iter() to the first batch) take {pct(starts)} of the time" \
        if starts is not None and starts >= 0.1 else ""
    if best is not None and best_busy >= 0.5 and best_busy >= 0.75 * best_thread \
            and best_busy >= (trainer_busy or 0.0):
        p = rows[best]["perf"]
        return best, (f"{label(best)} limits the graph: {pct(best_busy)} busy; inputs wait {pct(p.get('wait'))}"
                      + restarts)
    if busiest is not None and load[busiest] >= 0.5 and load[busiest] >= (trainer_busy or 0.0):
        members = sorted(threads[busiest], reverse=True)
        shares = ", ".join(f"{n} {pct(b)}" for b, n in members if b >= 0.01) or "each under 1 %"
        first = next(n for n in rows if n in {m for _, m in members})
        return f"thread:{busiest}", (
            f"one thread runs {first} to {busiest} and limits the graph: {pct(load[busiest])} busy between "
            f"them ({shares}); give the heaviest its own workers (map workers) or run the graph in worker "
            "copies" + restarts)
    trainer = f"the trainer ({1000 * step_time:g} ms a step)"
    if trainer_busy is not None and step_time > 0 and trainer_busy >= 0.5 and (data_wait or 0.0) < 0.25:
        tail = f"; the busiest node, {label(best)}, is {pct(best_busy)} busy" if best else ""
        return "trainer", (f"{trainer} limits the graph: it waits for data {pct(data_wait or 0.0)} of the "
                           f"time{tail}{restarts}")
    hidden = []  # work out of sight: a node its consumer waits on, that hardly waits itself
    for name, row in rows.items():
        p = row.get("perf") or {}
        if p.get("busy") is None and p.get("runs") and p.get("seconds") is not None and wall > 0:
            consumer_waits = p["seconds"] / wall
            if consumer_waits > 0.5 and (p.get("wait") or 0.0) < 0.5:
                hidden.append((consumer_waits, name))
    if hidden:
        w, name = max(hidden)
        return name, (f"{label(name)} limits the graph: its consumer waits on it {pct(w)} of the time; "
                      f"inputs wait {pct(rows[name]['perf'].get('wait'))}")
    if best is None:
        return None, "no node could be timed (none ran in this process)"
    waits = f"; {'the trainer' if step_time > 0 else 'the loop'} waits for data {pct(data_wait)}" \
        if data_wait is not None else ""
    where = restarts or "; start-up, epoch starts, thread hand-offs or the GIL take the rest of the time"
    return None, f"no node limits the graph: the busiest, {label(best)}, is {pct(best_busy)} busy{waits}{where}"


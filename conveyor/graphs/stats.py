"""stats: from a running graph's counters to what a user reads.

``node_perf`` turns the counters of ``Counted`` (conveyor/graphs/instrument.py) into per-node
figures: busy seconds (its own work: its time minus its same-thread inputs' time, or ``fn``
time on the workers), wait seconds (time spent getting items from its inputs), items/s and
how full its queue ran. ``epoch_stats`` is ``Loader.stats()``: those figures with what each
node counts itself, for the current epoch; ``skip_ledger`` is ``Loader.skipped()``: the
samples ``on_error: skip`` left out, from this process's nodes and the worker copies'.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from torchdata.nodes import BaseNode

from conveyor.nodes import LEDGER_KEY, Map, WorkerCopies, gather, ledgers

if TYPE_CHECKING:
    from conveyor.graphs.epochs import Epochs
    from conveyor.graphs.instrument import Counted


def describe(inner: BaseNode) -> str:
    """How a node runs, for tables: ``"2 thread workers"``, ``"3 process copies"``, ``""``."""
    if isinstance(inner, Map) and inner.workers:
        return f"{inner.workers} {inner.method} worker{'s' if inner.workers > 1 else ''}"
    if isinstance(inner, WorkerCopies):
        return f"{inner.copies} {inner.method} copies"
    return ""


def add_raw(a: Mapping[str, Any], b: Mapping[str, Any], sign: int = 1) -> dict[str, Any]:
    """``a + b`` (or ``a - b`` with ``sign=-1``) of two ``Counted.raw()`` dicts."""
    out = dict(a)
    for k, v in b.items():
        if k == "q_max":
            out[k] = max(out.get(k, 0), v)
        else:
            out[k] = out.get(k, 0) + sign * v
    return out


def node_perf(counted: Mapping[str, Counted], inputs: Mapping[str, Iterable[str]],
              raws: Mapping[str, Mapping[str, Any]], wall: float) -> dict[str, dict[str, Any]]:
    """Per node: busy and wait seconds and fractions, items/s and queue fill.

    Args:
        counted: the graph's ``Counted`` nodes by name (for which thread each ran in).
        inputs: each node's input names (names not in ``counted`` ran in worker copies).
        raws: ``Counted.raw()`` per node, possibly summed over epochs.
        wall: the seconds the counters cover.

    ``busy_s`` is the node's own work: its time minus its same-thread inputs' time, or for a
    map with thread workers the time in ``fn`` summed over the workers (``threads`` of them
    can be busy at once); ``None`` where the work runs out of sight (process workers, worker
    copies, or a prefetch, which only moves items). ``wait_s`` is the time spent getting
    items from its inputs, in its own thread or in its background thread; ``reset_s`` is the
    part of ``busy_s`` done in resets (in the thread that started the epoch). ``thread`` names
    the thread a node ran in by the last node of that thread (the one pulled from another
    thread or by the caller): the busy shares of the nodes of one thread add up.
    """
    out: dict[str, dict[str, Any]] = {}
    for name, c in counted.items():
        raw = raws.get(name)
        if not raw:
            continue
        ins = list(inputs.get(name, ()))
        known = [i for i in ins if i in counted and raws.get(i)]
        same = [i for i in known if counted[i].tid is None or c.tid is None or counted[i].tid == c.tid]
        remote = any(i not in counted for i in ins) or isinstance(c.inner, WorkerCopies)
        threaded = remote or len(same) < len(known)
        wait_s: float | None = sum(raws[i]["seconds"] for i in known)
        threads = 1
        if c.timed_fn:
            busy_s: float | None = raw["work_seconds"]
            threads = c.inner.workers
        elif threaded:
            busy_s = None
            if remote:
                wait_s = None
        else:
            busy_s = max(0.0, raw["seconds"] - sum(raws[i]["seconds"] for i in same))
        # its own reset work (a shuffle filling its window): its inputs reset inside its reset
        reset_s = max(0.0, raw.get("reset_seconds", 0.0) - sum(raws[i].get("reset_seconds", 0.0) for i in known))
        entry: dict[str, Any] = {
            "seconds": round(raw["seconds"], 6),
            "reset_s": round(reset_s, 6),
            "busy_s": None if busy_s is None else round(busy_s, 6),
            "wait_s": None if wait_s is None else round(wait_s, 6),
            "threads": threads,
            "busy": None if busy_s is None or wall <= 0 else round(busy_s / (threads * wall), 4),
            "wait": None if wait_s is None or wall <= 0 else round(wait_s / wall, 4),
            "items_per_s": round(raw["items"] / wall, 3) if wall > 0 else 0.0,
            "runs": describe(c.inner),
            "queue": None,
            "thread": None,
        }
        if c.queue_capacity:
            n = raw["q_n"]
            entry["queue"] = {"capacity": c.queue_capacity, "samples": n,
                              "mean": round(raw["q_sum"] / n, 3) if n else None, "max": raw["q_max"]}
        out[name] = entry
    # the nodes that ran in one thread, labelled by the last of them (the one pulled from
    # another thread or by the caller): their busy shares add up to that thread's load
    groups: dict[int, list[str]] = {}
    for name, c in counted.items():
        if name in out and c.tid is not None:
            groups.setdefault(c.tid, []).append(name)
    for names in groups.values():
        fed = {i for n in names for i in inputs.get(n, ())}
        label = next((n for n in reversed(names) if n not in fed), names[-1])
        for n in names:
            out[n]["thread"] = label
    return out


# ----- the loader's stats() and skipped() --------------------------------------------------

def epoch_stats(epochs: Epochs) -> dict[str, Any]:
    """What each node did in the current epoch, as plain data (``Loader.stats()``)."""
    run = epochs.run
    c = run.compiled
    nodes = {}
    copies = run.copies()
    from_copies = copies.copy_stats() if copies is not None else {}
    elapsed = time.perf_counter() - epochs.t_start if epochs.started else 0.0
    wall = elapsed + run.root.reset_seconds if epochs.started else 0.0
    perf = node_perf(c.nodes, {n: c.plan.nodes[n].inputs for n in c.nodes},
                     {n: counted.raw() for n, counted in c.nodes.items()}, wall)
    for name in c.order:
        entry: dict[str, Any] = {"op": c.plan.nodes[name].op.name}
        if name in from_copies:  # counted inside the worker copies, summed over them
            entry.update(from_copies[name])
        counted = c.nodes.get(name)
        if counted is not None:
            entry["items"] = counted.items
            own = getattr(counted.inner, "stats", None)
            if callable(own):
                entry.update(own())
        entry["perf"] = perf.get(name)
        nodes[name] = entry
    return {"epoch": epochs.epoch, "batches": epochs.yielded, "seconds": elapsed,
            "data_wait_s": round(run.root.seconds, 6), "nodes": nodes,
            "even_batches": {"agreeing": run.ranks.agreeing,
                             "epochs_cut": epochs.epochs_cut,
                             "this_epoch_cut": epochs.cut}}


def skip_ledger(epochs: Epochs) -> dict[str, Any]:
    """The ledger of the samples ``on_error: skip`` left out, since the run began
    (``Loader.skipped()``)."""
    if not epochs.started:
        return {"count": 0, "entries": []}  # nothing ran yet (and nothing is started to ask)
    c = epochs.run.compiled
    # the nodes of this process are read live (their ledgers in a state are as of the point a
    # restore would replay from), and those of worker copies as the copies last reported them
    live = [counted.inner.ledger.state() for counted in c.nodes.values()
            if getattr(counted.inner, "ledger", None) is not None]
    if c.copied:
        copies = epochs.run.copies()
        live += (copies.copy_ledgers() if copies is not None
                 else list(ledgers(epochs.rank_state()["graph"], set(c.copied))))
    entries, count = gather([{LEDGER_KEY: ledger} for ledger in live])
    return {"count": count, "entries": entries}

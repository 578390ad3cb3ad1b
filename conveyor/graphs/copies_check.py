"""The spec's top-level ``workers``: run the per-item part of the graph in N worker copies.

    workers: 2                                   # shorthand: 2 processes, default `until`
    workers: {copies: 2, method: process, until: tokenize, mp_context: spawn}
    workers: {copies: 4, method: ray, address: "10.0.0.1:6379"}   # Ray actors (RAY_ADDRESS by default)
    workers: {copies: 2, timeout: 600}           # a copy silent for 600 s is an error naming it

``until`` is the last node run inside the copies; the default is the node just before the
first batching op (``OpSpec.batches``: ``batch``, ``bucket_batch``) on the way to the output,
so that per-item work is copied and batches are cut from the merged stream (then, when the
copied part maps items one to one, the batches are those of ``workers: 1``). Every source in
the copied part must be followed by a ``shard`` with ``by: [..., worker]`` (an op whose
``OpSpec.deal`` deals by worker), or every copy would yield every item; with
``method: process`` every ``fn`` in it must pickle; ``method: ray`` needs Ray installed.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import pickle
from dataclasses import dataclass
from typing import Any

from conveyor.graphs.params import did_you_mean, interpolate
from conveyor.graphs.registry import resolve_fn

METHODS = ("process", "thread", "ray")
KEYS = ("copies", "method", "until", "mp_context", "address", "timeout")


@dataclass(frozen=True)
class CopiesPlan:
    count: int
    method: str
    until: str
    mp_context: str | None
    address: str | None = None
    timeout: float | None = None  # seconds a copy may send nothing (DataLoader's timeout); None: no limit


def start_methods() -> list[str]:
    """The multiprocessing start methods this platform offers (``fork``, ``spawn``, ...)."""
    return sorted(multiprocessing.get_all_start_methods())


COPIES_MAX = 1024  # as a map's workers: past it a hang (billions of processes) or a MemoryError


def _default_until(nodes: dict, output: str) -> str:
    chain = [output]
    while nodes.get(chain[-1]) is not None and len(nodes[chain[-1]].inputs) == 1:
        chain.append(nodes[chain[-1]].inputs[0])
    for i in range(len(chain) - 1, -1, -1):  # from the source side
        node = nodes.get(chain[i])
        if node is not None and node.op.batches and i + 1 < len(chain):
            return chain[i + 1]
    return output


def check_copies(raw: Any, nodes: dict, graph: dict[str, list[str]], output: str,
                 params: dict[str, Any], errs: Any, names: Any = ()) -> CopiesPlan | None:
    """Read and check the top-level ``workers``; errors go to ``errs``.

    ``nodes`` holds the nodes that passed their own checks; ``names`` every node of the spec,
    so that a node already reported as broken is not reported again (nor looked up)."""
    if raw is None:
        return None
    at = ("workers",)
    try:
        raw = interpolate(raw, params)
    except KeyError as missing:
        errs.add(f"undefined param '${{{missing.args[0]}}}'" + did_you_mean(missing.args[0], params), at,
                 param="workers")
        return None
    spec = {"copies": raw} if isinstance(raw, int) and not isinstance(raw, bool) else raw
    if not isinstance(spec, dict):
        errs.add(f"workers must be a count or a mapping with {', '.join(KEYS)}, got {raw!r}", at,
                 param="workers")
        return None
    ok = True
    for key in spec:
        if key not in KEYS:
            errs.add(f"unknown key '{key}' in workers" + did_you_mean(key, KEYS), at + (key,), key=True,
                     param="workers")
            ok = False
    count = spec.get("copies", 1)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        errs.add(f"workers: copies must be a positive int, got {count!r}", at + ("copies",),
                 param="workers")
        ok = False
    elif count > COPIES_MAX:
        errs.add(f"workers: copies must be at most {COPIES_MAX} (a process or thread each), got {count!r}",
                 at + ("copies",), param="workers")
        ok = False
    mp_context = spec.get("mp_context")
    if mp_context is not None and mp_context not in start_methods():
        errs.add(f"workers: mp_context must be one of {'|'.join(start_methods())} (the start methods "
                 f"of this platform), got {mp_context!r}" + did_you_mean(str(mp_context), start_methods()), at + ("mp_context",),
                 param="workers")
        ok = False
    method = spec.get("method", "process")
    if method not in METHODS:
        errs.add(f"workers: method must be one of {'|'.join(METHODS)}, got {method!r}", at + ("method",),
                 param="workers")
        ok = False
    address = spec.get("address")
    if address is not None and (method != "ray" or not isinstance(address, str) or not address):
        errs.add(f"workers: address names the Ray cluster of method: ray, got {address!r} with method: "
                 f"{method}", at + ("address",), param="workers")
        ok = False
    timeout = spec.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not timeout > 0 or timeout == float("inf")):
        errs.add(f"workers: timeout must be a positive number of seconds a copy may send nothing (or "
                 f"null: no limit), got {timeout!r}", at + ("timeout",), param="workers")
        ok = False
    if method == "ray" and importlib.util.find_spec("ray") is None:
        errs.add("workers: method: ray needs Ray, which is not installed: pip install 'conveyor[ray]' "
                 "(keeps torch as it is)", at + ("method",), param="workers")
        ok = False
    until = spec.get("until") or _default_until(nodes, output)
    if isinstance(until, str) and until in names and until not in nodes:
        return None  # a broken node, reported already
    if not isinstance(until, str) or until not in nodes:
        errs.add(f"workers: until '{until}' is not a node" + did_you_mean(str(until), nodes),
                 at + ("until",), param="workers")
        return None
    if not ok:
        return None
    plan = CopiesPlan(count, method, until, spec.get("mp_context"), address, timeout)
    if count == 1:
        return plan
    copied = _closure(until, graph)
    for name in sorted(n for n in copied if n in nodes):  # a broken node is reported already
        node = nodes[name]
        if node.op.inputs == "none" and not _sharded_by_worker(name, until, nodes, graph):
            errs.add(f"graph-level workers copy '{name}' into {count} workers, but no shard with "
                     f"by: [rank, worker] follows it before '{until}': every copy would yield every "
                     "item", ("nodes", name), key=True, node=name, op=node.op.name)
        fn = getattr(node.params, "fn", None) if node.params is not None else None
        if method == "process" and fn:
            try:
                pickle.dumps(resolve_fn(fn))
            except Exception as exc:
                errs.add(f"workers: method: process sends this node's fn {fn!r} to worker "
                         f"processes, but it cannot be pickled ({type(exc).__name__}); define it at "
                         "module level or use method: thread", ("nodes", name, "fn"), node=name,
                         op=node.op.name, param="fn")
    return plan


def _closure(name: str, graph: dict[str, list[str]]) -> set[str]:
    seen = {name}
    todo = [name]
    while todo:
        for m in graph.get(todo.pop(), []):
            if m not in seen:
                seen.add(m)
                todo.append(m)
    return seen


def _sharded_by_worker(source: str, until: str, nodes: dict, graph: dict[str, list[str]]) -> bool:
    consumers = {i: n for n, ins in graph.items() for i in ins}
    cur = source
    while True:
        node = nodes.get(cur)
        if node is None:
            return True  # a broken node, reported already: no second error about it
        if node.op.deal is not None and node.params is not None and node.op.deal(node.params).by_worker:
            return True
        if cur == until or cur not in consumers:
            return False
        cur = consumers[cur]

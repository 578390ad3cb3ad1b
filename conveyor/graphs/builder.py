"""conveyor.Graph: build a spec in Python, checked and compiled exactly as a YAML spec is.

```python
from conveyor import Graph
from conveyor.files import read_numbers

graph = (Graph(params={"root": "examples/data/numbers", "batch_size": 8, "seed": 0})
         .node("files", "list_files", url="${root}/*/*.txt", label="parent_dir", shuffle=True)
         .node("shard", "shard", by=["rank"])
         .node("parse", "map", fn=read_numbers, workers=2)        # a callable or "module:attr"
         .node("batch", "batch", size="${batch_size}")
         .node("collate", "collate"))
with graph.load(batch_size=4) as loader:                          # same overrides as load_graph
    for batch in loader: ...
graph.to_yaml("numbers.yaml")                                     # the same graph as a spec file
```

The graph is plain spec data, read by the same validator: the same errors, each naming the
file and line of the ``.node(...)`` call that wrote the node (or of ``Graph(...)`` for params
and graph-level keys). ``to_yaml()`` writes a spec that loads into the identical graph (same
digest, so states move between the two). A callable given as a param (``fn=read_numbers``,
``dataset=MyDataset``) is written as its ``module:attr``; lambdas and nested functions have
none and are refused. ``${spec_dir}`` in a Graph is the folder of the script that made it.
"""

from __future__ import annotations

import enum
import inspect
import os
import sys
from typing import Any

import yaml

from conveyor.errors import SpecError, SpecErrors

_TOP = ("description", "resumable", "even_batches", "workers")


def _call_site(depth: int) -> tuple[str, int, int]:
    """(file, line, col) of the caller ``depth`` frames up."""
    frame = sys._getframe(depth + 1)
    info = inspect.getframeinfo(frame, context=0)
    col = 1
    positions = getattr(info, "positions", None)
    if positions is not None and positions.col_offset is not None:
        col = positions.col_offset + 1
    return info.filename, info.lineno, col


def _plain(value: Any, what: str) -> Any:
    """A param value as spec data: callables as ``module:attr``, enums as values, tuples as lists,
    paths (``os.PathLike``) as strings."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v, what) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v, what) for k, v in value.items()}
    if callable(value) and (inspect.isfunction(value) or inspect.isclass(value) or inspect.isbuiltin(value)):
        qualname = getattr(value, "__qualname__", "")
        if "<" in qualname:  # <lambda>, <locals>
            raise ValueError(f"{what}: {qualname} cannot be named as 'module:attr'; define it at module level")
        return f"{value.__module__}:{qualname}"
    return value


class Graph:
    """A spec built in Python.

    Args:
        params: the spec's ``params:`` (each can be overridden in ``load``/``check``).
        output: the output node (default: the last node added).
        **top: graph-level keys: ``workers``, ``resumable``, ``even_batches``, ``description``.

    Example:
        >>> g = Graph(params={"n": 2}).node("files", "list_files", url="data/*.txt")
        >>> g = g.node("b", "batch", size="${n}")
        >>> print(g.to_yaml().splitlines()[-1])
        output: b
    """

    def __init__(self, params: dict[str, Any] | None = None, *, output: str | None = None, **top: Any):
        unknown = [k for k in top if k not in _TOP]
        if unknown:
            raise TypeError(f"Graph() got unknown graph-level keys {unknown}; it takes {', '.join(_TOP)}")
        self.params = dict(params or {})
        self.output = output
        self.top = dict(top)
        self.nodes: dict[str, dict[str, Any]] = {}
        self._where = _call_site(1)
        self._node_where: dict[str, tuple[str, int, int]] = {}

    def node(self, name: str, op: str, *, input: str | list[str] | None = None, **params: Any) -> "Graph":
        """Add node ``name`` running ``op`` (without ``input``: it reads the node added before).

        Returns:
            the graph, so that calls chain.

        Raises:
            SpecErrors: a node of that name exists already.
            ValueError: a callable param has no ``module:attr`` name (a lambda, a nested function).
        """
        where = _call_site(1)
        if name in self.nodes:
            first = self._node_where[name]
            raise SpecErrors([SpecError(f"duplicate node '{name}' (first defined at line {first[1]})",
                                        where[0], where[1], where[2], node=name)])
        body: dict[str, Any] = {"op": op}
        if input is not None:
            body["input"] = list(input) if isinstance(input, (list, tuple)) else input
        body.update({k: _plain(v, f"node '{name}' param '{k}'") for k, v in params.items()})
        self.nodes[name] = body
        self._node_where[name] = where
        return self

    # ----- as a spec ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The spec as plain data (what ``to_yaml`` writes)."""
        spec: dict[str, Any] = {}
        if "description" in self.top:
            spec["description"] = self.top["description"]
        if self.params:
            spec["params"] = _plain(self.params, "params")
        spec["nodes"] = {n: dict(b) for n, b in self.nodes.items()}
        if self.output is not None or self.nodes:
            spec["output"] = self.output if self.output is not None else list(self.nodes)[-1]
        spec.update({k: _plain(v, k) for k, v in self.top.items() if k != "description"})
        return spec

    def to_yaml(self, path: str | os.PathLike[str] | None = None) -> str:
        """The spec as YAML, one flow mapping per node; written to ``path`` when given."""
        spec = self.to_dict()

        def dump(value: Any) -> str:
            text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=10**6)
            return text.removesuffix("...\n").strip()  # a plain scalar ends its "document"

        lines = ["# written by conveyor.Graph.to_yaml()"]
        if "description" in spec:
            lines.append(f"description: {dump(spec['description'])}")
        if "params" in spec:
            lines.append("params:")
            lines += [f"  {dump(k)}: {dump(v)}" for k, v in spec["params"].items()]
        lines.append("nodes:")
        lines += [f"  {dump(n)}: {dump(b)}" for n, b in spec["nodes"].items()]
        for key in ("output", "resumable", "even_batches", "workers"):
            if key in spec:
                lines.append(f"{key}: {dump(spec[key])}")
        text = "\n".join(lines) + "\n"
        if path is not None:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        return text

    def located(self) -> Any:
        """The spec with positions (the ``.node(...)`` call of each node), for the validator."""
        from conveyor.graphs.yaml_loader import Located

        path, line, col = self._where
        doc = Located(data=self.to_dict(), path=path)
        doc.values[()] = (line, col)
        for key in doc.data:
            doc.keys[(key,)] = doc.values[(key,)] = (line, col)
        for pname in self.params:
            doc.keys[("params", pname)] = doc.values[("params", pname)] = (line, col)
        for name, body in self.nodes.items():
            _, nline, ncol = self._node_where[name]
            doc.keys[("nodes", name)] = doc.values[("nodes", name)] = (nline, ncol)
            for key in body:
                doc.keys[("nodes", name, key)] = doc.values[("nodes", name, key)] = (nline, ncol)
        return doc

    def check(self, **overrides: Any) -> Any:
        """Validate the graph (as ``check_spec`` does a file) and return its ``Plan``.

        Raises:
            SpecErrors: every problem, each naming the ``.node(...)`` call it is in.
        """
        from conveyor.graphs.validate import validate

        return validate(self.located(), overrides)

    def load(self, **overrides: Any) -> Any:
        """Check and compile the graph into a ``Loader`` (overrides as for ``load_graph``)."""
        from conveyor.graphs.compile import compile_plan
        from conveyor.graphs.loader import Loader

        return Loader(compile_plan(self.check(**overrides)))

    def __repr__(self) -> str:
        return f"Graph({len(self.nodes)} nodes: {', '.join(self.nodes)})"

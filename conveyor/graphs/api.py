"""The entry points that tie the stages together: read a spec, check it, build a Loader."""

from __future__ import annotations

import os
from typing import Any, Mapping

from conveyor.graphs.compile import compile_plan
from conveyor.graphs.loader import Loader
from conveyor.graphs.validate import Plan, validate
from conveyor.graphs.yaml_loader import Located, load_yaml


def read_spec(path: str | os.PathLike[str]) -> Located:
    """Read and parse a spec file, keeping positions."""
    path = os.fspath(path)
    with open(path, encoding="utf-8") as f:
        return load_yaml(f.read(), path)


def check_spec(spec: str | os.PathLike[str] | Located, overrides: Mapping[str, Any] | None = None) -> Plan:
    """Parse and validate a spec, raising ``SpecErrors`` with every problem at once."""
    doc = spec if isinstance(spec, Located) else read_spec(spec)
    return validate(doc, overrides)


def load_graph(spec: str | os.PathLike[str], **overrides: Any) -> Loader:
    """Compile a YAML spec into a running ``Loader``.

    Args:
        spec: path of the YAML spec.
        **overrides: values for the spec's ``params`` (``batch_size=64``, ``root="s3://..."``).

    Raises:
        SpecErrors: the spec has mistakes (all of them are listed, each with file:line:col).

    Example:
        >>> loader = load_graph("specs/numbers.yaml", batch_size=4)   # doctest: +SKIP
        >>> for batch in loader: ...
    """
    return Loader(compile_plan(check_spec(spec, overrides)))

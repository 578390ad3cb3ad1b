"""The entry points that tie the stages together: read a spec, check it, build a Loader."""

from __future__ import annotations

import os
from typing import Any, Mapping

from conveyor.graphs.bundled import bundled_path, is_name, missing_samples, required_reason
from conveyor.graphs.compile import compile_plan
from conveyor.graphs.loader import Loader
from conveyor.graphs.params import REQUIRED
from conveyor.graphs.validate import Plan, validate
from conveyor.errors import SpecError, SpecErrors
from conveyor.graphs.yaml_loader import MAX_SPEC_BYTES, Located, decode_spec, load_yaml, too_big


def read_spec(path: str | os.PathLike[str]) -> Located:
    """Read and parse a spec file, keeping positions.

    ``path`` may also be the name of a bundled spec (no ``/``, no ``.yaml``: ``"imagenet"``,
    see ``conveyor/graphs/bundled.py``); where its sample data is not beside it (an installed
    package), the params that name it become required.

    Raises:
        FileNotFoundError: no file at ``path``.
        SpecErrors: the file cannot be read as a spec (a directory, not UTF-8, too big, bad
            YAML), or no bundled spec has that name.
    """
    if is_name(path):
        name = str(path)
        doc = read_spec(bundled_path(name))
        declared = doc.data.get("params") if isinstance(doc.data, dict) else None
        if isinstance(declared, dict):
            for key in missing_samples(declared, doc.path):
                declared[key] = REQUIRED
                doc.required[key] = required_reason(name, key)
        return doc
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SPEC_BYTES + 1)  # never more than the bound, whatever the file holds
    except FileNotFoundError:
        raise
    except IsADirectoryError:
        raise SpecErrors([SpecError(f"{path} is a directory, not a spec file", path, 0, 0)]) from None
    except OSError as exc:  # no permission, a device, ...
        raise SpecErrors([SpecError(f"the spec cannot be read: {exc.strerror or exc}", path, 0, 0)]) from None
    if len(data) > MAX_SPEC_BYTES:
        raise too_big(os.path.getsize(path), path)
    return load_yaml(decode_spec(data, path), path)


def check_spec(spec: Any, overrides: Mapping[str, Any] | None = None) -> Plan:
    """Parse and validate a spec (a path, a parsed ``Located`` or a ``conveyor.Graph``), raising
    ``SpecErrors`` with every problem at once."""
    from conveyor.graphs.builder import Graph

    if isinstance(spec, Graph):
        doc = spec.located()
    else:
        doc = spec if isinstance(spec, Located) else read_spec(spec)
    return validate(doc, overrides)


def load_graph(spec: Any, **overrides: Any) -> Loader:
    """Compile a YAML spec (or a ``conveyor.Graph`` built in Python) into a running ``Loader``.

    Args:
        spec: path of the YAML spec, the name of a bundled one (``"imagenet"``: ``conveyor
            specs`` lists them), or a ``conveyor.Graph``.
        **overrides: values for the spec's ``params`` (``batch_size=64``, ``root="s3://..."``).

    Raises:
        SpecErrors: the spec has mistakes (all of them are listed, each with file:line:col).

    Example:
        >>> loader = load_graph("specs/numbers.yaml", batch_size=4)   # doctest: +SKIP
        >>> for batch in loader: ...
    """
    return Loader(compile_plan(check_spec(spec, overrides)))

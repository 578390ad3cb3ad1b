"""YAML with source positions.

PyYAML's safe loader gives plain values but forgets where they came from. This module
composes the document with the safe loader, turns it into plain Python values, and records
the line and column of every mapping key and value by its path (a tuple of keys and list
indices), so that later checks can say ``spec.yaml:14:5`` about any param. Duplicate keys,
which PyYAML silently overwrites, are errors here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from conveyor.errors import SpecError

Path = tuple[Any, ...]


@dataclass
class Located:
    """A parsed document and the 1-based (line, col) of each value and each key, by path."""

    data: Any
    path: str
    values: dict[Path, tuple[int, int]] = field(default_factory=dict)
    keys: dict[Path, tuple[int, int]] = field(default_factory=dict)

    def where(self, at: Path, *, key: bool = False) -> tuple[int, int]:
        """Position of the value (or the key) at ``at``; falls back to the nearest parent."""
        table = self.keys if key else self.values
        probe = tuple(at)
        while probe:
            if probe in table:
                return table[probe]
            if probe in self.values:
                return self.values[probe]
            probe = probe[:-1]
        return self.values.get((), (1, 1))


def _mark(node: yaml.Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


def _convert(node: yaml.Node, at: Path, doc: Located, errors: list[SpecError]) -> Any:
    doc.values[at] = _mark(node)
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = yaml.SafeLoader.construct_scalar(_SCALAR_LOADER, key_node) if isinstance(
                key_node, yaml.ScalarNode) else None
            if key is None:
                line, col = _mark(key_node)
                errors.append(SpecError("mapping keys must be plain strings", doc.path, line, col))
                continue
            if key in out:
                line, col = _mark(key_node)
                first = doc.keys[at + (key,)]
                errors.append(SpecError(
                    f"duplicate key '{key}' (first defined at line {first[0]})", doc.path, line, col))
                continue
            doc.keys[at + (key,)] = _mark(key_node)
            out[key] = _convert(value_node, at + (key,), doc, errors)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_convert(child, at + (i,), doc, errors) for i, child in enumerate(node.value)]
    return _SCALAR_LOADER.construct_object(node, deep=True)


_SCALAR_LOADER = yaml.SafeLoader("")


def load_yaml(text: str, path: str = "<string>") -> Located:
    """Parse ``text`` with the safe loader, keeping the position of every value.

    Args:
        text: the YAML source.
        path: the file name used in error messages.

    Raises:
        SpecErrors: on a syntax error or duplicate keys (all of them at once).

    Example:
        >>> doc = load_yaml("a:\\n  b: 1\\n")
        >>> doc.data, doc.where(("a", "b"))
        ({'a': {'b': 1}}, (2, 6))
    """
    from conveyor.errors import SpecErrors

    doc = Located(data=None, path=path)
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (0, 0)
        problem = exc.problem or exc.context or "invalid YAML"
        raise SpecErrors([SpecError(f"YAML syntax error: {problem}", path, line, col)]) from None
    except yaml.YAMLError as exc:
        raise SpecErrors([SpecError(f"YAML error: {exc}", path, 0, 0)]) from None
    if root is None:
        raise SpecErrors([SpecError("the spec is empty", path, 1, 1)])
    errors: list[SpecError] = []
    try:
        doc.data = _convert(root, (), doc, errors)
    except yaml.constructor.ConstructorError as exc:
        mark = exc.problem_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (0, 0)
        errors.append(SpecError(f"YAML error: {exc.problem}", path, line, col))
    if errors:
        raise SpecErrors(errors)
    return doc

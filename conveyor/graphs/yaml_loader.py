"""YAML with source positions.

PyYAML's safe loader gives plain values but forgets where they came from. This module
composes the document with the safe loader, turns it into plain Python values, and records
the line and column of every mapping key and value by its path (a tuple of keys and list
indices), so that later checks can say ``spec.yaml:14:5`` about any param. Duplicate keys,
which PyYAML silently overwrites, are errors here. Merge keys (``<<: *defaults``) work as in
PyYAML's safe loader; a merged value keeps the position where the anchor wrote it.
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


_PLAIN_TAGS = ("tag:yaml.org,2002:map", "tag:yaml.org,2002:seq")


def _mark(node: yaml.Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


def _convert(node: yaml.Node, at: Path, doc: Located, errors: list[SpecError],
             loader: yaml.SafeLoader) -> Any:
    doc.values[at] = _mark(node)
    if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)) and node.tag not in _PLAIN_TAGS:
        line, col = _mark(node)
        errors.append(SpecError(f"YAML error: the tag '{node.tag}' is not supported (specs are read with "
                                "the safe loader, which builds plain data only)", doc.path, line, col))
        return None
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        merged: set[Any] = set()  # keys from a `<<: *anchor` merge, which explicit keys override
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
                for source in sources:
                    if not isinstance(source, yaml.MappingNode):
                        line, col = _mark(source)
                        errors.append(SpecError("'<<' merges a mapping (or a list of mappings)",
                                                doc.path, line, col))
                        continue
                    here = doc.values[at]
                    values = _convert(source, at, doc, errors, loader)
                    doc.values[at] = here
                    for k, v in values.items():
                        if k not in out:
                            out[k] = v
                            merged.add(k)
                continue
            key = loader.construct_scalar(key_node) if isinstance(key_node, yaml.ScalarNode) else None
            if key is None:
                line, col = _mark(key_node)
                errors.append(SpecError("mapping keys must be plain strings", doc.path, line, col))
                continue
            if key in merged:
                merged.discard(key)
            elif key in out:
                line, col = _mark(key_node)
                first = doc.keys[at + (key,)]
                errors.append(SpecError(
                    f"duplicate key '{key}' (first defined at line {first[0]})", doc.path, line, col))
                continue
            doc.keys[at + (key,)] = _mark(key_node)
            out[key] = _convert(value_node, at + (key,), doc, errors, loader)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_convert(child, at + (i,), doc, errors, loader) for i, child in enumerate(node.value)]
    try:
        return loader.construct_object(node, deep=True)
    except yaml.constructor.ConstructorError as exc:  # e.g. a !!python/... tag: safe loader only
        line, col = _mark(node)
        errors.append(SpecError(f"YAML error: {exc.problem} (specs are read with the safe loader, "
                                "which builds plain data only)", doc.path, line, col))
        return None


def _syntax_message(exc: yaml.MarkedYAMLError) -> str:
    """PyYAML's problem and context in one line, e.g. ``expected ',' or '}', but got '<scalar>'
    (while parsing a flow mapping that starts at line 3, column 10)``."""
    problem, context, mark = exc.problem, exc.context, exc.context_mark
    if not problem:
        return context or "invalid YAML"
    if not context:
        return problem
    if problem.startswith("but "):
        return f"{context}, {problem}"
    if mark is not None and context.startswith("while "):
        return f"{problem} ({context} that starts at line {mark.line + 1}, column {mark.column + 1})"
    return f"{problem} ({context})"


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
        raise SpecErrors([SpecError(f"YAML syntax error: {_syntax_message(exc)}", path, line, col)]) from None
    except yaml.YAMLError as exc:
        raise SpecErrors([SpecError(f"YAML error: {exc}", path, 0, 0)]) from None
    if root is None:
        raise SpecErrors([SpecError("the spec is empty", path, 1, 1)])
    errors: list[SpecError] = []
    loader = yaml.SafeLoader("")  # one per document: it caches every object it constructs
    try:
        doc.data = _convert(root, (), doc, errors, loader)
    finally:
        loader.dispose()
    if errors:
        raise SpecErrors(errors)
    return doc

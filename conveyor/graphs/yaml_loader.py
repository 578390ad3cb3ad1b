"""YAML with source positions.

PyYAML's safe loader gives plain values but forgets where they came from. This module
composes the document with the safe loader, turns it into plain Python values, and records
the line and column of every mapping key and value by its path (a tuple of keys and list
indices), so that later checks can say ``spec.yaml:14:5`` about any param. Duplicate keys,
which PyYAML silently overwrites, are errors here. Merge keys (``<<: *defaults``) work as in
PyYAML's safe loader; a merged value keeps the position where the anchor wrote it.

A spec is small, so what would make reading it slow or unbounded is refused with a
``SpecError`` at the place it starts: a file over ``MAX_SPEC_BYTES``, values nested deeper
than ``MAX_DEPTH``, aliases that expand to more than ``MAX_VALUES`` values (an "alias bomb")
or that refer to the mapping or list they are inside of, and scalars a ``!!tag`` cannot read
(``!!int "32x"``). Any spec is read in well under a second, or refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from conveyor.errors import SpecError, SpecErrors

Path = tuple[Any, ...]

# A spec is a few KB. PyYAML's pure-Python reader (the one that keeps positions) reads ~50 KB/s
# on a busy 2-core machine, so these bounds keep any spec's check within a few seconds.
MAX_SPEC_BYTES = 64 << 10  # a bigger file is refused before it is parsed
MAX_DEPTH = 100  # nesting of mappings and lists, aliases expanded
MAX_VALUES = 20_000  # values in the document once its aliases are expanded


@dataclass
class Located:
    """A parsed document and the 1-based (line, col) of each value and each key, by path."""

    data: Any
    path: str
    values: dict[Path, tuple[int, int]] = field(default_factory=dict)
    keys: dict[Path, tuple[int, int]] = field(default_factory=dict)
    # params that must be given, with why (a bundled spec read by name whose sample data is not
    # beside it: conveyor/graphs/bundled.py)
    required: dict[str, str] = field(default_factory=dict)

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


class _Refused(Exception):
    """Reading stops here: ``message`` at 1-based ``(line, col)``."""

    def __init__(self, message: str, line: int, col: int):
        super().__init__(message)
        self.message, self.line, self.col = message, line, col


class _Composer(yaml.SafeLoader):
    """The safe loader, composing no deeper than ``MAX_DEPTH`` (PyYAML composes by recursion,
    so ~500 levels of ``[[[...`` end in a ``RecursionError``), and remembering where each alias
    was written, for messages about aliases."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self.depth = 0
        self.aliases: dict[tuple[int, Any], tuple[str, tuple[int, int]]] = {}

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            slot = index if isinstance(index, int) else id(index)
            self.aliases[(id(parent), slot)] = (event.anchor, (event.start_mark.line + 1,
                                                               event.start_mark.column + 1))
        if self.depth >= MAX_DEPTH:
            raise _Refused(f"YAML error: values nested more than {MAX_DEPTH} levels deep; a spec "
                           "is refused past that", event.start_mark.line + 1, event.start_mark.column + 1)
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def _children(node: yaml.Node) -> list[tuple[Any, yaml.Node]]:
    """``(slot, child)`` pairs: a mapping's keys and values (slot: the key node), a list's items."""
    if isinstance(node, yaml.MappingNode):
        return [pair for k, v in node.value for pair in ((None, k), (k, v))]
    if isinstance(node, yaml.SequenceNode):
        return list(enumerate(node.value))
    return []


def _check_expansion(root: yaml.Node, aliases: dict[tuple[int, Any], tuple[str, tuple[int, int]]]) -> None:
    """Refuse a document whose aliases refer to a node they are inside of, or that expands
    (aliases followed) to more than ``MAX_VALUES`` values or ``MAX_DEPTH`` levels. Each distinct
    node is visited once (sizes are memoized), without recursion."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    open_: set[int] = set()  # begun, not finished: exactly the nodes on the current path
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, finish = stack.pop()
        nid = id(node)
        if finish:
            kids = [id(c) for _, c in _children(node)]
            size[nid] = 1 + sum(size[k] for k in kids)
            depth[nid] = 1 + max((depth[k] for k in kids), default=0)
            open_.discard(nid)
            if size[nid] > MAX_VALUES or depth[nid] > MAX_DEPTH:
                what = (f"more than {MAX_VALUES} values" if size[nid] > MAX_VALUES
                        else f"values nested more than {MAX_DEPTH} levels deep")
                raise _Refused(f"YAML error: this value expands, through its aliases, to {what}; "
                               "a spec is refused past that", *_mark(node))
            continue
        if nid in size:
            continue
        open_.add(nid)
        stack.append((node, True))
        for slot, child in _children(node):
            if id(child) in open_:
                key = slot if isinstance(slot, int) else id(slot)
                anchor, (line, col) = aliases.get((nid, key), ("?", _mark(child)))
                raise _Refused(f"YAML error: the alias '*{anchor}' is inside the value its anchor "
                               f"names (line {_mark(child)[0]}): a recursive alias never ends",
                               line, col)
            if id(child) not in size:
                stack.append((child, False))


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
                    for k, v in (values or {}).items():
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
    except (ValueError, KeyError, AttributeError, TypeError, OverflowError, IndexError):
        # PyYAML's constructors trust their tag: !!int "32x", !!bool "maybe", !!timestamp "x"
        line, col = _mark(node)
        tag = node.tag.replace("tag:yaml.org,2002:", "!!")
        errors.append(SpecError(f"YAML error: {node.value[:40]!r} cannot be read as {tag}; remove the "
                                "tag or fix the value", doc.path, line, col))
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


def _position(text: str, index: int) -> tuple[int, int]:
    """1-based (line, col) of character ``index`` of ``text``."""
    index = max(0, min(index, len(text)))
    return text.count("\n", 0, index) + 1, index - (text.rfind("\n", 0, index) + 1) + 1


def too_big(size: int, path: str) -> SpecErrors:
    """The error for a spec of ``size`` bytes, over ``MAX_SPEC_BYTES``."""
    return SpecErrors([SpecError(f"the spec is {size:,} bytes; a spec is refused past "
                                 f"{MAX_SPEC_BYTES:,} bytes (keep data in files, not in the spec)",
                                 path, 1, 1)])


def decode_spec(data: bytes, path: str) -> str:
    """The text of a spec file: UTF-8 (a BOM is allowed).

    Raises:
        SpecErrors: naming the line and column of the first byte that is not UTF-8.
    """
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        good = data[:exc.start].decode("utf-8-sig", "replace")
        line, col = _position(good, len(good))
        utf16 = data[:2] in (b"\xff\xfe", b"\xfe\xff") or (len(data) > 1 and b"\x00" in data[:4])
        hint = ("it looks like UTF-16: save it as UTF-8" if utf16 else "save the file as UTF-8")
        raise SpecErrors([SpecError(f"the spec is not UTF-8 text (byte 0x{data[exc.start]:02x} cannot "
                                    f"be decoded); {hint}", path, line, col)]) from None


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
    doc = Located(data=None, path=path)
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_SPEC_BYTES:
        raise too_big(size, path)
    composer = None
    try:
        composer = _Composer(text)  # the reader checks every character here
        root = composer.get_single_node()
        if root is not None:
            _check_expansion(root, composer.aliases)
    except _Refused as exc:
        raise SpecErrors([SpecError(exc.message, path, exc.line, exc.col)]) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (0, 0)
        raise SpecErrors([SpecError(f"YAML syntax error: {_syntax_message(exc)}", path, line, col)]) from None
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow (control characters)
        line, col = _position(text, exc.position)
        char = exc.character if isinstance(exc.character, str) else chr(exc.character)
        hint = ("; a NUL byte: if the file is UTF-16, save it as UTF-8" if char == "\x00" else
                "; remove it, or write it as an escape inside a double-quoted string")
        raise SpecErrors([SpecError(f"YAML error: the character {char!r} (#x{ord(char):02x}) is not "
                                    f"allowed in YAML{hint}", path, line, col)]) from None
    except yaml.YAMLError as exc:
        raise SpecErrors([SpecError(f"YAML error: {exc}", path, 1, 1)]) from None
    finally:
        if composer is not None:
            composer.dispose()
    if root is None:
        raise SpecErrors([SpecError("the spec is empty", path, 1, 1)])
    errors: list[SpecError] = []
    loader = yaml.SafeLoader("")  # one per document: it caches every object it constructs
    try:
        doc.data = _convert(root, (), doc, errors, loader)
    finally:
        loader.dispose()
    if errors:  # a value reached twice (through a merge) is reported once
        raise SpecErrors(list({(e.line, e.col, e.message): e for e in errors}.values()))
    return doc

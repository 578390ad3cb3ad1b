"""Spec params: ``${name}`` interpolation and typed overrides.

A spec declares ``params:`` with defaults. Overrides come as keyword arguments
(``load_graph(path, batch_size=64)``, already typed) or as ``--set k=v`` strings from the
command line, whose values are read as YAML scalars (``64`` is an int, ``true`` a bool,
``[1, 2]`` a list). An override must name a declared param and fit its type.

Inside node params, a string that is exactly ``${name}`` becomes the param's value with its
type; ``${name}`` inside a longer string is replaced by its text.

Two kinds of reference need no declaration: ``${env:NAME}`` (or ``${env:NAME,default}``) reads
an environment variable (a whole-string reference is read as a YAML scalar, so
``${env:BATCH,32}`` is the int 32; an unset variable without a default is a spec error), and
``${spec_dir}`` is the folder of the spec file, so a spec can name files next to it whatever
the current directory. Both work in declared params' defaults too.

A param whose default is ``"???"`` (``REQUIRED``) must be given: left out, it is a spec error
(``required_problems``). The override may then be of any type.

An override whose key is ``NODE.PARAM`` (``--set decode.workers=4``,
``load_graph(path, **{"decode.workers": 4})``) sets that node's param; see ``split_overrides``.
"""

from __future__ import annotations

import os
import re
from typing import Any, Iterable, Mapping

import yaml

from conveyor.errors import SpecError, did_you_mean
from conveyor.graphs.yaml_loader import MAX_DEPTH, MAX_VALUES

_REF = re.compile(r"\$\{([^{}]*)\}")  # innermost first: ${env:A,${spec_dir}/x} nests
_NUMBER = re.compile(r"[-+]?(\d[\d_]*\.?[\d_]*|\.\d[\d_]*)([eE][-+]?\d+)?")


ENV_PREFIX = "env:"
SPEC_DIR = "spec_dir"  # the built-in param: the folder of the spec file
# a param's default that says it must be given (Hydra's and OmegaConf's marker for a missing
# value): a SpecError names it unless an override sets it (``conveyor init`` writes it)
REQUIRED = "???"


def _read_scalar(text: str) -> Any:
    """``text`` read as one YAML scalar (``32`` an int, ``true`` a bool), else kept as text."""
    try:
        value = yaml.safe_load(text) if text else ""
    except yaml.YAMLError:
        return text
    return value if isinstance(value, (str, bool, int, float)) else text


def _env(ref: str) -> tuple[bool, str]:
    """(found, value) of an ``env:NAME[,default]`` reference."""
    name, comma, default = ref[len(ENV_PREFIX):].partition(",")
    name = name.strip()
    if name in os.environ:
        return True, os.environ[name]
    if comma:
        return True, default.strip()
    return False, ""


def env_name(ref: str) -> str | None:
    """The variable an ``env:NAME[,default]`` reference names, or ``None`` for a param reference."""
    return ref[len(ENV_PREFIX):].partition(",")[0].strip() if ref.startswith(ENV_PREFIX) else None


def builtin_params(spec_path: str) -> dict[str, Any]:
    """The params every spec has without declaring them: ``spec_dir``, the spec file's folder
    (absolute; the current directory for a spec that is not a file)."""
    if spec_path.startswith("<") or not spec_path:
        return {SPEC_DIR: os.getcwd()}
    return {SPEC_DIR: os.path.dirname(os.path.abspath(spec_path))}


def required_problems(params: Mapping[str, Any], reasons: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """(param, message) for each param still ``REQUIRED`` after the overrides, with the reason
    given for it (``reasons``) or how to pass it.

    Example:
        >>> required_problems({"root": "???", "batch_size": 8})
        [('root', 'required, and not given: pass root=... (load_graph(spec, root=...), --set root=...)')]
    """
    reasons = reasons or {}
    return [(k, "required, and not given: " + reasons.get(
                k, f"pass {k}=... (load_graph(spec, {k}=...), --set {k}=...)"))
            for k, v in params.items() if isinstance(v, str) and v == REQUIRED]


def parse_set(pairs: Iterable[str], declared: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Turn ``["batch_size=64", "root=s3://b/x"]`` into typed values.

    Each value is read as YAML (``64`` an int, ``0.5`` and ``1e-3`` floats, ``true`` a bool,
    ``[1, 2]`` a list, ``{a: 1}`` a mapping); anything else, dates and ``a: b`` included, stays
    text. Only the first ``=`` splits, so ``filter=x=1`` sets ``filter`` to ``"x=1"``.

    Args:
        pairs: ``key=value`` strings, as given to ``--set``.
        declared: the spec's ``params:``; a param whose default is a string then keeps the text
            as written (``--set tag=007`` gives ``"007"``, not the int 7).

    Raises:
        ValueError: for an item without ``=`` or without a key.

    Example:
        >>> parse_set(["batch_size=64", "lr=1e-3", "root=s3://b/x", "flip=true"])
        {'batch_size': 64, 'lr': 0.001, 'root': 's3://b/x', 'flip': True}
    """
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key, text = key.strip(), raw.strip()
        if not sep or not key:
            raise ValueError(f"--set expects key=value, got {pair!r}")
        try:
            value = yaml.safe_load(text) if text else ""
        except yaml.YAMLError:
            value = text
        except RecursionError:  # PyYAML composes by recursion: [[[[... hundreds deep
            raise ValueError(f"--set {key}: the value nests deeper than {MAX_DEPTH} levels") from None
        if isinstance(value, str) and value == text and _NUMBER.fullmatch(text):
            try:
                value = float(text)  # YAML 1.1 reads 1e-3 (no dot) as a string
            except ValueError:
                pass
        elif isinstance(value, dict) and not text.startswith("{"):
            value = text  # "a: b" is text here, not a mapping
        elif not isinstance(value, (str, bool, int, float, list, dict, type(None))):
            value = text  # dates and timestamps stay as written
        if declared is not None and isinstance(declared.get(key), str) and \
                isinstance(value, (bool, int, float)):
            value = text
        out[key] = value
    return out


def _type_name(value: Any) -> str:
    return {bool: "bool", int: "int", float: "float", str: "string", list: "list", tuple: "list",
            dict: "mapping", type(None): "null"}.get(type(value), type(value).__name__)


def _article(name: str) -> str:
    return ("an " if name[0] in "aeiou" else "a ") + name


def _fits(default: Any, value: Any) -> bool:
    if default is None or value is None or (isinstance(default, str) and default == REQUIRED):
        return True
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(default, bool) and isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    if isinstance(default, int):
        return isinstance(value, int)
    if isinstance(default, (list, tuple)):
        return isinstance(value, (list, tuple))
    return isinstance(value, type(default))


def referenced(value: Any) -> set[str]:
    """The param names that ``${name}`` references inside ``value`` (lists and dicts too)."""
    if isinstance(value, str):
        return {m.strip() for m in _REF.findall(value) if not m.strip().startswith(ENV_PREFIX)}
    if isinstance(value, (list, tuple)):
        return set().union(*(referenced(v) for v in value)) if value else set()
    if isinstance(value, dict):
        return set().union(*(referenced(v) for v in value.values())) if value else set()
    return set()


def secret_texts(value: Any) -> set[str]:
    """How ``value`` may appear in a message (its text, its repr, its items'), for redaction.
    Texts under 4 characters are left out: replacing them would garble every message."""
    out: set[str] = set()
    if isinstance(value, bool) or value is None:
        return out
    if isinstance(value, (list, tuple, dict)):
        out.add(repr(value))
        for item in (value.values() if isinstance(value, dict) else value):
            out |= secret_texts(item)
    else:
        out |= {str(value), repr(value)}
    return {t for t in out if len(t) >= 4}


def redact_texts(text: str, secrets: Iterable[str]) -> str:
    """``text`` with each of ``secrets`` (longest first) replaced by ``***``."""
    for secret in sorted(set(secrets), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def apply_overrides(
    declared: Mapping[str, Any], overrides: Mapping[str, Any], *, where: tuple[str, int, int],
    secret: Iterable[str] = (),
) -> tuple[dict[str, Any], list[SpecError]]:
    """Merge ``overrides`` into ``declared`` params, checking names and types.

    Args:
        declared: the spec's ``params:`` with their defaults.
        overrides: typed values from keyword arguments or ``--set``.
        where: (path, line, col) of the spec's ``params:`` block, for error positions.
        secret: params whose values reach ``storage_options``: a message names their type,
            never their value.

    Returns:
        The merged params and the errors found (unknown key, wrong type).
    """
    path, line, col = where
    hidden = set(secret)
    merged = dict(declared)
    errors: list[SpecError] = []
    for key, value in overrides.items():
        shape = shape_problem(value)
        if shape:
            errors.append(SpecError(f"override {shape}", path, line, col, param=key))
            continue
        if key not in declared:
            errors.append(SpecError(
                "unknown override: the spec declares no such param" + did_you_mean(key, declared)
                + f"; declared: {', '.join(sorted(declared)) or 'none'}", path, line, col, param=key))
            continue
        if not _fits(declared[key], value):
            like, got = (("", " (value hidden: it reaches storage_options)") if key in hidden else
                         (f" (like the default {declared[key]!r})", f" {value!r}"))
            errors.append(SpecError(
                f"override expects {_article(_type_name(declared[key]))}{like}, got {_type_name(value)}{got}",
                path, line, col, param=key))
            continue
        merged[key] = float(value) if isinstance(declared[key], float) and value is not None else value
    return merged, errors


def shape_problem(value: Any) -> str | None:
    """What makes an override's value unbounded, if anything: a list or mapping inside itself
    (``--set 'weights=&a [*a]'``), nesting deeper than ``MAX_DEPTH``, or more than ``MAX_VALUES``
    values with aliases expanded (the bounds a spec file has). Walked without recursion and
    stopped at the bound, so any value is judged quickly."""
    stack: list[tuple[Any, int, tuple[int, ...]]] = [(value, 1, ())]
    seen = 0
    while stack:
        item, depth, inside = stack.pop()
        seen += 1
        if seen > MAX_VALUES:
            return f"expands to more than {MAX_VALUES} values (aliases followed); a param is a small value"
        if not isinstance(item, (list, tuple, dict)):
            continue
        if id(item) in inside:
            return ("is a list or mapping that contains itself (a recursive YAML alias such as "
                    "'&a [*a]'): it never ends")
        if depth > MAX_DEPTH:
            return f"nests deeper than {MAX_DEPTH} levels"
        kids = item.values() if isinstance(item, dict) else item
        stack.extend((kid, depth + 1, inside + (id(item),)) for kid in kids)
    return None


def interpolate(value: Any, params: Mapping[str, Any], *, partial: bool = False) -> Any:
    """Replace ``${name}`` and ``${env:NAME[,default]}`` references in ``value`` (recursively
    through lists and dicts).

    Args:
        value: a spec value.
        params: the params a reference may name.
        partial: leave a reference to a name not in ``params`` as written (used on params'
            own defaults, which may only use ``${env:...}`` and the built-ins).

    Raises:
        KeyError: naming the first undefined param, or ``env:NAME`` for an unset variable
            without a default (the caller adds the position).
    """
    if isinstance(value, str):
        return _interpolate_text(value, params, partial)
    if isinstance(value, list):
        return [interpolate(v, params, partial=partial) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v, params, partial=partial) for k, v in value.items()}
    return value


def _lookup(name: str, params: Mapping[str, Any], partial: bool, whole: bool) -> tuple[bool, Any]:
    """(found, value) of one reference; ``whole``: the value keeps its type."""
    if name.startswith(ENV_PREFIX):
        found, text = _env(name)
        if not found:
            raise KeyError(name)
        return True, _read_scalar(text) if whole else text
    if name not in params:
        if partial:
            return False, None
        raise KeyError(name)
    return True, params[name] if whole else str(params[name])


def _interpolate_text(value: str, params: Mapping[str, Any], partial: bool) -> Any:
    for _ in range(8):  # nested references resolve innermost first, one level per pass
        whole = _REF.fullmatch(value.strip())
        if whole:
            found, out = _lookup(whole.group(1).strip(), params, partial, True)
            return out if found else value

        def sub(match: re.Match[str]) -> str:
            found, out = _lookup(match.group(1).strip(), params, partial, False)
            return out if found else match.group(0)

        new = _REF.sub(sub, value)
        if new == value:
            return value
        value = new
    return value


def split_overrides(overrides: Mapping[str, Any], declared: Mapping[str, Any],
                    nodes: Mapping[str, Any]) -> tuple[dict[str, Any], dict[tuple[str, str], Any]]:
    """Separate param overrides from node-param overrides (``NODE.PARAM`` keys).

    A key is a node-param override when it is not a declared param and its part before the
    first ``.`` names a node (or, if no node has that name, it still has a ``.``: then the
    validator says that no such node exists). A ``pathlib.Path`` (any ``os.PathLike``) is
    taken as its string, as ``open()`` takes it: ``load_graph(spec, root=Path("data"))``.

    Returns:
        (param overrides, {(node, param): value}).
    """
    params: dict[str, Any] = {}
    node_params: dict[tuple[str, str], Any] = {}
    for key, value in overrides.items():
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        node, dot, name = key.partition(".")
        if key in declared or not dot:
            params[key] = value
        else:
            node_params[(node, name)] = value
    return params, node_params

"""The specs that ship with conveyor, loadable by name from anywhere.

``load_graph("imagenet", root=...)``, ``conveyor run imagenet --set root=...``: a *name* (no
``/``, no ``.yaml`` suffix) is a spec of the package's ``conveyor/specs/`` folder (in a checkout,
a link to the top-level ``specs/``, so ``specs/imagenet.yaml`` and ``imagenet`` are one file);
anything else is a path. ``conveyor specs`` lists them, ``conveyor init NAME [DST]`` writes an
editable copy (``init_text``).

A bundled spec names its sample data beside the checkout (``root: "${spec_dir}/../examples/..."``).
An installed package has no examples: a param whose default points under ``${spec_dir}`` at
nothing is then *required* (``REQUIRED_REASON``), a ``SpecError`` when not given, instead of a
listing of a folder that is not there.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml

from conveyor.errors import SpecError, SpecErrors, did_you_mean
from conveyor.graphs.params import REQUIRED, SPEC_DIR

SUFFIXES = (".yaml", ".yml")
_SPEC_DIR_REF = "${" + SPEC_DIR + "}"


def bundled_dir() -> Path | None:
    """The folder of the bundled specs: the package's ``specs/`` (a link to the checkout's
    ``specs/`` in a checkout), or the checkout's own ``specs/`` where the link is not there
    (a checkout made without symlinks); None when neither exists."""
    package = Path(__file__).resolve().parents[1]
    for folder in (package / "specs", package.parent / "specs"):
        if folder.is_dir() and any(folder.glob("*.yaml")):
            return folder
    return None


def bundled_names() -> list[str]:
    """The names of the bundled specs, sorted (``imagenet``, ``numbers``, ...)."""
    folder = bundled_dir()
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder else []


def is_name(spec: Any) -> bool:
    """Whether ``spec`` names a bundled spec rather than a file: a string with no ``/`` (nor the
    platform's separator) and no ``.yaml``/``.yml`` suffix, like ``"imagenet"``."""
    return (isinstance(spec, str) and bool(spec) and not spec.startswith((".", "<"))
            and "/" not in spec and os.sep not in spec and not spec.lower().endswith(SUFFIXES))


def bundled_path(name: str) -> str:
    """The file of the bundled spec ``name`` (its real path: in a checkout, under ``specs/``).

    Raises:
        SpecErrors: no bundled spec has that name; the message lists the names.
    """
    folder = bundled_dir()
    names = bundled_names()
    if folder is None or name not in names:
        hint = did_you_mean(name, names)
        raise SpecErrors([SpecError(
            f"no bundled spec is named '{name}'{hint}; bundled: {', '.join(names) or 'none'} "
            "(a spec file is named by a path: ./my.yaml, specs/x.yaml)", name, 0, 0)])
    return os.path.realpath(folder / f"{name}.yaml")


def summary(name: str) -> str:
    """The spec's one line: its first comment, less the ``# specs/x.yaml —`` it opens with."""
    with open(bundled_path(name), encoding="utf-8") as f:
        first = f.readline().strip()
    text = first.lstrip("#").strip()
    return text.split(" — ", 1)[1] if " — " in text else text


def _local_target(default: Any, spec_dir: str) -> str | None:
    """The local path a ``${spec_dir}/...`` default points at, or None for any other default."""
    if not isinstance(default, str) or not default.startswith(_SPEC_DIR_REF + "/"):
        return None
    rest = default[len(_SPEC_DIR_REF):]
    if "${" in rest or "*" in rest:
        return None
    return os.path.normpath(spec_dir + rest)


def sample_params(params: dict[str, Any]) -> list[str]:
    """The declared params whose default is data beside the spec (``${spec_dir}/...``)."""
    return [k for k, v in params.items() if _local_target(v, "/") is not None]


def missing_samples(params: dict[str, Any], spec_path: str) -> list[str]:
    """The params whose default names, under ``${spec_dir}``, something that is not there
    (an installed package has no ``examples/``)."""
    spec_dir = os.path.dirname(os.path.abspath(spec_path))
    out = []
    for key in sample_params(params):
        target = _local_target(params[key], spec_dir)
        if target is not None and not os.path.exists(target):
            out.append(key)
    return out


def required_reason(name: str, param: str) -> str:
    """Why ``param`` of the bundled spec ``name`` must be given, and how."""
    return (f"the bundled spec '{name}' has no sample data beside it; pass {param}=... "
            f"(load_graph('{name}', {param}=...), --set {param}=...), or write an editable copy with "
            f"`conveyor init {name}`")


_PARAM_LINE = r"^(?P<lead>\s+{key}:\s*)(?P<value>\"[^\"]*\"|'[^']*'|[^#\s]+)(?P<rest>.*)$"


def init_text(name: str) -> str:
    """The text of an editable copy of the bundled spec ``name``: the same spec, its comments
    kept, with each param that names the sample data beside the package (``root``) made
    required (``"???"``, ``REQUIRED``), so that the copy runs on the user's data or says what
    it lacks."""
    path = bundled_path(name)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    data = yaml.safe_load(text)
    params = data.get("params") or {} if isinstance(data, dict) else {}
    made = []
    for key in sample_params(params):
        pattern = re.compile(_PARAM_LINE.format(key=re.escape(key)), re.MULTILINE)
        text, n = pattern.subn(lambda m: f'{m["lead"]}"{REQUIRED}"{m["rest"]}', text, count=1)
        if n:
            made.append(key)
    head = (f"# A copy of conveyor's bundled spec '{name}' (`conveyor init {name}`): edit it freely.\n"
            + (f"# Required: {', '.join(made)} (\"{REQUIRED}\" below): write it here, or pass it "
               f"(load_graph(\"this.yaml\", {made[0]}=...), --set {made[0]}=...).\n" if made else "")
            + "#\n")
    return head + text

"""The layering of ``conveyor/`` (DESIGN.md, "The layers"): every import runs down or sideways,
none runs up, and no modules import each other in a circle.

Bottom -> top: 0 errors, 1 storage, 2 fns (image, _pixels, text, files, dataset and the private
root modules beside them), 3 nodes, 4 graphs, 5 pack and tools, 6 the face (``__init__``,
``__main__``, ``lightning``, ``hf``). A module imports only its own layer or those below it.

Every import counts, at any depth (inside functions too): ``import conveyor.x.y``,
``from conveyor.x import y`` (the module ``conveyor.x.y`` where there is one, else
``conveyor.x``), relative imports, and ``from conveyor import x`` / ``import conveyor``, which
import the package root: the face. Below the face, write ``from conveyor.errors import ...``
or ``from conveyor.x import y``, never ``from conveyor import x``. A root module that is in no
layer fails the test, so that a new one is placed on purpose.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "conveyor"

ERRORS, STORAGE, FNS, NODES, GRAPHS, TOOLS, FACE = range(7)
LAYER_NAMES = {ERRORS: "errors", STORAGE: "storage", FNS: "fns", NODES: "nodes", GRAPHS: "graphs",
               TOOLS: "pack+tools", FACE: "face"}

# each module or package at the root of conveyor/, by its name; the package root itself
# (conveyor/__init__.py) is the face, and a private root module (_name) sits beside the fns
LAYER_OF = {
    "errors": ERRORS,
    "storage": STORAGE,
    "image": FNS, "_pixels": FNS, "text": FNS, "files": FNS, "dataset": FNS,
    "nodes": NODES,
    "graphs": GRAPHS,
    "pack": TOOLS, "tools": TOOLS,
    "__main__": FACE, "lightning": FACE, "hf": FACE,
}

# Imports that run upward and are known: none. (file, module imported) pairs would go here
# only while a move is under way; an entry that no longer occurs fails the test.
_BEING_FIXED: set[tuple[str, str]] = set()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@functools.cache  # one walk a run: _where and _being_fixed ask for it at every import edge
def all_modules() -> dict[str, Path]:
    """Every module of conveyor/ by its dotted name, and every package folder (one without an
    ``__init__.py`` too: it is imported as a namespace package). Read it, never change it."""
    found = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "__pycache__" not in p.parts}
    for path in list(found.values()):
        for folder in path.parents:
            if folder == PACKAGE.parent:
                break
            found.setdefault(module_name(folder), folder)
    return found


def layer_of(module: str) -> int | None:
    """The layer of a module of conveyor/, or None for a root module in no layer."""
    parts = module.split(".")
    if parts == ["conveyor"]:
        return FACE
    top = parts[1]
    if top in LAYER_OF:
        return LAYER_OF[top]
    if top.startswith("_") and not top.startswith("__"):
        return FNS  # a private helper of the fn modules, beside them
    return None


def _known(name: str, modules: dict[str, Path]) -> str:
    """``name`` itself where it is a module, else its longest prefix that is one."""
    parts = name.split(".")
    while len(parts) > 1 and ".".join(parts) not in modules:
        parts.pop()
    return ".".join(parts)


def imports(module: str, path: Path, modules: dict[str, Path]) -> list[tuple[int, str]]:
    """``(line, module of conveyor/ imported)`` for every import in ``path``, at any depth."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "conveyor" or alias.name.startswith("conveyor."):
                    out.append((node.lineno, _known(alias.name, modules)))
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the package, ``level - 1`` packages up
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source != "conveyor" and not source.startswith("conveyor."):
                continue
            if source == "conveyor":  # from conveyor import x: the package root, the face
                out.append((node.lineno, "conveyor"))
                continue
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                out.append((node.lineno, sub if sub in modules else _known(source, modules)))
    return sorted(out)


def import_graph() -> dict[str, list[tuple[int, str]]]:
    """Each module's imports of conveyor/ (a namespace package's folder has none)."""
    modules = all_modules()
    return {m: imports(m, p, modules) if p.is_file() else [] for m, p in modules.items()}


def _where(module: str, line: int) -> str:
    return f"{all_modules()[module].relative_to(ROOT).as_posix()}:{line}"


def _layer(n: int) -> str:
    return f"{n} {LAYER_NAMES[n]}"


def _being_fixed(module: str, target: str) -> bool:
    return (all_modules()[module].relative_to(ROOT).as_posix(), target) in _BEING_FIXED


def test_every_root_module_has_a_layer():
    unplaced = sorted(m for m in all_modules() if layer_of(m) is None)
    assert not unplaced, (
        f"root modules in no layer: {unplaced}: place each in LAYER_OF of tests/test_layers.py "
        "(and DESIGN.md's layers) on purpose")


def test_no_import_runs_upward():
    upward, fixed = [], set()
    for module, found in import_graph().items():
        for line, target in found:
            a, b = layer_of(module), layer_of(target)
            if a is None or b is None or b <= a:
                continue
            if _being_fixed(module, target):
                fixed.add((all_modules()[module].relative_to(ROOT).as_posix(), target))
                continue
            upward.append(f"{_where(module, line)} imports {target} (layer {_layer(a)} -> {_layer(b)})")
    assert not upward, "imports that run upward:\n" + "\n".join(upward)
    stale = sorted(_BEING_FIXED - fixed)
    assert not stale, f"fixed (no longer imported upward): remove them from _BEING_FIXED: {stale}"


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_modules_import_each_other_in_a_circle():
    found = import_graph()
    # the imports being fixed elsewhere close circles too (through the face): left out here
    graph = {m: {t for _, t in edges if not _being_fixed(m, t)} for m, edges in found.items()}
    circles = _circles(graph)
    lines = []
    for members in circles:
        inside = set(members)
        lines.append("circle: " + ", ".join(members))
        lines += [f"  {_where(m, line)} imports {t}" for m in members for line, t in found[m]
                  if t in inside and not _being_fixed(m, t)]
    assert not circles, "modules that import each other in a circle:\n" + "\n".join(lines)


def test_the_walk_sees_every_kind_of_import(tmp_path):
    """The walk itself: nested, dotted, from-imports of modules and names, relative, the root."""
    modules = {"conveyor": Path(), "conveyor.errors": Path(), "conveyor.nodes": Path(),
               "conveyor.nodes.map": Path(), "conveyor.nodes.batch": Path(), "conveyor.graphs.api": Path()}
    path = tmp_path / "x.py"
    path.write_text("import os\n"
                    "import conveyor.nodes.map\n"
                    "from conveyor.errors import SampleError\n"
                    "from conveyor.nodes import batch, Batch\n"
                    "from . import map\n"
                    "from ..graphs.api import load_graph\n"
                    "def f():\n"
                    "    from conveyor import load_graph\n"
                    "    import conveyor\n", encoding="utf-8")
    assert imports("conveyor.nodes.x", path, modules) == [
        (2, "conveyor.nodes.map"), (3, "conveyor.errors"), (4, "conveyor.nodes"), (4, "conveyor.nodes.batch"),
        (5, "conveyor.nodes.map"), (6, "conveyor.graphs.api"), (8, "conveyor"), (9, "conveyor")]
    assert layer_of("conveyor") == layer_of("conveyor.lightning") == FACE
    assert layer_of("conveyor._text_vocab") == layer_of("conveyor.image") == FNS
    assert layer_of("conveyor.storage._errors") == STORAGE and layer_of("conveyor.tools.cli") == TOOLS
    assert layer_of("conveyor.newthing") is None
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]

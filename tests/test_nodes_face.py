"""``conveyor.nodes`` has a face: a sorted ``__all__`` of its node classes and the few helpers
the rest of conveyor uses, and no module outside ``conveyor/nodes/`` reaches past it into a
private module (``_workers``, ``_skips``...) or a private name."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

from torchdata.nodes import BaseNode

import conveyor.nodes as nodes

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "conveyor"
NODES = PACKAGE / "nodes"


def _outside_nodes() -> list[Path]:
    """conveyor's own modules outside conveyor/nodes/, and the examples users copy."""
    files = [p for p in sorted(PACKAGE.rglob("*.py")) if NODES not in p.parents]
    return files + sorted((ROOT / "examples").rglob("*.py"))


def _imports_past_the_face(source: str, name: str) -> list[str]:
    """What the module ``name`` (its text ``source``) imports of conveyor.nodes past its face."""
    problems = []
    tree = ast.parse(source, name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules = [(node.module, [alias.name for alias in node.names])]
        else:
            continue
        for module, names in modules:
            if module != "conveyor.nodes" and not module.startswith("conveyor.nodes."):
                continue
            where = f"{name}:{node.lineno}"
            private = [part for part in module.split(".")[2:] if part.startswith("_")]
            if private:
                problems.append(f"{where}: imports the private module {module}")
            for imported in names:
                if imported.startswith("_"):
                    problems.append(f"{where}: imports the private name {imported} from {module}")
                elif module == "conveyor.nodes" and imported not in nodes.__all__:
                    problems.append(f"{where}: imports {imported}, which conveyor.nodes does not export")
    return problems


def test_no_module_outside_nodes_imports_a_private_module_or_name_of_nodes() -> None:
    problems = [p for path in _outside_nodes()
                for p in _imports_past_the_face(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))]
    assert problems == []


def test_the_check_sees_each_way_past_the_face() -> None:
    source = ("from conveyor.nodes._skips import gather\n"
              "import conveyor.nodes._workers.map_engines\n"
              "from conveyor.nodes.map import _Hidden\n"
              "from conveyor.nodes import Nope\n"
              "from conveyor.nodes import Map\n"
              "from conveyor.errors import SampleError\n")
    assert _imports_past_the_face(source, "planted.py") == [
        "planted.py:1: imports the private module conveyor.nodes._skips",
        "planted.py:2: imports the private module conveyor.nodes._workers.map_engines",
        "planted.py:3: imports the private name _Hidden from conveyor.nodes.map",
        "planted.py:4: imports Nope, which conveyor.nodes does not export",
    ]


def test_all_is_sorted_and_every_name_is_there() -> None:
    assert nodes.__all__ == sorted(nodes.__all__)
    assert len(set(nodes.__all__)) == len(nodes.__all__)
    for name in nodes.__all__:
        assert getattr(nodes, name) is not None


def test_every_node_class_of_a_public_module_is_exported() -> None:
    missing = []
    for path in sorted(NODES.glob("*.py")):
        if path.name.startswith("_") or path.stem == "capabilities":
            continue
        module = importlib.import_module(f"conveyor.nodes.{path.stem}")
        for name, obj in vars(module).items():
            if (inspect.isclass(obj) and issubclass(obj, BaseNode) and obj.__module__ == module.__name__
                    and not name.startswith("_") and getattr(nodes, name, None) is not obj):
                missing.append(f"{module.__name__}.{name}")
    assert missing == []

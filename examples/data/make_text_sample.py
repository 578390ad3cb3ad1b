"""Generate the JSONL text sample that specs/text.yaml, the tests and the padding benchmark read.

Writes ``text-sample/part-0000.jsonl`` ... ``part-0003.jsonl`` and ``text-sample/vocab.txt``
next to this file. The records are docstrings of the Python standard library: real English
prose and code-like text whose lengths are long-tailed the way real corpora are (many one-line
docstrings, a few pages long). Each line is ``{"text": ..., "source": "module.Qual.name"}``.

How the docstrings are found: ``pkgutil.iter_modules`` walks the standard library's folder
(packages recursively, without importing anything, so no module runs its import-time code),
each module's source is parsed with ``ast`` and the docstrings of the module, its classes
and functions are cleaned with ``inspect.cleandoc``. Test packages, private modules and
duplicate texts are left out. The walk is in sorted order, the selection keeps a record when
a hash of its ``source`` falls under a threshold, and records go to the files round-robin,
so a run writes the same files again (for the same Python version: the docstrings are those
of the interpreter that runs the script). ``vocab.txt`` holds the special tokens ``<pad>``,
``<unk>``, ``<bos>``, ``<eos>`` and then the most frequent whitespace-separated tokens of
the sample, one per line (ties broken alphabetically).

Usage::

    python examples/data/make_text_sample.py                 # writes, prints sizes and lengths
    python examples/data/make_text_sample.py --out /tmp/text --records 1000 --files 2
"""

from __future__ import annotations

import argparse
import ast
import collections
import hashlib
import inspect
import json
import pkgutil
import sysconfig
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parent / "text-sample"
SKIP_PACKAGES = {"test", "tests", "idle_test", "idlelib", "lib2to3", "site-packages", "turtledemo",
                 "ensurepip", "venv", "pydoc_data", "dist-packages", "config-3.11-x86_64-linux-gnu"}
MIN_CHARS = 20
MAX_CHARS = 6000          # a few very long module docstrings would dominate the byte budget
SPECIALS = ["<pad>", "<unk>", "<bos>", "<eos>"]


def iter_module_files(root: Path, prefix: str = "") -> list[tuple[str, Path]]:
    """(dotted name, source path) of every public module under ``root``, sorted, no imports."""
    found: list[tuple[str, Path]] = []
    for info in sorted(pkgutil.iter_modules([str(root)]), key=lambda m: m.name):
        if info.name.startswith("_") or info.name in SKIP_PACKAGES:
            continue
        name = prefix + info.name
        if info.ispkg:
            pkg = root / info.name
            if (pkg / "__init__.py").is_file():
                found.append((name, pkg / "__init__.py"))
            found.extend(iter_module_files(pkg, name + "."))
        else:
            path = root / (info.name + ".py")
            if path.is_file():
                found.append((name, path))
    return found


def docstrings(module: str, path: Path) -> list[tuple[str, str]]:
    """(qualified name, cleaned docstring) for the module and its classes and functions."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []
    out: list[tuple[str, str]] = []

    def visit(node: ast.AST, qual: str) -> None:
        doc = ast.get_docstring(node, clean=False)
        if doc:
            out.append((qual, inspect.cleandoc(doc)))
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, f"{qual}.{child.name}")

    visit(tree, module)
    return out


def _keep(source: str, fraction: float) -> bool:
    h = int.from_bytes(hashlib.sha1(source.encode()).digest()[:8], "big")
    return h < fraction * 2**64


def collect(records: int) -> list[dict[str, str]]:
    """About ``records`` docstrings of the standard library, deterministic."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    seen: set[str] = set()
    pool: list[dict[str, str]] = []
    for module, path in iter_module_files(stdlib):
        for qual, text in docstrings(module, path):
            text = text.strip()
            if len(text) < MIN_CHARS or text in seen:
                continue
            seen.add(text)
            pool.append({"text": text[:MAX_CHARS], "source": qual})
    fraction = min(1.0, records / max(len(pool), 1))
    return [r for r in pool if _keep(r["source"], fraction)]


def build_vocab(texts: list[str], size: int) -> list[str]:
    counts = collections.Counter(tok for t in texts for tok in t.split())
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return SPECIALS + [tok for tok, _ in ranked[: size - len(SPECIALS)]]


def write(out: Path, records: list[dict[str, str]], files: int, vocab_size: int) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("part-*.jsonl"):
        stale.unlink()
    paths = [out / f"part-{i:04d}.jsonl" for i in range(files)]
    handles = [p.open("w", encoding="utf-8", newline="\n") for p in paths]
    try:
        for i, rec in enumerate(records):
            handles[i % files].write(json.dumps(rec, ensure_ascii=False) + "\n")
    finally:
        for h in handles:
            h.close()
    vocab = build_vocab([r["text"] for r in records], vocab_size)
    (out / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--records", type=int, default=4000, help="about this many records")
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--vocab-size", type=int, default=8000)
    args = parser.parse_args()
    records = collect(args.records)
    paths = write(args.out, records, args.files, args.vocab_size)
    sizes = sorted(len(r["text"].encode()) for r in records)
    total = sum(p.stat().st_size for p in paths) + (args.out / "vocab.txt").stat().st_size
    q = lambda f: sizes[min(len(sizes) - 1, int(f * len(sizes)))]  # noqa: E731
    print(f"{len(records)} records in {len(paths)} files under {args.out} ({total / 1e6:.2f} MB); "
          f"bytes per text: median {q(0.5)}, p90 {q(0.9)}, p99 {q(0.99)}, max {sizes[-1]}")


if __name__ == "__main__":
    main()

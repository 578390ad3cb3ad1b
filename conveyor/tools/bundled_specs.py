"""``conveyor specs`` and ``conveyor init``: the specs that ship with conveyor.

    conveyor specs                      # each bundled spec's name and one line
    conveyor init imagenet              # ./imagenet.yaml: an editable copy, root required
    conveyor init imagenet my.yaml      # (or into a folder: DST/imagenet.yaml)

A bundled spec runs by name (``conveyor run imagenet --set root=...``,
``load_graph("imagenet", root=...)``); ``init`` is for changing it. The copy keeps the
spec's comments and makes each param that names the sample data beside the package
(``root``) required: ``"???"``, a spec error until it is given (conveyor/graphs/bundled.py).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from conveyor.graphs.bundled import bundled_dir, bundled_names, bundled_path, init_text, summary
from conveyor.tools._args import UsageError


def cmd_specs(args: argparse.Namespace) -> int:
    names = bundled_names()
    if not names:
        print("conveyor: no bundled specs found (this install has no conveyor/specs/)", file=sys.stderr)
        return 1
    width = max(map(len, names))
    for name in names:
        print(f"{name:<{width}}  {summary(name)}")
    print(f"\n({bundled_dir()}; run one by name: conveyor run NAME --set root=..., or copy it: "
          "conveyor init NAME)", file=sys.stderr)
    return 0


def cmd_init(args: argparse.Namespace) -> int:
    bundled_path(args.name)  # an unknown name: a SpecErrors listing the names
    dst = args.dst or f"{args.name}.yaml"
    if os.path.isdir(dst):
        dst = os.path.join(dst, f"{args.name}.yaml")
    if os.path.exists(dst) and not args.force:
        raise UsageError(f"{dst} exists; pass --force to overwrite it")
    text = init_text(args.name)
    with open(dst, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {dst}: edit it, then `conveyor run {dst}`", file=sys.stderr)
    return 0


def add_parsers(sub: Any) -> None:
    """Add ``conveyor specs`` and ``conveyor init`` to the CLI's subcommands."""
    specs = sub.add_parser("specs", help="list the bundled specs (run one by name: conveyor run imagenet)")
    specs.set_defaults(func=cmd_specs)
    init = sub.add_parser("init", help="write an editable copy of a bundled spec, its data root required")
    init.add_argument("name", help="a bundled spec (conveyor specs lists them)")
    init.add_argument("dst", nargs="?", help="the file (or folder) to write; default ./NAME.yaml")
    init.add_argument("--force", action="store_true", help="overwrite DST if it exists")
    init.set_defaults(func=cmd_init, spec=None)

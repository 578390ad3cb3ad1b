"""``conveyor index URL``: list once, write a manifest that ``list_files`` reads in one request.

    conveyor index s3://bucket/train/*.tar > train.json
    conveyor index s3://bucket/train --extensions .jpg .jpeg --label top_dir -o train.json

A bucket of 1.28 M objects takes ~1,300 LIST requests to list; a manifest is one GET. It holds
what ``list_files`` would list (the sorted paths, their labels, the classes) with the count and
the digest a loader state keeps, and each object's size and ETag where the listing gave them
(S3: both, at no extra request). ``list_files: {manifest: train.json}`` reads it; a reader that
finds an object gone or changed since says so, naming the manifest, and asks to run this again.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from conveyor.nodes import write_manifest
from conveyor.tools._args import UsageError

LABELS = ("parent_dir", "top_dir")


def cmd_index(args: argparse.Namespace) -> int:
    if args.extensions is not None and not all(e.strip(".") for e in args.extensions):
        raise UsageError(f"--extensions: expected extensions such as .jpg .png, got {args.extensions}")
    manifest = write_manifest(args.url, extensions=args.extensions, label=args.label)
    text = json.dumps(manifest, separators=(",", ":")) + "\n"
    if args.out in (None, "-"):
        sys.stdout.write(text)
    else:
        tmp = f"{args.out}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, args.out)  # never half a manifest where the last one was
    print(f"conveyor index: {manifest['count']} files, digest {manifest['digest']}", file=sys.stderr)
    return 0


def add_parser(sub: Any) -> None:
    """Add ``conveyor index`` to the CLI's subcommands."""
    p = sub.add_parser("index", help="list a URL once and write a manifest for list_files (manifest: ...)")
    p.add_argument("url", help="what list_files would list: a glob or a folder, local or s3://...")
    p.add_argument("--extensions", nargs="+", default=None, help="keep only names ending in these (.jpg .png)")
    p.add_argument("--label", choices=LABELS, default=None, help="label the files as list_files does")
    p.add_argument("-o", "--out", default=None, help="write here (default: standard output)")
    p.set_defaults(func=cmd_index)

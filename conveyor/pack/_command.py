"""``conveyor pack``'s command line: its arguments, checked, then ``pack`` or ``pack_lmdb``."""

from __future__ import annotations

import argparse
import time
from typing import Any

from conveyor.nodes import suffixes
from conveyor.pack._formats import pack_from
from conveyor.pack._lmdb import pack_lmdb
from conveyor.pack._shrink import DEFAULT_QUALITY
from conveyor.pack._tar import pack
from conveyor.storage import parse_size, redact


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``pack`` to the ``conveyor`` command's subparsers."""
    p = subparsers.add_parser(
        "pack", help="write tar shards (WebDataset layout) from an ImageNet-layout folder",
        description="Write SRC/<class>/<image> as tar shards under DST (local or any fsspec "
                    "URL, e.g. s3://bucket/prefix), with DST/index.json. Credentials and the "
                    "endpoint come from the usual AWS variables (AWS_ENDPOINT_URL...).")
    p.add_argument("src", help="ImageNet-layout folder: SRC/<class>/<image>")
    p.add_argument("dst", help="output folder for the shards and index.json")
    p.add_argument("--shard-size", default="256MB", help="bytes per shard, e.g. 256MB (default), 1GiB")
    p.add_argument("--prefix", default="shard", help="shard file name prefix (default: shard)")
    p.add_argument("--concurrency", type=int, default=16, help="source reads in flight (default 16)")
    p.add_argument("--overwrite", action="store_true", help="replace shards already in DST")
    p.add_argument("--format", choices=("tar", "lmdb"), default="tar",
                   help="tar: WebDataset shards (default); lmdb: one LMDB environment at DST (local disk)")
    p.add_argument("--resize", type=int, default=None, metavar="N",
                   help="re-encode images whose shorter side is above N pixels to JPEG with that "
                        "shorter side, aspect kept (training at 224: N = 256-320)")
    p.add_argument("--quality", type=int, default=DEFAULT_QUALITY, metavar="Q",
                   help=f"JPEG quality of resized images, 1-100 (default {DEFAULT_QUALITY})")
    p.add_argument("--extensions", default=None, metavar="EXT,...",
                   help="pack only these, in any case, e.g. .jpg,.jpeg,.png (default: every "
                        "visible file with an extension; what is left out is named in a warning)")
    p.add_argument("--from", dest="from_format", choices=("mds", "litdata"), default=None,
                   help="SRC is a MosaicML Streaming (MDS) or LitData optimize() dataset (its folder, "
                        "with index.json): re-pack its samples as tar shards, a member per field")
    p.add_argument("--label", default=None, metavar="FIELD",
                   help="with --from: the field written as cls (the class number read_tar reads)")
    p.add_argument("--allow-pickle", action="store_true",
                   help="with --from: read pkl/pickle fields (unpickling runs code from the file)")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Run ``conveyor pack``; prints one line per shard and a summary, returns the exit code."""
    try:
        size = parse_size(args.shard_size)
    except ValueError as exc:
        raise SystemExit(f"conveyor pack: --shard-size: {exc}") from None
    if size < 1024:
        raise SystemExit(f"conveyor pack: --shard-size must be at least 1kB, got {args.shard_size!r}")
    if args.concurrency < 1:
        raise SystemExit("conveyor pack: --concurrency must be >= 1")
    if args.resize is not None and args.resize < 1:
        raise SystemExit("conveyor pack: --resize must be a positive number of pixels")
    if not 1 <= args.quality <= 100:
        raise SystemExit("conveyor pack: --quality must be in 1..100")
    extensions = None if args.extensions is None else [e for e in args.extensions.split(",") if e.strip()]
    if extensions is not None:
        try:
            suffixes(extensions)
        except ValueError:
            raise SystemExit(f"conveyor pack: --extensions expects e.g. .jpg,.png, got {args.extensions!r}") from None
    t0 = time.perf_counter()
    if getattr(args, "from_format", None):
        if args.format != "tar" or args.resize is not None or extensions is not None:
            raise SystemExit("conveyor pack: --from writes tar shards; --format, --resize and --extensions "
                             "are for image folders")
        index = pack_from(args.from_format, args.src, args.dst, shard_size=size, prefix=args.prefix,
                          overwrite=args.overwrite, label=args.label, allow_pickle=args.allow_pickle)
        print(f"packed {index['samples']} samples of the {args.from_format} dataset {redact(args.src)} into "
              f"{len(index['shards'])} shard(s) under {redact(args.dst)} in {time.perf_counter() - t0:.1f} s")
        return 0
    if args.format == "lmdb":
        if args.resize is not None:
            raise SystemExit("conveyor pack: --resize is for tar shards (--format tar) only")
        out = pack_lmdb(args.src, args.dst, concurrency=args.concurrency, overwrite=args.overwrite,
                        extensions=extensions)
        print(f"packed {out['samples']} samples ({out['bytes']:,} bytes) of {len(out['classes'])} classes "
              f"into the LMDB environment {out['path']} in {time.perf_counter() - t0:.1f} s")
        return 0
    index = pack(args.src, args.dst, shard_size=size, prefix=args.prefix,
                 concurrency=args.concurrency, overwrite=args.overwrite, resize=args.resize,
                 quality=args.quality, extensions=extensions)
    for shard in index["shards"]:
        print(f"  {shard['name']}  {shard['samples']:>7} samples  {shard['bytes']:>12,} bytes")
    print(f"packed {index['samples']} samples of {len(index['classes'])} classes into "
          f"{len(index['shards'])} shard(s) under {redact(args.dst)} in {time.perf_counter() - t0:.1f} s")
    return 0

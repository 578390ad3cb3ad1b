"""The ``conveyor`` command: run, validate, show, bench and tune a spec.

    conveyor run SPEC [--set k=v ...] [--params FILE] [--epochs N] [--steps N] [--trace FILE]
    conveyor validate SPEC [--set k=v ...]
    conveyor show SPEC [--format text|dot|mermaid] [--batch] [--set k=v ...]
    conveyor bench SPEC [--seconds N] [--step-time MS] [--set k=v ...] [--trace FILE] [--report FILE]
    conveyor tune SPEC --param workers=1,2,4,8 [--param k=a,b] [--seconds N] [--rounds N]
                       [--write FILE] [--plot FILE.svg] [--report FILE.html]
    conveyor check SPEC [--set k=v ...] [--out skipped.jsonl]
    conveyor pack SRC DST [--shard-size 256MB]          (conveyor/pack/)
    conveyor ops [OP]
    conveyor specs                      (the bundled specs; SPEC may be one's name: imagenet)
    conveyor init NAME [DST] [--force]  (an editable copy of one, its data root required)

``validate`` prints every problem as ``file:line:col: node 'x' (op): message`` and exits 1,
or prints ``ok`` and the nodes and exits 0. Spec errors exit 1 from every command; bad
command-line usage exits 2. ``run`` prints each node's counts (stdout) and where the time
went (stderr); ``bench`` prints a table per node, names the node that limits the graph and
estimates the memory its buffers hold (``--report`` writes all of it, with charts, as one
HTML page); ``tune`` measures params in alternating rounds and picks the knee of the
throughput curve, or says the noise hides it (``--plot`` draws the curve as SVG). ``--params FILE`` reads overrides from a YAML mapping (``tune --write``
makes one); ``--set`` wins over it.

Each subcommand is added by its own module: ``run``, ``show`` (validate, show),
``bench_commands`` (bench, tune), ``check``, ``reference`` (ops), ``bundled_specs`` (specs,
init) and ``conveyor.pack``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any, Sequence

from conveyor.errors import ConveyorError, SpecErrors
from conveyor.pack import add_parser as add_pack_parser
from conveyor.tools import bench_commands, bundled_specs, check, index, reference, run, show
from conveyor.tools._args import INTERRUPTED, UsageError
from conveyor.tools.measure import batch_len

__all__ = ["batch_len", "build_parser", "main"]  # batch_len lives in conveyor.tools.measure


def build_parser() -> argparse.ArgumentParser:
    """The ``conveyor`` command's parser; each subcommand's module adds its own."""
    parser = argparse.ArgumentParser(prog="conveyor", description="PyTorch data loading as a declared graph")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)
    run.add_parser(sub)
    check.add_parser(sub)
    bench_commands.add_parsers(sub)  # bench, tune
    show.add_parsers(sub)  # validate, show
    reference.add_parser(sub)  # conveyor ops [OP]: the reference, from the op registry
    index.add_parser(sub)  # conveyor index URL: a manifest for list_files
    add_pack_parser(sub)  # conveyor pack SRC DST (conveyor/pack/)
    bundled_specs.add_parsers(sub)  # conveyor specs, conveyor init NAME [DST]
    return parser


def _import_path(spec: Any) -> None:
    """Put the current folder, then the spec's folder, first on the import path, as
    ``python -m`` puts the current folder: a spec's ``fn: myfns:double`` finds ``myfns.py``
    where the user runs the command or beside the spec (a console script's path holds
    neither; ``load_graph`` in a script has the script's folder)."""
    folders = [os.getcwd()]
    if isinstance(spec, str) and os.path.isfile(spec):
        folders.append(os.path.dirname(os.path.abspath(spec)))
    for folder in reversed(folders):
        if folder not in sys.path:
            sys.path.insert(0, folder)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _import_path(getattr(args, "spec", None))
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except UsageError as exc:
        print(f"conveyor: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C outside a run's loop (checking, building, closing)
        print("conveyor: interrupted", file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:  # `conveyor show spec.yaml | head`: the reader left, say nothing more
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so that the flush at exit does not fail again
        return 1
    except SpecErrors as exc:
        for err in exc.errors:
            print(err, file=sys.stderr)
        print(f"{len(exc.errors)} error(s) in {getattr(args, 'spec', None) or getattr(args, 'name', '?')}",
              file=sys.stderr)
        return 1
    except FileNotFoundError as exc:  # the spec file, or a SourceError (no file matches ...)
        print(f"conveyor: {exc}", file=sys.stderr)
        for note in getattr(exc, "__notes__", ()):  # the node it came from
            print(f"  {note}", file=sys.stderr)
        return 1
    except ConveyorError as exc:
        print(f"conveyor: {type(exc).__name__}: {exc}", file=sys.stderr)
        for note in getattr(exc, "__notes__", ()):  # the node it came from ("in node 'read' ...")
            print(f"  {note}", file=sys.stderr)
        return 1
    except MemoryError as exc:  # a batch, a shuffle window, an image too big for this machine's memory
        print(f"conveyor: out of memory: {exc or 'an allocation failed'}; a smaller batch size, shuffle "
              "window, prefetch depth or image size (or fewer workers) needs less", file=sys.stderr)
        for note in getattr(exc, "__notes__", ()):  # the node it came from
            print(f"  {note}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

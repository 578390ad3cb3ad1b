"""What every ``conveyor`` subcommand shares: SPEC with its ``--set`` and ``--params``, read and
checked into a plan; the mistake on the command line (exit status 2); the status of Ctrl-C."""

from __future__ import annotations

import argparse
from typing import Any

import yaml

from conveyor.graphs.api import check_spec, read_spec
from conveyor.graphs.params import parse_set
from conveyor.graphs.validate import Plan
from conveyor.graphs.yaml_loader import Located

INTERRUPTED = 130  # the shell's status for a command stopped by Ctrl-C (128 + SIGINT)


class UsageError(Exception):
    """A mistake on the command line itself (exit status 2, like argparse's own)."""


def declared_params(doc: Located) -> dict[str, Any] | None:
    declared = doc.data.get("params") if isinstance(doc.data, dict) else None
    return declared if isinstance(declared, dict) else None


def overrides(args: argparse.Namespace, doc: Located) -> dict[str, Any]:
    """``--params FILE`` values, then ``--set`` values over them."""
    overrides: dict[str, Any] = {}
    if getattr(args, "params", None):
        with open(args.params, encoding="utf-8") as f:
            try:
                data = yaml.safe_load(f)
            except yaml.YAMLError as exc:
                raise UsageError(f"--params {args.params}: not YAML: {exc}") from None
        if data is not None and not isinstance(data, dict):
            raise UsageError(f"--params {args.params}: expected a mapping of param: value, "
                             f"got {type(data).__name__}")
        overrides.update({str(k): v for k, v in (data or {}).items()})
    try:
        overrides.update(parse_set(args.set or [], declared_params(doc)))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return overrides


def checked_plan(args: argparse.Namespace) -> Plan:
    """Read the spec, parse ``--params`` and ``--set`` against its declared params, check it all."""
    doc = read_spec(args.spec)
    return check_spec(doc, overrides(args, doc))



def add_spec_args(p: argparse.ArgumentParser) -> None:
    """SPEC, ``--set K=V`` (repeatable) and ``--params FILE``: what every command on a spec takes."""
    p.add_argument("spec", help="path of the YAML spec")
    p.add_argument("--set", action="append", metavar="K=V", help="override a spec param (repeatable)")
    p.add_argument("--params", metavar="FILE", help="YAML mapping of param overrides (--set wins)")

"""The errors conveyor raises, so that callers can catch them by kind.

``ConveyorError`` is the root. ``SpecError`` is a mistake in a spec, found before anything
runs; it carries where (``path``, ``line``, ``col``) and what (``node``, ``op``, ``param``)
as attributes. ``SpecErrors`` gathers every mistake of one spec, since the compiler reports
them all at once. ``StateError`` is a saved state that does not fit the graph it is loaded
into. ``SampleError`` is one bad input item (a corrupt image, a line that is not JSON): it
names the file and, where it has one, the line. ``WorkerError`` is a worker process that died
under the loader (the out-of-memory killer's SIGKILL, a crash in native code): it names the
node, the pid and the signal or exit code. ``did_you_mean`` is the hint that messages
naming a wrong choice end with (a param, a node, an op, a storage option).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Callable, Iterable


class ConveyorError(Exception):
    """Root of every error conveyor raises on purpose."""


@dataclass
class SpecError(ConveyorError):
    """One mistake in a spec, with where it is.

    Args:
        message: what is wrong, and what to do about it where that is known.
        path: the spec file (or ``<string>``).
        line: 1-based line, or 0 when unknown.
        col: 1-based column, or 0 when unknown.
        node: the node's name, when the mistake is inside a node.
        op: the node's op, when known.
        param: the param, when the mistake is in one.
    """

    message: str
    path: str = "<spec>"
    line: int = 0
    col: int = 0
    node: str | None = None
    op: str | None = None
    param: str | None = None

    def __post_init__(self) -> None:
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}:{self.col}"
        parts = [where]
        if self.node is not None:
            parts.append(f"node '{self.node}'" + (f" ({self.op})" if self.op else ""))
        if self.param is not None:
            parts.append(f"param '{self.param}'")
        return ": ".join(parts) + f": {self.message}"

    def __hash__(self) -> int:  # dataclass eq would make it unhashable; exceptions must hash
        return id(self)


class SpecErrors(ConveyorError):
    """Every mistake found in one spec; ``errors`` lists them in file order."""

    def __init__(self, errors: list[SpecError]):
        self.errors = sorted(errors, key=lambda e: (e.path, e.line, e.col))
        super().__init__("\n".join(str(e) for e in self.errors))


class StateError(ConveyorError):
    """A saved loader state that does not fit this graph (other spec, params, rank, version)."""


class SampleError(ConveyorError):
    """One input item that cannot be used; the message names the file (and line) it came from."""


class SourceError(ConveyorError, FileNotFoundError):
    """A source that cannot be read at all (no file matches, no such bucket); names the URL."""


class WorkerError(ConveyorError, RuntimeError):
    """A worker process that died while the loader ran (killed by a signal, or gone without
    a word); a ``RuntimeError`` too, as ``DataLoader``'s "worker (pid N) is killed by signal".

    The loader's state from before the error is intact: a new loader resumes from it exactly.

    Args:
        message: what died, and how, in words.
        node: the node (or the worker copies) the process worked for.
        pid: the process's id.
        exitcode: its exit code; ``-N`` when it was killed by signal N.
    """

    def __init__(self, message: str, *, node: str = "", pid: int | None = None, exitcode: int | None = None):
        super().__init__(message)
        self.node = node
        self.pid = pid
        self.exitcode = exitcode  # (pickles as any exception: its args, then these fields)


_HINT_CHOICES = 300  # at most this many choices are compared (those nearest in length)


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest choice, or an empty string.

    Comparing strings costs; with very many choices (a spec of thousands of nodes) only the
    ``_HINT_CHOICES`` nearest in length are compared, so that hints stay cheap.
    """
    pool = [c for c in choices if isinstance(c, str)]
    if len(pool) > _HINT_CHOICES:
        pool = sorted(pool, key=lambda c: abs(len(c) - len(name)))[:_HINT_CHOICES]
    close = difflib.get_close_matches(name, pool, n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def check_message(check: Callable[[], Any]) -> str | None:
    """The message of the ``ValueError`` or ``TypeError`` that ``check()`` raises, or None:
    how a fn's ``check_args`` turns the checks its fn runs on its args into spec problems."""
    try:
        check()
    except (ValueError, TypeError) as exc:
        return str(exc)
    return None

"""The one rule for skipped items (``on_error: skip``), and the ledger that names them.

Every skip is counted in the node's ``stats()``; the first few are also logged with what was
wrong, then only counted. Each skipping node also keeps a ``SkipLedger``: for each skipped
sample its identity (``sample_id``: a path, a shard and key, a file and line, an index), the
error's type and message, and how many times it was skipped (once per epoch it is met); the
first ``LEDGER_LIMIT`` distinct samples in full, the rest counted. The ledger is part of the
node's state, so it survives a resume and travels back from worker copies inside theirs;
``Loader.skipped()`` gathers the ledgers of the whole graph (``gather``). ``OnError`` is the
rule for the failures a map's ``fn`` raised: raised with a note naming the node, or counted,
named in the ledger and logged.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Iterator

LOGGED_SKIPS = 5
LEDGER_LIMIT = 1000        # distinct samples kept in full per node
LEDGER_KEY = "ledger"      # the key of a ledger in a node's state
_MESSAGE_CHARS = 300       # a message is cut to this many characters (the state stays small)


def log_skip(log: logging.Logger, skipped: int, what: str) -> None:
    """Log skip number ``skipped`` (1-based) of a node, if it is among the first few."""
    if skipped <= LOGGED_SKIPS:
        log.warning("%s%s", what, "; further skips are only counted" if skipped == LOGGED_SKIPS else "")


def sample_id(item: Any) -> str:
    """What names an item for a person: shard and key, path, file:line, LMDB key, or index.

    Example:
        >>> sample_id({"path": "a/b.jpg", "index": 3})
        'a/b.jpg'
        >>> sample_id({"file": "x.jsonl", "line": 7})
        'x.jsonl:7'
    """
    if isinstance(item, dict):
        if item.get("__key__") is not None and item.get("__url__") is not None:
            return f"{item['__url__']}#{item['__key__']}"
        for key in ("path", "url"):
            if isinstance(item.get(key), str):
                return item[key]
        if item.get("file") is not None and item.get("line") is not None:
            return f"{item['file']}:{item['line']}"
        if item.get("file") is not None and item.get("row") is not None:
            return f"{item['file']} row {item['row']}"
        if item.get("lmdb") is not None and item.get("key") is not None:
            return f"{item['lmdb']}#{item['key']}"
        if item.get("index") is not None:
            return f"index {item['index']}"
    text = repr(item)
    return text if len(text) <= 80 else text[:77] + "..."


class SkipLedger:
    """The skipped samples of one node: ``[sample, error type, message, times]`` each.

    Args:
        node: the node's name in the graph (set by the compiler; empty for plain nodes).
        limit: distinct samples kept in full; later ones are only counted.
    """

    def __init__(self, node: str = "", limit: int = LEDGER_LIMIT):
        self.node = node
        self.limit = limit
        self.count = 0           # skips, all of them
        self.entries: dict[str, list] = {}
        self._lock = threading.Lock()

    def add(self, sample: str, error: BaseException | str, message: str | None = None) -> None:
        """Record one skip of ``sample`` because of ``error`` (an exception, or its type name)."""
        kind = error if isinstance(error, str) else type(error).__name__
        text = message if message is not None else str(error)
        with self._lock:
            self.count += 1
            entry = self.entries.get(sample)
            if entry is not None:
                entry[3] += 1
            elif len(self.entries) < self.limit:
                self.entries[sample] = [sample, kind, text[:_MESSAGE_CHARS], 1]

    def state(self) -> dict:
        """Plain data for the node's state."""
        with self._lock:
            return {"node": self.node, "count": self.count, "entries": [list(e) for e in self.entries.values()]}

    def load(self, state: dict | None) -> None:
        """Take the ledger of a state (``None``, from a state made before ledgers: empty)."""
        with self._lock:
            if state is not None and state.get("node"):
                self.node = state["node"]
            self.count = 0 if state is None else int(state["count"])
            self.entries = {} if state is None else {e[0]: list(e) for e in state["entries"]}


class OnError:
    """A node's ``on_error`` for the failures its ``fn`` raised (``map_calls.Failed``): raise
    the exception with a note naming the node, or count the skip, name the sample in the ledger
    and log it (the first few). A failure marked ``never_skip`` (a ``SourceError``) is raised
    even with ``"skip"``.

    Args:
        on_error: ``"raise"`` or ``"skip"``.
        where: the node, for the note and the log.
        log: the logger that reports skips (the node's module's).
    """

    def __init__(self, on_error: str, where: str, log: logging.Logger):
        self.on_error = on_error
        self.where = where
        self.log = log
        self.skipped = 0  # this epoch (restored from a state)
        self.ledger = SkipLedger()

    def fail(self, failed: Any) -> None:
        if self.on_error == "raise" or failed.never_skip:
            exc = failed.error(self.where)
            exc.add_note(f"in {self.where}")
            raise exc
        self.skipped += 1
        self.ledger.add(failed.sample, failed.kind, failed.message)
        log_skip(self.log, self.skipped, f"{self.where}: skipped an item ({failed.text})")


def ledgers(state: Any, only: set[str] | None = None) -> Iterator[dict]:
    """The ledgers in a state (of nodes named in ``only``, when given)."""
    if isinstance(state, dict):
        for key, value in state.items():
            if key == LEDGER_KEY and isinstance(value, dict) and "entries" in value:
                if only is None or value.get("node") in only:
                    yield value
            else:
                yield from ledgers(value, only)
    elif isinstance(state, list):
        for value in state:
            yield from ledgers(value, only)


def gather(state: Any, limit: int = LEDGER_LIMIT, only: set[str] | None = None) -> tuple[list[dict], int]:
    """Every ledger found in a graph's state (worker copies' included), merged by node.

    Args:
        state: a state, or any plain data holding ledgers under ``LEDGER_KEY``.
        limit: entries returned at most.
        only: the node names to gather (default: all).

    Returns:
        ``(entries, total)``: at most ``limit`` entries, each ``{"node", "sample", "error",
        "message", "times"}``, in node and then skip order; ``total`` counts every skip.
    """
    merged: dict[tuple[str, str], dict] = {}
    total = 0
    for ledger in ledgers(state, only):
        total += ledger["count"]
        for sample, kind, message, times in ledger["entries"]:
            key = (ledger["node"], sample)
            if key in merged:
                merged[key]["times"] += times
            else:
                merged[key] = {"node": ledger["node"], "sample": sample, "error": kind, "message": message,
                               "times": times}
    return list(merged.values())[:limit], total

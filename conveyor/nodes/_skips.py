"""The one rule for logging skipped items (``on_error: skip``): every skip is counted in the
node's ``stats()``; the first few are also logged with what was wrong, then only counted."""

from __future__ import annotations

import logging

LOGGED_SKIPS = 5


def log_skip(log: logging.Logger, skipped: int, what: str) -> None:
    """Log skip number ``skipped`` (1-based) of a node, if it is among the first few."""
    if skipped <= LOGGED_SKIPS:
        log.warning("%s%s", what, "; further skips are only counted" if skipped == LOGGED_SKIPS else "")

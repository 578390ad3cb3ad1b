"""How a ``Storage`` retries and what it counts: ``RetryPolicy``, ``StorageStats``, and
``parse_size`` for the sizes a spec writes as text (``cache_size: 10GB``, ``--shard-size``)."""

from __future__ import annotations

import random
import re
import threading
from dataclasses import dataclass

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)b?\s*$", re.I)
_UNITS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}


# ----- sizes ------------------------------------------------------------------------------

def parse_size(value: int | str) -> int:
    """Bytes from an int or a string like ``"256MB"``, ``"1.5GiB"``, ``"500k"`` (k = 1000, ki = 1024).

    Raises:
        ValueError: the value is not a size.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"size {value!r} must be >= 0")
        return value
    m = _SIZE.match(str(value))
    if not m:
        raise ValueError(f"expected a size such as 256MB, 1GiB or a number of bytes, got {value!r}")
    number, unit, binary = m.groups()
    return int(float(number) * (1024 if binary else 1000) ** _UNITS[unit.lower()])


# ----- policy and counters ----------------------------------------------------------------

@dataclass(frozen=True)
class RetryPolicy:
    """How requests are retried.

    Args:
        attempts: tries per request, >= 1 (transient failures only are tried again).
        timeout: seconds a request may take in all (also the socket read timeout).
        backoff: the first delay in seconds; each retry doubles it, up to ``backoff_max``.
        backoff_max: the cap on one delay.

    The delay before retry ``i`` is drawn uniformly from ``[d/2, d]`` with
    ``d = min(backoff_max, backoff * 2**i)`` (jitter spreads out clients that failed together).
    """

    attempts: int = 5
    timeout: float = 30.0
    backoff: float = 0.1
    backoff_max: float = 5.0

    def __post_init__(self) -> None:
        if not isinstance(self.attempts, int) or self.attempts < 1:
            raise ValueError(f"attempts={self.attempts!r} must be an int >= 1")
        if not self.timeout > 0:
            raise ValueError(f"timeout={self.timeout!r} must be > 0 seconds")
        if self.backoff < 0 or self.backoff_max < self.backoff:
            raise ValueError(f"backoff={self.backoff!r}, backoff_max={self.backoff_max!r}: need "
                             "0 <= backoff <= backoff_max")

    def delay(self, retry: int, rng: random.Random) -> float:
        d = min(self.backoff_max, self.backoff * (2 ** retry))
        return rng.uniform(d / 2, d)


class StorageStats:
    """Thread-safe counters: requests made, retries, failures given up on, bytes, cache hits."""

    FIELDS = ("requests", "retries", "failed", "bytes", "cache_hits")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(self.FIELDS, 0)

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n

    def clear(self) -> None:
        with self._lock:
            self._counts = dict.fromkeys(self.FIELDS, 0)

    def as_dict(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


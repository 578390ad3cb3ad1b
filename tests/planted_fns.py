"""Slow functions for planted bottlenecks (tests/test_bench.py, tests/test_tune.py).

Specs in the tests name them as ``planted_fns:<name>`` (``tests/`` is on ``sys.path`` while
pytest runs). ``time.sleep`` releases the GIL, so a sleeping node is slow without slowing
the threads around it; ``burn`` holds the GIL, as pure-Python work does.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path


def ident(item):
    """The item unchanged."""
    return item


def slow(item, *, ms: float = 5.0):
    """Sleep ``ms`` milliseconds, then return the item."""
    time.sleep(ms / 1000.0)
    return item


def slow_keep(item, *, ms: float = 5.0) -> bool:
    """A filter predicate that sleeps ``ms`` milliseconds and keeps every item."""
    time.sleep(ms / 1000.0)
    return True


def burn_keep(item, *, ms: float = 3.0) -> bool:
    """A filter predicate that burns ``ms`` milliseconds of CPU in Python (holding the GIL)."""
    end = time.perf_counter() + ms / 1000.0
    x = 0
    while time.perf_counter() < end:
        x += 1
    return True


_SLOTS: dict[int, threading.BoundedSemaphore] = {}
_SLOTS_LOCK = threading.Lock()


def limited(item, *, ms: float = 2.0, slots: int = 2):
    """Sleep ``ms`` milliseconds holding one of ``slots`` process-wide slots.

    A map of this runs ``workers / ms`` items per millisecond up to ``slots`` workers and no
    faster beyond: a throughput curve with its knee at ``workers = slots``, like a decode
    that scales with the cores up to their number.
    """
    with _SLOTS_LOCK:
        sem = _SLOTS.setdefault(slots, threading.BoundedSemaphore(slots))
    with sem:
        time.sleep(ms / 1000.0)
    return item


# ----- planted specs ----------------------------------------------------------------------

SAMPLE = Path(__file__).resolve().parent.parent / "examples" / "data" / "imagenet-sample" / "train"


def empty_files(root: Path, count: int, classes: int = 4) -> Path:
    """``count`` empty ``root/c<k>/<i>.JPEG`` files, for a longer epoch of file records."""
    for i in range(count):
        d = root / f"c{i % classes}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{i:06d}.JPEG").touch()
    return root


def planted_spec(*, source: str = "", decode: str = "planted_fns:ident", decode_args: str = "{}",
                 collate: str = "planted_fns:ident", collate_args: str = "{}", after: str = "",
                 workers: int = 2, batch_size: int = 8, root: Path = SAMPLE, before_out: str = "") -> str:
    """A spec over file records (the bundled sample's 200 by default; nothing is decoded)
    with one slow part.

    files -> [source] -> shard -> shuffle -> decode (map, ``workers`` threads) -> batch ->
    collate (a map over batches) -> [before_out] -> out (prefetch) -> [after]. ``source``,
    ``before_out`` and ``after`` are whole node lines (``"  name: {...}"``); the output is
    ``gpu`` when ``after`` is given.
    """
    return f"""params: {{root: "{root.as_posix()}", workers: {workers}}}
nodes:
  files:   {{op: list_files, url: "${{root}}/*/*.JPEG", label: parent_dir}}
{source}
  shard:   {{op: shard, by: [rank]}}
  shuffle: {{op: shuffle_buffer, size: 16}}
  decode:  {{op: map, fn: "{decode}", args: {decode_args}, workers: "${{workers}}"}}
  batch:   {{op: batch, size: {batch_size}}}
  collate: {{op: map, fn: "{collate}", args: {collate_args}}}
{before_out}
  out:     {{op: prefetch, depth: 2}}
{after}
output: {"gpu" if after else "out"}
"""

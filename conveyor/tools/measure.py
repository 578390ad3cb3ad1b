"""Measuring a loader as it runs, for ``conveyor bench`` and ``conveyor tune``: samples in a
batch, the bytes an item holds, the process's memory, and ``drive``, which iterates a loader
epoch after epoch for a warm-up and then a measured window while a ``Meter`` sums every node's
counters over the epochs it crosses."""

from __future__ import annotations

import bisect
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from conveyor.graphs.instrument import Counted
from conveyor.graphs.stats import add_raw
from conveyor.graphs.loader import Loader

_SIZE_EVERY = 32  # a node's item size is measured on its 1st item and every 32nd after


# ----- small measures ----------------------------------------------------------------------

def batch_len(batch: Any) -> int:
    """Samples in a batch: the leading dim of its first tensor, or its length."""
    first = batch
    while isinstance(first, (dict, list, tuple)) and not hasattr(first, "shape"):
        if isinstance(first, dict):
            if not first:
                return 0
            first = next(iter(first.values()))
        elif isinstance(first, (list, tuple)):
            if not first or not isinstance(first[0], (dict, list, tuple)) and not hasattr(first[0], "shape"):
                return len(first)
            if isinstance(batch, list) and first is batch:
                return len(first)
            first = first[0]
    shape = getattr(first, "shape", None)
    return int(shape[0]) if shape else 1


def nbytes(obj: Any, _depth: int = 0) -> int:
    """Roughly the memory an item holds: tensor and array data, bytes and text, containers."""
    if _depth > 8:
        return 0
    n = getattr(obj, "nbytes", None)  # numpy arrays, and torch tensors since 2.1
    if isinstance(n, int):
        return n
    if hasattr(obj, "element_size") and hasattr(obj, "nelement"):
        return int(obj.element_size() * obj.nelement())
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return len(obj)
    if isinstance(obj, str):
        return len(obj) + 49
    if isinstance(obj, dict):
        return 64 + sum(nbytes(k, _depth + 1) + nbytes(v, _depth + 1) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return 56 + 8 * len(obj) + sum(nbytes(v, _depth + 1) for v in obj)
    size = getattr(obj, "size", None)  # a PIL image: width x height x bands
    if isinstance(size, tuple) and hasattr(obj, "getbands"):
        return size[0] * size[1] * len(obj.getbands())
    return sys.getsizeof(obj)


def status_bytes(*keys: str) -> dict[str, int]:
    """Fields of /proc/self/status (VmRSS, VmHWM) in bytes; empty where there is no /proc."""
    out: dict[str, int] = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name in keys:
                    out[name] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


def reset_peak_rss() -> bool:
    """Make VmHWM restart from the current RSS (Linux >= 4.0); False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False




class SizeSampler:
    """A ``Counted`` watcher that measures item sizes: the first item, then every 32nd."""

    def __init__(self) -> None:
        self.seen: dict[int, list] = {}  # id(counted) -> [calls, bytes summed, sampled]

    def __call__(self, c: Counted, item: Any, t0: float, t1: float) -> None:
        st = self.seen.get(id(c))
        if st is None:
            st = self.seen[id(c)] = [0, 0, 0]
        st[0] += 1
        if st[0] % _SIZE_EVERY == 1:
            st[1] += nbytes(item)
            st[2] += 1

    def mean(self, c: Counted) -> float | None:
        st = self.seen.get(id(c))
        return st[1] / st[2] if st and st[2] else None


# ----- driving a loader --------------------------------------------------------------------

@dataclass
class Drive:
    """What one timed run of a loader measured (after its warm-up)."""

    seconds: float = 0.0          # the measured window
    batches: int = 0
    samples: int = 0
    epochs: int = 0               # epochs started, warm-up included
    data_wait_s: float = 0.0      # time the trainer spent in iter()/next()
    starts_s: float = 0.0         # of which: iter() to the first batch of each epoch
    trainer_s: float = 0.0        # time the simulated trainer spent on its steps
    t_measured: float | None = None  # time.perf_counter() where the measured window began
    raws: dict[str, dict] = field(default_factory=dict)  # counters over the window, per node

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0


def counted_nodes(loader: Loader) -> dict[str, Counted]:
    """The ``Counted`` wrapper of each node built in this process, by name."""
    return dict(loader._c.nodes)


class Meter:
    """Sums a loader's per-node counters over epochs (the loader zeroes them at each epoch).

    Call ``mark()`` where measuring starts (mid-epoch is fine) and ``fold()`` at the end of
    every epoch and where measuring stops; ``raws`` then holds the counters in between.
    """

    def __init__(self, loader: Loader):
        self.counted = counted_nodes(loader)
        self.raws: dict[str, dict] = {n: {} for n in self.counted}
        self._mark: dict[str, dict] | None = None

    def mark(self) -> None:
        self._mark = {n: c.raw() for n, c in self.counted.items()}

    def fold(self) -> None:
        for n, c in self.counted.items():
            now = c.raw()
            if self._mark is not None:
                now = add_raw(now, self._mark[n], -1)
            self.raws[n] = add_raw(self.raws[n], now)
        self._mark = None


def drive(loader: Loader, *, seconds: float, warmup: float, step_time: float = 0.0,
          max_seconds: float | None = None, stable: float | None = None,
          progress: Callable[[float, int], None] | None = None, every: float = 1.0) -> Drive:
    """Iterate ``loader`` (epoch after epoch) for ``warmup`` then ``seconds`` seconds.

    Args:
        loader: a fresh or used loader.
        seconds: the measured window, after the warm-up (and after the first batch).
        warmup: seconds to run before measuring.
        step_time: seconds a simulated trainer sleeps per batch.
        max_seconds: with ``stable``, keep measuring up to this long while the rates of the
            window's two halves differ by more than ``stable`` (a fraction).
        stable: see ``max_seconds``.
        progress: called every ``every`` seconds of the measured window with the seconds
            measured so far and the samples in them (for a progress line).
        every: see ``progress``.
    """
    meter = Meter(loader)
    out = Drive(raws=meter.raws)
    clock = time.perf_counter
    t_begin = clock()
    t_meas = None
    next_report = 0.0
    times: list[float] = []  # when each measured batch came, and the samples so far
    totals: list[int] = []

    def done(now: float) -> bool:
        if t_meas is None or now - t_meas < seconds:
            return False
        if stable is None or max_seconds is None or now - t_meas >= max_seconds:
            return True
        # the samples of the window's second half against its first half
        i = bisect.bisect_right(times, t_meas + (now - t_meas) / 2)
        n1 = totals[i - 1] if i else 0
        n2 = (totals[-1] if totals else 0) - n1
        return n1 > 0 and abs(n2 - n1) <= stable * max(n1, n2)

    stop = False
    while not stop:
        out.epochs += 1
        t = t_iter = clock()
        it = iter(loader)
        got = 0
        if t_meas is not None:
            out.data_wait_s += clock() - t
        while True:
            t = clock()
            try:
                batch = next(it)
            except StopIteration:
                if t_meas is not None:
                    out.data_wait_s += clock() - t
                break
            now = clock()
            got += 1
            if t_meas is not None:
                out.data_wait_s += now - t
                if got == 1:
                    out.starts_s += now - t_iter
                out.batches += 1
                out.samples += batch_len(batch)
                times.append(now)
                totals.append(out.samples)
            if step_time > 0:
                time.sleep(step_time)
                if t_meas is not None:
                    out.trainer_s += clock() - now
                now = clock()
            if t_meas is None and now - t_begin >= warmup:
                t_meas = next_report = out.t_measured = now
                meter.mark()
            elif t_meas is not None and progress is not None and now >= next_report + every:
                next_report = now
                progress(now - t_meas, out.samples)
            if t_meas is not None and done(now):
                stop = True
                break
        if t_meas is not None:
            meter.fold()
        if got == 0:  # an empty epoch: nothing more will come
            break
    if t_meas is None:  # the run ended inside the warm-up: nothing measured
        return out
    out.seconds = clock() - t_meas
    return out


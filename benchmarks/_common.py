"""Shared helpers for the benchmarks: timing, memory, tables, machine facts, test images.

Nothing here knows about a particular contender. Import it from a benchmark script as
``_common`` (the scripts put their own folder on ``sys.path``), or as a map function in a
spec (``fn: _common:full_train_transform``) from a process whose ``sys.path`` holds this
folder.
"""

from __future__ import annotations

import io
import os
import platform
import random
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch
from PIL import Image

from conveyor.tools.measure import reset_peak_rss, status_bytes  # noqa: F401 - reset_peak_rss re-exported
from conveyor.image import random_resized_crop_box

# ----- time ----------------------------------------------------------------------------------


@dataclass
class EpochTime:
    """One epoch of one contender: samples delivered and where the time went."""

    samples: int
    seconds: float        # iter() call to exhaustion: what a training loop waits in total
    first_batch_s: float  # iter() call to the first batch (restart + pipeline fill)
    batches: int = 0
    steady_rate: float = float("nan")  # samples/s between batch n//5 and the last batch
    foreign: float = float("nan")      # share of the CPUs other processes used meanwhile


@dataclass
class Measurement:
    """Several timed epochs of one contender in one round."""

    epochs: list[EpochTime] = field(default_factory=list)

    @property
    def samples(self) -> int:
        return sum(e.samples for e in self.epochs)

    @property
    def seconds(self) -> float:
        return sum(e.seconds for e in self.epochs)

    @property
    def rate(self) -> float:
        """Samples per second over whole epochs, restarts included."""
        return self.samples / self.seconds if self.seconds > 0 else float("nan")

    @property
    def first_batch_s(self) -> float:
        return statistics.median(e.first_batch_s for e in self.epochs)

    @property
    def steady_rate(self) -> float:
        return statistics.median(e.steady_rate for e in self.epochs)

    @property
    def foreign(self) -> float:
        """Other processes' CPU share, weighted by epoch time."""
        return sum(e.foreign * e.seconds for e in self.epochs) / self.seconds if self.seconds else float("nan")


def time_epoch(batches: Iterable[int]) -> EpochTime:
    """Drain an iterable of per-batch sample counts, timing it from the first ``next``.

    ``batches`` must be lazy (a generator) so that the loader's own ``iter()`` (where
    epoch restarts happen) runs inside the timed region.
    """
    cpu0 = cpu_snapshot()
    t0 = time.perf_counter()
    marks: list[tuple[float, int]] = []
    n = 0
    for count in batches:
        n += count
        marks.append((time.perf_counter(), n))
    total = time.perf_counter() - t0
    share = foreign_share(cpu0, cpu_snapshot(), total)
    first = marks[0][0] - t0 if marks else total
    steady = float("nan")
    if len(marks) >= 5:
        (ta, na), (tb, nb_) = marks[len(marks) // 5], marks[-1]
        steady = (nb_ - na) / (tb - ta) if tb > ta else float("nan")
    return EpochTime(samples=n, seconds=total, first_batch_s=first, batches=len(marks),
                     steady_rate=steady, foreign=share)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


# ----- memory (Linux /proc; no psutil) ---------------------------------------------------------


def proc_status_kib(*keys: str) -> dict[str, int]:
    """Fields of /proc/self/status in KiB, e.g. ``proc_status_kib("VmRSS", "VmHWM")``."""
    return {k: v // 1024 for k, v in status_bytes(*keys).items()}


# ----- CPU used by others (the machine may be shared) ------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc_times(stat_line: str) -> tuple[int, int, int, int, int]:
    """(ppid, utime, stime, cutime, cstime) from a /proc/<pid>/stat line."""
    f = stat_line[stat_line.rindex(")") + 2:].split()
    return int(f[1]), int(f[11]), int(f[12]), int(f[13]), int(f[14])


def cpu_snapshot() -> tuple[float, float]:
    """(busy CPU seconds of the whole machine, CPU seconds of this process and its children).

    Children still running (DataLoader workers) are read from /proc/<pid>/stat; reaped ones
    are in this process's cutime/cstime. Linux only; (nan, nan) elsewhere.
    """
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        busy = sum(v) - v[3] - (v[4] if len(v) > 4 else 0)  # all but idle and iowait
        me = os.getpid()
        with open("/proc/self/stat") as f:
            _, ut, st, cut, cst = _proc_times(f.read())
        own = ut + st + cut + cst
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) == me:
                continue
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    ppid, ut, st, cut, cst = _proc_times(f.read())
            except (OSError, ValueError, IndexError):
                continue
            if ppid == me:
                own += ut + st + cut + cst
        return busy / _TICK, own / _TICK
    except (OSError, ValueError, IndexError):
        return float("nan"), float("nan")


def foreign_share(before: tuple[float, float], after: tuple[float, float], seconds: float) -> float:
    """Fraction of the machine's CPUs (0..1) that other processes used between two snapshots."""
    cpus = os.cpu_count() or 1
    other = (after[0] - before[0]) - (after[1] - before[1])
    return max(0.0, other) / (cpus * seconds) if seconds > 0 else float("nan")


def wait_for_quiet(max_wait_s: float, threshold: float = 0.2, probe_s: float = 0.5) -> tuple[float, float]:
    """Sleep until other processes use under ``threshold`` of the CPUs (or ``max_wait_s``).

    Returns (seconds waited, the last probe's foreign share).
    """
    waited, share = 0.0, float("nan")
    while True:
        a = cpu_snapshot()
        time.sleep(probe_s)
        share = foreign_share(a, cpu_snapshot(), probe_s)
        waited += probe_s
        if not share > threshold or waited >= max_wait_s:
            return waited, share


# ----- output ----------------------------------------------------------------------------------


def md_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], right: Sequence[bool] | None = None) -> str:
    """A GitHub markdown table; ``right[i]`` right-aligns column i."""
    right = right or [False] * len(headers)
    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join("---:" if r else "---" for r in right) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(str(c) for c in row) + " |")
    return "\n".join(lines)


def machine() -> dict[str, str]:
    """The facts a reader needs to judge a throughput number."""
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    import PIL
    import torchdata

    try:
        load = "%.2f %.2f %.2f" % os.getloadavg()
    except OSError:
        load = "?"
    try:
        nproc = subprocess.run(["nproc"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        nproc = str(os.cpu_count())
    return {
        "cpus (nproc)": nproc,
        "cpu": cpu,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchdata": getattr(torchdata, "__version__", "?"),
        "pillow": PIL.__version__,
        "cuda": str(torch.cuda.is_available()),
        "load average at start": load,
    }


def repo_state(repo: Path, paths: Sequence[str] = ("conveyor", "specs")) -> str:
    """The commit and any uncommitted changes under ``paths`` (read-only git calls)."""
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        st = subprocess.run(["git", "--no-optional-locks", "-C", str(repo), "status", "--porcelain",
                             "--", *paths], capture_output=True, text=True, check=True).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):
        return "not a git checkout"
    changed = [line[3:] for line in st if line.strip()]
    return f"HEAD {head}" + (f"; uncommitted changes in {', '.join(changed)}" if changed else "; clean")


# ----- images ----------------------------------------------------------------------------------


def camera_like_jpeg(width: int, height: int, seed: int, quality: int = 90) -> bytes:
    """A deterministic camera-sized JPEG: smooth colour regions, edges, stripes and grain.

    Not flat colour: JPEG decode time depends on how much detail the entropy coder carries,
    so the picture mixes a low-frequency colour field, a few hard-edged shapes, a periodic
    texture and per-pixel sensor-like noise.
    """
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (max(2, height // 60), max(2, width // 60), 3), dtype=np.uint8)
    base = np.asarray(Image.fromarray(coarse).resize((width, height), Image.Resampling.BICUBIC),
                      dtype=np.float32)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    fx, fy = rng.uniform(0.02, 0.2, 2)
    stripes = 18.0 * np.sin(xx * fx + yy * fy + rng.uniform(0, 6.3))
    base += stripes[..., None]
    for _ in range(6):  # hard edges: a few filled boxes in random colours
        x0, y0 = int(rng.integers(0, width - 2)), int(rng.integers(0, height - 2))
        x1 = min(width, x0 + int(rng.integers(width // 20, width // 3)))
        y1 = min(height, y0 + int(rng.integers(height // 20, height // 3)))
        base[y0:y1, x0:x1] = 0.5 * base[y0:y1, x0:x1] + 0.5 * rng.integers(0, 256, 3)
    base += rng.normal(0.0, 5.0, (height, width, 1)).astype(np.float32)
    buf = io.BytesIO()
    Image.fromarray(np.clip(base, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def write_imagenet_folder(root: Path, count: int, classes: int, width: int, height: int,
                          seed: int = 0) -> list[Path]:
    """Write ``count`` camera-like JPEGs as ``root/<class>/<name>.JPEG``, deterministically."""
    paths = []
    for i in range(count):
        cls = root / f"n{9000000 + i % classes:08d}"
        cls.mkdir(parents=True, exist_ok=True)
        p = cls / f"synthetic_{i:05d}.JPEG"
        p.write_bytes(camera_like_jpeg(width, height, seed=seed * 100003 + i))
        paths.append(p)
    return paths


def link_subset(src_root: Path, dst_root: Path, limit: int, pattern: str = "*/*.JPEG",
                copies: int = 1) -> int:
    """Symlink the first ``limit`` files (sorted) of an ImageNet-layout folder into ``dst_root``,
    ``copies`` times each (``name.JPEG``, ``name_r1.JPEG``, ...), keeping the class folders."""
    files = sorted(src_root.glob(pattern))[:limit]
    for f in files:
        d = dst_root / f.parent.name
        d.mkdir(parents=True, exist_ok=True)
        for k in range(copies):
            name = f.name if k == 0 else f"{f.stem}_r{k}{f.suffix}"
            (d / name).symlink_to(f.resolve())
    return len(files) * copies


# ----- a full-decode transform (what the usual Pillow pipeline does) ---------------------------


def full_train_transform(item: dict, *, size: int = 224, rng: random.Random) -> dict:
    """``Image.open().convert("RGB")``, then the same crop rule, resize and flip as
    ``conveyor.image.train_transform``, with the same draws from ``rng``, but no draft decode.

    This is what a torchvision ``ImageFolder`` + ``RandomResizedCrop`` + ``RandomHorizontalFlip``
    pipeline does with PIL: decode every pixel, copy to RGB, crop, bilinear resize.
    """
    with open(item["path"], "rb") as f:
        data = f.read()
    img = Image.open(io.BytesIO(data)).convert("RGB")
    top, left, h, w = random_resized_crop_box(img.width, img.height, rng=rng)
    img = img.crop((left, top, left + w, top + h)).resize((size, size), Image.Resampling.BILINEAR)
    if rng.random() < 0.5:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    image = torch.from_numpy(np.ascontiguousarray(np.asarray(img).transpose(2, 0, 1)))
    return {"image": image, "label": item.get("label"), "index": item.get("index")}


_TINY = torch.zeros(3, 8, 8, dtype=torch.uint8)


def cheap_transform(item: dict, *, size: int = 224, rng: random.Random) -> dict:
    """A near-free stand-in for a decode: one rng draw and a tiny constant tensor.

    With it, a loader's samples/s is its own per-item overhead (queues, threads, snapshots,
    wrappers), not the cost of the work.
    """
    rng.random()
    return {"image": _TINY, "label": item.get("label"), "index": item.get("index")}


def cheap_read_transform(item: dict, *, size: int = 224, rng: random.Random) -> dict:
    """:func:`cheap_transform` that also reads the file when the item has no ``bytes`` yet,
    as a real decode would: graphs that read in a ``fetch`` node and graphs that read in the
    map then do the same I/O, and differ only in what the loader itself costs."""
    if item.get("bytes") is None and item.get("path") is not None:
        with open(item["path"], "rb") as f:
            f.read()
    return cheap_transform(item, size=size, rng=rng)


def drain_count(batches: Iterable[Any], count: Callable[[Any], int]) -> Iterable[int]:
    """Per-batch sample counts of a loader, lazily (see :func:`time_epoch`)."""
    for b in batches:
        yield count(b)

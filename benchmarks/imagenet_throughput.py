"""Samples/s of conveyor's ImageNet spec against DataLoader, hand-written torchdata, one core.

One run, the same images, the same transform (``conveyor.image.train_transform``) and the same
per-sample seeds ``derive_seed(seed, epoch, index)`` in every contender, so the pixel work is
identical (checked on one batch before timing):

  (a) conveyor    ``load_graph("specs/imagenet.yaml", workers=2, batch_size=32)``
  (b) DataLoader  a map-style Dataset over the sorted file list, num_workers 0/1/2/4,
                  pin_memory=True, shuffle=True, persistent_workers when workers > 0, drop_last
  (c) torchdata   the same graph by hand: SamplerWrapper -> ParallelMapper(2 threads) ->
                  Batcher -> Mapper(default_collate) -> Prefetcher(4), driven by ``Loader``
  (d) 1 thread    read + train_transform on each image, nothing else (the per-core rate;
                  cores x that rate is the machine's limit)

Parts of the default run (ImageNet-sized images, the bundled 200-image sample):

  memory  one conveyor loader alone, epochs 0..``--mem-epochs``: RSS after and peak RSS during
          each epoch (``VmRSS`` / ``VmHWM`` from /proc/self/status; the peak is reset before
          each epoch through /proc/self/clear_refs).
  A       whole epochs of the sample: each contender built fresh, ``--warmup`` untimed epochs,
          then ``--epochs`` timed ones back to back, each timed from the ``iter()`` call to
          exhaustion (restarts included, as a training loop sees them); ``--rounds`` rounds,
          round-robin, the order rotated each round; medians.
  B       steady state: the same files listed ``--repeat`` times (symlinks, each copy its own
          index and seed) so one epoch is long; the rate from batch n/5 to the last batch
          (start-up and restart excluded); plus plain threads with no loader (the GIL's ceiling).
  C       each loader's own cost per sample: the map function replaced by a near-free one.

``--large``: camera-sized JPEGs (3000x2000, generated deterministically into a temporary
ImageNet-layout folder, listed ``--large-repeat`` times) and conveyor's fused draft decode
against a full-decode transform (``Image.open().convert("RGB")`` + the same crop rule +
resize, ``_common.full_train_transform``) in DataLoader and in conveyor; steady-state rates.

The machine may be shared: before each measurement the run waits (``--quiet-wait``) while
other processes use over 20 % of the CPUs, measures again once if they took over 15 % during
it, and reports the share they took; waiting stops after ``--wait-budget`` seconds of run.

    python benchmarks/imagenet_throughput.py                 # ~4 min on a quiet 2-core machine
    python benchmarks/imagenet_throughput.py --large         # ~2.5 min on a quiet 2-core machine
    python benchmarks/imagenet_throughput.py --quick         # a few seconds: smoke test
    python benchmarks/imagenet_throughput.py --out table.md  # also write the markdown

``--targets`` (issue 12) is another comparison: conveyor's specs as they are against the
DataLoader users write, whose Dataset does the work with Pillow (``_common.full_train_transform``:
full decode, RandomResizedCrop rule, BILINEAR resize, flip), on generated JPEGs that are not
the bundled sample: ``--count`` ImageNet-sized (~450x360, ~50 kB) and ``--large-count``
camera-sized ones listed ``--large-repeat`` times. Contenders: imagenet.yaml (threads),
imagenet-procs.yaml (processes), DataLoader with ``--dl-workers`` (2,4), plain threads, plain
forked processes and one thread running conveyor's kernel with no loader (2 x one thread is the
machine limit; the plain processes show how much of it the host gives two cores at once). Each
measurement builds a fresh contender, runs ``--epochs`` epochs back to back and closes it
(worker processes stopped) before the next starts, so nothing of one contender runs while
another is timed; samples/s are counted from batch ``--skip`` (10) on, the build-to-first-batch
time is reported apart; ``--rounds`` rounds (5 ImageNet-sized, 3 camera-sized unless given), the
order rotated each round, ratios are medians of per-round ratios. Then the memory (PSS) of one loader's process tree over ``--mem-epochs``
epochs. ``--parts small,large,mem`` picks parts.

    python benchmarks/imagenet_throughput.py --targets --out targets.md  # ~5 min quiet
    python benchmarks/imagenet_throughput.py --targets --quick           # ~1 min: smoke test
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import re
import sys
import tempfile
import time
import warnings
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from multiprocessing import RawValue
from pathlib import Path
from typing import Any, Callable, Iterator

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(HERE) not in sys.path:  # `_common` for this script and for specs naming `_common:...`
    sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset, Sampler, default_collate  # noqa: E402
from torchdata.nodes import Batcher, Loader, Mapper, ParallelMapper, Prefetcher, SamplerWrapper  # noqa: E402

import _common as C  # noqa: E402
from conveyor import load_graph  # noqa: E402
from conveyor.image import train_transform  # noqa: E402
from conveyor.nodes._rng import derive_seed  # noqa: E402  (the seeds conveyor's map uses)
from conveyor.nodes._workers.torchdata_threads import shutdown_torchdata  # noqa: E402

DEFAULT_SPEC = REPO / "specs/imagenet.yaml"
DEFAULT_ROOT = REPO / "examples/data/imagenet-sample/train"
PATTERN = "*/*.JPEG"


# ----- the work every contender does ------------------------------------------------------------


def list_records(root: Path) -> list[dict]:
    """What conveyor's ``list_files(label=parent_dir)`` lists: sorted paths, class index, index."""
    paths = sorted(os.path.abspath(p) for p in root.glob(PATTERN))
    if not paths:
        raise SystemExit(f"no {PATTERN} under {root}")
    classes = {n: i for i, n in enumerate(sorted({Path(p).parent.name for p in paths}))}
    return [{"path": p, "label": classes[Path(p).parent.name], "index": i} for i, p in enumerate(paths)]


class Work:
    """``fn(record, size=..., rng=Random(derive_seed(seed, epoch, index)))``, as conveyor's map."""

    def __init__(self, fn: Callable, size: int, seed: int):
        self.fn, self.size, self.seed = fn, size, seed

    def __call__(self, record: dict, epoch: int) -> dict:
        rng = random.Random(derive_seed(self.seed, epoch, record["index"]))
        return self.fn(record, size=self.size, rng=rng)


def batch_count(batch: Any) -> int:
    return int(batch["image"].shape[0])


# ----- contenders ------------------------------------------------------------------------------


class Contender:
    """Build (``open``), iterate epochs (lazy per-batch sample counts), ``close``."""

    name = "?"
    kind = "?"

    def open(self) -> None: ...
    def epoch(self, e: int) -> Iterator[int]: raise NotImplementedError
    def close(self) -> None: ...


class Conveyor(Contender):
    kind = "conveyor"

    def __init__(self, name: str, spec: Path, **overrides: Any):
        self.name, self.spec, self.overrides = name, spec, overrides
        self.loader = None

    def open(self) -> None:
        self.loader = load_graph(str(self.spec), **self.overrides)

    def epoch(self, e: int) -> Iterator[int]:
        assert self.loader.epoch == e - 1, (self.loader.epoch, e)  # epochs line up with the seeds
        return C.drain_count(self.loader, batch_count)

    def close(self) -> None:
        if self.loader is not None:
            self.loader.close()
            self.loader = None


class EpochSeededDataset(Dataset):
    """Map-style dataset over the sorted records; per-sample rng from (seed, epoch, index).

    The epoch lives in shared memory (set before each ``iter(dataloader)``), so persistent
    fork-started workers see it: the same crops and flips as conveyor's epoch ``e``.
    """

    def __init__(self, records: list[dict], work: Work):
        self.records, self.work = records, work
        self._epoch = RawValue("q", 0)

    def set_epoch(self, e: int) -> None:
        self._epoch.value = e

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> dict:
        return self.work(self.records[i], self._epoch.value)


class TorchDataLoader(Contender):
    kind = "dataloader"

    def __init__(self, name: str, records: list[dict], work: Work, workers: int, batch_size: int,
                 seed: int):
        self.name, self.records, self.work = name, records, work
        self.workers, self.batch_size, self.seed = workers, batch_size, seed
        self.ds: EpochSeededDataset | None = None
        self.dl: DataLoader | None = None

    def open(self) -> None:
        self.ds = EpochSeededDataset(self.records, self.work)
        self.dl = DataLoader(self.ds, batch_size=self.batch_size, shuffle=True, drop_last=True,
                             num_workers=self.workers, pin_memory=True,
                             persistent_workers=self.workers > 0,
                             generator=torch.Generator().manual_seed(self.seed))

    def epoch(self, e: int) -> Iterator[int]:
        def run() -> Iterator[int]:
            self.ds.set_epoch(e)  # before iter(): workers start fetching at once
            for batch in self.dl:
                yield batch_count(batch)
        return run()

    def close(self) -> None:
        if self.dl is not None:
            it = getattr(self.dl, "_iterator", None)
            if it is not None and hasattr(it, "_shutdown_workers"):
                it._shutdown_workers()
            self.dl = self.ds = None


class EpochShuffle(Sampler):
    """A permutation per epoch from (seed, epoch), yielding (epoch, index) keys."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int) -> None:  # SamplerWrapper calls this on every reset
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        order = list(range(self.n))
        random.Random(derive_seed(self.seed, self.epoch)).shuffle(order)
        e = self.epoch
        return ((e, i) for i in order)


class HandTorchData(Contender):
    """The spec's graph written directly against torchdata.nodes, torchdata defaults."""

    kind = "torchdata"

    def __init__(self, name: str, records: list[dict], work: Work, threads: int, batch_size: int,
                 depth: int, seed: int):
        self.name, self.records, self.work = name, records, work
        self.threads, self.batch_size, self.depth, self.seed = threads, batch_size, depth, seed
        self.loader: Loader | None = None
        self._nodes: list = []

    def _map(self, key: tuple[int, int]) -> dict:
        epoch, i = key
        return self.work(self.records[i], epoch)

    def open(self) -> None:
        src = SamplerWrapper(EpochShuffle(len(self.records), self.seed))
        mapped = ParallelMapper(src, self._map, num_workers=self.threads, in_order=True, method="thread")
        batched = Batcher(mapped, batch_size=self.batch_size, drop_last=True)
        collated = Mapper(batched, default_collate)
        out = Prefetcher(collated, prefetch_factor=self.depth)
        self._nodes = [out, mapped]
        self.loader = Loader(out)

    def epoch(self, e: int) -> Iterator[int]:
        return C.drain_count(self.loader, batch_count)

    def close(self) -> None:
        for node in self._nodes:  # torchdata's Loader has no close(): stop the threads here
            shutdown_torchdata(node)
        self._nodes, self.loader = [], None


class OneThread(Contender):
    """Read + transform each image in this thread, in listing order; no loader at all."""

    kind = "1 thread"

    def __init__(self, name: str, records: list[dict], work: Work):
        self.name, self.records, self.work = name, records, work

    def epoch(self, e: int) -> Iterator[int]:
        def run() -> Iterator[int]:
            for r in self.records:
                self.work(r, e)
                yield 1
        return run()


class PlainThreads(Contender):
    """``threads`` threads mapping read + transform over the listing, no loader, no batching:
    how far threads scale on this work when nothing else runs (the GIL's ceiling)."""

    kind = "1 thread"  # no batches: no first-batch latency to show

    def __init__(self, name: str, records: list[dict], work: Work, threads: int):
        self.name, self.records, self.work, self.threads = name, records, work, threads
        self.pool: ThreadPoolExecutor | None = None

    def open(self) -> None:
        self.pool = ThreadPoolExecutor(self.threads)

    def epoch(self, e: int) -> Iterator[int]:
        def run() -> Iterator[int]:
            for _ in self.pool.map(lambda r: self.work(r, e), self.records):
                yield 1
        return run()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None


def _run_chunk(chunk: list[dict], work: Work, epoch: int) -> int:
    for r in chunk:
        work(r, epoch)
    return len(chunk)


class PlainProcesses(Contender):
    """``procs`` forked processes doing read + transform on chunks of ``chunk`` records and
    returning only a count: the machine's own ceiling for this work, with no loader and no
    hand-off of pixels."""

    kind = "1 thread"  # no batches handed over: no first-batch latency to show

    def __init__(self, name: str, records: list[dict], work: Work, procs: int, chunk: int):
        self.name, self.records, self.work, self.procs, self.chunk = name, records, work, procs, chunk
        self.pool: ProcessPoolExecutor | None = None

    def open(self) -> None:
        self.pool = ProcessPoolExecutor(self.procs, mp_context=mp.get_context("fork"))

    def epoch(self, e: int) -> Iterator[int]:
        chunks = [self.records[i:i + self.chunk] for i in range(0, len(self.records), self.chunk)]

        def run() -> Iterator[int]:
            yield from self.pool.map(_run_chunk, chunks, [self.work] * len(chunks), [e] * len(chunks))
        return run()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None


# ----- running ---------------------------------------------------------------------------------


def measure(c: Contender, warmup: int, epochs: int) -> C.Measurement:
    m = C.Measurement()
    c.open()
    try:
        for e in range(warmup):
            for _ in c.epoch(e):
                pass
        for e in range(warmup, warmup + epochs):
            m.epochs.append(C.time_epoch(c.epoch(e)))
    finally:
        c.close()
    return m


def round_robin(contenders: list[Contender], rounds: int, warmup: int, epochs: int,
                log: Callable[[str], None], quiet_s: float, tag: str,
                deadline: float = float("inf"), attempts: int = 3) -> dict[str, list[C.Measurement]]:
    """Every contender once per round, in an order rotated each round.

    The machine may be shared: before each measurement wait (up to ``quiet_s``) until other
    processes use under 20 % of the CPUs, and measure again (up to ``attempts`` in all) if they
    took over 10 % during it, keeping the least disturbed attempt. Waiting and re-measuring
    stop at ``deadline`` (a ``time.perf_counter()`` value), to bound the run time.
    """
    results: dict[str, list[C.Measurement]] = {c.name: [] for c in contenders}
    k = len(contenders)
    for r in range(rounds):
        order = contenders[r % k:] + contenders[:r % k]
        t0 = time.perf_counter()
        for c in order:
            best: C.Measurement | None = None
            for attempt in range(attempts):
                if quiet_s > 0 and time.perf_counter() < deadline:
                    C.wait_for_quiet(quiet_s, probe_s=0.5)
                m = measure(c, warmup, epochs)
                if best is None or m.foreign < best.foreign:
                    best = m
                if not m.foreign > 0.10 or time.perf_counter() >= deadline:
                    break
                if attempt + 1 < attempts:
                    log(f"{tag}: {c.name}: other processes took {m.foreign:.0%} of the CPUs; measuring again")
            results[c.name].append(best)
        log(f"{tag} round {r + 1}/{rounds} ({time.perf_counter() - t0:.1f} s): " + ", ".join(
            f"{c.name} {results[c.name][-1].rate:.0f}/s ({results[c.name][-1].foreign:.0%} others)"
            for c in contenders))
    return results


def memory_profile(spec: Path, overrides: dict, epochs: int) -> tuple[list[tuple], bool]:
    """Epochs 0..epochs of one conveyor loader: (epoch, samples, s, VmRSS MiB, peak MiB)."""
    rows = []
    can_reset = C.reset_peak_rss()
    loader = load_graph(str(spec), **overrides)
    try:
        for e in range(epochs + 1):
            C.reset_peak_rss()
            t = C.time_epoch(C.drain_count(loader, batch_count))
            st = C.proc_status_kib("VmRSS", "VmHWM")
            rows.append((e, t.samples, t.seconds, st["VmRSS"] / 1024, st["VmHWM"] / 1024))
    finally:
        loader.close()
    return rows, can_reset


def check_same_work(pairs: list[tuple[Contender, Work]], records: list[dict]) -> str:
    """The first batch of epoch 0 of each loader against the DataLoader Dataset's items."""
    checked = []
    for c, work in pairs:
        ds = EpochSeededDataset(records, work)
        ds.set_epoch(0)
        c.open()
        try:
            batch = next(iter(c.loader))
        finally:
            c.close()
        for j, idx in enumerate(batch["index"].tolist()):
            ref = ds[idx]
            if not torch.equal(ref["image"], batch["image"][j]) or ref["label"] != int(batch["label"][j]):
                raise SystemExit(f"{c.name}: sample {idx} differs from the Dataset's: not the same work")
        checked.append(f"{c.name} ({len(batch['index'])} samples, vs `{work.fn.__module__}.{work.fn.__name__}`)")
    return ("Same work, checked before timing: the first batch of epoch 0 from " + ", ".join(checked)
            + " equals, pixel for pixel and label for label, what the DataLoader's Dataset returns for "
            "those indices at epoch 0")


def spec_variant(spec: Path, dst: Path, *, fn: str | None = None, no_fetch: bool = False,
                 snapshot_every: int | None = None) -> Path | None:
    """A copy of ``spec`` with another map fn, without its ``fetch`` node (the map then reads
    the file itself), and/or with snapshots every N items in the map and the prefetch.
    None when the spec has no such node to change (it may have changed since this was written)."""
    text = spec.read_text()
    if fn is not None:
        needle = "fn: conveyor.image:train_transform"
        if needle not in text:
            return None
        text = text.replace(needle, f"fn: {fn}")
    if no_fetch:
        text, n = re.subn(r"(?m)^  fetch:\s*\{op: fetch[^}]*\}.*\n", "", text)
        if n != 1:
            return None
    if snapshot_every is not None:
        text, n1 = re.subn(r"(?m)^(    op: map\n)", rf"\g<1>    snapshot_every: {snapshot_every}\n", text)
        text, n2 = re.subn(r"\{op: prefetch([^}]*)\}", rf"{{op: prefetch\g<1>, snapshot_every: {snapshot_every}}}",
                           text)
        if n1 != 1 or n2 != 1:
            return None
    dst.write_text(text)
    return dst


def swapped_spec(spec: Path, fn: str, dst: Path) -> Path:
    """A copy of ``spec`` whose map calls ``fn`` instead of conveyor.image:train_transform."""
    text = spec.read_text()
    needle = "fn: conveyor.image:train_transform"
    if needle not in text:
        raise SystemExit(f"{spec} has no '{needle}' to swap for {fn}")
    dst.write_text(text.replace(needle, f"fn: {fn}"))
    return dst


# ----- report ----------------------------------------------------------------------------------


def rates(res: dict[str, list[C.Measurement]], steady: bool) -> dict[str, float]:
    return {k: C.median([m.steady_rate if steady else m.rate for m in ms]) for k, ms in res.items()}


def contender_table(contenders: list[Contender], res: dict[str, list[C.Measurement]], ref: str,
                    steady: bool) -> str:
    """One row per contender; ``steady`` puts the in-epoch rate first (long epochs)."""
    whole, inner = rates(res, False), rates(res, True)
    main = inner if steady else whole
    rows = []
    for c in contenders:
        ms = res[c.name]
        per_round = [m.steady_rate if steady else m.rate for m in ms]
        first = C.median([m.first_batch_s for m in ms]) * 1e3
        row = [c.name, f"{main[c.name]:.0f}"]
        if steady:
            row.append(f"{whole[c.name]:.0f}")
        row += [" ".join(f"{r:.0f}" for r in per_round),
                "—" if c.kind == "1 thread" else f"{first:.0f}",
                f"{100 * C.median([m.foreign for m in ms]):.0f} %",
                f"{main[c.name] / main[ref]:.2f}"]
        rows.append(row)
    head = ["contender"]
    head += (["steady samples/s (median)", "whole-epoch samples/s"] if steady else ["samples/s (median)"])
    head += ["per round", "iter() → 1st batch, ms", "CPU used by other processes", f"÷ {ref}"]
    right = [False] + [True] * (2 if steady else 1) + [False, True, True, True]
    return C.md_table(head, rows, right)


def verdict(ratio: float, target: float) -> str:
    if ratio >= target:
        return f"met (+{(ratio / target - 1) * 100:.0f} %)"
    return f"**missed** by {(1 - ratio / target) * 100:.0f} %"


def target_rows(label: str, med: dict[str, float], conv: str, hand: str, dls: list[str],
                limit: float, limit_text: str) -> list[tuple]:
    best_dl = max(dls, key=med.__getitem__)
    rows = [(label, "conveyor ÷ torchdata by hand", f"{med[conv] / med[hand]:.3f}", "≥ 0.95",
             verdict(med[conv] / med[hand], 0.95))]
    r = med[conv] / med[best_dl]
    rows.append((label, f"conveyor ÷ best DataLoader ({best_dl.split()[-1]}, {med[best_dl]:.0f}/s)",
                 f"{r:.3f}", "≥ 1.0", verdict(r, 1.0)))
    r = med[conv] / limit
    rows.append((label, f"conveyor ÷ machine limit ({limit_text})", f"{r:.3f}", "≥ 0.85", verdict(r, 0.85)))
    return rows


# ----- --targets: issue 12's comparison against the DataLoader users write ------------------------


class Batched(Contender):
    """One thread doing read + transform, counted in batches of ``bs`` (no loader)."""

    kind = "1 thread"

    def __init__(self, name: str, records: list[dict], work: Work, bs: int):
        self.name, self.records, self.work, self.bs = name, records, work, bs

    def epoch(self, e: int) -> Iterator[int]:
        def run() -> Iterator[int]:
            for i, r in enumerate(self.records, 1):
                self.work(r, e)
                if i % self.bs == 0:
                    yield self.bs
        return run()


class BatchedThreads(PlainThreads):
    """``threads`` plain threads doing read + transform, counted in batches (no loader)."""

    def __init__(self, name: str, records: list[dict], work: Work, threads: int, bs: int):
        super().__init__(name, records, work, threads)
        self.bs = bs

    def epoch(self, e: int) -> Iterator[int]:
        def run() -> Iterator[int]:
            for i, _ in enumerate(self.pool.map(lambda r: self.work(r, e), self.records), 1):
                if i % self.bs == 0:
                    yield self.bs
        return run()


class Run:
    """One fresh contender, ``epochs`` epochs back to back: samples/s counted from batch
    ``skip`` on (start-up excluded, epoch restarts included), the time from building the
    loader to its first batch, and the CPU time this process and its worker processes used
    per sample over the same span (``cpu_ms``: what the machine's sharers inflate least). Both
    count the samples delivered, so a loader that has work buffered at batch ``skip``
    (prefetch, worker queues) reads faster and cheaper than it is by up to that buffer over
    the span, and worker processes that run ahead into an epoch nobody asks for add CPU."""

    def __init__(self, c: Contender, epochs: int, skip: int):
        cpu0 = C.cpu_snapshot()
        t0 = time.perf_counter()
        c.open()
        marks: list[tuple[float, int]] = []
        n = 0
        cpu_a = cpu_b = cpu0
        try:
            for e in range(epochs):
                for count in c.epoch(e):
                    n += count
                    marks.append((time.perf_counter(), n))
                    if len(marks) == skip:
                        cpu_a = C.cpu_snapshot()
            cpu_b = C.cpu_snapshot()  # workers still alive: their CPU time is still readable
        finally:
            c.close()  # stops workers before anything else is timed
        if len(marks) <= skip:
            raise SystemExit(f"{c.name}: {len(marks)} batches; --targets needs more than {skip}")
        (ta, na), (tb, nb) = marks[skip - 1], marks[-1]
        self.rate = (nb - na) / (tb - ta)
        self.cpu_ms = 1e3 * (cpu_b[1] - cpu_a[1]) / (nb - na)
        self.first_s = marks[0][0] - t0
        self.samples = n
        self.foreign = C.foreign_share(cpu0, C.cpu_snapshot(), tb - t0)


def tree_rss_mib() -> float:
    """Memory of this process and all its descendants, MiB (worker processes included): the
    sum of their PSS (pages shared between them, such as batches in shared memory, counted
    once, split between the sharers), or of VmRSS where /proc has no smaps_rollup."""
    kids: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    ppid = C._proc_times(f.read())[0]
            except (OSError, ValueError, IndexError):
                continue
            kids.setdefault(ppid, []).append(int(entry.name))
    total, todo = 0, [os.getpid()]
    while todo:
        pid = todo.pop()
        todo += kids.get(pid, [])
        for name, field in (("smaps_rollup", "Pss:"), ("status", "VmRSS:")):
            try:
                with open(f"/proc/{pid}/{name}") as f:
                    total += next(int(line.split()[1]) for line in f if line.startswith(field))
                break
            except (OSError, StopIteration, ValueError):
                continue
    return total / 1024


def memory_epochs(spec: Path, overrides: dict, epochs: int) -> list[float]:
    """PSS of the process tree after each of epochs 0..epochs of one loader, MiB."""
    out = []
    with load_graph(str(spec), **overrides) as loader:
        for _ in range(epochs + 1):
            for _ in loader:
                pass
            out.append(tree_rss_mib())
    return out


def write_imagenet_sized(root: Path, count: int, classes: int = 10, seed: int = 0) -> None:
    """``count`` ~450x360 JPEGs (every fourth portrait), ~50 kB, in class folders."""
    for i in range(count):
        d = root / f"n{8000000 + i % classes:08d}"
        d.mkdir(parents=True, exist_ok=True)
        w, h = (360, 450) if i % 4 == 0 else (450, 360)
        (d / f"gen_{i:05d}.JPEG").write_bytes(C.camera_like_jpeg(w, h, seed=seed * 100003 + i))


def alternate(contenders: list[Contender], rounds: int, epochs: int, skip: int, quiet_s: float,
              deadline: float, tag: str) -> list[dict[str, Run]]:
    """Every contender once per round, the order rotated each round; a fresh one each time."""
    out = []
    for r in range(rounds):
        k = r % len(contenders)
        got = {}
        for c in contenders[k:] + contenders[:k]:
            if quiet_s > 0 and time.perf_counter() < deadline:
                C.wait_for_quiet(quiet_s, probe_s=0.5)
            got[c.name] = Run(c, epochs, skip)
        out.append(got)
        print(f"{tag} round {r + 1}/{rounds}: " + ", ".join(
            f"{n} {v.rate:.0f}/s ({v.foreign:.0%} others)" for n, v in got.items()), file=sys.stderr, flush=True)
    return out


def rounds_table(contenders: list[Contender], res: list[dict[str, Run]], best_dl: str) -> str:
    rows = []
    for c in contenders:
        runs = [r[c.name] for r in res]
        ratio = C.median([r[c.name].rate / r[best_dl].rate for r in res])
        rows.append((c.name, f"{C.median([x.rate for x in runs]):.0f}",
                     " ".join(f"{x.rate:.0f}" for x in runs),
                     "—" if c.kind == "1 thread" else f"{1e3 * C.median([x.first_s for x in runs]):.0f}",
                     f"{100 * C.median([x.foreign for x in runs]):.0f} %",
                     f"{C.median([x.cpu_ms for x in runs]):.2f}", f"{ratio:.2f}"))
    return C.md_table(["contender", "samples/s from batch 10 (median)", "per round",
                       "build → 1st batch, ms", "CPU used by other processes",
                       "CPU ms per sample (process tree)",
                       f"÷ {best_dl} (median of per-round ratios)"], rows,
                      [False, True, False, True, True, True, True])


def best_dataloader(res: list[dict[str, Run]], names: list[str]) -> str:
    return max(names, key=lambda n: C.median([r[n].rate for r in res]))


def per_round(res: list[dict[str, Run]], num: str, den: Callable[[dict[str, Run]], float]) -> float:
    """Median over rounds of ``num``'s rate over ``den`` of the same round."""
    return C.median([r[num].rate / den(r) for r in res])


def targets_main(a: argparse.Namespace, argv: list[str] | None) -> int:
    """Issue 12's targets: imagenet.yaml and imagenet-procs.yaml against the DataLoader a user
    writes (Pillow RandomResizedCrop + flip in a Dataset), on generated ImageNet-sized and
    camera-sized JPEGs; the machine limit of the kernel; memory over 10 epochs."""
    out_lines: list[str] = []

    def emit(text: str = "") -> None:
        print(text, flush=True)
        out_lines.append(text)

    warnings.filterwarnings("ignore", message=".*pin_memory.*no accelerator.*")
    t_start = time.perf_counter()
    deadline = t_start + a.wait_budget
    cores = os.cpu_count() or 1
    cpu0 = C.cpu_snapshot()
    procs_spec = REPO / "specs/imagenet-procs.yaml"
    parts = {"small", "large", "mem"} if a.parts == "mem,A,B,C" else {x.strip().lower() for x in a.parts.split(",")}
    rows: list[tuple] = []
    emit("### Issue 12 targets: conveyor against the DataLoader users write")
    emit()
    emit("Command: `python benchmarks/imagenet_throughput.py"
         + "".join(" " + x for x in (argv if argv is not None else sys.argv[1:])) + "`")
    emit()
    emit("Machine: " + "; ".join(f"{k} {v}" for k, v in C.machine().items()))
    emit()
    emit(f"Code: {C.repo_state(REPO)}.")
    emit()
    emit(f"Method: every contender is built fresh for each measurement and closed (workers "
         f"stopped) before the next one starts; {a.rounds} rounds ({a.large_rounds} camera-sized), the "
         "order rotated each round; "
         f"{a.epochs} epochs back to back per measurement, samples/s counted from batch "
         f"{a.skip} to the last batch (start-up excluded, epoch restarts included); the time "
         "from building the loader to its first batch is reported apart. Ratios are medians of "
         "per-round ratios. The DataLoader contenders run what users write: a map-style Dataset "
         "doing `Image.open().convert(\"RGB\")`, the RandomResizedCrop rule, BILINEAR resize and "
         "a flip with Pillow (`_common.full_train_transform`; torchvision does not load here), "
         "shuffle, pin_memory, persistent workers, drop_last. conveyor runs its specs unchanged "
         "(`conveyor.image.train_transform`: simplejpeg + torch antialiased resize).")
    emit()
    with tempfile.TemporaryDirectory(prefix="conveyor-targets-") as tmp:
        tmp_path = Path(tmp)
        kernel = Work(train_transform, a.size, a.seed)
        pil = Work(C.full_train_transform, a.size, a.seed)

        def contenders(root: Path, records: list[dict], bs: int) -> tuple[list[Contender], list[str]]:
            over = dict(root=str(root), batch_size=bs, image_size=a.size, seed=a.seed, workers=a.workers)
            dls = [TorchDataLoader(f"DataLoader num_workers={w}, Pillow", records, pil, w, bs, a.seed)
                   for w in (int(x) for x in a.dl_workers.split(",") if x.strip() and int(x) > 0)]
            cs: list[Contender] = [
                Conveyor(f"imagenet.yaml ({a.workers} threads)", a.spec, **over),
                Conveyor(f"imagenet-procs.yaml ({a.workers} processes)", procs_spec, **over),
                *dls,
                BatchedThreads(f"{a.workers} plain threads, conveyor kernel, no loader", records, kernel,
                               a.workers, bs),
                PlainProcesses(f"{a.workers} plain processes, conveyor kernel, no loader", records, kernel,
                               a.workers, bs),
                Batched("1 thread, conveyor kernel, no loader", records, kernel, bs)]
            return cs, [d.name for d in dls]

        def part(label: str, root: Path, bs: int, epochs: int, big: bool) -> None:
            records = list_records(root)
            mb = sum(os.path.getsize(r["path"]) for r in records) / 2**20
            cs, dls = contenders(root, records, bs)
            res = alternate(cs, a.large_rounds if big else a.rounds, epochs, a.skip, a.quiet_wait,
                            deadline, label)
            best = best_dataloader(res, dls)
            one = cs[-1].name
            emit(f"**{label}**: {len(records)} JPEGs ({mb:.1f} MiB) per epoch, batch {bs}, "
                 f"{epochs} epochs per measurement.")
            emit()
            emit(rounds_table(cs, res, best))
            emit()
            conv, procs = cs[0].name, cs[1].name
            want = 3.5 if big else 1.5
            r = per_round(res, conv, lambda x: x[best].rate)
            rows.append((label, f"imagenet.yaml ÷ best DataLoader ({best.split(',')[0].split()[-1]})",
                         f"{r:.2f}", f"≥ {want}", verdict(r, want)))
            r = per_round(res, procs, lambda x: x[best].rate)
            rows.append((label, "imagenet-procs.yaml ÷ best DataLoader", f"{r:.2f}",
                         "≥ 1.5" if not big else "—", verdict(r, 1.5) if not big else "(information)"))
            r = per_round(res, conv, lambda x: cores * x[one].rate)
            rows.append((label, f"imagenet.yaml ÷ machine limit ({cores} × 1 thread of the kernel)",
                         f"{r:.2f}", "≥ 0.85" if not big else "—", verdict(r, 0.85) if not big else "(information)"))
            r = per_round(res, procs, lambda x: cores * x[one].rate)
            rows.append((label, "imagenet-procs.yaml ÷ machine limit", f"{r:.2f}", "—", "(information)"))
            threads, procs_bare = cs[-3].name, cs[-2].name
            r = per_round(res, conv, lambda x: x[threads].rate)
            rows.append((label, f"imagenet.yaml ÷ {a.workers} plain threads (the same kernel, no loader)",
                         f"{r:.2f}", "—", "(information)"))
            r = per_round(res, procs_bare, lambda x: cores * x[one].rate)
            rows.append((label, f"{a.workers} plain processes ÷ machine limit (what this host gives "
                         "two copies of the kernel with no GIL and no loader)", f"{r:.2f}", "—",
                         "(information)"))
            r = per_round(res, conv, lambda x: x[procs_bare].rate)
            rows.append((label, f"imagenet.yaml ÷ {a.workers} plain processes", f"{r:.2f}", "—",
                         "(information)"))
            r = per_round(res, threads, lambda x: x[one].rate)
            rows.append((label, f"{a.workers} plain threads ÷ 1 thread (the kernel's thread scaling)",
                         f"{r:.2f}", f"≥ {0.85 * a.workers:.2f}", verdict(r, 0.85 * a.workers)))

        if "small" in parts:
            root = tmp_path / "imagenet-sized"
            t0 = time.perf_counter()
            write_imagenet_sized(root, a.count, seed=a.seed)
            print(f"wrote {a.count} ImageNet-sized JPEGs in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
            part(f"ImageNet-sized (~450×360, generated, not the bundled sample)", root, a.batch_size,
                 a.epochs, big=False)
        if "large" in parts:
            w, h = (int(v) for v in a.large_wh.lower().split("x"))
            gen, root = tmp_path / "camera-distinct", tmp_path / "camera"
            t0 = time.perf_counter()
            C.write_imagenet_folder(gen, a.large_count, classes=4, width=w, height=h, seed=a.seed)
            C.link_subset(gen, root, a.large_count, PATTERN, copies=a.large_repeat)
            print(f"wrote {a.large_count} {w}x{h} JPEGs in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
            part(f"Camera-sized ({w}×{h}, {a.large_count} generated files listed {a.large_repeat}×)",
                 root, a.large_batch, a.large_epochs, big=True)
        if "mem" in parts:
            root = tmp_path / "imagenet-sized"
            if not root.exists():
                write_imagenet_sized(root, a.count, seed=a.seed)
            over = dict(root=str(root), batch_size=a.batch_size, image_size=a.size, seed=a.seed,
                        workers=a.workers)
            mem = {s.name: memory_epochs(s, over, a.mem_epochs) for s in (a.spec, procs_spec)}
            batch_mib = a.batch_size * 3 * a.size * a.size / 2**20
            emit(f"**Memory**: PSS of the process and its worker processes after each epoch of one "
                 f"loader (epoch 0 is the warm-up), MiB, {a.count} images per epoch:")
            emit()
            emit(C.md_table(["spec"] + [str(e) for e in range(a.mem_epochs + 1)],
                            [[k] + [f"{v:.0f}" for v in vs] for k, vs in mem.items()],
                            [False] + [True] * (a.mem_epochs + 1)))
            emit()
            for k, vs in mem.items():
                half = max(1, a.mem_epochs // 2)
                trend = C.median(vs[1 + half:]) - C.median(vs[1:1 + half])
                rows.append(("memory", f"{k}: median PSS of epochs {half + 1}..{a.mem_epochs} − "
                             f"epochs 1..{half}", f"{trend:+.1f} MiB",
                             f"≤ one batch ({batch_mib:.1f} MiB)", "met" if trend <= batch_mib else "**missed**"))
        emit("**Targets**")
        emit()
        emit(C.md_table(["part", "measure", "value", "target", "verdict"], rows))
        emit()
        share = C.foreign_share(cpu0, C.cpu_snapshot(), time.perf_counter() - t_start)
        emit(f"Total run time {time.perf_counter() - t_start:.0f} s; other processes used {share:.0%} "
             "of the CPUs over the whole run; load average at the end "
             + ("%.2f %.2f %.2f" % os.getloadavg()) + ".")
    if a.out:
        a.out.write_text("\n".join(out_lines) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="ImageNet-layout folder")
    p.add_argument("--spec", type=Path, default=DEFAULT_SPEC)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=2, help="conveyor / hand-graph map threads")
    p.add_argument("--dl-workers", default="0,1,2,4", help="DataLoader num_workers settings")
    p.add_argument("--rounds", type=int, default=None,
                   help="rounds over the short epochs (default 5; 3 with --large)")
    p.add_argument("--warmup", type=int, default=1, help="untimed epochs per measurement")
    p.add_argument("--epochs", type=int, default=5, help="timed epochs per measurement")
    p.add_argument("--mem-epochs", type=int, default=10, help="memory check: epochs 1..N")
    p.add_argument("--repeat", type=int, default=8,
                   help="long epochs: the listing repeated N times (symlinks), for the in-epoch rate")
    p.add_argument("--long-rounds", type=int, default=3)
    p.add_argument("--limit", type=int, default=0, help="use only the first N images (symlinks)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--large", action="store_true", help="camera-sized JPEGs, fused vs full decode")
    p.add_argument("--large-count", type=int, default=32, help="distinct generated images")
    p.add_argument("--large-repeat", type=int, default=4, help="listing repeats per epoch")
    p.add_argument("--large-batch", type=int, default=8)
    p.add_argument("--large-wh", default="3000x2000")
    p.add_argument("--quiet-wait", type=float, default=10.0,
                   help="before each round wait up to N s while other processes use >20%% of the CPUs")
    p.add_argument("--wait-budget", type=float, default=120.0,
                   help="stop waiting for quiet / re-measuring after this many seconds of run time")
    p.add_argument("--parts", default="mem,A,B,C", help="default mode: which parts to run")
    p.add_argument("--quick", action="store_true", help="a few seconds: smoke test of every path")
    p.add_argument("--out", type=Path, help="also write the markdown report here")
    p.add_argument("--targets", action="store_true",
                   help="issue 12's targets against the DataLoader users write (see --help)")
    p.add_argument("--count", type=int, default=800, help="--targets: ImageNet-sized images generated")
    p.add_argument("--skip", type=int, default=10, help="--targets: rate counted from this batch on")
    p.add_argument("--large-epochs", type=int, default=6,
                   help="--targets: epochs per camera-sized run (fewer count the work buffered before batch 10)")
    a = p.parse_args(argv)
    if a.targets:
        if a.quick:
            a.count, a.rounds, a.epochs, a.mem_epochs, a.quiet_wait, a.batch_size = 48, 1, 2, 2, 0.0, 8
            a.large_count, a.large_repeat, a.large_wh, a.large_batch = 4, 3, "1200x800", 2
            a.dl_workers = "2" if a.dl_workers == "0,1,2,4" else a.dl_workers  # (4 is the same path)
        # 5 rounds of the ImageNet-sized part: one contender's rate moves by up to ~10 % between
        # rounds on a shared host, and the median of 5 per-round ratios moves less than of 3
        a.large_rounds = a.rounds or 3
        a.rounds = a.rounds or 5
        a.epochs = 3 if a.epochs == 5 else a.epochs
        a.dl_workers = "2,4" if a.dl_workers == "0,1,2,4" else a.dl_workers
        a.large_count = 24 if a.large_count == 32 else a.large_count
        return targets_main(a, argv)

    if a.quick:
        a.rounds, a.warmup, a.epochs, a.mem_epochs, a.long_rounds = 1, 1, 1, 2, 1
        a.dl_workers, a.quiet_wait, a.repeat = "0,2", 0.0, 4
        if a.large:
            a.large_count, a.large_repeat, a.large_batch, a.large_wh = 4, 3, 2, "1200x800"
        elif not a.limit:
            a.limit = 64
    if a.rounds is None:
        a.rounds = 3 if a.large else 5
    dl_workers = [int(w) for w in a.dl_workers.split(",") if w.strip()]
    out_lines: list[str] = []

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    def emit(text: str = "") -> None:
        print(text, flush=True)
        out_lines.append(text)

    warnings.filterwarnings("ignore", message=".*pin_memory.*no accelerator.*")
    t_start = time.perf_counter()
    deadline = t_start + a.wait_budget
    cores = os.cpu_count() or 1
    cpu0 = C.cpu_snapshot()
    with tempfile.TemporaryDirectory(prefix="conveyor-bench-") as tmp:
        tmp_path = Path(tmp)
        root = a.root
        if a.large:
            w, h = (int(v) for v in a.large_wh.lower().split("x"))
            root = tmp_path / "generated"
            t0 = time.perf_counter()
            C.write_imagenet_folder(root, a.large_count, classes=4, width=w, height=h, seed=a.seed)
            log(f"wrote {a.large_count} {w}x{h} JPEGs in {time.perf_counter() - t0:.1f} s")
        elif a.limit:
            root = tmp_path / "subset"
            C.link_subset(a.root, root, a.limit, PATTERN)
        records = list_records(root)
        n, mb = len(records), sum(os.path.getsize(r["path"]) for r in records) / 2**20
        repeat = a.large_repeat if a.large else a.repeat
        long_root = tmp_path / "long"
        C.link_subset(root, long_root, len(records), PATTERN, copies=repeat)
        long_records = list_records(long_root)
        bs = a.large_batch if a.large else a.batch_size
        fused = Work(train_transform, a.size, a.seed)

        def conveyor(name: str, spec: Path, r: Path) -> Conveyor:
            return Conveyor(name, spec, root=str(r), workers=a.workers, batch_size=bs,
                            image_size=a.size, seed=a.seed)

        def hand(name: str, recs: list[dict], work: Work) -> HandTorchData:
            return HandTorchData(name, recs, work, a.workers, bs, depth=4, seed=a.seed)

        def loaders(prefix: str, recs: list[dict], work: Work) -> list[Contender]:
            return [TorchDataLoader(f"{prefix}num_workers={w}", recs, work, w, bs, a.seed) for w in dl_workers]

        title = "Camera-sized JPEGs (`--large`)" if a.large else "ImageNet-sized JPEGs (the bundled sample)"
        emit(f"### {title}")
        emit()
        emit("Command: `python benchmarks/imagenet_throughput.py"
             + "".join(" " + x for x in (argv if argv is not None else sys.argv[1:])) + "`")
        emit()
        emit("Machine: " + "; ".join(f"{k} {v}" for k, v in C.machine().items()))
        emit()
        emit(f"Code: {C.repo_state(REPO)}.")
        emit()
        where = f"generated {a.large_wh}, quality 90" if a.large else f"`{a.root}`" + (
            f", first {a.limit}" if a.limit else "")
        emit(f"Data: {n} JPEGs ({mb:.1f} MiB; {where}); output {a.size}×{a.size} uint8, batch {bs}, "
             f"drop_last. Conveyor: `{a.spec.relative_to(REPO) if a.spec.is_relative_to(REPO) else a.spec}` "
             f"with workers={a.workers}, batch_size={bs}.")
        emit()
        conv = conveyor(f"conveyor spec ({a.workers} threads)", a.spec, root)
        hnd = hand(f"torchdata by hand ({a.workers} threads)", records, fused)
        if not a.large:
            emit(check_same_work([(conv, fused), (hnd, fused)], records) + ".")
            emit()

        if not a.large:
            parts = {x.strip().upper() for x in a.parts.split(",")}
            rows: list[tuple] = []
            one_name = "1 thread, read+transform"
            if "MEM" in parts:  # first, before anything else has used this process's heap
                mem_rows, can_reset = memory_profile(a.spec, dict(root=str(root), workers=a.workers,
                                                                   batch_size=bs, image_size=a.size,
                                                                   seed=a.seed), a.mem_epochs)
            if "A" in parts:  # short epochs of the sample, restarts included
                short: list[Contender] = [conv, hnd, *loaders("DataLoader ", records, fused),
                                          OneThread(one_name, records, fused)]
                res_a = round_robin(short, a.rounds, a.warmup, a.epochs, log, a.quiet_wait, "A", deadline)
                med_a = rates(res_a, False)
                emit(f"**A. Whole epochs of the {n} images, restarts included** ({len(records) // bs * bs} "
                     f"samples delivered per epoch; {a.warmup} warm-up + {a.epochs} timed epochs back to "
                     f"back per measurement, each contender built fresh per measurement; {a.rounds} rounds, "
                     "round-robin, order rotated each round). An epoch is timed from the `iter()` call to "
                     "exhaustion, so every epoch's restart is in it, as a training loop sees it.")
                emit()
                emit(contender_table(short, res_a, conv.name, steady=False))
                emit()
                lim = cores * med_a[one_name]
                rows += target_rows("A whole epochs", med_a, conv.name, hnd.name,
                                    [c.name for c in short if c.kind == "dataloader"], lim,
                                    f"{cores} × {med_a[one_name]:.0f} = {lim:.0f}/s")
            if "B" in parts:  # one long epoch (listing repeated), the rate inside the epoch
                lconv = conveyor(conv.name, a.spec, long_root)
                lhand = hand(hnd.name, long_records, fused)
                nofetch = spec_variant(a.spec, tmp_path / "nofetch.yaml", no_fetch=True)
                extra = [conveyor("conveyor spec without its fetch node", nofetch, long_root)] if nofetch else []
                long_: list[Contender] = [
                    lconv, *extra, lhand, *loaders("DataLoader ", long_records, fused),
                    PlainThreads(f"{a.workers} plain threads, read+transform, no loader", long_records,
                                 fused, a.workers),
                    PlainProcesses(f"{cores} plain processes, read+transform, no loader", long_records,
                                   fused, cores, bs),
                    OneThread(one_name, long_records, fused)]
                res_b = round_robin(long_, a.long_rounds, 0, 1, log, a.quiet_wait, "B", deadline)
                med_b = rates(res_b, True)
                emit(f"**B. Steady state inside one long epoch** (the same {n} files listed {repeat}× "
                     f"through symlinks = {len(long_records)} samples per epoch, each with its own index "
                     f"and seed; rate from batch {len(long_records) // bs // 5} to the last, so start-up "
                     f"and restart are excluded; fresh loaders; {a.long_rounds} rounds round-robin).")
                emit()
                emit(contender_table(long_, res_b, lconv.name, steady=True))
                emit()
                lim = cores * med_b[one_name]
                rows += target_rows("B steady state", med_b, lconv.name, lhand.name,
                                    [c.name for c in long_ if c.kind == "dataloader"], lim,
                                    f"{cores} × {med_b[one_name]:.0f} = {lim:.0f}/s")
                pt, pp = long_[-3].name, long_[-2].name
                if extra:
                    rows.append(("B steady state", f"{extra[0].name} ÷ torchdata by hand",
                                 f"{med_b[extra[0].name] / med_b[lhand.name]:.3f}", "—", "(information)"))
                rows.append(("B steady state", f"{pp} ÷ machine limit (is the limit reachable?)",
                             f"{med_b[pp] / lim:.3f}", "—", "(information)"))
                rows.append(("B steady state", f"{pt} ÷ machine limit (the threads' ceiling)",
                             f"{med_b[pt] / lim:.3f}", "—", "(information)"))
                rows.append(("B steady state", f"conveyor ÷ {pt}", f"{med_b[lconv.name] / med_b[pt]:.3f}",
                             "—", "(information)"))
            if "C" in parts:  # the loaders' own per-sample cost, with a near-free map function
                cheap = Work(C.cheap_read_transform, a.size, a.seed)
                fn = "_common:cheap_read_transform"
                c_cont: list[Contender] = [
                    conveyor(conv.name, spec_variant(a.spec, tmp_path / "cheap.yaml", fn=fn), long_root)]
                for label, kw in (("conveyor spec without its fetch node", dict(no_fetch=True)),
                                  ("conveyor spec without fetch, snapshots every 1000 items "
                                   "(map and prefetch)", dict(no_fetch=True, snapshot_every=1000))):
                    v = spec_variant(a.spec, tmp_path / f"cheap{len(c_cont)}.yaml", fn=fn, **kw)
                    if v is not None:
                        c_cont.append(conveyor(label, v, long_root))
                c_cont.append(hand(hnd.name, long_records, cheap))
                res_c = round_robin(c_cont, a.long_rounds, 1, 3, log, a.quiet_wait, "C", deadline)
                med_c = rates(res_c, True)
                emit(f"**C. Loader cost per sample** (the map fn replaced by a near-free stand-in that "
                     f"only reads the file when no `fetch` node did, `_common.cheap_read_transform`; "
                     f"{len(long_records)}-sample epochs, in-epoch rate, median over {a.long_rounds} "
                     "rounds of the median of 3 epochs). Variants of the spec isolate what its nodes cost:")
                emit()
                emit(C.md_table(["contender", "samples/s", "µs per sample", "CPU used by other processes"],
                                [(k, f"{v:.0f}", f"{1e6 / v:.0f}",
                                  f"{100 * C.median([m.foreign for m in res_c[k]]):.0f} %")
                                 for k, v in med_c.items()], [False, True, True, True]))
                emit()
            if "MEM" in parts:
                peaks = [row[4] for row in mem_rows[1:]]
                batch_mib = bs * 3 * a.size * a.size / 2**20
                half = max(1, len(peaks) // 2)
                trend = C.median(peaks[half:]) - C.median(peaks[:half]) if len(peaks) > 1 else 0.0
                k5 = min(5, len(peaks))
                rows.append(("memory", f"peak RSS per epoch: median of epochs {half + 1}..{len(peaks)} − "
                             f"median of epochs 1..{half} (epoch {k5} − epoch 1: "
                             f"{peaks[k5 - 1] - peaks[0]:+.1f} MiB; range over epochs 1..{len(peaks)}: "
                             f"{max(peaks) - min(peaks):.1f} MiB)", f"{trend:+.1f} MiB",
                             f"no growth (≤ one batch, {batch_mib:.1f} MiB)",
                             "met" if trend <= batch_mib else "**missed**"))
            if rows:
                emit("**Targets**")
                emit()
                emit(C.md_table(["part", "measure", "value", "target", "verdict"], rows))
                emit()
            if "MEM" in parts:
                peak_how = "reset before each epoch" if can_reset else "NOT resettable here: cumulative"
                emit(f"**Memory**, one conveyor loader alone, before everything else (epoch 0 is the "
                     f"warm-up; peak RSS {peak_how}; "
                     f"MALLOC_ARENA_MAX={os.environ.get('MALLOC_ARENA_MAX', 'unset')}):")
                emit()
                emit(C.md_table(["epoch", "samples", "s", "VmRSS after, MiB", "VmHWM during, MiB"],
                                [(e, s, f"{t:.2f}", f"{rss:.1f}", f"{hwm:.1f}")
                                 for e, s, t, rss, hwm in mem_rows], [True] * 5))
                emit()
        else:
            full = Work(C.full_train_transform, a.size, a.seed)
            full_spec = swapped_spec(a.spec, "_common:full_train_transform", tmp_path / "full.yaml")
            lconv = conveyor(f"conveyor spec, fused decode ({a.workers} threads)", a.spec, long_root)
            lfull = conveyor(f"conveyor spec, full decode ({a.workers} threads)", full_spec, long_root)
            one_fused = OneThread("1 thread, fused decode", long_records, fused)
            one_full = OneThread("1 thread, full decode", long_records, full)
            emit(check_same_work([(lconv, fused), (lfull, full)], long_records) + ".")
            emit()
            cont: list[Contender] = [lconv, lfull, *loaders("DataLoader full decode, ", long_records, full),
                                     one_fused, one_full]
            res = round_robin(cont, a.rounds, 0, 1, log, a.quiet_wait, "large", deadline)
            med = rates(res, True)
            emit(f"**Steady state inside one epoch** (the {n} generated files listed {repeat}× through "
                 f"symlinks = {len(long_records)} samples per epoch; rate from batch "
                 f"{len(long_records) // bs // 5} to the last; fresh loaders, no warm-up epoch; "
                 f"{a.rounds} rounds round-robin, order rotated).")
            emit()
            emit(contender_table(cont, res, lconv.name, steady=True))
            emit()
            dls = [c.name for c in cont if c.kind == "dataloader"]
            best_dl = max(dls, key=med.__getitem__)
            r = med[lconv.name] / med[best_dl]
            rows = [(f"conveyor fused ÷ best DataLoader full decode ({best_dl.split()[-1]}, "
                     f"{med[best_dl]:.1f}/s)", f"{r:.2f}", "≥ 2.5", verdict(r, 2.5)),
                    ("conveyor fused ÷ conveyor full decode", f"{med[lconv.name] / med[lfull.name]:.2f}",
                     "—", "(information)"),
                    ("1 thread: fused ÷ full decode", f"{med[one_fused.name] / med[one_full.name]:.2f}",
                     "—", "(information)"),
                    (f"conveyor fused ÷ machine limit ({cores} × {med[one_fused.name]:.1f}/s)",
                     f"{med[lconv.name] / (cores * med[one_fused.name]):.2f}", "≥ 0.85",
                     verdict(med[lconv.name] / (cores * med[one_fused.name]), 0.85)),
                    (f"best DataLoader full ÷ machine limit, full decode ({cores} × "
                     f"{med[one_full.name]:.1f}/s)", f"{med[best_dl] / (cores * med[one_full.name]):.2f}",
                     "—", "(information)")]
            emit(C.md_table(["comparison", "ratio", "target", "verdict"], rows))
            emit()
        share = C.foreign_share(cpu0, C.cpu_snapshot(), time.perf_counter() - t_start)
        emit(f"Total run time {time.perf_counter() - t_start:.0f} s; other processes used {share:.0%} of "
             "the CPUs over the whole run; load average at the end " + ("%.2f %.2f %.2f" % os.getloadavg()) + ".")
    if a.out:
        a.out.write_text("\n".join(out_lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

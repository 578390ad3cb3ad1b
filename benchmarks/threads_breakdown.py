"""Where a decode thread's time goes in ``specs/imagenet.yaml``, per image (issue 12.3/12.4).

The spec as shipped (2 decode threads) over generated ImageNet-sized JPEGs (the targets
benchmark's ``write_imagenet_sized``), alternating with one thread running the same kernel
with no loader. The map's worker loop (``conveyor.nodes._workers.ordered_threads._run``) and the prefetch
thread (``conveyor.nodes.prefetch._run``) are wrapped to count, per image:

* ``fn CPU`` / ``fn wait``: thread CPU inside the map fn (and its minor page faults, with
  those of the kernel in one thread), and its wall time minus that CPU
  (time a decode thread was runnable or in a C call but not on a core: waiting to retake the
  GIL, or a core taken by another thread);
* ``starved``: wall time a worker waited on an empty queue, and how often it found it empty;
* ``hand-off``: wall time a worker spent handing its result over (a lock, maybe a wake-up);
* ``prefetch CPU`` and ``collate CPU`` / ``collate faults``: the loader's own thread (input
  nodes, the map's caller side, batch, collate, state snapshots), of which collate's
  ``np.stack`` into a new batch (its page faults are minor faults of fresh memory);
* ``process CPU``: all threads, per image, against the kernel's CPU per image in one thread;
* ``2 bare threads`` / ``2 processes``: the machine's own ceiling at the same moment, the
  kernel with no loader on two threads of one process and in two forked processes, each
  doing half the listing, as a fraction of 2 x one thread. On this KVM guest both move from
  one round to the next (2026-12-01: threads 0.71-1.05, processes 0.74-1.08), the threads more
  often: a GIL hand-off wakes the other vCPU, which a busy host may serve late.

Threads and processes other than this one change every figure: run it on a quiet machine
(it waits up to ``--quiet-wait`` s for one before each measurement and prints the share of
the CPUs other processes took).

    python benchmarks/threads_breakdown.py [--rounds 4] [--count 800] [--epochs 3]
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing as mp
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import _common as C  # noqa: E402
import imagenet_throughput as B  # noqa: E402

import conveyor.nodes._workers.ordered_threads as pool  # noqa: E402
import conveyor.nodes.collate as collate  # noqa: E402
import conveyor.nodes.prefetch as prefetch  # noqa: E402
from conveyor import load_graph  # noqa: E402
from conveyor.image import train_transform  # noqa: E402

SPEC = HERE.parent / "specs/imagenet.yaml"
acc: dict[str, float] = collections.defaultdict(float)
lock = threading.Lock()


def _add(local: dict[str, float]) -> None:
    with lock:
        for k, v in local.items():
            acc[k] += v


def worker(jobs, call, shared) -> None:
    """``ordered_threads._run`` with clocks around each step."""
    clk, cpu = time.perf_counter, time.thread_time
    mine: dict[str, float] = collections.defaultdict(float)
    cond = shared.cond
    try:
        while True:
            t0 = clk()
            empty = jobs.empty()
            slot = jobs.get()
            if empty:
                mine["starved_s"] += clk() - t0
                mine["starved_n"] += 1
            if slot is None:
                return
            with cond:
                if slot.state != pool._QUEUED:
                    continue
                slot.state = pool._RUNNING
            item, slot.item = slot.item, None
            f0 = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
            c0, t1 = cpu(), clk()
            out = call(item)
            t2, c1 = clk(), cpu()
            mine["fn_faults"] += resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - f0
            mine["fn_cpu"] += c1 - c0
            mine["fn_wait"] += (t2 - t1) - (c1 - c0)
            with cond:
                if slot.state == pool._RUNNING:
                    slot.out, slot.state = out, pool._DONE
                    if shared.want is slot:
                        cond.notify()
                        mine["wakes"] += 1
            mine["handoff"] += clk() - t2
            del slot, item, out
    finally:
        _add(mine)


_prefetch_run = prefetch._run


def prefetch_thread(*args) -> None:
    r0 = resource.getrusage(resource.RUSAGE_THREAD)
    try:
        _prefetch_run(*args)
    finally:
        r1 = resource.getrusage(resource.RUSAGE_THREAD)
        _add({"prefetch_cpu": r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime})


_stack = collate._stack_tensors


def timed_stack(batch, **kw):
    r0 = resource.getrusage(resource.RUSAGE_THREAD)
    out = _stack(batch, **kw)
    r1 = resource.getrusage(resource.RUSAGE_THREAD)
    if out.dim() == 4:  # the images, not the labels
        _add({"collate_cpu": r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime,
              "collate_faults": r1.ru_minflt - r0.ru_minflt})
    return out


def _run_half(records: list[dict], work: B.Work, epochs: int) -> None:
    for e in range(epochs):
        B._run_chunk(records, work, e)


def bare_rate(records: list[dict], work: B.Work, epochs: int, processes: bool) -> float:
    """Images/s of the kernel alone on two threads (or two forked processes), each doing every
    other record."""
    if processes:
        ctx = mp.get_context("fork")
        runners = [ctx.Process(target=_run_half, args=(records[i::2], work, epochs)) for i in range(2)]
    else:
        runners = [threading.Thread(target=_run_half, args=(records[i::2], work, epochs)) for i in range(2)]
    t0 = time.perf_counter()
    for x in runners:
        x.start()
    for x in runners:
        x.join()
    if processes and any(x.exitcode for x in runners):
        raise SystemExit(f"a kernel process failed: exit codes {[x.exitcode for x in runners]}")
    return len(records) * epochs / (time.perf_counter() - t0)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--count", type=int, default=800)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--quiet-wait", type=float, default=30.0)
    a = p.parse_args()
    pool._run = worker
    prefetch._run = prefetch_thread
    collate._stack_tensors = timed_stack  # what each Collate node binds when it is made
    rows = []
    with tempfile.TemporaryDirectory(prefix="conveyor-breakdown-") as tmp:
        root = Path(tmp) / "imagenet-sized"
        B.write_imagenet_sized(root, a.count)
        records = B.list_records(root)
        kernel = B.Work(train_transform, 224, 0)
        for r in range(a.rounds):
            C.wait_for_quiet(a.quiet_wait, threshold=0.1)
            c0, t0, p0 = C.cpu_snapshot(), time.perf_counter(), time.thread_time()
            f0 = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
            for e in range(a.epochs):
                for rec in records:
                    kernel(rec, e)
            one_s, one_cpu = time.perf_counter() - t0, time.thread_time() - p0
            one_faults = (resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - f0) / (len(records) * a.epochs)
            one_fg = C.foreign_share(c0, C.cpu_snapshot(), one_s)
            bare = [bare_rate(records, kernel, a.epochs, processes) for processes in (False, True)]
            C.wait_for_quiet(a.quiet_wait, threshold=0.1)
            acc.clear()
            loader = load_graph(str(SPEC), root=str(root), batch_size=32)
            c0, t0, p0 = C.cpu_snapshot(), time.perf_counter(), time.process_time()
            n = 0
            for _ in range(a.epochs):
                for batch in loader:
                    n += int(batch["image"].shape[0])
            wall, proc = time.perf_counter() - t0, time.process_time() - p0
            fg = C.foreign_share(c0, C.cpu_snapshot(), wall)
            loader.close()
            one_rate = len(records) * a.epochs / one_s
            us = {k: 1e6 * v / n for k, v in acc.items()}
            rows.append((r + 1, f"{n / wall:.0f}", f"{one_rate:.0f}", f"{n / wall / (2 * one_rate):.3f}",
                         f"{bare[0] / (2 * one_rate):.3f}", f"{bare[1] / (2 * one_rate):.3f}",
                         f"{1e6 * proc / n:.0f}", f"{1e6 * one_cpu / (len(records) * a.epochs):.0f}",
                         f"{us.get('fn_cpu', 0):.0f} ({acc['fn_faults'] / n:.1f} faults/img; 1 thread "
                         f"{one_faults:.1f})", f"{us.get('fn_wait', 0):.0f}",
                         f"{us.get('starved_s', 0):.1f} ({acc['starved_n'] / n:.3f}/img)",
                         f"{us.get('handoff', 0):.1f} ({acc['wakes'] / n:.2f} wakes/img)",
                         f"{us.get('prefetch_cpu', 0):.0f}",
                         f"{us.get('collate_cpu', 0):.0f} ({acc['collate_faults'] / n:.1f} faults/img)",
                         f"{100 * max(fg, one_fg):.0f} %"))
            print(f"round {r + 1}: {rows[-1]}", file=sys.stderr, flush=True)
    print(f"imagenet.yaml as shipped (2 decode threads), {a.count} generated ImageNet-sized JPEGs, "
          f"{a.epochs} epochs per measurement, batch 32; figures in µs per image:\n")
    print(C.md_table(["round", "imagenet.yaml img/s", "1 thread img/s", "÷ 2 × 1 thread",
                      "2 bare threads ÷ 2 × 1 thread", "2 processes ÷ 2 × 1 thread", "process CPU", "1 thread CPU", "fn CPU", "fn wait", "starved", "hand-off",
                      "prefetch CPU", "of which collate", "others' CPU share"], rows,
                     [True] * 8 + [False, True, False, False, True, False, True]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The benchmark scripts still run against the library as it is now.

They live beside the suite, not in it, and three of them had drifted from the code they
measure without anyone noticing: ``shuffle_stall.py`` called a method ``shuffle_buffer`` no
longer has, ``state_cost.py`` and ``even_batches_cost.py`` copied a bundled spec into a temp
folder, where its ``${spec_dir}``-relative root pointed at nothing. Each script here runs once
at the smallest size that still makes its table (a few seconds each); what the figures are is
for ``benchmarks/RESULTS.md``, not for a test: only that the script finishes and prints them.
Every script behind a figure in RESULTS.md's summary runs here but ``s3_throughput.py``, whose
smallest run (a sweep of loose objects and shards on moto) takes ~20 s; ``s3_stalls.py`` runs
the same server and shards spec.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from test_torchrun import _free_port

ROOT = Path(__file__).resolve().parents[1]

RUNS = {
    "shuffle_stall": (["--records", "400", "--window", "100", "--rounds", "1"], "|---"),
    "state_cost": (["--rounds", "1", "--files", "50"], "|---"),
    "text_throughput": (["--rounds", "1", "--epochs", "1", "--no-hf"], "|---"),
    "padding": (["--repeats", "1", "--epochs", "1"], "buckets, max_tokens, pool 8 (spec)"),
    "packing": (["--docs", "600", "--pool", "200"], "|---"),
    "pack_profile": (["--epochs", "2", "--rounds", "1"], "bare / graph"),
    "parquet_vs_jsonl": (["--rows", "2000", "--rounds", "1", "--epochs", "1"], "|---"),
    "threads_breakdown": (["--count", "64", "--rounds", "1", "--epochs", "1", "--quiet-wait", "0"], "|---"),
    "camera_breakdown": (["--images", "2", "--samples", "4", "--repeats", "1"], "|---"),
    # the scripts behind the issue targets in RESULTS.md's summary
    "imagenet_throughput": (["--quick"], "|---"),
    "imagenet_throughput --targets": (["--targets", "--quick"], "**Targets**"),
    "decode_micro": (["--repeats", "1", "--count", "4", "--rounds", "1", "--passes", "1"],
                     "median speed-up of 2 threads over 1"),
    "workers_throughput": (["--rounds", "1", "--epochs", "1", "--records", "200", "--mp-context", "fork"], "|---"),
    "pack_resize": (["--count", "8", "--rounds", "1", "--resize", "160"], "|---"),
    "elastic_state": (["--n", "2000", "--old", "2", "--new", "3", "--steps", "2"], "state of a new rank"),
    "s3_stalls": (["--copies", "2", "--window", "64", "--epochs", "1"], "window-boundary median"),
    "stats_overhead": (["--quick"], "|---"),
    "profiler_check": (["--items", "200", "--rounds", "1"], "difference: median"),
    "checkouts_ab": (["--a", str(ROOT), "--b", str(ROOT), "--pairs", "1", "--loaders", "1", "--epochs", "1"],
                     "B / A per pair"),
}


@pytest.mark.parametrize("script", sorted(RUNS))
def test_benchmark_script_runs_at_its_smallest_size(script, forker):
    args, expect = RUNS[script]
    _check_run([sys.executable, str(ROOT / "benchmarks" / f"{script.split()[0]}.py"), *args], expect, forker)


def test_even_batches_cost_runs_under_torchrun():
    """even_batches_cost needs a process group: two ranks on loopback, as its docstring runs it."""
    _check_run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
                f"--master_port={_free_port()}", str(ROOT / "benchmarks" / "even_batches_cost.py"), "--rounds", "1",
                "--calls", "10", "--epochs", "1"], "agreement, bare")


def _check_run(cmd: list[str], expect: str, forker=None) -> None:
    """Run ``cmd`` in its own process group (ended whole if it overruns) and check its output;
    with ``forker`` (tests/forked_python.py) forked from a process that imported torch already."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")  # this checkout's conveyor
    if forker is not None:
        try:
            proc = forker.run(cmd, cwd=ROOT, env=env, timeout=120)
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"{' '.join(cmd[1:])} ran past 120 s:\n{(e.stderr or '')[-3000:]}")
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert expect in proc.stdout, proc.stdout[-3000:]
        return
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(cmd[1:])} ran past 120 s:\n{err[-3000:]}")
    assert proc.returncode == 0, err[-3000:]
    assert expect in out, out[-3000:]

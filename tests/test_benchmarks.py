"""The benchmark scripts still run against the library as it is now.

They live beside the suite, not in it, and three of them had drifted from the code they
measure without anyone noticing: ``shuffle_stall.py`` called a method ``shuffle_buffer`` no
longer has, ``state_cost.py`` and ``even_batches_cost.py`` copied a bundled spec into a temp
folder, where its ``${spec_dir}``-relative root pointed at nothing. Each script here runs once
at the smallest size that still makes its table (a few seconds each); what the figures are is
for ``benchmarks/RESULTS.md``, not for a test: only that the script finishes and prints them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

RUNS = {
    "shuffle_stall": (["--records", "400", "--window", "100", "--rounds", "1"], "|---"),
    "state_cost": (["--rounds", "1", "--files", "50"], "|---"),
    "text_throughput": (["--rounds", "1", "--epochs", "1", "--no-hf"], "|---"),
    "padding": (["--repeats", "1", "--epochs", "1"], "buckets, max_tokens, pool 8 (spec)"),
    "parquet_vs_jsonl": (["--rows", "2000", "--rounds", "1", "--epochs", "1"], "|---"),
    "threads_breakdown": (["--count", "64", "--rounds", "1", "--epochs", "1", "--quiet-wait", "0"], "|---"),
    "camera_breakdown": (["--images", "2", "--samples", "4", "--repeats", "1"], "|---"),
}


@pytest.mark.parametrize("script", sorted(RUNS))
def test_benchmark_script_runs_at_its_smallest_size(script):
    args, expect = RUNS[script]
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # this checkout's conveyor, whatever is installed
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / f"{script}.py"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert expect in done.stdout, done.stdout[-3000:]

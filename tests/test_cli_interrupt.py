"""``conveyor run`` stopped by Ctrl-C prints its summary so far and exits 130, with no traceback;
a run that yields no batch says where the items stopped and exits 1 (issue 13, item 16)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conveyor.tools import cli

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
NUMBERS = str(REPO / "specs" / "numbers.yaml")


def _interrupt_run(spec: Path, flag: Path) -> tuple[int, str, str]:
    """Start ``conveyor run SPEC``, send it SIGINT once ``flag`` exists (and a moment more), and
    return its exit status, stdout and stderr."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS)])}
    # Ctrl-C reaches a command run from an interactive shell. A suite started as a background
    # job has SIGINT ignored, and a child inherits an ignored signal (not a handler): the run
    # would never see the SIGINT below. So the child starts with SIGINT at its default.
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "conveyor", "run", str(spec), "-q", "--epochs", "100"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    finally:
        signal.signal(signal.SIGINT, inherited)
    try:
        deadline = time.monotonic() + 60
        while not flag.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # a few items in
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out, err


def test_ctrl_c_prints_the_summary_so_far_and_exits_130(write_spec, tmp_path):
    flag = tmp_path / "flowing"
    spec = write_spec(f"""nodes:
  files: {{op: list_files, url: "{REPO}/examples/data/numbers/*/*.txt"}}
  parse: {{op: map, fn: "conveyor.files:read_numbers"}}
  slow: {{op: map, fn: "helpers_fns:announce_then_sleep", args: {{path: "{flag}", ms: 200}}}}
  batch: {{op: batch, size: 2}}
output: batch
""")
    rc, out, err = _interrupt_run(spec, flag)
    assert rc == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "done: " in out and "\nbatch " in out, out
    assert err.rstrip().splitlines()[-1].startswith("conveyor: interrupted after "), err


def test_ctrl_c_before_the_worker_copies_report_prints_the_summary(write_spec, tmp_path):
    # issue 32, item 5: interrupted before any copy had reported its counts, the summary
    # failed on a node with no count yet (KeyError: 'items') and the run exited 1. A copy reports
    # with its first batch, 2 x 2 s after the flag; the SIGINT comes 0.5 s after it (with 50 ms
    # items every copy had reported, and "done: 0 batches" fails). Each copy ends the item it is
    # in before it stops, so a longer item only makes the run slower (5 s items: 14 s)
    flag = tmp_path / "flowing"
    spec = write_spec(f"""workers: {{copies: 2, method: process, until: batch}}
nodes:
  files: {{op: list_files, url: "{REPO}/examples/data/numbers/*/*.txt"}}
  shard: {{op: shard, by: [rank, worker]}}
  slow: {{op: map, fn: "helpers_fns:announce_then_sleep", args: {{path: "{flag}", ms: 2000}}}}
  batch: {{op: batch, size: 2}}
output: batch
""")
    rc, out, err = _interrupt_run(spec, flag)
    assert rc == 130, err
    assert "Traceback" not in err and "KeyError" not in err, err
    assert "done: 0 batches" in out, out
    table = {ln.split()[0]: ln.split() for ln in out.splitlines()[1:-1]}
    assert list(table) == ["files", "shard", "slow", "batch"], out
    assert err.rstrip().splitlines()[-1] == "conveyor: interrupted after 0 batches (the summary above is up to there)"


def test_a_run_that_yields_no_batch_warns_and_exits_1(capsys):
    assert cli.main(["run", NUMBERS, "-q", "--set", "batch_size=500", "--set", "batch.drop_last=true"]) == 1
    captured = capsys.readouterr()
    assert "done: 0 batches, 0 samples" in captured.out
    assert captured.err.splitlines()[-1] == (
        "conveyor: warning: no batch came out of 1 epoch(s): node 'batch' (batch) received 40 item(s) and "
        "yielded none: a batch of 500 with drop_last: true needs at least 500 items; lower the batch size "
        "or set drop_last: false")

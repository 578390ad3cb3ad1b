"""Exact resume: every spec, every op, across epochs, across a killed process."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conveyor import StateError, load_graph
from conveyor.graphs.state import rank_states
from resume_check import check_resume, fingerprint, remaining, run_with_states

ROOT = Path(__file__).resolve().parent.parent
SPECS = sorted((ROOT / "specs").glob("*.yaml"))

# Small batches so that each spec has several steps per epoch on the bundled data.
OVERRIDES = {
    "numbers.yaml": {"batch_size": 3},
    "imagenet.yaml": {"batch_size": 16, "image_size": 32},
    "imagenet-procs.yaml": {"batch_size": 32, "image_size": 16},
    "imagenet-eval.yaml": {"batch_size": 16, "image_size": 32, "resize": 40},
    "imagenet-shards.yaml": {"batch_size": 16, "image_size": 32, "shuffle_window": 8},
}
# Specs with many steps are checked on a sample of steps (always the first, the epoch
# boundaries and the very end are among them).
STEP_SAMPLE = 12


# Every restore of a spec with graph-level worker processes starts its processes again (a few
# seconds each on a busy machine): those specs are resumed at a few chosen points only, mid-epoch
# and on both sides of the epoch boundary, and at the last step.
PROCESS_SPECS = ("imagenet-procs.yaml",)


def _few_steps(n_states: int, epoch_len: int) -> list[int]:
    return sorted({epoch_len // 2, epoch_len - 1, epoch_len, epoch_len + 1, n_states - 1})


def _steps(n_states: int, epoch_len: int) -> list[int]:
    if n_states <= 40:
        return list(range(n_states))
    rng = random.Random(n_states)
    keep = {0, 1, epoch_len - 1, epoch_len, epoch_len + 1, n_states - 2, n_states - 1}
    keep.update(rng.sample(range(n_states), STEP_SAMPLE))
    return sorted(k for k in keep if 0 <= k < n_states)


@pytest.fixture(scope="session")
def packed_sample(tmp_path_factory) -> Path:
    """The bundled train sample as tar shards of ~1 MB (6 shards), for imagenet-shards.yaml."""
    from conveyor.pack import pack

    out = tmp_path_factory.mktemp("shards") / "train"
    pack(str(ROOT / "examples/data/imagenet-sample/train"), str(out), shard_size="1MB")
    return out


@pytest.mark.parametrize("spec", SPECS, ids=[p.name for p in SPECS])
def test_every_spec_resumes_exactly(spec: Path, packed_sample: Path, tmp_path: Path) -> None:
    overrides = dict(OVERRIDES.get(spec.name, {}))
    if spec.name == "imagenet-shards.yaml":
        overrides["root"] = str(packed_sample)
    if spec.name in PROCESS_SPECS:  # copies from the fork server: where a batch comes from does not depend on
        text = spec.read_text()     # how they start, and spawning took ~14 s on a busy host (the
        assert text.count("method: process,") == 1  # shipped spec's spawn: test_saved_states.py)
        spec = tmp_path / spec.name
        spec.write_text(text.replace("method: process,", "method: process, mp_context: forkserver,"))
        overrides["root"] = str(ROOT / "examples/data/imagenet-sample/train")

    def make():
        return load_graph(spec, **overrides)

    seen = {}

    def steps(n_states: int, epoch_len: int) -> list[int]:
        seen.update(n_states=n_states, epoch_len=epoch_len)
        return (_few_steps if spec.name in PROCESS_SPECS else _steps)(n_states, epoch_len)

    n = check_resume(make, epochs=2, steps=steps, reuse=spec.name in PROCESS_SPECS)
    assert seen["epoch_len"] >= 2, f"{spec.name}: too few batches per epoch to test resume ({seen})"
    assert n == seen["n_states"] - 1 >= 2 * seen["epoch_len"]


def test_state_has_the_same_shape_at_every_step() -> None:
    def shape(obj):
        if isinstance(obj, dict):
            return {k: shape(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return ["list"]
        return type(obj).__name__

    with load_graph(ROOT / "specs/imagenet.yaml", batch_size=16, image_size=32) as loader:
        _, states = run_with_states(loader, 2)
    shapes = {json.dumps(shape(rank_states(s)[0]), sort_keys=True) for s in states}
    assert len(shapes) == 1, shapes


def test_state_after_last_batch_resumes_at_next_epoch_first_batch() -> None:
    spec = ROOT / "specs/numbers.yaml"
    with load_graph(spec, batch_size=8) as loader:
        first = [fingerprint(b) for b in loader]
        end_state = loader.state_dict()            # after the last batch, before StopIteration
        second = [fingerprint(b) for b in loader]
    assert first != second                         # reshuffled
    with load_graph(spec, batch_size=8) as again:
        again.load_state_dict(json.loads(json.dumps(end_state)))
        resumed = [fingerprint(b) for b in again]
        assert again.epoch == 1
    assert resumed == second


def test_resume_with_other_map_workers_gives_the_same_batches() -> None:
    spec = ROOT / "specs/imagenet.yaml"
    with load_graph(spec, batch_size=16, image_size=32, workers=2) as loader:
        _, states = run_with_states(loader, 1)
    with load_graph(spec, batch_size=16, image_size=32, workers=2) as a:
        a.load_state_dict(states[5])
        want = [fingerprint(b) for b in a]
    for workers in (0, 1, 3):
        with load_graph(spec, batch_size=16, image_size=32, workers=workers) as b:
            b.load_state_dict(states[5])  # a safe change loads under the default strict=True
            assert [fingerprint(x) for x in b] == want, f"workers={workers}"


def test_state_from_other_params_names_the_difference() -> None:
    spec = ROOT / "specs/numbers.yaml"
    with load_graph(spec, batch_size=3) as loader:
        state = loader.state_dict()
    with load_graph(spec, batch_size=4, seed=1) as other:
        with pytest.raises(StateError) as info:
            other.load_state_dict(state)
    msg = str(info.value)
    assert "node 'batch' param 'size': saved 3, now 4 (breaks exactness" in msg
    assert "strict=False" in msg


def _checkout_at(where: Path) -> Path:
    """specs/numbers.yaml and the data it names through ``${spec_dir}/..``, copied under ``where``."""
    (where / "specs").mkdir(parents=True)
    shutil.copy(ROOT / "specs/numbers.yaml", where / "specs/numbers.yaml")
    shutil.copytree(ROOT / "examples/data/numbers", where / "examples/data/numbers")
    return where / "specs/numbers.yaml"


def test_a_state_loads_strictly_in_a_checkout_moved_elsewhere(tmp_path) -> None:
    here, there = _checkout_at(tmp_path / "a"), _checkout_at(tmp_path / "b")
    with load_graph(here, batch_size=3) as loader:
        batches, states = run_with_states(loader, 2)
    saved = json.dumps(states[4])
    assert str(tmp_path) not in saved and "${spec_dir}/../examples/data/numbers" in saved
    with load_graph(there, batch_size=3) as moved:
        moved.load_state_dict(json.loads(saved))  # strict: the spec names the same data
        assert remaining(moved, 1) == batches[4:]
    # a state written before paths were kept as ${spec_dir}/...: absolute, and still loads where taken
    old = json.loads(saved.replace("${spec_dir}", str(tmp_path / "a" / "specs")))
    rank0 = json.loads(old["rank0"])
    old["rank0"] = json.dumps({**rank0, "digest": "of-the-absolute-paths"})  # so the params are compared
    with load_graph(here, batch_size=3) as again:
        again.load_state_dict(old)
        assert remaining(again, 1) == batches[4:]
    with load_graph(here, batch_size=3, root=str(tmp_path / "b/examples/data/numbers")) as elsewhere:
        with pytest.raises(StateError, match="param 'url'"):  # other data: named, as before
            elsewhere.load_state_dict(json.loads(saved))


def test_state_from_other_graph_or_rank_is_refused(monkeypatch) -> None:
    with load_graph(ROOT / "specs/numbers.yaml") as loader:
        state = loader.state_dict()
    with load_graph(ROOT / "specs/imagenet-eval.yaml") as other:
        with pytest.raises(StateError, match="different graph"):
            other.load_state_dict(state, strict=False)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with load_graph(ROOT / "specs/numbers.yaml") as rank1:
        rank1_state = rank1.state_dict()
    monkeypatch.setenv("RANK", "0")
    with load_graph(ROOT / "specs/numbers.yaml") as rank0:
        with pytest.raises(StateError, match="rank 1 of world 2.*rank 0 of world 2"):
            rank0.load_state_dict(rank1_state)
    with pytest.raises(StateError, match="not a conveyor loader state"):
        load_graph(ROOT / "specs/numbers.yaml").load_state_dict({"x": 1})


# ----- property test: random chains of ops over the bundled number files --------------------

_OPS = {
    "shard": lambda d: f"{{op: shard, rank: {d.draw(st.integers(0, 1))}, world: 2}}",
    "shuffle": lambda d: f"{{op: shuffle_buffer, size: {d.draw(st.integers(1, 12))}}}",
    "map": lambda d: (f"{{op: map, fn: 'chain_fns:tag', "
                      f"workers: {d.draw(st.integers(0, 2))}}}"),
    "filter": lambda d: "{op: filter, fn: 'chain_fns:keep_two_of_three'}",
    "prefetch": lambda d: f"{{op: prefetch, depth: {d.draw(st.integers(1, 3))}}}",
}


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_chains_resume_exactly(tmp_path_factory, data) -> None:
    names = data.draw(st.lists(st.sampled_from(sorted(_OPS)), min_size=1, max_size=4))
    lines = ["nodes:",
             f"  files: {{op: list_files, url: '{ROOT}/examples/data/numbers/*/*.txt', "
             f"shuffle: {data.draw(st.booleans())}}}"]
    for i, name in enumerate(names):
        lines.append(f"  n{i}: {_OPS[name](data)}")
    lines.append(f"  batch: {{op: batch, size: {data.draw(st.integers(1, 7))}}}")
    spec = tmp_path_factory.mktemp("chain") / "chain.yaml"
    spec.write_text("\n".join(lines) + "\n")
    with load_graph(spec) as loader:
        _, states = run_with_states(loader, 2)
    steps = data.draw(st.lists(st.integers(0, len(states) - 1), min_size=1, max_size=4, unique=True))
    check_resume(lambda: load_graph(spec), epochs=2, steps=steps)


# ----- a real process, killed with SIGKILL, restarted from its last checkpoint --------------

def _read_log(path: Path) -> list[tuple[int, str]]:
    out = []
    for line in path.read_text().splitlines():
        step, _epoch, idx = line.split(" ")
        out.append((int(step), idx))
    return out


@pytest.mark.timeout(240)
def test_killed_training_resumes_with_exactly_the_uninterrupted_samples(tmp_path: Path, forker) -> None:
    script = ROOT / "examples/train_imagenet.py"
    common = [sys.executable, str(script), "--steps", "24", "--every", "3", "--batch-size", "8",
              "--image-size", "32"]
    ref_log = tmp_path / "ref.log"
    # the runs that are not killed are forked from a process that imported torch already
    # (tests/forked_python.py); the killed one is a plain process, killed as a trainer is
    ref = forker.run(common + ["--ckpt", str(tmp_path / "ref"), "--log-samples", str(ref_log)], timeout=180)
    assert ref.returncode == 0, ref.stderr[-3000:]
    reference = _read_log(ref_log)
    assert [s for s, _ in reference] == list(range(1, 25))

    kill_after = random.Random(os.getpid()).randint(5, 18)
    log1 = tmp_path / "run1.log"
    proc = subprocess.Popen(common + ["--ckpt", str(tmp_path / "ck"), "--log-samples", str(log1),
                                      "--step-sleep", "0.05"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if log1.exists() and len(log1.read_text().splitlines()) >= kill_after:
                break
            assert proc.poll() is None, "the training process ended before it could be killed"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    import torch

    saved_step = torch.load(tmp_path / "ck/last.pt")["step"]  # torch.load defaults read it
    assert 3 <= saved_step < 24

    log2 = tmp_path / "run2.log"
    out = forker.run(common + ["--ckpt", str(tmp_path / "ck"), "--log-samples", str(log2)], timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"resumed at step {saved_step}" in out.stdout
    before = [entry for entry in _read_log(log1) if entry[0] <= saved_step]
    combined = before + _read_log(log2)
    assert combined == reference

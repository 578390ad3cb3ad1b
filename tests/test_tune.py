"""``conveyor tune``: the sweep finds the knee of a planted throughput curve.

The planted map (``planted_fns:limited``) sleeps 4 ms per item holding one of 2 process-wide
slots: 1 worker gives ~250 items/s, 2 or more give ~500 and no more, so the knee is
``workers=2``, as for a decode that scales with the cores of a 2-core machine. Its input is
3000 empty files, so that no epoch restart falls inside a point's measurement.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from conveyor import cli, tune
from conveyor.graphs.api import read_spec
from planted_fns import empty_files, planted_spec

REPO = Path(__file__).resolve().parent.parent
CURVE = dict(decode="planted_fns:limited", decode_args="{ms: 4, slots: 2}")


@pytest.mark.timeout(90)
def test_tune_finds_the_knee_of_a_planted_curve(write_spec, tmp_path):
    root = empty_files(tmp_path / "files", 3000)
    doc = read_spec(write_spec(planted_spec(root=root, **CURVE)))
    grid = tune.parse_grid(["workers=1,2,4"], {"workers": 2})
    points = tune.sweep(doc, grid, seconds=1.2, warmup=0.3)
    rate = {p.params["workers"]: p.samples_per_s for p in points}
    assert 1.6 < rate[2] / rate[1] < 2.2, rate   # scales up to 2 workers...
    assert 0.9 < rate[4] / rate[2] < 1.1, rate   # ...and not beyond
    pick = tune.knee(points)
    assert pick.params == {"workers": 2}, rate
    assert pick.samples_per_s >= 0.9 * max(rate.values())


@pytest.mark.timeout(60)
def test_tune_command_prints_the_curve_and_writes_a_params_file(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(REPO)
    out_file = tmp_path / "params.yaml"
    assert cli.main(["tune", "specs/numbers.yaml", "--param", "workers=1,2", "--seconds", "0.4",
                     "--warmup", "0.1", "--set", "batch_size=4", "--write", str(out_file)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "tune specs/numbers.yaml: 2 setting(s), about 0.4 s each after a warm-up"
    assert out[1].startswith("  workers=1: ") and out[2].startswith("  workers=2: ")
    header = out.index(next(ln for ln in out if ln.startswith("setting ")))
    assert out[header].split() == ["setting", "samples/s", "batches/s", "of", "best"]
    assert [ln.split()[0] for ln in out[header + 1:header + 3]] == ["workers=1", "workers=2"]
    assert sum("<- pick" in ln for ln in out) == 1
    pick = next(ln for ln in out if ln.startswith("pick "))
    assert "--set workers=" in pick and "of the best" in pick
    assert out[-1] == f"wrote {out_file}"
    params = yaml.safe_load(out_file.read_text())
    assert set(params) == {"workers"} and params["workers"] in (1, 2)
    assert f"--set workers={params['workers']}" in pick
    # the file is a params file for --params
    assert cli.main(["run", "specs/numbers.yaml", "--params", str(out_file), "-q"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("done: 5 batches, 40 samples")


def test_parse_grid_types_values_and_names_mistakes():
    declared = {"workers": 2, "root": "x", "ratio": 0.5, "flag": True}
    assert tune.parse_grid(["workers=1,2,4", "ratio=0.25,1", "flag=false,true"], declared) == {
        "workers": [1, 2, 4], "ratio": [0.25, 1], "flag": [False, True]}
    assert tune.parse_grid(["root=007,a"], declared) == {"root": ["007", "a"]}  # text stays text
    with pytest.raises(ValueError, match=r"declares no such param \(did you mean 'workers'\?\)"):
        tune.parse_grid(["worker=1,2"], declared)
    with pytest.raises(ValueError, match="expects name=v1,v2"):
        tune.parse_grid(["workers"], declared)
    with pytest.raises(ValueError, match="given twice"):
        tune.parse_grid(["workers=1", "workers=2"], declared)


def _point(params: dict, cost: tuple, rate: float) -> tune.Point:
    return tune.Point(params, cost, rate, rate / 10, 1.0)


def test_knee_is_the_cheapest_setting_within_5_percent():
    pts = [_point({"w": w}, (i,), r) for i, (w, r) in enumerate([(1, 100.0), (2, 196.0), (4, 200.0), (8, 190.0)])]
    assert tune.knee(pts).params == {"w": 2}
    pts[1].samples_per_s = 189.0  # 5.5 % below the best: not good enough
    assert tune.knee(pts).params == {"w": 4}
    grid = {"w": [1, 2], "d": [2, 4]}
    settings = tune.settings(grid)
    assert [s for s, _ in settings] == [{"w": 1, "d": 2}, {"w": 1, "d": 4}, {"w": 2, "d": 2}, {"w": 2, "d": 4}]
    rates = [100.0, 101.0, 199.0, 200.0]
    pts2 = [_point(s, c, r) for (s, c), r in zip(settings, rates)]
    assert tune.knee(pts2).params == {"w": 2, "d": 2}


def test_tune_usage_errors(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert cli.main(["tune", "specs/numbers.yaml", "--param", "prefetch=2,4"]) == 2
    err = capsys.readouterr().err
    assert "--param prefetch: the spec declares no such param" in err and "declared: batch_size" in err
    assert cli.main(["tune", "specs/numbers.yaml", "--param", "workers=1,2", "--set", "workers=3"]) == 2
    assert "given both to --param" in capsys.readouterr().err


def test_params_yaml_round_trips():
    text = tune.params_yaml({"workers": 2, "root": "007", "flag": True}, "made by a test")
    assert text.startswith("# made by a test\n")
    assert yaml.safe_load(text) == {"workers": 2, "root": "007", "flag": True}
    assert tune.set_args({"workers": 2, "root": "s3://b/x", "flag": False}) == \
        "--set workers=2 --set root=s3://b/x --set flag=false"

"""``conveyor tune``: alternating rounds, medians and spreads, the knee or "no pick".

The sweep's decisions are tested on planted rates with planted noise (a stand-in for the
measurement, so no test depends on how fast this machine is); the command runs for real on
specs/numbers.yaml for its output format, and with planted rates for the no-pick path.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from conveyor.tools import cli, tune
from conveyor.graphs.api import read_spec

REPO = Path(__file__).resolve().parent.parent


class Planted:
    """A stand-in for measuring a loader: planted rates per setting, planted noise per round.

    ``rates`` maps a setting's ``workers`` to its true samples/s; each measurement returns that
    times ``1 + noise[k]`` for the k-th call, so a test knows every figure the sweep saw.
    """

    def __init__(self, rates: dict, noise: list[float]):
        self.rates, self.noise, self.calls = rates, noise, []

    def __call__(self, plan, params):
        k = len(self.calls)
        self.calls.append(params["workers"])
        rate = self.rates[params["workers"]] * (1 + self.noise[k % len(self.noise)])
        return rate, rate / 8, 1.0


def _sweep(rates: dict, noise: list[float], rounds: int = 3, values: str = "1,2,4"):
    doc = read_spec(REPO / "specs" / "numbers.yaml")
    planted = Planted(rates, noise)
    grid = tune.parse_grid([f"workers={values}"], {"workers": 2})
    return tune.sweep(doc, grid, rounds=rounds, measure=planted), planted


def test_rounds_alternate_their_order_and_the_figure_is_the_median():
    points, planted = _sweep({1: 250.0, 2: 500.0, 4: 505.0}, [0.0, 0.1, -0.1, 0.02, 0.0, 0.04, -0.02, 0.0, 0.3])
    assert planted.calls == [1, 2, 4, 4, 2, 1, 1, 2, 4]        # forward, reverse, forward
    by = {p.params["workers"]: p for p in points}
    assert by[1].rates == [250.0, 260.0, 245.0]                # calls 0, 5 and 6
    assert by[1].samples_per_s == 250.0
    assert by[4].rates == pytest.approx([505 * 0.9, 505 * 1.02, 505 * 1.3])
    assert by[4].samples_per_s == pytest.approx(505 * 1.02)      # the median, not the mean
    assert by[4].spread == pytest.approx((505 * 1.3 - 505 * 0.9) / 2 / (505 * 1.02))
    assert by[2].seconds == 3.0 and by[2].batches_per_s == pytest.approx(by[2].samples_per_s / 8)


def test_the_knee_of_a_planted_curve_is_picked_despite_small_noise():
    # scales to 2 workers and not beyond; every figure moves by up to 3 %
    points, _ = _sweep({1: 250.0, 2: 500.0, 4: 530.0}, [0.03, -0.02, 0.0, -0.03, 0.01, 0.02, 0.0])
    verdict = tune.decide(points)
    assert verdict.pick is not None and verdict.pick.params == {"workers": 2}
    assert verdict.best.params == {"workers": 4} and verdict.tied == []
    assert verdict.sentence.startswith("pick: workers=2, the cheapest setting within 5% of the best")
    table = tune.format_curve(points, verdict).splitlines()
    assert table[0].split() == ["setting", "samples/s", "spread", "batches/s", "of", "best"]
    assert table[2].startswith("workers=2") and table[2].endswith("<- pick")
    assert table[3].endswith("<- best") and "±" in table[3]


def test_noise_larger_than_the_difference_names_no_winner():
    # 1 worker is truly 20 % slower, but the rounds swing by +-30 %: the ranges overlap, as on a
    # busy machine
    points, _ = _sweep({1: 400.0, 2: 500.0}, [0.3, -0.3, 0.1, 0.25, -0.25, -0.1], values="1,2")
    verdict = tune.decide(points)
    # (the noise even made 1 worker look best: 520, 500, 300 against 350, 550, 450)
    assert verdict.pick is None and verdict.best.params == {"workers": 1}
    assert [p.params for p in verdict.tied] == [{"workers": 2}]
    assert verdict.sentence.startswith("no pick: workers=2 measured 10% below the best (workers=1)")
    assert "cannot be told apart" in verdict.sentence and "--rounds" in verdict.sentence
    assert "within the noise of the best" in tune.format_curve(points, verdict)
    # the same curve measured quietly has a clear answer: 2 workers
    quiet, _ = _sweep({1: 400.0, 2: 500.0}, [0.01, -0.01, 0.0], values="1,2")
    assert tune.decide(quiet).pick.params == {"workers": 2}


def test_a_flat_curve_picks_the_cheapest_and_one_round_says_the_noise_is_unknown():
    points, _ = _sweep({1: 500.0, 2: 498.0, 4: 502.0}, [0.0], rounds=1)
    verdict = tune.decide(points)
    assert verdict.pick.params == {"workers": 1}
    assert "one round, so the noise is unknown" in verdict.sentence
    assert all(p.spread is None for p in points)


@pytest.mark.timeout(60)
def test_tune_command_prints_the_curve_and_writes_a_params_file(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(tune, "measure_loader", lambda seconds, warmup: Planted(
        {1: 300.0, 2: 600.0}, [0.02, -0.02, 0.0, 0.01]))
    out_file, plot = tmp_path / "params.yaml", tmp_path / "tune.svg"
    assert cli.main(["tune", "specs/numbers.yaml", "--param", "workers=1,2", "--rounds", "2", "--seconds", "0.4",
                     "--set", "batch_size=4", "--write", str(out_file), "--plot", str(plot)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "tune specs/numbers.yaml: 2 setting(s) x 2 round(s), about 0.4 s each after a warm-up"
    assert [ln.split(":")[0:2] for ln in out[1:5]] == [
        ["  round 1", " workers=1"], ["  round 1", " workers=2"], ["  round 2", " workers=2"],
        ["  round 2", " workers=1"]]
    header = out.index(next(ln for ln in out if ln.startswith("setting ")))
    assert [ln.split()[0] for ln in out[header + 1:header + 3]] == ["workers=1", "workers=2"]
    assert sum("<- pick" in ln for ln in out) == 1 and out[header + 2].endswith("<- pick")
    assert "pick: workers=2, the cheapest setting within 5% of the best (100% of the best)" in out
    assert "use: conveyor run specs/numbers.yaml --set workers=2" in out
    assert f"plot: written to {plot}" in out and plot.read_text().startswith("<svg")
    assert out[-1] == f"wrote {out_file}"
    assert yaml.safe_load(out_file.read_text()) == {"workers": 2}
    # the file is a params file for --params, and the graph runs for real with it
    assert cli.main(["run", "specs/numbers.yaml", "--params", str(out_file), "-q"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("done: 5 batches, 40 samples")


def test_tune_command_with_noise_writes_no_params_file(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(tune, "measure_loader", lambda seconds, warmup: Planted(
        {1: 450.0, 2: 500.0}, [0.3, -0.3, 0.25, -0.25, 0.0, 0.0]))
    out_file = tmp_path / "params.yaml"
    assert cli.main(["tune", "specs/numbers.yaml", "--param", "workers=1,2", "--write", str(out_file)]) == 0
    out = capsys.readouterr().out
    assert "no pick: workers=" in out and "cannot be told apart" in out
    assert f"not written: {out_file} (no pick)" in out and not out_file.exists()


def test_tune_report_with_no_pick_draws_the_curve_and_benches_nothing(capsys, monkeypatch, tmp_path):
    # issue 29, item 7: after saying "no pick", --report went on to bench the fastest setting
    from conveyor.tools import bench

    monkeypatch.chdir(REPO)
    monkeypatch.setattr(tune, "measure_loader", lambda seconds, warmup: Planted(
        {1: 450.0, 2: 500.0}, [0.3, -0.3, 0.25, -0.25, 0.0, 0.0]))
    monkeypatch.setattr(bench, "run_bench", lambda *a, **k: pytest.fail("benched a setting after no pick"))
    page = tmp_path / "tune.html"
    assert cli.main(["tune", "specs/numbers.yaml", "--param", "workers=1,2", "--report", str(page)]) == 0
    out = capsys.readouterr().out
    assert "no pick: workers=" in out and f"report: written to {page} (the curve only: no pick to bench)" in out
    html = page.read_text(encoding="utf-8")
    assert "No setting was benched" in html and "<svg" in html and "cannot be told apart" in html


def test_a_real_short_sweep_measures_every_setting_in_every_round():
    doc = read_spec(REPO / "specs" / "numbers.yaml")
    grid = tune.parse_grid(["workers=1,2"], {"workers": 2})
    points = tune.sweep(doc, grid, seconds=0.2, warmup=0.05, rounds=2)
    assert [len(p.rates) for p in points] == [2, 2]
    assert all(r > 0 for p in points for r in p.rates) and all(p.seconds >= 0.4 for p in points)
    assert tune.decide(points).best in points


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
    return tune.Point(params, cost, [rate], [rate / 10], 1.0)


def test_knee_is_the_cheapest_setting_within_5_percent():
    pts = [_point({"w": w}, (i,), r) for i, (w, r) in enumerate([(1, 100.0), (2, 196.0), (4, 200.0), (8, 190.0)])]
    assert tune.knee(pts).params == {"w": 2}
    pts[1].rates = [189.0]  # 5.5 % below the best: not good enough
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

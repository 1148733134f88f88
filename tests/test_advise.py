"""The advise study and ``precisionlab advise``: the least traffic within a drift budget."""

from __future__ import annotations

import json

import matplotlib
import numpy as np
import pytest
import xarray as xr
from typer.testing import CliRunner

import precisionlab
from cli import app
from precisionlab.metrics import final_half_width, summarise, traffic
from precisionlab.studies import StudyError, recommend, recommendation
from precisionlab.studies.advise import advice_table

matplotlib.use("Agg")
runner = CliRunner()


@pytest.fixture(scope="module")
def ds() -> xr.Dataset:
    return precisionlab.drift("tiny-gdn", ["fp8-e4m3", "nvfp4"], windows=[4, 16],
                              checkpoint_format=["fp32", "fp16-sr"], steps=96, batch=3,
                              device="cpu")


def _brute_force(ds: xr.Dataset, value: xr.DataArray, ok) -> dict | None:
    """The cheapest configuration whose value passes ``ok``, by walking every one."""
    cost = traffic(ds)
    best = None
    for d in ds["design"].values:
        for f in ds["format"].values:
            for w in ds["window"].values:
                sel = {"design": d, "format": f, "window": w}
                v, c = float(value.sel(sel)), float(cost.sel(sel))
                if ok(v) and (best is None or (c, v) < best[0]):
                    best = ((c, v), {"design": str(d), "format": str(f), "window": int(w)})
    return None if best is None else best[1]


@pytest.mark.parametrize("bound", [0.02, 0.05, 0.1, 0.3])
def test_recommends_the_cheapest_configuration_within_the_budget(ds, bound):
    advised = recommend(ds, max_value=bound)
    final = summarise(ds, "final")
    assert recommendation(advised) == _brute_force(ds, final, lambda v: v <= bound)
    assert (advised["meets_budget"] == (final <= bound)).all()
    assert advised.attrs["study"] == "advise"


def test_no_configuration_within_the_budget(ds):
    advised = recommend(ds, max_value=1e-9)
    assert recommendation(advised) is None
    assert int(advised["meets_budget"].sum()) == 0


def test_confident_holds_the_interval_to_the_budget(ds):
    final = summarise(ds, "final")
    bound = float(final.sel(design="split-fp32", format="fp8-e4m3", window=16)) * 1.01
    plain, sure = recommend(ds, max_value=bound), recommend(ds, max_value=bound, confident=True)
    upper = final + final_half_width(ds)
    assert recommendation(sure) == _brute_force(ds, upper, lambda v: v <= bound)
    assert int(sure["meets_budget"].sum()) < int(plain["meets_budget"].sum())
    one = precisionlab.drift("tiny-gdn", "nvfp4", windows=4, steps=32, batch=1, device="cpu")
    with pytest.raises(StudyError, match="two or more sequences"):
        recommend(one, max_value=1.0, confident=True)


def test_more_is_better_metrics_take_a_lower_bound(ds):
    agree = 1.0 - ds["rel_err"]  # stands in for top1_agree: higher is better
    scored = ds.assign(top1_agree=agree)
    advised = recommend(scored, min_value=0.95, metric="top1_agree")
    final = summarise(scored, "final", "top1_agree")
    assert recommendation(advised) == _brute_force(ds, -final, lambda v: -v >= 0.95)
    with pytest.raises(StudyError, match="--min"):
        recommend(scored, max_value=0.95, metric="top1_agree")
    with pytest.raises(StudyError, match="--max"):
        recommend(ds, min_value=0.05)


@pytest.mark.parametrize("kwargs, message", [
    ({}, "give a budget"),
    ({"max_value": -1.0}, "finite number >= 0"),
    ({"max_value": float("nan")}, "finite number >= 0"),
    ({"max_value": 0.1, "metric": "growth"}, "per-step variable"),
    ({"max_value": 0.1, "at": 10**6}, "outside"),
    ({"max_value": 0.1, "metric": "rel_err_max", "confident": True}, "--confident"),
])
def test_bad_budgets(ds, kwargs, message):
    with pytest.raises(StudyError, match=message):
        recommend(ds, **kwargs)


def test_advice_needs_two_windows_of_steps(ds):
    """A window that has not flushed twice within the run is not judged (its copy has
    barely been rounded), whether the study runs now or was saved."""
    with pytest.raises(StudyError, match="two windows of steps: 96 steps against window 64"):
        recommend(ds.reindex(window=[4, 64]), max_value=0.1)
    with pytest.raises(StudyError, match="raise --steps to 32"):
        precisionlab.advise("tiny-gdn", max_value=0.1, steps=31, windows=[4, 16])


def test_advice_survives_every_result_format(ds, tmp_path):
    advised = recommend(ds, max_value=0.05)
    for suffix in (".nc", ".zarr", ".csv"):
        back = precisionlab.load_result(precisionlab.save_result(advised, tmp_path / f"a{suffix}"))
        assert recommendation(back) == recommendation(advised)
        assert advice_table(back) == advice_table(advised)


def test_advice_table_is_cheapest_first(ds):
    rows = advice_table(recommend(ds, max_value=0.05))
    costs = [r["bytes_per_step"] for r in rows]
    assert costs == sorted(costs) and len(rows) == 3 * 2 * 2
    with pytest.raises(StudyError, match="no advice"):
        advice_table(ds)


def test_tradeoff_plot_draws_the_budget_and_the_pick(ds):
    from precisionlab.plots import tradeoff_figure

    fig = tradeoff_figure(recommend(ds, max_value=0.05))
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "budget (max)" in labels and "recommended" in labels
    plain = tradeoff_figure(ds)
    assert "budget (max)" not in [t.get_text() for t in plain.axes[0].get_legend().get_texts()]


def test_advise_runs_the_study_and_writes_the_advice(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["advise", "--model", "tiny-mamba2", "--max", "0.05", "--steps",
                            "64", "--window", "4", "--window", "16", "--device", "cpu",
                            "--plot", "a.png"])
    assert r.exit_code == 0, r.output
    assert "recommended:" in r.output and "wrote advise-tiny-mamba2.nc" in r.output
    text = " ".join(r.output.split())  # brackets are not read as markup
    assert "advice for tiny-mamba2, 64 steps, batch 2: rel_err[final] <= 0.05" in text
    saved = precisionlab.load_result(tmp_path / "advise-tiny-mamba2.nc")
    best = recommendation(saved)
    assert best is not None and f"{best['design']} {best['format']} L={best['window']}" in r.output
    assert saved.sizes["design"] == 3 and (tmp_path / "a.png").stat().st_size > 0
    again = runner.invoke(app, ["advise", "--from", "advise-tiny-mamba2.nc", "--max", "0.05",
                                "--json"])
    assert again.exit_code == 0, again.output
    doc = json.loads(again.stdout)
    assert doc["recommended"] == best and doc["budget"] == "rel_err[final] <= 0.05"
    assert [c["bytes_per_step"] for c in doc["configurations"]] == sorted(
        c["bytes_per_step"] for c in doc["configurations"])


def test_confident_advice_says_it_holds_the_interval(ds, tmp_path):
    path = precisionlab.save_result(ds, tmp_path / "r.nc")
    r = runner.invoke(app, ["advise", "--from", str(path), "--max", "0.3", "--confident"])
    assert r.exit_code == 0, r.output
    assert "rel_err[final] + 95% = " in " ".join(r.output.split())


def test_advise_exits_1_when_nothing_meets_the_budget(ds, tmp_path):
    path = precisionlab.save_result(ds, tmp_path / "r.nc")
    r = runner.invoke(app, ["advise", "--from", str(path), "--max", "1e-9"])
    assert r.exit_code == 1, r.output
    assert "no configuration meets rel_err[final] <= 1e-09" in r.output
    assert not list(tmp_path.glob("advise-*"))  # --from writes only where --out asks


@pytest.mark.parametrize("args, message", [
    (["--steps", "8"], "give a budget: --max on rel_err"),
    (["--max", "0.1", "--metric", "kl"], "from a model-level result"),
    (["--min", "0.1"], "less is better"),
    (["--max", "0.1", "--at", "sometime"], "--at must be"),
    (["--max", "0.1", "--metric", "rel_err_max", "--confident"], "--confident needs"),
    (["--max", "0.1", "--from", "missing.nc"], "not found"),
    (["--max", "0.1", "--from", "r.nc", "--model", "tiny-gdn"], "--model sets up a study"),
    (["--max", "0.1", "--from", "r.nc", "--steps", "9"], "--steps sets up a study"),
    (["--max", "0.1", "--steps", "8", "-L", "4", "--out", "no/such/dir/a.nc"], "does not exist"),
    (["--max", "0.1", "--steps", "8", "-L", "4", "--format", "fp7"], "fp7"),
    (["--max", "0.1", "--steps", "100"], "two windows of steps: 100 steps against window 64"),
])
def test_advise_bad_input_is_one_line_and_exit_2(ds, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    precisionlab.save_result(ds, tmp_path / "r.nc")
    r = runner.invoke(app, ["advise", "--model", "tiny-gdn", "--device", "cpu", *args]
                      if "--from" not in args else ["advise", *args])
    assert r.exit_code == 2, r.output
    assert message in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1
    assert not list(tmp_path.glob("advise-*")) and not list(tmp_path.rglob("*.tmp*"))


def test_advise_api_runs_the_default_grid():
    advised = precisionlab.advise("tiny-gdn", max_value=0.2, steps=48, windows=[4],
                                  device="cpu")
    assert advised["design"].values.tolist() == ["shared", "split-fp32", "split-fp16-sr"]
    assert advised["format"].values.tolist() == ["fp8-e4m3", "nvfp4"]
    assert recommendation(advised) is not None
    assert np.isfinite(advised["advice_value"]).all()


def test_show_prints_a_saved_advice(ds, tmp_path):
    path = precisionlab.save_result(recommend(ds, max_value=0.05), tmp_path / "a.nc")
    best = recommendation(precisionlab.load_result(path))
    r = runner.invoke(app, ["show", str(path)])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert f"recommended: {best['design']} {best['format']} L={best['window']}" in text
    doc = json.loads(runner.invoke(app, ["show", str(path), "--json"]).stdout)
    assert doc["advice"]["recommended"] == best
    assert doc["advice"]["budget"] == "rel_err[final] <= 0.05"
    plain = json.loads(runner.invoke(app, ["show", str(precisionlab.save_result(
        ds, tmp_path / "r.nc")), "--json"]).stdout)
    assert "advice" not in plain


def test_a_budget_on_the_worst_head(ds, tmp_path):
    worst = ds["head_rel_err"].max("head")
    bound = float(worst.median())
    advised = recommend(ds, max_value=bound, metric="head_rel_err")
    assert recommendation(advised) == _brute_force(ds, worst, lambda v: v <= bound)
    # a worst-head budget is stricter than the same bound on the layer's error
    layer = recommend(ds, max_value=bound)
    assert int(advised["meets_budget"].sum()) <= int(layer["meets_budget"].sum())
    with pytest.raises(StudyError, match="final steps only"):
        recommend(ds, max_value=bound, metric="head_rel_err", at="max")
    r = runner.invoke(app, ["advise", "--model", "tiny-gdn", "--device", "cpu", "--steps", "32",
                            "-L", "4", "--metric", "head_rel_err", "--max", "10", "--json",
                            "--out", str(tmp_path / "a.nc")])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["budget"] == "head_rel_err[final] <= 10" and doc["recommended"] is not None

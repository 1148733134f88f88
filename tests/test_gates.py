"""Gates on any per-step metric of a result, with the right direction per metric."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from precisionlab.gates import GateError, check
from precisionlab.testing import assert_drift

DIMS = ("design", "format", "window", "step")


@pytest.fixture()
def ds() -> xr.Dataset:
    """A two-configuration model-level-like result with known summaries: the last
    step is the whole 'final' window (5% of 10 steps, at least the window of 1)."""
    coords = {"design": ["shared", "split"], "format": ["nvfp4"], "window": [1],
              "step": np.arange(10)}
    ones = np.ones((2, 1, 1, 10))
    kl = ones * np.array([0.02, 0.001])[:, None, None, None]
    top1 = ones * np.array([0.9, 1.0])[:, None, None, None]
    return xr.Dataset({"rel_err": (DIMS, ones * 0.1), "kl": (DIMS, kl),
                       "top1_agree": (DIMS, top1), "state_rel_err": (DIMS, ones * np.nan),
                       "growth": (DIMS[:-1], np.zeros((2, 1, 1)))}, coords=coords)


def verdicts(checks) -> dict[str, bool]:
    return {c.config["design"]: c.passed for c in checks}


def test_an_upper_bound_on_kl_and_a_lower_bound_on_top1(ds):
    assert verdicts(check(ds, var="kl", max_value=0.01)) == {"shared": False, "split": True}
    assert verdicts(check(ds, var="top1_agree", min_value=0.95)) == {"shared": False,
                                                                   "split": True}
    c = check(ds, var="top1_agree", min_value=0.95)[0]
    assert c.at_least and c.verdict("final").startswith("top1_agree[final] = 0.9 (limit 0.95 "
                                                        "from below")


def test_a_baseline_tolerance_points_the_metrics_way(ds):
    worse = ds.copy(deep=True)
    worse["kl"] = ds["kl"] * 1.5
    worse["top1_agree"] = ds["top1_agree"] * 0.8
    assert verdicts(check(worse, var="kl", baseline=ds, rtol=0.6)) == {"shared": True,
                                                                      "split": True}
    assert verdicts(check(worse, var="kl", baseline=ds, rtol=0.4)) == {"shared": False,
                                                                      "split": False}
    assert verdicts(check(worse, var="top1_agree", baseline=ds, rtol=0.25)) == {
        "shared": True, "split": True}
    assert verdicts(check(worse, var="top1_agree", baseline=ds, rtol=0.1)) == {
        "shared": False, "split": False}


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"var": "top1_agree", "max_value": 0.9}, "more is better, so bound it with --min"),
    ({"var": "kl", "min_value": 0.1}, "less is better, so bound it with --max"),
    ({"var": "kl", "max_rel_err": 0.1}, "--max-rel-err bounds rel_err"),
    ({"var": "kl"}, r"give a bound \(--max\)"),
    ({"var": "top1_agree"}, r"give a bound \(--min\)"),
    ({"var": "growth", "max_value": 1.0}, "per-step variable of the result "
                                         r"\(rel_err, kl, top1_agree\)"),
    ({"var": "state_rel_err", "max_value": 1.0}, "per-step variable"),
    ({"var": "nope", "max_value": 1.0}, "no variable 'nope'"),
    ({"var": "kl", "max_value": -1.0}, "--max must be a finite number"),
    ({"var": "kl", "max_value": 1.0, "where": {"colour": ["red"]}},
     "cannot select by 'colour': use design, format, window"),
])
def test_bad_gates_are_refused(ds, kwargs, message):
    with pytest.raises(GateError, match=message):
        check(ds, **kwargs)


def test_assert_drift_gates_other_metrics(ds):
    assert_drift(ds, metric="kl", max_value=0.05)
    offender = r"design=shared format=nvfp4 window=1: kl\[final\] = 0.02 \(limit 0.01"
    with pytest.raises(AssertionError, match=offender):
        assert_drift(ds, metric="kl", max_value=0.01)


def test_the_worst_head_is_gated():
    """``head_rel_err`` gates each configuration's worst head: a bound between the
    worst head's error and the layer's passes the layer and fails the head."""
    import precisionlab
    from precisionlab.metrics import summarise

    run = precisionlab.drift("tiny-mamba2", "nvfp4", designs="shared", windows=4, steps=48,
                             device="cpu")
    worst = float(run["head_rel_err"].max())
    layer = float(summarise(run, "final").max())
    assert layer < worst
    bound = (layer + worst) / 2
    assert all(c.passed for c in check(run, max_rel_err=bound))
    (c,) = check(run, var="head_rel_err", max_value=bound)
    assert not c.passed and c.value == pytest.approx(worst)
    assert all(c.passed for c in check(run, var="head_rel_err", max_value=worst))
    with pytest.raises(GateError, match="final steps only"):
        check(run, var="head_rel_err", max_value=1.0, at="max")
    with pytest.raises(AssertionError, match="head_rel_err"):
        assert_drift(run, metric="head_rel_err", max_value=bound)


def test_a_pass_on_a_result_with_notes_repeats_them(tmp_path):
    """A result whose windows never flushed passes any bound; the gate says why that
    pass means little (a note line from the command line, a warning from Python)."""
    from typer.testing import CliRunner

    import precisionlab
    from cli import app
    from precisionlab.export import save_result

    with pytest.warns(UserWarning):
        ds = precisionlab.drift("tiny-gdn", "nvfp4", windows=16, steps=4)
    with pytest.warns(UserWarning, match="the gated result notes: window 16 is longer"):
        assert_drift(ds, max_rel_err=1.0)
    path = save_result(ds, tmp_path / "r.nc")
    r = CliRunner().invoke(app, ["gate", str(path), "--max-rel-err", "1"])
    assert r.exit_code == 0
    assert "note: window 16 is longer than the 4 steps" in r.output

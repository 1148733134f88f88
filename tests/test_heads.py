"""Per-head drift: each head's output error and memory, kept in results and plotted."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import precisionlab
from cli import app
from precisionlab import engine
from precisionlab.designs import make_design
from precisionlab.kinds import kind_for
from precisionlab.presets import Preset
from precisionlab.traces import SyntheticTrace

runner = CliRunner()
DESIGNS = [make_design("shared", "nvfp4", 4), make_design("split", "fp8-e4m3", 4)]


@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
def test_one_heads_error_is_the_layers_error(kind):
    preset = Preset(f"one-head-{kind}", kind, 1, 16, 16, 1, 1, "test")
    trace = SyntheticTrace(preset, steps=24, batch=2, seed=3)
    for m in engine.run(trace, DESIGNS, device="cpu", backend="torch"):
        assert m.head_rel_err.shape == (2, 2, 1)
        torch.testing.assert_close(m.head_rel_err[..., 0], m.rel_err, rtol=1e-12, atol=0)


@pytest.mark.parametrize("model", ["tiny-mamba2", "tiny-gdn"])
def test_the_layers_error_lies_between_its_heads_errors(model):
    """The layer's relative error is the heads' errors' RMS weighted by their output
    norms, so it lies between the smallest and the largest."""
    trace = SyntheticTrace(model, steps=32, batch=2, seed=1)
    seen = 0
    for m in engine.run(trace, DESIGNS, device="cpu", backend="torch"):
        lo, hi = m.head_rel_err.amin(-1), m.head_rel_err.amax(-1)
        assert (lo <= m.rel_err * (1 + 1e-9)).all() and (m.rel_err <= hi * (1 + 1e-9)).all()
        seen += int((hi > lo).any())
    assert seen > 0  # heads do differ


def test_results_keep_each_heads_final_error_and_memory():
    ds = precisionlab.drift("tiny-mamba2", ["nvfp4"], windows=[4], steps=64, batch=2,
                            device="cpu")
    trace = SyntheticTrace("tiny-mamba2", steps=64, batch=2, seed=0)
    kind = kind_for(trace.preset)
    params = kind.params({k: v.float() for k, v in trace.params.items()})
    rate = np.mean([-kind.log_decay(kind.prepare(raw, params, torch.bfloat16), params)
                    .mean(0).numpy() for raw in trace], axis=0)
    np.testing.assert_allclose(ds["head_memory"].values, 1 / rate, rtol=1e-6)
    assert ds["head_rel_err"].dims == ("design", "format", "window", "head")
    # heads whose state fades within a step carry no error; the longest memory carries most
    err = ds["head_rel_err"].sel(design="shared", format="nvfp4", window=4).values
    memory = ds["head_memory"].values
    assert err[np.argmax(memory)] == err.max() > 0
    assert (err[memory < 0.1] < 1e-4).all()


@pytest.mark.parametrize("suffix", [".nc", ".zarr", ".csv"])
def test_per_head_variables_survive_every_result_format(tmp_path, suffix):
    ds = precisionlab.drift("tiny-gdn", ["nvfp4", "fp8-e4m3"], windows=[8, 4], steps=32,
                            device="cpu")
    back = precisionlab.load_result(precisionlab.save_result(ds, tmp_path / f"r{suffix}"))
    for name in ("head_rel_err", "head_memory", "rel_err", "growth"):
        assert back[name].dims == ds[name].dims
        assert np.array_equal(back[name].values, ds[name].values, equal_nan=True), name


def test_plot_heads(tmp_path):
    path = precisionlab.save_result(
        precisionlab.drift("tiny-mamba2", ["nvfp4"], windows=[4], steps=48, device="cpu"),
        tmp_path / "r.nc")
    png = tmp_path / "heads.png"
    r = runner.invoke(app, ["plot", str(path), "--kind", "heads", "--out", str(png)])
    assert r.exit_code == 0, r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = runner.invoke(app, ["plot", str(path), "--kind", "heads", "--metric", "rel_err_max",
                              "--out", str(tmp_path / "x.png")])
    assert bad.exit_code == 2 and "takes no other --metric" in bad.output
    assert not (tmp_path / "x.png").exists()
    old = precisionlab.load_result(path).drop_vars(["head_rel_err", "head_memory"])
    precisionlab.save_result(old, tmp_path / "old.nc")
    r = runner.invoke(app, ["plot", str(tmp_path / "old.nc"), "--kind", "heads", "--out",
                            str(tmp_path / "y.png")])
    assert r.exit_code == 2 and "no per-head errors" in r.output


def test_summary_names_each_configurations_worst_head():
    ds = precisionlab.drift("tiny-gdn", ["nvfp4", "fp8-e4m3"], windows=[4], steps=40,
                            device="cpu")
    rows = precisionlab.summary(ds)
    for (design, fmt, window), row in rows.iterrows():
        heads = ds["head_rel_err"].sel(design=design, format=fmt, window=window).values
        assert row["worst_head"] == int(np.argmax(heads))
        assert row["worst_head_err"] == heads.max()
        assert row["worst_head_memory"] == ds["head_memory"].values[row["worst_head"]]

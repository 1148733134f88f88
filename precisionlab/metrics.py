"""Summaries of drift curves: growth exponent and per-configuration statistics."""

from __future__ import annotations

import numpy as np
import xarray as xr

SUMMARIES = ("final", "max", "mean")


def is_flush_step(ds: xr.Dataset) -> xr.DataArray:
    """True where a configuration flushed (its state error was measured)."""
    return ds["state_rel_err"].notnull()


def output_steps(ds: xr.Dataset, var: str = "rel_err") -> xr.DataArray:
    """``var`` on output steps only (flush steps read the fresh fp32 state, so their
    error says nothing about the stored copy); window-1 designs keep every step."""
    flush = is_flush_step(ds)
    keep = ~flush | (ds["window"] == 1)
    return ds[var].where(keep)


def _slope(err: np.ndarray, steps: np.ndarray) -> float:
    ok = np.isfinite(err) & (err > 0)
    if ok.sum() < 3:
        return float("nan")
    x, y = np.log(steps[ok] + 1.0), np.log(err[ok])
    return float(np.polyfit(x, y, 1)[0])


def growth_exponent(ds: xr.Dataset) -> xr.DataArray:
    """Least-squares slope of log(rel_err) against log(step + 1) over the output
    steps after the first window: ~0 for bounded error, ~0.5 for a random walk."""
    err = output_steps(ds)
    steps = ds["step"].values

    def fit(curve: np.ndarray, window: int) -> float:
        start = min(int(window), len(steps) - 1)
        return _slope(curve[start:], steps[start:])

    out = xr.apply_ufunc(
        fit, err, ds["window"], input_core_dims=[["step"], []], vectorize=True,
        output_dtypes=[float],
    )
    out.attrs["long_name"] = "growth exponent: slope of log error vs log step"
    return out


def final_window(ds: xr.Dataset) -> int:
    """Steps averaged by the 'final' summary: the last 5% of the run, at least one
    window (largest window in the result) and at least one step."""
    n = ds.sizes["step"]
    return max(1, min(n, max(int(ds["window"].max()), n // 20)))


def summarise(ds: xr.Dataset, at: str | int = "final", var: str = "rel_err") -> xr.DataArray:
    """One number per configuration: 'final' (mean over the last steps, see
    :func:`final_window`), 'max', 'mean', or the value at a step index."""
    err = ds[var]
    if at == "final":
        return err.isel(step=slice(-final_window(ds), None)).mean("step")
    if at == "max":
        return err.max("step")
    if at == "mean":
        return err.mean("step")
    step = int(at)
    if not 0 <= step < ds.sizes["step"]:
        raise ValueError(f"step {step} is outside the result's 0..{ds.sizes['step'] - 1}")
    return err.sel(step=step)

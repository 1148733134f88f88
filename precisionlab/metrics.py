"""Summaries of drift curves: growth exponent and per-configuration statistics."""

from __future__ import annotations

import numpy as np
import xarray as xr

SUMMARIES = ("final", "max", "mean")
# per-step metrics where more is better (gated from below, plotted on a linear axis);
# every other one is an error or a divergence
HIGHER_IS_BETTER = frozenset({"top1_agree"})


def step_metrics(ds: xr.Dataset) -> list[str]:
    """The result's per-step variables that gates and plots take (``state_rel_err`` is
    left out: it exists on flush steps only)."""
    return [str(v) for v in ds.data_vars
            if ds[v].dims == ("design", "format", "window", "step") and v != "state_rel_err"]


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


def final_steps(steps: int, largest_window: int) -> int:
    """Steps averaged by the 'final' summary of a run of ``steps``: the last 5%, at
    least one window (the largest) and at least one step."""
    return max(1, min(steps, max(int(largest_window), steps // 20)))


def final_window(ds: xr.Dataset) -> int:
    """:func:`final_steps` of a result."""
    return final_steps(ds.sizes["step"], int(ds["window"].max()))


def final_sem(ds: xr.Dataset, per_sequence: np.ndarray) -> xr.DataArray:
    """Standard error of each configuration's 'final' summary over the batch's
    sequences: ``per_sequence`` holds ``rel_err`` per sequence, shaped (design, format,
    window, step, sequence); each sequence's mean over the final window
    (:func:`final_window`), then their standard deviation / sqrt(batch).  NaN with one
    sequence."""
    finals = per_sequence[..., -final_window(ds):, :].mean(axis=-2)
    n = finals.shape[-1]
    sem = (finals.std(axis=-1, ddof=1) / np.sqrt(n) if n > 1
           else np.full(finals.shape[:-1], np.nan))
    return xr.DataArray(sem, dims=("design", "format", "window"),
                        coords={d: ds[d] for d in ("design", "format", "window")},
                        attrs={"long_name": "standard error of the final relative output "
                                            "error over the batch's sequences"})


def t_quantile_95(n: int) -> float:
    """Student's t quantile of a two-sided 95% interval of a mean over ``n`` samples
    (12.7 for 2, 2.36 for 8, 1.96 in the limit); NaN below 2."""
    from scipy.stats import t

    return float(t.ppf(0.975, n - 1)) if n >= 2 else float("nan")


def final_half_width(ds: xr.Dataset) -> xr.DataArray:
    """Half width of each configuration's 95% interval on the 'final' error over the
    batch's sequences: ``final_sem`` times Student's t quantile for the batch size
    (the ``batch`` attribute; NaN where the result has no ``final_sem``)."""
    if "final_sem" not in ds:
        return xr.full_like(summarise(ds, "final"), np.nan)
    n = int(ds.attrs.get("batch", 0))
    out = t_quantile_95(n) * ds["final_sem"]
    out.attrs = {"long_name": "half width of the final error's 95% interval (Student t)"}
    return out


def head_memory(rate: np.ndarray) -> xr.DataArray:
    """Each head's memory in steps, from its mean decay rate per step (-log decay):
    the steps over which its state, and a rounding error in it, fades by a factor e."""
    rate = np.asarray(rate, dtype=float)
    with np.errstate(divide="ignore"):
        steps = np.where(rate > 0, 1.0 / np.where(rate > 0, rate, 1.0), np.inf)
    return xr.DataArray(steps, dims=("head",), attrs={
        "long_name": "head memory: steps for its state to decay by a factor e",
        "units": "step"})


WORST_HEAD = "head_rel_err"
"""Summarised as its worst head: the largest of the heads' final errors."""


def metric_summary(ds: xr.Dataset, at: str | int, metric: str) -> xr.DataArray:
    """One number per configuration of a per-step ``metric`` (:func:`summarise`) or of
    ``head_rel_err``, the worst head's final error (``at`` must be 'final')."""
    if metric != WORST_HEAD:
        return summarise(ds, at, metric)
    if at != "final":
        raise ValueError(f"{WORST_HEAD} is kept for the final steps only: use it at final")
    if WORST_HEAD not in ds:
        raise ValueError(f"the result has no variable {WORST_HEAD!r}")
    return ds[WORST_HEAD].max("head")


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


def state_matrix(ds: xr.Dataset) -> tuple[int, int] | None:
    """The (rows, cols) of one head's state matrix, from a result's ``dim_*``
    attributes (Mamba-2: headdim x dstate; GDN: V x K); None if they are missing."""
    a = ds.attrs
    for rows, cols in (("dim_headdim", "dim_dstate"), ("dim_V", "dim_K")):
        if rows in a and cols in a:
            return int(a[rows]), int(a[cols])
    return None


TRAFFIC_ATTRS = {
    "long_name": "modelled bytes moved per state element per decode step (window mean)",
    "units": "byte",
    "note": "DESIGN performance model: output steps read the read copy; a flush reads and "
            "writes the checkpoint and writes a split read copy; scales included, ring left "
            "out; conventional fp32 decoding moves 8",
}


def traffic(ds: xr.Dataset) -> xr.DataArray:
    """Modelled bytes per state element per decode step of each configuration
    (:meth:`precisionlab.designs.Design.bytes_per_step`): the result's
    ``bytes_per_step`` where it has one, else computed from its coordinates and its
    ``checkpoint_format`` attribute."""
    if "bytes_per_step" in ds:
        return ds["bytes_per_step"]
    from .designs import make_design

    matrix = state_matrix(ds)
    ckpt = str(ds.attrs.get("checkpoint_format", "fp32"))
    dims = ("design", "format", "window")
    out = np.empty([ds.sizes[d] for d in dims])
    for i, label in enumerate(ds["design"].values):
        # "split-fp16-sr": a split design of a result with several checkpoint formats
        kind, _, own = str(label).partition("-")
        for j, fmt in enumerate(ds["format"].values):
            for k, w in enumerate(ds["window"].values):
                try:
                    design = make_design(kind, str(fmt), int(w), own or ckpt)
                except (KeyError, ValueError) as exc:
                    raise ValueError(f"cannot model the traffic of {kind} {fmt} (L={int(w)}): "
                                     f"{exc}") from None
                out[i, j, k] = design.bytes_per_step(matrix)
    return xr.DataArray(out, dims=dims, coords={d: ds[d] for d in dims},
                        attrs=dict(TRAFFIC_ATTRS))


def frontier(err: xr.DataArray, cost: xr.DataArray) -> xr.DataArray:
    """True for configurations no other configuration beats on both ``err`` and
    ``cost`` (at most equal on both, lower on one); NaN errors are never on it."""
    e, c = xr.broadcast(err, cost)
    ev, cv = e.values.ravel(), c.values.ravel()
    ok = np.isfinite(ev) & np.isfinite(cv)
    le = (ev[None, :] <= ev[:, None]) & (cv[None, :] <= cv[:, None])
    lt = (ev[None, :] < ev[:, None]) | (cv[None, :] < cv[:, None])
    dominated = (le & lt & ok[None, :]).any(axis=1)
    out = (ok & ~dominated).reshape(e.shape)
    return xr.DataArray(out, dims=e.dims, coords=e.coords,
                        attrs={"long_name": "on the error / traffic frontier"})


def summary_records(ds: xr.Dataset) -> list[dict[str, object]]:
    """One plain record per configuration, as the study tables print them: design,
    format, window, bytes_per_step, final, peak and mean error, final_sem and final_ci95
    (its 95% half width, :func:`final_half_width`; NaN where the result has none),
    growth, frontier, the worst head (its index, final error and memory: worst_head,
    worst_head_err, worst_head_memory) where the result keeps per-head errors, and at
    the model level kl_mean, top1_agree_mean and first_divergence (None: never)."""
    final, peak, mean = (summarise(ds, a) for a in ("final", "max", "mean"))
    half = final_half_width(ds)
    cost = traffic(ds)
    best = frontier(final, cost)
    model_level = "kl" in ds
    rows = []
    for d in ds["design"].values:
        for f in ds["format"].values:
            for w in ds["window"].values:
                sel = {"design": d, "format": f, "window": w}
                row: dict[str, object] = {
                    "design": str(d), "format": str(f), "window": int(w),
                    "bytes_per_step": float(cost.sel(sel)), "final": float(final.sel(sel)),
                    "peak": float(peak.sel(sel)), "mean": float(mean.sel(sel)),
                    "final_sem": float(ds["final_sem"].sel(sel)) if "final_sem" in ds
                    else float("nan"),
                    "final_ci95": float(half.sel(sel)),
                    "growth": float(ds["growth"].sel(sel)), "frontier": bool(best.sel(sel))}
                if WORST_HEAD in ds:
                    heads = ds[WORST_HEAD].sel(sel)
                    worst = int(heads.argmax("head"))
                    row.update(worst_head=worst, worst_head_err=float(heads[worst]),
                               worst_head_memory=float(ds["head_memory"][worst]))
                if model_level:
                    first = float(ds["first_divergence"].sel(sel))
                    row.update(kl_mean=float(ds["kl"].sel(sel).mean()),
                               top1_agree_mean=float(ds["top1_agree"].sel(sel).mean()),
                               first_divergence=None if first != first else int(first))
                rows.append(row)
    return rows


def summary(ds: xr.Dataset):
    """:func:`summary_records` as a ``pandas.DataFrame`` indexed by (design, format,
    window): the study table of a result, for notebooks."""
    import pandas as pd

    return pd.DataFrame(summary_records(ds)).set_index(["design", "format", "window"])

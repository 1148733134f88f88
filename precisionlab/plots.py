"""Figures of drift results (seaborn + matplotlib, written as PNG atomically)."""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import seaborn as sns  # noqa: E402
import xarray as xr  # noqa: E402

from .atomic import atomic_path, write_problem  # noqa: E402
from .designs import CONVENTIONAL_FP32_BYTES  # noqa: E402
from .metrics import (  # noqa: E402
    HIGHER_IS_BETTER,
    final_half_width,
    frontier,
    output_steps,
    step_metrics,
    summarise,
    traffic,
)

PLOT_KINDS = ("curves", "window", "tradeoff", "heads")


class PlotError(ValueError):
    """A plot that cannot be made (unknown kind, bad path)."""


def _subtitle(ds: xr.Dataset) -> str:
    a = ds.attrs
    parts = [f"{a.get('model', '?')} ({a.get('kind', '?')})", f"batch {a.get('batch', '?')}",
             f"checkpoint {a.get('checkpoint_format', '?')}", f"ring {a.get('ring_dtype', '?')}",
             f"dynamics {a.get('dynamics', '?')}", f"seed {a.get('seed', '?')}"]
    return ", ".join(parts)


CURVE_POINTS = 300


def log_binned(err: xr.DataArray, points: int = CURVE_POINTS,
               geometric: bool = True) -> xr.DataArray:
    """Geometric (or, with ``geometric=False``, arithmetic) mean of ``err`` over
    log-spaced step bins (one bin per step while steps are fewer than ``points``), so
    long runs stay readable on a log axis without smearing the early steps."""
    n = err.sizes["step"]
    edges = np.unique(np.round(np.logspace(0, np.log10(n + 1), points)).astype(int)) - 1
    edges = np.unique(np.append(edges, n))
    values = np.log10(err.where(err > 0)) if geometric else err
    bins = zip(edges[:-1], edges[1:], strict=True)
    binned = xr.concat([values.isel(step=slice(a, b)).mean("step") for a, b in bins],
                       dim="step")
    out = 10 ** binned if geometric else binned
    return out.assign_coords(step=edges[:-1])


METRIC_LABELS = {
    "rel_err_max": "relative L2 output error (batch max)",
    "abs_err_max": "max absolute output error",
    "kl": "KL(reference || design), nats",
    "top1_agree": "top-1 agreement with the reference",
    "dlogp_mean": "|delta log-prob| of the reference token",
    "dlogp_p95": "p95 |delta log-prob| of the reference token",
    "ssm_out_rel_err": "relative L2 error of the SSM layer outputs",
}


def _metric_label(ds: xr.Dataset, metric: str) -> str:
    """A short axis label (the variables' long names are too long for an axis)."""
    if metric == "rel_err":
        return ("relative L2 error of the logits" if ds.attrs.get("rel_err_of") == "final logits"
                else "relative L2 output error")
    return METRIC_LABELS.get(metric, metric)


def _wrapped_title(prefix: str, ds: xr.Dataset) -> str:
    return f"{prefix}\n{_subtitle(ds)}"


def curves_figure(ds: xr.Dataset, metric: str = "rel_err") -> plt.Figure:
    """``metric`` (default the output error) vs step on log axes: hue = format, style =
    design, one panel per window.  Flush steps (which read the fresh fp32 state) are
    left out; long runs are averaged over log-spaced step bins (see
    :func:`log_binned`).  A metric where more is better (``top1_agree``) gets a
    linear axis and arithmetic bin means."""
    higher = metric in HIGHER_IS_BETTER
    binned = ds.sizes["step"] > CURVE_POINTS
    err = output_steps(ds, metric)
    err = log_binned(err, geometric=not higher) if binned else err
    df = err.to_dataframe(name=metric).reset_index().dropna()
    if not higher:
        df = df[df[metric] > 0]
    df["step"] = df["step"] + 1
    grid = sns.relplot(
        data=df, x="step", y=metric, hue="format", style="design", col="window",
        kind="line", col_wrap=min(3, ds.sizes["window"]), height=3.6, aspect=1.3,
        facet_kws={"sharey": True}, errorbar=None, linewidth=1.2,
    )
    grid.set(xscale="log", yscale="linear" if higher else "log")
    grid.set_axis_labels("decode step", _metric_label(ds, metric))
    grid.set_titles("window L = {col_name}")
    mean = "arithmetic" if higher else "geometric"
    note = f" ({mean} mean over log-spaced step bins)" if binned else ""
    what = "Output drift" if metric == "rel_err" else metric
    grid.figure.suptitle(_wrapped_title(f"{what} vs fp64 reference{note}", ds), fontsize=9)
    grid.tight_layout()  # the grid's own layout keeps room for its legend
    grid.figure.subplots_adjust(top=1 - 0.75 / grid.figure.get_figheight())
    return grid.figure


def window_figure(ds: xr.Dataset, metric: str = "rel_err") -> plt.Figure:
    """Heat map of the final ``metric`` (window x format), one panel per design (log
    colours for errors, linear for a metric where more is better)."""
    final = summarise(ds, "final", metric)
    n = ds.sizes["design"]
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n + 1, 0.5 * ds.sizes["window"] + 2.5),
                             squeeze=False)
    if metric in HIGHER_IS_BETTER:
        norm = matplotlib.colors.Normalize(vmin=float(final.min()), vmax=float(final.max()))
        cmap, fmt = "rocket", ".3f"
    else:
        vmin = float(final.where(final > 0).min())
        vmax = float(final.max())
        norm = matplotlib.colors.LogNorm(vmin=max(vmin, 1e-12), vmax=max(vmax, vmin * 10))
        cmap, fmt = "rocket_r", ".1e"
    for ax, design in zip(axes[0], ds["design"].values, strict=False):
        table = final.sel(design=design).transpose("window", "format").to_pandas()
        sns.heatmap(table, ax=ax, annot=True, fmt=fmt, norm=norm, cmap=cmap,
                    cbar=ax is axes[0][-1], annot_kws={"fontsize": 8})
        ax.set_title(f"design: {design}")
        ax.set_xlabel("read format")
        ax.set_ylabel("window L")
    fig.suptitle(_wrapped_title(f"Final {_metric_label(ds, metric)}", ds), fontsize=9)
    fig.tight_layout()
    return fig


def tradeoff_figure(ds: xr.Dataset, metric: str = "rel_err") -> plt.Figure:
    """Final error against modelled memory traffic, one point per (design, format,
    window) (hue = format, style = design), the frontier of configurations no other
    beats on both drawn through them and labelled with their window; the top axis
    gives the traffic as a modelled speed-up over conventional fp32 decoding; error
    bars are the final error's 95% intervals over the batch's sequences.  With a
    metric where more is better (``top1_agree``) the frontier keeps the highest values
    and the axis is linear."""
    try:
        cost = traffic(ds)
    except ValueError as exc:
        raise PlotError(str(exc)) from None
    higher = metric in HIGHER_IS_BETTER
    final = summarise(ds, "final", metric)
    best = frontier(-final if higher else final, cost)
    df = xr.Dataset({"bytes": cost, "final": final, "frontier": best}).to_dataframe()
    df = df.reset_index()
    df = df[np.isfinite(df["final"]) & ((df["final"] > 0) | higher)]
    if df.empty:
        raise PlotError(f"no configuration has a positive final {metric} to place on a log "
                        "axis")
    fig, ax = plt.subplots(figsize=(7.2, 4.8))
    line = df[df["frontier"]].sort_values("bytes")
    ax.plot(line["bytes"], line["final"], ls="--", lw=1, color="0.55", zorder=1,
            label="frontier (labels: window L)")
    if metric == "rel_err" and "final_sem" in ds:  # 95% intervals over the sequences
        half = final_half_width(ds).to_dataframe(name="half").reset_index()
        bars = df.merge(half, on=["design", "format", "window"]).dropna()
        low = np.minimum(bars["half"], 0.9 * bars["final"])  # stays above 0 on a log axis
        ax.errorbar(bars["bytes"], bars["final"], yerr=[low, bars["half"]], fmt="none",
                    ecolor="0.65", elinewidth=0.8, capsize=2, zorder=1.5)
    sns.scatterplot(data=df, x="bytes", y="final", hue="format", style="design", s=70,
                    ax=ax, zorder=2)
    for row in line.itertuples():  # the frontier's windows (all points: too crowded)
        ax.annotate(f"L={int(row.window)}", (row.bytes, row.final), textcoords="offset points",
                    xytext=(4, -11), fontsize=7, color="0.25")
    ax.axvline(CONVENTIONAL_FP32_BYTES, ls=":", lw=1, color="0.4")
    _draw_advice(ax, ds, df, metric)
    ax.set_xscale("log", base=2)
    ax.set_yscale("linear" if higher else "log")
    lo = min(float(df["bytes"].min()), CONVENTIONAL_FP32_BYTES) / 1.3
    ax.set_xlim(lo, max(float(df["bytes"].max()), CONVENTIONAL_FP32_BYTES) * 1.3)
    ax.set_xlabel("modelled bytes per state element per step (dotted: conventional fp32)")
    ax.set_ylabel(f"final {_metric_label(ds, metric)}")
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    top = ax.secondary_xaxis("top", functions=(_speedup, _speedup))
    top.set_xticks([8 / b for b in (0.25, 0.5, 1, 2, 4, 8, 16)])
    top.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
    top.set_xlabel("modelled speed-up over conventional fp32 (8 / bytes)", fontsize=8)
    ax.legend(fontsize=7, loc="best")
    what = "Drift" if metric == "rel_err" else metric
    ax.set_title(_wrapped_title(f"{what} against memory traffic", ds), fontsize=9)
    fig.tight_layout()
    return fig


def heads_figure(ds: xr.Dataset, metric: str = "rel_err") -> plt.Figure:
    """Each head's final relative output error against its memory (the steps over which
    its state decays by e), hue = format, style = design, one panel per window: heads
    that remember longer keep a rounding error in their state longer.  Heads with no
    error (their state fades within a step) are left out of the log axis."""
    if metric != "rel_err":
        raise PlotError("the heads plot shows the relative output error per head; it takes "
                        "no other --metric")
    if "head_rel_err" not in ds or "head_memory" not in ds:
        raise PlotError("the result has no per-head errors (results of the layer drift "
                        "study have them)")
    df = ds["head_rel_err"].to_dataframe().reset_index()
    df = df.merge(ds["head_memory"].to_dataframe().reset_index(), on="head")
    shown = df[(df["head_rel_err"] > 0) & np.isfinite(df["head_memory"])]
    if shown.empty:
        raise PlotError("no head has a positive error to place on a log axis")
    grid = sns.relplot(data=shown, x="head_memory", y="head_rel_err", hue="format",
                       style="design", col="window", col_wrap=min(3, ds.sizes["window"]),
                       height=3.6, aspect=1.3, s=40, alpha=0.8)
    grid.set(xscale="log", yscale="log")
    grid.set_axis_labels("head memory: steps to decay by e", "final relative output error")
    grid.set_titles("window L = {col_name}")
    left = len(df) - len(shown)
    note = f" ({left} of {len(df)} points without error left out)" if left else ""
    grid.figure.suptitle(_wrapped_title(f"Drift per head against its memory{note}", ds),
                         fontsize=9)
    grid.tight_layout()
    grid.figure.subplots_adjust(top=1 - 0.75 / grid.figure.get_figheight())
    return grid.figure


def _draw_advice(ax, ds: xr.Dataset, df, metric: str) -> None:
    """An advised result's budget (a horizontal line, where it bounds the plotted final
    value) and its recommended configuration (a ring)."""
    a = ds.attrs
    if a.get("advice_metric") != metric or a.get("advice_at") != "final":
        return
    ax.axhline(float(a["advice_bound"]), ls="-.", lw=1, color="tab:red", zorder=1,
               label=f"budget ({'min' if a.get('advice_direction') == 'min' else 'max'})")
    if a.get("recommended_design"):
        row = df[(df["design"] == a["recommended_design"])
                 & (df["format"] == a["recommended_format"])
                 & (df["window"] == int(a["recommended_window"]))]
        ax.scatter(row["bytes"], row["final"], s=260, facecolors="none", edgecolors="tab:red",
                   linewidths=1.5, zorder=3, label="recommended")


def _speedup(x):
    """8 / x (its own inverse), safe at 0 for the secondary axis."""
    x = np.asarray(x, dtype=float)
    return CONVENTIONAL_FP32_BYTES / np.where(x > 0, x, np.inf)


def check_plot_path(path: str | os.PathLike) -> Path:
    """``path`` if a PNG figure can be written there, else a PlotError (the command line
    checks it before a study runs)."""
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise PlotError(f"plots are written as PNG: give a path ending in .png, not {str(path)!r}")
    problem = write_problem(path)
    if problem:
        raise PlotError(problem)
    return path


def save_plot(ds: xr.Dataset, path: str | os.PathLike, kind: str = "curves",
              metric: str = "rel_err") -> Path:
    """Draw ``kind`` ('curves', 'window', 'tradeoff' or 'heads') of the per-step ``metric``
    (default the output error; a model-level result also has ``kl``, ``top1_agree``,
    ...) and write it to ``path`` (PNG), atomically."""
    if kind not in PLOT_KINDS:
        raise PlotError(f"unknown plot kind {kind!r}; choose one of {', '.join(PLOT_KINDS)}")
    if metric not in step_metrics(ds):
        raise PlotError(f"--metric must be a per-step variable of the result "
                        f"({', '.join(step_metrics(ds))}), got {metric!r}")
    path = check_plot_path(path)
    draw = {"curves": curves_figure, "window": window_figure, "tradeoff": tradeoff_figure,
            "heads": heads_figure}
    fig = draw[kind](ds, metric)
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=130, format="png")
    finally:
        plt.close(fig)
    return path

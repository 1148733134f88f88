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

from .atomic import atomic_path  # noqa: E402
from .designs import CONVENTIONAL_FP32_BYTES  # noqa: E402
from .metrics import frontier, output_steps, summarise, traffic  # noqa: E402

PLOT_KINDS = ("curves", "window", "tradeoff")


class PlotError(ValueError):
    """A plot that cannot be made (unknown kind, bad path)."""


def _subtitle(ds: xr.Dataset) -> str:
    a = ds.attrs
    parts = [f"{a.get('model', '?')} ({a.get('kind', '?')})", f"batch {a.get('batch', '?')}",
             f"checkpoint {a.get('checkpoint_format', '?')}", f"ring {a.get('ring_dtype', '?')}",
             f"dynamics {a.get('dynamics', '?')}", f"seed {a.get('seed', '?')}"]
    return ", ".join(parts)


CURVE_POINTS = 300


def log_binned(err: xr.DataArray, points: int = CURVE_POINTS) -> xr.DataArray:
    """Geometric mean of ``err`` over log-spaced step bins (one bin per step while
    steps are fewer than ``points``), so long runs stay readable on a log axis
    without smearing the early steps."""
    n = err.sizes["step"]
    edges = np.unique(np.round(np.logspace(0, np.log10(n + 1), points)).astype(int)) - 1
    edges = np.unique(np.append(edges, n))
    logs = np.log10(err.where(err > 0))
    bins = zip(edges[:-1], edges[1:], strict=True)
    binned = [logs.isel(step=slice(a, b)).mean("step") for a, b in bins]
    out = 10 ** xr.concat(binned, dim="step")
    return out.assign_coords(step=edges[:-1])


def _wrapped_title(prefix: str, ds: xr.Dataset) -> str:
    return f"{prefix}\n{_subtitle(ds)}"


def curves_figure(ds: xr.Dataset) -> plt.Figure:
    """Output error vs step on log axes: hue = format, style = design, one panel per
    window.  Flush steps (which read the fresh fp32 state) are left out; long runs are
    averaged over log-spaced step bins (see :func:`log_binned`)."""
    binned = ds.sizes["step"] > CURVE_POINTS
    err = log_binned(output_steps(ds)) if binned else output_steps(ds)
    df = err.to_dataframe(name="rel_err").reset_index().dropna()
    df = df[df["rel_err"] > 0]
    df["step"] = df["step"] + 1
    grid = sns.relplot(
        data=df, x="step", y="rel_err", hue="format", style="design", col="window",
        kind="line", col_wrap=min(3, ds.sizes["window"]), height=3.6, aspect=1.3,
        facet_kws={"sharey": True}, errorbar=None, linewidth=1.2,
    )
    grid.set(xscale="log", yscale="log")
    grid.set_axis_labels("decode step", "relative L2 output error")
    grid.set_titles("window L = {col_name}")
    note = " (geometric mean over log-spaced step bins)" if binned else ""
    grid.figure.suptitle(_wrapped_title(f"Output drift vs fp64 reference{note}", ds),
                         fontsize=9)
    grid.tight_layout()  # the grid's own layout keeps room for its legend
    grid.figure.subplots_adjust(top=1 - 0.75 / grid.figure.get_figheight())
    return grid.figure


def window_figure(ds: xr.Dataset) -> plt.Figure:
    """Heat map of the final error (window x format), one panel per design."""
    final = summarise(ds, "final")
    n = ds.sizes["design"]
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n + 1, 0.5 * ds.sizes["window"] + 2.5),
                             squeeze=False)
    vmin = float(final.where(final > 0).min())
    vmax = float(final.max())
    norm = matplotlib.colors.LogNorm(vmin=max(vmin, 1e-12), vmax=max(vmax, vmin * 10))
    for ax, design in zip(axes[0], ds["design"].values, strict=False):
        table = final.sel(design=design).transpose("window", "format").to_pandas()
        sns.heatmap(table, ax=ax, annot=True, fmt=".1e", norm=norm, cmap="rocket_r",
                    cbar=ax is axes[0][-1], annot_kws={"fontsize": 8})
        ax.set_title(f"design: {design}")
        ax.set_xlabel("read format")
        ax.set_ylabel("window L")
    fig.suptitle(_wrapped_title("Final relative output error", ds), fontsize=9)
    fig.tight_layout()
    return fig


def tradeoff_figure(ds: xr.Dataset) -> plt.Figure:
    """Final error against modelled memory traffic, one point per (design, format,
    window) (hue = format, style = design), the frontier of configurations no other
    beats on both drawn through them and labelled with their window; the top axis
    gives the traffic as a modelled speed-up over conventional fp32 decoding."""
    try:
        cost = traffic(ds)
    except ValueError as exc:
        raise PlotError(str(exc)) from None
    final = summarise(ds, "final")
    best = frontier(final, cost)
    df = xr.Dataset({"bytes": cost, "final": final, "frontier": best}).to_dataframe()
    df = df.reset_index()
    df = df[np.isfinite(df["final"]) & (df["final"] > 0)]
    if df.empty:
        raise PlotError("no configuration has a positive final error to place on a log axis")
    fig, ax = plt.subplots(figsize=(7.2, 4.8))
    line = df[df["frontier"]].sort_values("bytes")
    ax.plot(line["bytes"], line["final"], ls="--", lw=1, color="0.55", zorder=1,
            label="frontier (labels: window L)")
    sns.scatterplot(data=df, x="bytes", y="final", hue="format", style="design", s=70,
                    ax=ax, zorder=2)
    for row in line.itertuples():  # the frontier's windows (all points: too crowded)
        ax.annotate(f"L={int(row.window)}", (row.bytes, row.final), textcoords="offset points",
                    xytext=(4, -11), fontsize=7, color="0.25")
    ax.axvline(CONVENTIONAL_FP32_BYTES, ls=":", lw=1, color="0.4")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    lo = min(float(df["bytes"].min()), CONVENTIONAL_FP32_BYTES) / 1.3
    ax.set_xlim(lo, max(float(df["bytes"].max()), CONVENTIONAL_FP32_BYTES) * 1.3)
    ax.set_xlabel("modelled bytes per state element per step (dotted: conventional fp32)")
    ax.set_ylabel("final relative output error")
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    top = ax.secondary_xaxis("top", functions=(_speedup, _speedup))
    top.set_xticks([8 / b for b in (0.25, 0.5, 1, 2, 4, 8, 16)])
    top.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
    top.set_xlabel("modelled speed-up over conventional fp32 (8 / bytes)", fontsize=8)
    ax.legend(fontsize=7, loc="best")
    ax.set_title(_wrapped_title("Drift against memory traffic", ds), fontsize=9)
    fig.tight_layout()
    return fig


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
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise PlotError(f"cannot write {str(path)!r}: folder {str(parent)!r} is not writable")
    return path


def save_plot(ds: xr.Dataset, path: str | os.PathLike, kind: str = "curves") -> Path:
    """Draw ``kind`` ('curves', 'window' or 'tradeoff') and write it to ``path`` (PNG),
    atomically."""
    if kind not in PLOT_KINDS:
        raise PlotError(f"unknown plot kind {kind!r}; choose one of {', '.join(PLOT_KINDS)}")
    path = check_plot_path(path)
    draw = {"curves": curves_figure, "window": window_figure, "tradeoff": tradeoff_figure}
    fig = draw[kind](ds)
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=130, format="png")
    finally:
        plt.close(fig)
    return path

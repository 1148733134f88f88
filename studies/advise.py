"""Advise: of the configurations a drift study ran, the one that moves the fewest
bytes per decode step while its drift stays within a budget."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import xarray as xr

from precisionlab.metrics import (
    HIGHER_IS_BETTER,
    WORST_HEAD,
    final_half_width,
    frontier,
    metric_summary,
    step_metrics,
    traffic,
)

from .drift import StudyError, drift

DEFAULT_FORMATS = ("fp8-e4m3", "nvfp4")
DEFAULT_WINDOWS = (4, 16, 64)
DEFAULT_CHECKPOINTS = ("fp32", "fp16-sr")


def _budget(metric: str, max_value: float | None, min_value: float | None) -> tuple[float, bool]:
    """(bound, whether it is a lower bound), checked against the metric's direction."""
    higher = metric in HIGHER_IS_BETTER
    if (max_value if higher else min_value) is not None:
        raise StudyError(f"{metric}: {'more' if higher else 'less'} is better, so give the "
                         f"budget as {'--min' if higher else '--max'}")
    bound = min_value if higher else max_value
    if bound is None:
        raise StudyError(f"give a budget: {'--min' if higher else '--max'} on {metric}")
    if not (np.isfinite(bound) and bound >= 0):
        raise StudyError(f"the budget must be a finite number >= 0, got {bound:g}")
    return float(bound), higher


def _check_length(steps: int | None, windows: Sequence[int]) -> None:
    """A configuration is judged after it has flushed at least twice: before that, its
    stored copy has barely been rounded and its error says little."""
    longest = max(windows)
    if steps is not None and steps < 2 * longest:
        raise StudyError(f"advice needs at least two windows of steps: {steps} "
                         f"step{'' if steps == 1 else 's'} against "
                         f"window {longest} (raise --steps to {2 * longest} or drop the window)")


def recommend(
    ds: xr.Dataset,
    *,
    max_value: float | None = None,
    min_value: float | None = None,
    metric: str = "rel_err",
    at: str | int = "final",
    confident: bool = False,
) -> xr.Dataset:
    """``ds`` (a drift, window, compare or model-level result) with the advice added.

    Each configuration's ``metric`` summarised ``at`` (final, max, mean or a step; for
    ``head_rel_err`` the worst head's final error) must stay within the budget: at
    most ``max_value`` (errors, divergences) or at least ``min_value``
    (``top1_agree``).  With ``confident`` the final error's 95% interval
    over the batch's sequences (Student t) must lie within it, not only its mean.
    Adds ``advice_value`` (the number held against the budget) and ``meets_budget``
    per configuration; the attributes name the budget and the recommendation, the
    configuration that meets it with the least modelled traffic (ties: the better
    value), or none (see :func:`recommendation`)."""
    if metric not in step_metrics(ds) and not (metric == WORST_HEAD and metric in ds):
        raise StudyError(f"the metric must be a per-step variable of the result "
                         f"({', '.join(step_metrics(ds))}) or {WORST_HEAD}, got {metric!r}")
    bound, higher = _budget(metric, max_value, min_value)
    _check_length(ds.sizes["step"], [int(w) for w in ds["window"].values])
    try:
        value = metric_summary(ds, at, metric)
    except ValueError as exc:
        raise StudyError(str(exc)) from None
    if confident:
        if metric != "rel_err" or at != "final":
            raise StudyError("--confident needs the final relative error (--metric rel_err "
                             "--at final): the result keeps its spread over the sequences")
        half = final_half_width(ds)
        if not np.isfinite(half.values).any():
            raise StudyError("--confident needs a result of two or more sequences (--batch)")
        value = value + half
    try:
        cost = traffic(ds)
    except ValueError as exc:
        raise StudyError(str(exc)) from None
    meets = np.isfinite(value) & ((value >= bound) if higher else (value <= bound))
    out = ds.copy()
    out["advice_value"] = value.assign_attrs(
        long_name=f"{metric}[{at}]" + (" + 95% half width" if confident else ""))
    out["meets_budget"] = meets.astype(np.int8).assign_attrs(
        long_name=f"1 where {metric}[{at}] {'>=' if higher else '<='} {bound:g}")
    if "bytes_per_step" not in out:
        out["bytes_per_step"] = cost
    best = _cheapest(value, cost, meets, higher)
    out.attrs.update({
        "study": "advise",
        "advice_metric": metric,
        "advice_at": str(at),
        "advice_bound": bound,
        "advice_direction": "min" if higher else "max",
        "advice_confident": int(confident),
        # none recommended: empty names and window 0 (netCDF attributes cannot be None)
        **{f"recommended_{k}": v for k, v in (best or {"design": "", "format": "",
                                                       "window": 0}).items()},
    })
    return out


def _cheapest_first(value: xr.DataArray, cost: xr.DataArray, meets: xr.DataArray,
                    higher: bool):
    """Every configuration as a row (design, format, window, bytes_per_step, value,
    meets_budget), least traffic first and, at equal traffic, the better value first."""
    frame = xr.Dataset({"bytes_per_step": cost, "value": value,
                        "meets_budget": meets.astype(bool)}).to_dataframe().reset_index()
    order = -frame["value"] if higher else frame["value"]
    return frame.assign(order=order).sort_values(["bytes_per_step", "order"], kind="stable")


def _cheapest(value: xr.DataArray, cost: xr.DataArray, meets: xr.DataArray,
              higher: bool) -> dict[str, object] | None:
    frame = _cheapest_first(value, cost, meets, higher)
    frame = frame[frame["meets_budget"]]
    if frame.empty:
        return None
    first = frame.iloc[0]
    return {"design": str(first["design"]), "format": str(first["format"]),
            "window": int(first["window"])}


def recommendation(ds: xr.Dataset) -> dict[str, object] | None:
    """The configuration an advised result recommends, as ``{"design", "format",
    "window"}``, or None when no configuration met the budget."""
    a = ds.attrs
    if "recommended_design" not in a:
        raise StudyError("the result has no advice: run precisionlab advise on it")
    if not a["recommended_design"]:
        return None
    return {"design": str(a["recommended_design"]), "format": str(a["recommended_format"]),
            "window": int(a["recommended_window"])}


def advice_table(ds: xr.Dataset) -> list[dict[str, object]]:
    """One record per configuration of an advised result, cheapest first: design,
    format, window, bytes_per_step, value, meets_budget, frontier."""
    if "meets_budget" not in ds:
        raise StudyError("the result has no advice: run precisionlab advise on it")
    higher = ds.attrs.get("advice_direction") == "min"
    value, cost = ds["advice_value"], traffic(ds)
    frame = _cheapest_first(value, cost, ds["meets_budget"], higher)
    best = frontier(-value if higher else value, cost).to_series()
    return [{"design": str(r.design), "format": str(r.format), "window": int(r.window),
             "bytes_per_step": float(r.bytes_per_step), "value": float(r.value),
             "meets_budget": bool(r.meets_budget),
             "frontier": bool(best.loc[(r.design, r.format, r.window)])}
            for r in frame.itertuples()]


def advise(
    model: str,
    *,
    max_value: float | None = None,
    min_value: float | None = None,
    metric: str = "rel_err",
    at: str | int = "final",
    confident: bool = False,
    formats: str | Sequence[str] = DEFAULT_FORMATS,
    windows: int | Sequence[int] = DEFAULT_WINDOWS,
    designs: str | Sequence[str] = ("shared", "split"),
    checkpoint_format: str | Sequence[str] = DEFAULT_CHECKPOINTS,
    **kwargs,
) -> xr.Dataset:
    """Run the drift study over ``formats`` x ``designs`` x ``checkpoint_format`` x
    ``windows`` and advise on it (:func:`recommend`): the configuration with the least
    modelled memory traffic whose ``metric`` stays within the budget.  ``kwargs`` go to
    :func:`precisionlab.studies.drift` (steps, batch, seed, backend, device, ...)."""
    _budget(metric, max_value, min_value)  # bad budgets fail before the study runs
    steps = kwargs.get("steps")
    if isinstance(steps, int) and steps >= 1:  # trace files: checked once read
        _check_length(steps, [windows] if isinstance(windows, int) else list(windows) or [1])
    if confident and (metric != "rel_err" or at != "final"):
        raise StudyError("--confident needs the final relative error (--metric rel_err "
                         "--at final): the result keeps its spread over the sequences")
    if metric not in ("rel_err", "rel_err_max", "abs_err_max", WORST_HEAD):
        raise StudyError(f"a layer's drift study measures rel_err, rel_err_max, abs_err_max "
                         f"and {WORST_HEAD}; advise on {metric!r} from a model-level result")
    if metric == WORST_HEAD and at != "final":
        raise StudyError(f"{WORST_HEAD} is kept for the final steps only: use --at final")
    ds = drift(model, formats, designs=designs, windows=windows,
               checkpoint_format=checkpoint_format, **kwargs)
    return recommend(ds, max_value=max_value, min_value=min_value, metric=metric, at=at,
                     confident=confident)


__all__ = ["advise", "recommend", "recommendation", "advice_table", "DEFAULT_FORMATS",
           "DEFAULT_WINDOWS", "DEFAULT_CHECKPOINTS"]

"""pytest helpers: gate a drift result from a test."""

from __future__ import annotations

import os
import warnings

import xarray as xr

from .export import load_result
from .gates import check


def assert_drift(
    result: xr.Dataset | str | os.PathLike,
    max_rel_err: float | None = None,
    *,
    at: str | int = "final",
    where: dict[str, str | list[str]] | None = None,
    baseline: xr.Dataset | str | os.PathLike | None = None,
    rtol: float = 0.1,
    metric: str = "rel_err",
    max_value: float | None = None,
    min_value: float | None = None,
) -> None:
    """Fail with one line per offending configuration if the gate does not pass.

    The Python twin of ``precisionlab gate``: ``where`` selects configurations
    (``{"design": "split", "format": ["nvfp4", "fp8-e4m3"]}``), ``at`` is 'final',
    'max', 'mean' or a step index; ``metric`` with ``max_value`` / ``min_value`` gates
    another per-step variable (``kl``, ``top1_agree``, ...).
    """
    ds = result if isinstance(result, xr.Dataset) else load_result(result)
    base = baseline if baseline is None or isinstance(baseline, xr.Dataset) else load_result(
        baseline)
    sel = {k: [str(x) for x in (v if isinstance(v, list | tuple) else [v])]
           for k, v in (where or {}).items()}
    failed = [c for c in check(ds, max_rel_err=max_rel_err, at=at, where=sel, baseline=base,
                               rtol=rtol, var=metric, max_value=max_value,
                               min_value=min_value) if not c.passed]
    if failed:
        lines = [f"{c.name}: {c.verdict(at)}" for c in failed]
        raise AssertionError("drift gate failed:\n" + "\n".join(lines))
    if ds.attrs.get("notes"):  # passed, but e.g. windows that never flushed
        warnings.warn(f"the gated result notes: {ds.attrs['notes']}", UserWarning, stacklevel=2)

"""Compare study: shared vs split at equal read format, as a ratio over steps."""

from __future__ import annotations

from collections.abc import Sequence

import xarray as xr

from precisionlab.metrics import output_steps, summarise

from .drift import StudyError, drift


def compare(
    model: str,
    formats: str | Sequence[str],
    windows: int | Sequence[int] = (16,),
    **kwargs,
) -> xr.Dataset:
    """Run shared and split for every format and window; return the drift Dataset
    plus ``ratio`` (shared error / split error on output steps, per step) and
    ``final_ratio`` (the same on the 'final' summary).  Ratios above 1 mean the
    split design drifts less."""
    kwargs.pop("designs", None)
    checkpoints = kwargs.get("checkpoint_format", "fp32")
    if not isinstance(checkpoints, str) and len(set(checkpoints)) > 1:
        raise StudyError("compare pairs shared with one split design: give one checkpoint "
                         "format (drift and window take several)")
    ds = drift(model, formats, designs=("shared", "split"), windows=windows, **kwargs)
    err = output_steps(ds)
    ds["ratio"] = err.sel(design="shared", drop=True) / err.sel(design="split", drop=True)
    ds["ratio"].attrs["long_name"] = "shared / split relative output error"
    final = summarise(ds, "final")
    ds["final_ratio"] = final.sel(design="shared", drop=True) / final.sel(design="split", drop=True)
    ds.attrs["study"] = "compare"
    return ds

"""Window sweep: how the final error and growth depend on the window L."""

from __future__ import annotations

from collections.abc import Sequence

import xarray as xr

from precisionlab.metrics import summarise

from .drift import drift

DEFAULT_WINDOWS = (1, 4, 8, 16, 32, 64)


def window_sweep(
    model: str,
    formats: str | Sequence[str],
    windows: Sequence[int] = DEFAULT_WINDOWS,
    designs: str | Sequence[str] = ("shared", "split"),
    **kwargs,
) -> xr.Dataset:
    """The drift study over ``windows`` with per-configuration summaries added:
    ``final``, ``peak`` and ``mean`` relative output error (see
    :func:`precisionlab.metrics.summarise`)."""
    ds = drift(model, formats, designs=designs, windows=windows, **kwargs)
    for name, at in (("final", "final"), ("peak", "max"), ("mean", "mean")):
        ds[name] = summarise(ds, at)
    ds.attrs["study"] = "window"
    return ds

"""Write and read results: netCDF (.nc, via h5netcdf), zarr (.zarr) and tidy CSV
(.csv), chosen by suffix.  Writes are atomic: a temporary sibling, then a rename."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

from .atomic import atomic_path, write_problem

SUFFIXES = (".nc", ".zarr", ".csv")
CSV_HEADER = "# precisionlab-result "
INEXACT_PROBE = "0.051182162470025674"
"""A float that pandas' default CSV parser before 3.1 reads one ulp off."""


def _exact_float_args() -> dict:
    """``read_csv`` arguments under which every float reads back exactly: none where
    the default parser is exact (pandas 3.1 on), else round-trip parsing (the default
    of pandas 2.x and 3.0 lands some floats an ulp off)."""
    default = pd.read_csv(io.StringIO(f"v\n{INEXACT_PROBE}"))["v"].iloc[0]
    return {} if default == float(INEXACT_PROBE) else {"float_precision": "round_trip"}


EXACT_FLOATS = _exact_float_args()
STEP_DIMS = ("design", "format", "window", "step")


class ResultError(ValueError):
    """A result path that cannot be written or read."""


def _suffix(path: Path, suffixes: tuple[str, ...] = SUFFIXES) -> str:
    suffix = path.suffix.lower()
    if suffix not in suffixes:
        raise ResultError(
            f"cannot tell the file type of {str(path)!r}: use one of {', '.join(suffixes)}"
        )
    return suffix


def check_writable(path: str | os.PathLike, suffixes: tuple[str, ...] = SUFFIXES) -> Path:
    """Fail early (before a long run) if ``path`` cannot be written: its type (one of
    ``suffixes``), its folder, a folder or file of the wrong kind already there."""
    path = Path(path)
    _suffix(path, suffixes)
    problem = write_problem(path, folder_ok=path.suffix.lower() == ".zarr")
    if problem:
        raise ResultError(problem)
    if path.suffix.lower() == ".zarr" and path.exists() and not path.is_dir():
        raise ResultError(f"cannot write {str(path)!r}: a file is there (a zarr result is a "
                          "folder)")
    return path


def to_tidy(ds: xr.Dataset) -> pd.DataFrame:
    """One row per (design, format, window, step); per-configuration variables repeat;
    variables on other axes (``head_rel_err``, ``head_memory``) are left out."""
    step_vars = [v for v in ds.data_vars if ds[v].dims == STEP_DIMS]
    df = ds[step_vars].to_dataframe().reset_index()
    others = [v for v in ds.data_vars
              if v not in step_vars and set(ds[v].dims) <= set(STEP_DIMS)]
    if others:
        cfg = ds[others].to_dataframe().reset_index()
        df = df.merge(cfg, on=[d for d in STEP_DIMS[:-1] if d in cfg.columns], how="left")
    return df


def from_tidy(df: pd.DataFrame, attrs: dict) -> xr.Dataset:
    """Inverse of :func:`to_tidy` (coordinates keep the order of the rows, not a
    sorted one)."""
    order = {d: pd.unique(df[d]) for d in STEP_DIMS}
    df = df.set_index(list(STEP_DIMS))
    config_vars = json.loads(attrs.pop("_config_vars", "[]"))
    extra = json.loads(attrs.pop("_extra_vars", "{}"))
    ds = xr.Dataset.from_dataframe(df[[c for c in df.columns if c not in config_vars]])
    for v in config_vars:
        ds[v] = xr.DataArray.from_series(
            df[v].groupby(level=list(STEP_DIMS[:-1]), sort=False).first()
        )
    ds = ds.reindex(order)
    for name, doc in extra.items():
        ds[name] = xr.DataArray.from_dict(doc)
    ds.attrs.update(attrs)
    return ds


def plain_value(value):
    """A numpy scalar (a coordinate's or a read-back attribute's) as the Python value it
    holds; anything else unchanged."""
    return value.item() if hasattr(value, "item") and not isinstance(value, str) else value


def _json_value(value):
    """A numpy scalar or array (the attributes of a result read back from netCDF) as
    the Python value it holds, for ``json.dumps``."""
    if isinstance(value, np.generic | np.ndarray):
        return value.tolist()
    raise TypeError(f"cannot write {type(value).__name__} to a CSV result's header")


def _netcdf_attrs(attrs: dict) -> dict:
    """netCDF attributes must be strings or numbers."""
    out = {}
    for k, v in attrs.items():
        if isinstance(v, bool):
            v = int(v)
        elif isinstance(v, str):
            v = str(v)  # plain str: subclasses (e.g. torch's version) confuse h5py
        elif not isinstance(v, str | int | float | np.integer | np.floating):
            v = json.dumps(v)
        out[k] = v
    return out


def save_result(ds: xr.Dataset, path: str | os.PathLike) -> Path:
    """Write ``ds`` to ``path`` (type from its suffix), atomically."""
    path = check_writable(path)
    suffix = _suffix(path)
    ds = ds.copy()
    ds.attrs = _netcdf_attrs(ds.attrs)
    if suffix == ".nc":
        with atomic_path(path) as tmp:
            ds.to_netcdf(tmp, engine="h5netcdf")
    elif suffix == ".zarr":
        with atomic_path(path) as tmp:
            ds.to_zarr(tmp, mode="w", zarr_format=2, consolidated=True)
    else:
        # variables on other axes (per head, ...) are few numbers: they ride in the header
        extra = [v for v in ds.data_vars if not set(ds[v].dims) <= set(STEP_DIMS)]
        extra_doc = {v: ds[v].to_dict(data="list") for v in extra}
        config_vars = [v for v in ds.data_vars if ds[v].dims != STEP_DIMS and v not in extra]
        header = CSV_HEADER + json.dumps({**ds.attrs, "_config_vars": json.dumps(config_vars),
                                          "_extra_vars": json.dumps(extra_doc)},
                                         default=_json_value)

        with atomic_path(path) as tmp, open(tmp, "w", newline="") as fh:
            fh.write(header + "\n")
            to_tidy(ds).to_csv(fh, index=False)
    return path


def load_result(path: str | os.PathLike) -> xr.Dataset:
    """Read a result written by :func:`save_result`."""
    path = Path(path)
    suffix = _suffix(path)
    if not path.exists():
        raise ResultError(f"result not found: {str(path)!r}")
    try:
        if suffix == ".nc":
            with xr.open_dataset(path, engine="h5netcdf") as ds:
                return ds.load()
        if suffix == ".zarr":
            return xr.open_zarr(path, consolidated=True).load()
        with open(path) as fh:
            first = fh.readline()
            if not first.startswith(CSV_HEADER):
                raise ResultError(f"{str(path)!r} is not a precisionlab CSV result")
            attrs = json.loads(first[len(CSV_HEADER):])
            df = pd.read_csv(fh, **EXACT_FLOATS)
        return from_tidy(df, attrs)
    except ResultError:
        raise
    except Exception as exc:  # any reader failure is the file's fault, not ours
        raise ResultError(f"cannot read result {str(path)!r}: {exc}") from None

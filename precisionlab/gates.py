"""CI gates on drift results: every selected configuration's error must stay under
a bound and/or within a tolerance of a baseline result."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from xml.etree import ElementTree as ET

import numpy as np
import xarray as xr

from .atomic import atomic_path
from .metrics import summarise

CONFIG_DIMS = ("design", "format", "window")


class GateError(ValueError):
    """A gate that cannot be evaluated (bad selection, bad variable, bad baseline)."""


@dataclass
class GateCheck:
    """One configuration's verdict."""

    config: dict[str, object]
    value: float
    limit: float
    passed: bool
    reason: str

    @property
    def name(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.config.items())


def parse_where(items: list[str] | None) -> dict[str, list[str]]:
    """``["design=split", "format=nvfp4", "format=fp8-e4m3"]`` -> selection dict."""
    out: dict[str, list[str]] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not value:
            raise GateError(f"--where needs KEY=VALUE, got {item!r}")
        if key not in CONFIG_DIMS:
            raise GateError(f"--where key must be one of {', '.join(CONFIG_DIMS)}, got {key!r}")
        if key == "window" and not value.isdigit():
            raise GateError(f"--where window needs a whole number, got {value!r}")
        out.setdefault(key, []).append(value)
    return out


def _select(da: xr.DataArray, where: dict[str, list[str]]) -> xr.DataArray:
    for key, values in where.items():
        coord = da[key]
        wanted = [int(v) for v in values] if key == "window" else values
        missing = [v for v in wanted if v not in coord.values.tolist()]
        if missing:
            raise GateError(
                f"no {key} {', '.join(map(str, missing))} in the result "
                f"(it has {', '.join(map(str, coord.values.tolist()))})"
            )
        da = da.sel({key: wanted})
    return da


def check(
    ds: xr.Dataset,
    *,
    max_rel_err: float | None = None,
    at: str | int = "final",
    where: dict[str, list[str]] | None = None,
    baseline: xr.Dataset | None = None,
    rtol: float = 0.1,
    var: str = "rel_err",
) -> list[GateCheck]:
    """Evaluate the gate; one :class:`GateCheck` per selected configuration."""
    if max_rel_err is None and baseline is None:
        raise GateError("give a bound (--max-rel-err) or a baseline (--baseline), or both")
    if max_rel_err is not None and not (np.isfinite(max_rel_err) and max_rel_err >= 0):
        raise GateError(f"--max-rel-err must be a finite number >= 0, got {max_rel_err:g}")
    if not (np.isfinite(rtol) and rtol >= 0):
        raise GateError(f"--rtol must be a finite number >= 0, got {rtol:g}")
    if var not in ds.data_vars:
        raise GateError(f"the result has no variable {var!r}")
    try:
        value = _select(summarise(ds, at, var), where or {})
        base = None if baseline is None else summarise(baseline, at, var)
    except (ValueError, KeyError) as exc:
        raise GateError(str(exc)) from None
    stacked = value.stack(config=CONFIG_DIMS)
    if stacked.size == 0:
        raise GateError("the selection is empty")
    checks = []
    for i in range(stacked.sizes["config"]):
        cfg = {d: _plain(stacked[d].values[i]) for d in CONFIG_DIMS}
        v = float(stacked.values[i])
        limits, reasons = [], []
        if max_rel_err is not None:
            limits.append(max_rel_err)
            reasons.append(f"bound {max_rel_err:.3g}")
        if base is not None:
            try:
                b = float(base.sel(cfg))
            except KeyError:
                raise GateError(f"the baseline has no configuration {cfg}") from None
            limits.append(b * (1 + rtol))
            reasons.append(f"baseline {b:.3g} x (1 + {rtol:g})")
        limit = min(limits)
        ok = bool(np.isfinite(v) and v <= limit)
        checks.append(GateCheck(cfg, v, limit, ok, " and ".join(reasons)))
    return checks


def _plain(x):
    return x.item() if hasattr(x, "item") else x


def write_junit(checks: list[GateCheck], path: str | os.PathLike, at: str | int) -> Path:
    """A JUnit XML report (one testcase per configuration), written atomically."""
    path = Path(path)
    failures = sum(not c.passed for c in checks)
    suite = ET.Element("testsuite", name="precisionlab.gate", tests=str(len(checks)),
                       failures=str(failures))
    for c in checks:
        case = ET.SubElement(suite, "testcase", classname="precisionlab.gate", name=c.name)
        if not c.passed:
            message = f"rel_err[{at}] {c.value:.4g} > {c.limit:.4g}"
            f = ET.SubElement(case, "failure", message=message)
            f.text = c.reason
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise GateError(f"cannot write {str(path)!r}: folder {str(parent)!r} does not exist")
    with atomic_path(path) as tmp:
        ET.ElementTree(suite).write(tmp, encoding="utf-8", xml_declaration=True)
    return path

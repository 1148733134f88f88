"""CI gates on drift results: every selected configuration's metric (by default the
output error) must stay within a bound and/or a tolerance of a baseline result."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from xml.etree import ElementTree as ET

import numpy as np
import xarray as xr

from .atomic import atomic_path, write_problem
from .export import plain_value
from .metrics import HIGHER_IS_BETTER, WORST_HEAD, metric_summary, step_metrics

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
    metric: str = "rel_err"
    at_least: bool = False  # the limit is a lower bound

    def verdict(self, at: str | int) -> str:
        """``"kl[final] = 0.012 (limit 0.01: bound 0.01)"``."""
        return (f"{self.metric}[{at}] = {self.value:.4g} (limit {self.limit:.4g}"
                f"{' from below' if self.at_least else ''}: {self.reason})")

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
        if key == "window" and not (value.isascii() and value.isdigit()):
            raise GateError(f"--where window needs a whole number, got {value!r}")
        out.setdefault(key, []).append(value)
    return out


def _select(da: xr.DataArray, where: dict[str, list[str]]) -> xr.DataArray:
    for key, values in where.items():
        if key not in CONFIG_DIMS:
            raise GateError(f"cannot select by {key!r}: use {', '.join(CONFIG_DIMS)}")
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
    max_value: float | None = None,
    min_value: float | None = None,
) -> list[GateCheck]:
    """Evaluate the gate; one :class:`GateCheck` per selected configuration.

    ``var`` is the per-step metric (default ``rel_err``; a model-level result also
    has ``kl``, ``dlogp_mean``, ``dlogp_p95``, ``top1_agree``, ``ssm_out_rel_err``),
    summarised by ``at``, or ``head_rel_err``: the worst head's final error.
    Lower-is-better metrics take an upper bound (``max_value``,
    or ``max_rel_err`` for ``rel_err``) and pass a baseline when at most
    ``baseline x (1 + rtol)``; ``top1_agree`` takes a lower bound (``min_value``) and
    passes a baseline when at least ``baseline x (1 - rtol)``."""
    if var not in ds.data_vars:
        raise GateError(f"the result has no variable {var!r}")
    if var not in step_metrics(ds) and var != WORST_HEAD:
        raise GateError(f"--metric must be a per-step variable of the result "
                        f"({', '.join(step_metrics(ds))}) or {WORST_HEAD}, got {var!r}")
    if max_rel_err is not None:
        if var != "rel_err" or max_value is not None:
            raise GateError("--max-rel-err bounds rel_err; bound other metrics with --max")
        max_value = max_rel_err
    higher = var in HIGHER_IS_BETTER
    wrong = max_value if higher else min_value
    if wrong is not None:
        raise GateError(f"{var}: {'more' if higher else 'less'} is better, so bound it with "
                        f"{'--min' if higher else '--max'}")
    bound = min_value if higher else max_value
    if bound is None and baseline is None:
        flag = "--min" if higher else ("--max-rel-err" if var == "rel_err" else "--max")
        raise GateError(f"give a bound ({flag}) or a baseline (--baseline), or both")
    if bound is not None and not (np.isfinite(bound) and bound >= 0):
        flag = "--min" if higher else ("--max-rel-err" if max_rel_err is not None else "--max")
        raise GateError(f"{flag} must be a finite number >= 0, got {bound:g}")
    if not (np.isfinite(rtol) and rtol >= 0):
        raise GateError(f"--rtol must be a finite number >= 0, got {rtol:g}")
    try:
        value = _select(metric_summary(ds, at, var), where or {})
        base = None if baseline is None else metric_summary(baseline, at, var)
    except (ValueError, KeyError) as exc:
        raise GateError(str(exc)) from None
    stacked = value.stack(config=CONFIG_DIMS)
    if stacked.size == 0:
        raise GateError("the selection is empty")
    checks = []
    for i in range(stacked.sizes["config"]):
        cfg = {d: plain_value(stacked[d].values[i]) for d in CONFIG_DIMS}
        v = float(stacked.values[i])
        limits, reasons = [], []
        if bound is not None:
            limits.append(bound)
            reasons.append(f"bound {bound:.3g}")
        if base is not None:
            try:
                b = float(base.sel(cfg))
            except KeyError:
                name = " ".join(f"{k}={v}" for k, v in cfg.items())
                raise GateError(f"the baseline has no configuration {name}") from None
            limits.append(b * (1 - rtol) if higher else b * (1 + rtol))
            reasons.append(f"baseline {b:.3g} x (1 {'-' if higher else '+'} {rtol:g})")
        limit = max(limits) if higher else min(limits)
        ok = bool(np.isfinite(v) and (v >= limit if higher else v <= limit))
        checks.append(GateCheck(cfg, v, limit, ok, " and ".join(reasons), var, higher))
    return checks


def check_report_path(path: str | os.PathLike) -> Path:
    """``path`` if a report can be written there (its folder exists, no folder is
    there), else a GateError; the command line checks it before reading results."""
    problem = write_problem(path)
    if problem:
        raise GateError(problem)
    return Path(path)


def write_junit(checks: list[GateCheck], path: str | os.PathLike, at: str | int) -> Path:
    """A JUnit XML report (one testcase per configuration), written atomically."""
    path = Path(path)
    failures = sum(not c.passed for c in checks)
    suite = ET.Element("testsuite", name="precisionlab.gate", tests=str(len(checks)),
                       failures=str(failures))
    for c in checks:
        case = ET.SubElement(suite, "testcase", classname="precisionlab.gate", name=c.name)
        if not c.passed:
            message = f"{c.metric}[{at}] {c.value:.4g} {'<' if c.at_least else '>'} {c.limit:.4g}"
            f = ET.SubElement(case, "failure", message=message)
            f.text = c.reason
    check_report_path(path)
    with atomic_path(path) as tmp:
        ET.ElementTree(suite).write(tmp, encoding="utf-8", xml_declaration=True)
    return path

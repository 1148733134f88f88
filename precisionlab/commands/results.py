"""Commands on saved results: plot, show and gate."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from .advice import advice_doc, print_advice
from .common import (
    RATIO_TITLE,
    SUMMARY_CAPTION,
    ResultSummaryError,
    err,
    fail,
    guarded,
    json_ready,
    markdown_table,
    out,
    parse_at,
    ratio_cells,
    ratio_records,
    ratio_table,
    summary_cells,
    summary_table,
    table_title,
)


class PlotKind(str, Enum):
    curves = "curves"
    window = "window"
    tradeoff = "tradeoff"
    heads = "heads"


def plot(
    result: Annotated[Path, typer.Argument(help="A result file (.nc, .zarr, .csv).")],
    kind: Annotated[PlotKind, typer.Option(
        help="curves: error per step; window: final error per window and format; tradeoff: "
             "final error against modelled memory traffic; heads: each head's final error "
             "against its memory.")] = PlotKind.curves,
    out_path: Annotated[Path, typer.Option("--out", "-o", help="PNG to write.")] = Path(
        "drift.png"),
    metric: Annotated[str, typer.Option(
        help="Per-step variable to draw: rel_err, or at the model level kl, top1_agree, "
             "dlogp_p95, ...")] = "rel_err",
) -> None:
    """Draw a result: drift curves, window map, error / traffic trade-off or heads."""
    from precisionlab.export import load_result
    from precisionlab.plots import save_plot

    guarded(lambda: out.print(
        f"wrote {save_plot(load_result(result), out_path, kind.value, metric)}"))


SHOWN_ATTRS = ("model", "kind", "trace", "weights", "steps", "batch", "seed",
               "checkpoint_format", "ring_dtype", "dynamics", "backend", "device",
               "version_precisionlab", "command", "notes")


def show(
    result: Annotated[Path, typer.Argument(help="A result file (.nc, .zarr, .csv).")],
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print where it came from and one record per configuration as "
                       "JSON.")] = False,
    as_markdown: Annotated[bool, typer.Option(
        "--markdown", help="Print the summary as a Markdown table (for a CI job's summary "
                           "page or a pull request).")] = False,
) -> None:
    """Print a saved result's summary table and where it came from."""
    if as_json and as_markdown:
        fail("give --json or --markdown, not both")
    from precisionlab.export import load_result, plain_value
    from precisionlab.metrics import summary_records

    def run():
        ds = load_result(result)
        try:
            return ds, summary_records(ds)
        except (KeyError, ValueError) as exc:
            raise ResultSummaryError(f"cannot summarise {str(result)!r}: {exc}") from None

    ds, rows = guarded(run)
    about = {k: plain_value(ds.attrs[k]) for k in SHOWN_ATTRS if k in ds.attrs}
    ratios = ds["final_ratio"] if "final_ratio" in ds else None
    if as_json:
        doc = {"result": str(result), **about, "configurations": rows}
        if ratios is not None:
            doc["shared_over_split"] = ratio_records(ds)
        if "meets_budget" in ds:
            doc["advice"] = advice_doc(ds)
        print(json.dumps(json_ready(doc), indent=2))
        return
    if as_markdown:
        print(_markdown(ds, about))
        return
    for k, v in about.items():
        out.print(escape(f"{k}: {v}"), highlight=False)
    out.print(summary_table(ds, table_title(ds)))
    if ratios is not None:
        out.print(ratio_table(ds))
    if "meets_budget" in ds:
        print_advice(ds, as_json=False)


def _markdown(ds, about: dict) -> str:
    """A result's summary as Markdown: a heading, the table, its caption and its command."""
    parts = [f"### {table_title(ds)}", "", markdown_table(*summary_cells(ds)), "",
             SUMMARY_CAPTION + "."]
    if "final_ratio" in ds:
        parts += ["", f"{RATIO_TITLE}:", "",
                  markdown_table(["format", "window", "ratio"], ratio_cells(ds))]
    if "meets_budget" in ds:
        doc = advice_doc(ds)
        rec = doc["recommended"]
        pick = (f"{rec['design']} {rec['format']} L = {rec['window']}" if rec else
                "no configuration meets the budget")
        parts += ["", f"Advice ({doc['budget']}): {pick}."]
    if "command" in about:
        parts += ["", f"`{about['command']}`"]
    if "notes" in about:
        parts += ["", f"Note: {about['notes']}"]
    return "\n".join(parts)


def gate(
    result: Annotated[Path, typer.Argument(help="A result file (.nc, .zarr, .csv).")],
    max_rel_err: Annotated[float | None, typer.Option(help="Bound on the error.")] = None,
    metric: Annotated[str, typer.Option(
        help="Per-step variable to gate: rel_err, or at the model level kl, dlogp_mean, "
             "dlogp_p95, top1_agree, ssm_out_rel_err, ...; or head_rel_err, the worst "
             "head's final error.")] = "rel_err",
    max_value: Annotated[float | None, typer.Option(
        "--max", help="Upper bound on --metric.")] = None,
    min_value: Annotated[float | None, typer.Option(
        "--min", help="Lower bound on --metric (for top1_agree).")] = None,
    at: Annotated[str, typer.Option(help="final, max, mean or a step index.")] = "final",
    where: Annotated[list[str] | None, typer.Option(
        help="Select configurations, KEY=VALUE (design, format, window); repeatable.")] = None,
    baseline: Annotated[Path | None, typer.Option(help="Earlier result to compare to.")] = None,
    rtol: Annotated[float, typer.Option(
        help="Allowed relative rise over the baseline (a drop, for --min metrics).")] = 0.1,
    junit: Annotated[Path | None, typer.Option(help="Write a JUnit XML report.")] = None,
) -> None:
    """Check a result in CI: exit 0 if all pass, 1 if any fails, 2 on bad input.

    All selected configurations are checked."""
    from precisionlab import gates
    from precisionlab.export import load_result

    at_value = parse_at(at)
    if junit is not None and any(p is not None and junit.resolve() == p.resolve()
                                 for p in (result, baseline)):
        fail(f"--junit {str(junit)!r} would overwrite a result being gated")
    if junit is not None:
        guarded(lambda: gates.check_report_path(junit))

    def run() -> list:
        ds = load_result(result)
        base = load_result(baseline) if baseline is not None else None
        checks = gates.check(ds, max_rel_err=max_rel_err, at=at_value,
                             where=gates.parse_where(where), baseline=base, rtol=rtol,
                             var=metric, max_value=max_value, min_value=min_value)
        if junit is not None:
            gates.write_junit(checks, junit, at_value)
        return checks, ds.attrs.get("notes")

    checks, notes = guarded(run)
    if notes:  # e.g. windows that never flushed: their verdicts say little
        err.print(escape(f"note: {notes}"), highlight=False, soft_wrap=True)
    for c in checks:
        mark = "[green]PASS[/]" if c.passed else "[bold red]FAIL[/]"
        out.print(f"{mark} " + escape(f"{c.name}: {c.verdict(at)}"), highlight=False)
    failed = sum(not c.passed for c in checks)
    out.print(f"{len(checks) - failed} passed, {failed} failed")
    raise typer.Exit(1 if failed else 0)

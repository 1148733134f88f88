"""The advise command: the cheapest configuration within a drift budget."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from .common import (
    Backend,
    BackendOpt,
    BatchOpt,
    DesignOpt,
    Device,
    DeviceOpt,
    Dynamics,
    ModelOpt,
    PlotOpt,
    RingDtype,
    StepsOpt,
    decode_study,
    default_out,
    err,
    fail,
    guarded,
    json_ready,
    out,
    parse_at,
    study_options,
)

STUDY_PARAMS = ("model", "format", "window", "design", "checkpoint_format", "steps", "batch",
                "seed", "dynamics", "ring_dtype", "backend", "device")


def advise(
    ctx: typer.Context,
    max_value: Annotated[float | None, typer.Option(
        "--max", help="Budget: the most --metric may reach (errors, divergences).")] = None,
    min_value: Annotated[float | None, typer.Option(
        "--min", help="Budget: the least --metric may fall to (top1_agree).")] = None,
    metric: Annotated[str, typer.Option(
        help="Per-step variable held to the budget: rel_err, rel_err_max, abs_err_max; "
             "head_rel_err (the worst head's final error); from a model-level result also "
             "kl, top1_agree, ...")] = "rel_err",
    at: Annotated[str, typer.Option(help="final, max, mean or a step index.")] = "final",
    confident: Annotated[bool, typer.Option(
        "--confident", help="The final error's 95% interval over the sequences must lie "
                            "within the budget, not only its mean.")] = False,
    from_result: Annotated[Path | None, typer.Option(
        "--from", help="Advise on a saved result instead of running the study.")] = None,
    model: ModelOpt = "nemotron-3-nano-4b",
    format: Annotated[list[str] | None, typer.Option(
        "--format", "-f",
        help="Read format (repeatable; all: every format). Default: fp8-e4m3 and nvfp4.",
    )] = None,
    window: Annotated[list[int] | None, typer.Option(
        "--window", "-L", help="Window (repeatable). Default: 4 16 64.")] = None,
    design: DesignOpt = None,
    checkpoint_format: Annotated[list[str] | None, typer.Option(
        help="Split designs' checkpoint (repeatable). Default: fp32 and fp16-sr.")] = None,
    steps: StepsOpt = 1024,
    batch: BatchOpt = 2,
    seed: int = 0,
    dynamics: Dynamics = Dynamics.trained,
    ring_dtype: RingDtype = RingDtype.bf16,
    backend: BackendOpt = Backend.auto,
    device: DeviceOpt = Device.auto,
    out_path: Annotated[Path | None, typer.Option(
        "--out", "-o", help="Result file (.nc, .zarr, .csv). Default: advise-<model>.nc; with "
                            "--from none.")] = None,
    plot: PlotOpt = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print the advice as JSON instead of the table.")] = False,
) -> None:
    """The configuration with the fewest bytes per step within a drift budget.

    Exit 0 with a recommendation, 1 if none meets the budget, 2 on bad input."""
    from precisionlab.export import check_writable, load_result, save_result
    from precisionlab.plots import check_plot_path, save_plot
    from precisionlab.studies import advise as study
    from precisionlab.studies import recommend
    from precisionlab.studies.advise import DEFAULT_CHECKPOINTS, DEFAULT_FORMATS, DEFAULT_WINDOWS

    at_value = parse_at(at)
    budget = dict(max_value=max_value, min_value=min_value, metric=metric, at=at_value,
                  confident=confident)
    if from_result is not None:
        # by name: typer may carry its own copy of click's ParameterSource
        given = [p for p in STUDY_PARAMS
                 if getattr(ctx.get_parameter_source(p), "name", "DEFAULT") != "DEFAULT"]
        if given:
            fail(f"--{given[0].replace('_', '-')} sets up a study run; with --from the saved "
                 "result is advised as it is")

    def run():
        if out_path is not None:
            check_writable(out_path)
        if plot is not None:
            check_plot_path(plot)
        if from_result is not None:
            return recommend(load_result(from_result), **budget)
        opts = study_options(model, format or list(DEFAULT_FORMATS),
                              window or list(DEFAULT_WINDOWS),
                              checkpoint_format or list(DEFAULT_CHECKPOINTS), steps, batch, seed,
                              dynamics, ring_dtype, backend, device)
        opts["designs"] = design or ["shared", "split"]
        return decode_study(ctx, study, **opts, **budget)

    ds = guarded(run)
    found = print_advice(ds, as_json)
    said = err if as_json else out  # --json keeps standard output to the JSON document
    target = out_path or (None if from_result is not None else default_out(model, "advise"))
    if target is not None:
        said.print(f"wrote {guarded(lambda: save_result(ds, target))}")
    if plot is not None:
        said.print(f"wrote {guarded(lambda: save_plot(ds, plot, 'tradeoff', metric=metric))}")
    raise typer.Exit(0 if found else 1)


def _budget_text(ds) -> tuple[str, str]:
    """An advised result's metric (``rel_err[final]``) and budget (``... <= 0.05``)."""
    a = ds.attrs
    what = f"{a['advice_metric']}[{a['advice_at']}]"
    sign = ">=" if a["advice_direction"] == "min" else "<="
    return what, f"{what} {sign} {float(a['advice_bound']):g}"


def advice_doc(ds) -> dict:
    """An advised result's budget, pick and configurations (cheapest first), for JSON."""
    from precisionlab.studies import recommendation
    from precisionlab.studies.advise import advice_table

    return {"budget": _budget_text(ds)[1], "confident": bool(ds.attrs.get("advice_confident")),
            "recommended": recommendation(ds), "configurations": advice_table(ds)}


def print_advice(ds, as_json: bool) -> bool:
    """Print an advised result (table or JSON); whether it recommends a configuration."""
    from precisionlab.designs import CONVENTIONAL_FP32_BYTES
    from precisionlab.studies import recommendation
    from precisionlab.studies.advise import advice_table

    rows, best = advice_table(ds), recommendation(ds)
    a = ds.attrs
    what, budget = _budget_text(ds)
    higher = a["advice_direction"] == "min"
    held = what + (" + 95%" if a.get("advice_confident") else "")  # the number held to it
    if as_json:
        print(json.dumps(json_ready({
            "model": a.get("model"), "steps": a.get("steps"), "batch": a.get("batch"),
            **advice_doc(ds)}), indent=2))
        return best is not None
    title = (f"advice for {a.get('model', '?')}, {a.get('steps', '?')} steps, batch "
             f"{a.get('batch', '?')}: {budget}")
    table = Table(title=escape(title), title_justify="left",
                  caption="cheapest first; B/elt: modelled bytes per state element per step; "
                          "x fp32: conventional fp32's 8 bytes over B/elt",
                  caption_justify="left")
    for col in ("design", "format", "window", "B/elt", "x fp32", held, "meets", "frontier"):
        table.add_column(escape(col), justify="left" if col in ("design", "format") else "right")
    for r in rows:
        pick = best is not None and all(r[k] == best[k] for k in ("design", "format", "window"))
        style = "bold green" if pick else None
        table.add_row(r["design"], r["format"], str(r["window"]), f"{r['bytes_per_step']:.2f}",
                      f"{CONVENTIONAL_FP32_BYTES / r['bytes_per_step']:.1f}",
                      f"{r['value']:.3e}",
                      "yes" if r["meets_budget"] else "no", "yes" if r["frontier"] else "",
                      style=style)
    out.print(table)
    if best is None:
        closest = min(rows, key=lambda r: -r["value"] if higher else r["value"])
        out.print(escape(f"no configuration meets {budget}; the closest is {closest['design']} "
                         f"{closest['format']} L={closest['window']} at "
                         f"{closest['value']:.3g}"), highlight=False)
        return False
    row = next(r for r in rows if all(r[k] == best[k] for k in ("design", "format", "window")))
    out.print(escape(f"recommended: {row['design']} {row['format']} L={row['window']}: "
                     f"{row['bytes_per_step']:.2f} B/elt "
                     f"({CONVENTIONAL_FP32_BYTES / row['bytes_per_step']:.1f}x less "
                     f"traffic than conventional fp32), {held} = {row['value']:.3g}"),
              highlight=False)
    return True

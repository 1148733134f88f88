"""The ``precisionlab`` command line: drift studies, plots, CI gates, formats,
model presets and GPU benchmarks."""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

app = typer.Typer(
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    help="Numerical-precision studies of SSM decode state (Mamba-2, Gated DeltaNet).",
)
trace_app = typer.Typer(no_args_is_help=True, help="Save and inspect layer-input traces.")
app.add_typer(trace_app, name="trace")
# wide enough for the tables when the output is a file or a CI log
out = Console() if sys.stdout.isatty() else Console(width=160)
err = Console(stderr=True) if sys.stderr.isatty() else Console(stderr=True, width=160)

USAGE_EXIT = 2


class Dynamics(str, Enum):
    trained = "trained"
    init = "init"


class RingDtype(str, Enum):
    bf16 = "bf16"
    fp16 = "fp16"
    fp32 = "fp32"


class Backend(str, Enum):
    auto = "auto"
    torch = "torch"
    triton = "triton"


class Device(str, Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class Level(str, Enum):
    layer = "layer"
    model = "model"


class ModelDtype(str, Enum):
    fp32 = "fp32"
    bf16 = "bf16"


class PlotKind(str, Enum):
    curves = "curves"
    window = "window"
    tradeoff = "tradeoff"
    heads = "heads"


def _usage_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean 'bad input': reported in one line, exit 2."""
    from precisionlab import export, gates, plots
    from precisionlab.designs import DesignError
    from precisionlab.engine import EngineError
    from precisionlab.formats import FormatError, UnknownFormatError
    from precisionlab.models import ModelError
    from precisionlab.presets import UnknownModelError
    from precisionlab.studies import StudyError
    from precisionlab.traces import TraceError

    return (StudyError, DesignError, EngineError, TraceError, FormatError, UnknownFormatError,
            UnknownModelError, export.ResultError, plots.PlotError, gates.GateError, ModelError,
            ResultSummaryError)


def fail(message: str, code: int = USAGE_EXIT) -> None:
    err.print("[bold red]error:[/] " + escape(message), highlight=False, soft_wrap=True)
    raise typer.Exit(code)


# what numpy and torch say of an array too large to allocate at all (a size past 64 bits)
TOO_LARGE = ("array is too big", "Maximum allowed dimension exceeded",
             "Storage size calculation overflowed", "Overflow when unpacking long long")


def _out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is a failed allocation (host or GPU memory), or one too large to
    try."""
    text = str(exc)
    if isinstance(exc, MemoryError):
        return True
    if isinstance(exc, RuntimeError) and ("can't allocate memory" in text
                                          or "out of memory" in text.lower()):
        return True
    return isinstance(exc, RuntimeError | ValueError | TypeError) and any(
        t in text for t in TOO_LARGE)


def guarded(fn: Callable[[], object]) -> object:
    """Run ``fn``; turn the project's bad-input errors, and a run too large for the
    memory, into one line and exit 2."""
    try:
        return fn()
    except _usage_errors() as exc:
        fail(str(exc))
    except (MemoryError, RuntimeError, ValueError, TypeError) as exc:
        if not _out_of_memory(exc):
            raise
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        fail(f"not enough memory for this run ({first}); try a smaller --batch or --steps")


def _progress():
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    # off where stderr is not a terminal: there a transient bar draws nothing but the
    # newline it leaves on exit (a blank line before an error message or in a log)
    return Progress("[progress.description]{task.description}", BarColumn(),
                    MofNCompleteColumn(), TimeRemainingColumn(), console=err, transient=True,
                    disable=not err.is_terminal)


def _summary_table(ds, title: str) -> Table:
    from precisionlab.metrics import summary_records

    rows = summary_records(ds)
    model_level = "kl" in ds
    table = Table(title=title, title_justify="left",
                  caption="B/elt: modelled bytes moved per state element per step "
                          "(conventional fp32: 8); ± 95%: half width of the final error's "
                          "interval over the batch's sequences (Student t); frontier: no "
                          "other row has both less traffic and a lower final error",
                  caption_justify="left")
    cols = ["design", "format", "window", "B/elt", "final", "± 95%", "peak", "mean", "growth",
            "frontier"]
    if model_level:
        cols += ["KL (mean)", "top-1 agree", "first divergence"]
    for col in cols:
        table.add_column(col, justify="right" if col not in ("design", "format") else "left")
    for r in rows:
        cells = [r["design"], r["format"], str(r["window"]), f"{r['bytes_per_step']:.2f}",
                 f"{r['final']:.3e}", _half_width(r["final_ci95"]), f"{r['peak']:.3e}",
                 f"{r['mean']:.3e}", f"{r['growth']:+.2f}", "yes" if r["frontier"] else ""]
        if model_level:
            first = r["first_divergence"]
            cells += [f"{r['kl_mean']:.3e}", f"{r['top1_agree_mean']:.3f}",
                      "never" if first is None else str(first)]
        table.add_row(*cells)
    return table


def _half_width(half: float) -> str:
    return "-" if half != half else f"{half:.1e}"


def _ratio_table(ds) -> Table:
    """A compare result's shared / split ratio of final errors per format and window."""
    table = Table(title="shared / split final error (above 1: split drifts less)",
                  title_justify="left")
    for col in ("format", "window", "ratio"):
        table.add_column(col)
    for f in ds["format"].values:
        for w in ds["window"].values:
            r = float(ds["final_ratio"].sel(format=f, window=w))
            table.add_row(str(f), str(int(w)), f"{r:.2f}")
    return table


def _table_title(ds) -> str:
    return (f"{ds.attrs.get('title', 'precisionlab result')} — {ds.attrs.get('steps', '?')} "
            f"steps, batch {ds.attrs.get('batch', '?')}, relative output error")


def command_line(ctx: typer.Context) -> str:
    """The running command with every option spelled out (defaults included), so a
    result file says exactly how to reproduce it."""
    import shlex

    words = ["precisionlab", *ctx.command_path.split()[1:]]
    for param in ctx.command.params:
        value = ctx.params.get(param.name)
        if value is None or getattr(param, "param_type_name", "") != "option":
            continue
        flag = max(param.opts, key=len)
        for v in value if isinstance(value, list | tuple) else [value]:
            words += [flag, str(v.value if isinstance(v, Enum) else v)]
    return shlex.join(words)


def _decode(ctx: typer.Context, study: Callable, **kwargs):
    """Run ``study`` with a progress bar over its decode steps and the command line
    recorded in its result."""
    with _progress() as progress:
        task = progress.add_task("decoding", total=None)

        def tick(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        return study(progress=tick, command=command_line(ctx), **kwargs)


def _run_study(ctx: typer.Context, study: Callable, out_path: Path | None,
               plot_path: Path | None, plot_kind: str, **kwargs):
    from precisionlab.export import check_writable, save_result
    from precisionlab.plots import check_plot_path, save_plot

    if out_path is not None:
        check_writable(out_path)
    if plot_path is not None:
        check_plot_path(plot_path)
    ds = _decode(ctx, study, **kwargs)
    out.print(_summary_table(ds, _table_title(ds)))
    if out_path is not None:
        out.print(f"wrote {save_result(ds, out_path)}")
    if plot_path is not None:
        out.print(f"wrote {save_plot(ds, plot_path, plot_kind)}")
    return ds


BackendOpt = Annotated[Backend, typer.Option(
    help="Runs the designs: torch emulation, or the fused Triton kernels (CUDA); auto takes "
         "the kernels on CUDA.")]
DeviceOpt = Annotated[Device, typer.Option(help="auto takes CUDA where there is a GPU.")]
ModelOpt = Annotated[str, typer.Option("--model", "-m", help="Preset name or trace file.")]
FormatOpt = Annotated[list[str] | None, typer.Option(
    "--format", "-f", help="Read format (repeatable). Default: fp8-e4m3 and nvfp4.")]
WindowOpt = Annotated[list[int] | None, typer.Option("--window", "-L", help="Window (repeatable).")]
StepsOpt = Annotated[int, typer.Option(help="Decode steps.")]
BatchOpt = Annotated[int, typer.Option(help="Sequences per batch.")]
OutOpt = Annotated[Path | None, typer.Option(
    "--out", "-o", help="Result file: .nc, .zarr or .csv. Default: drift-<model>.nc")]
PlotOpt = Annotated[Path | None, typer.Option("--plot", help="Also write a PNG figure.")]

DesignOpt = Annotated[list[str] | None, typer.Option(
    "--design", "-d", help="shared and/or split (repeatable).")]
CheckpointOpt = Annotated[list[str] | None, typer.Option(
    help="Split designs' checkpoint (repeatable: one split design per format, named "
         "split-<format>). Default: fp32.")]

DEFAULT_FORMATS = ["fp8-e4m3", "nvfp4"]


def _study_options(model, formats, windows, checkpoint_format, steps, batch, seed, dynamics,
                   ring_dtype, backend, device) -> dict:
    return dict(model=model, formats=formats or DEFAULT_FORMATS, windows=windows or [16],
                checkpoint_format=checkpoint_format or ["fp32"], steps=steps, batch=batch,
                seed=seed, dynamics=dynamics.value, ring_dtype=ring_dtype.value,
                backend=backend.value, device=device.value)


def _default_out(model: str, study: str) -> Path:
    return Path(f"{study}-{Path(model).stem}.nc")


@app.command()
def drift(
    ctx: typer.Context,
    model: Annotated[str, typer.Option(
        "--model", "-m", help="Preset name or trace file; with --level model also a local "
                              "Hugging Face checkpoint directory.")] = "nemotron-3-nano-4b",
    format: FormatOpt = None,
    design: DesignOpt = None,
    window: WindowOpt = None,
    checkpoint_format: CheckpointOpt = None,
    steps: StepsOpt = 1024,
    batch: BatchOpt = 2,
    seed: int = 0,
    dynamics: Dynamics = Dynamics.trained,
    ring_dtype: RingDtype = RingDtype.bf16,
    backend: BackendOpt = Backend.auto,
    device: DeviceOpt = Device.auto,
    out_path: OutOpt = None,
    plot: PlotOpt = None,
    level: Annotated[Level, typer.Option(
        help="layer: one SSM layer on a trace; model: a whole hybrid model (transformers) "
             "with every SSM layer's state under the design.")] = Level.layer,
    layers: Annotated[int | None, typer.Option(
        help="Model level: number of SSM layers to build (preset) or keep (checkpoint).")] = None,
    prompt: Annotated[Path | None, typer.Option(
        help="Model level: a text file tokenized with the checkpoint's tokenizer "
             "(default: seeded token ids).")] = None,
    dtype: Annotated[ModelDtype, typer.Option(help="Model level: weights dtype.")] = (
        ModelDtype.fp32),
) -> None:
    """Drift of each (design, format, window) against the fp64 reference."""
    opts = _study_options(model, format, window, checkpoint_format, steps, batch, seed, dynamics,
                          ring_dtype, backend, device)
    opts["designs"] = design or ["shared", "split"]
    if level is Level.model:
        from precisionlab.studies.model_drift import model_drift as study

        if dynamics is not Dynamics.trained:
            fail("--dynamics applies to --level layer (a whole model decodes its own inputs)")
        opts.pop("dynamics")
        opts.update(layers=layers, prompt=prompt, dtype=dtype.value)
    else:
        from precisionlab.studies import drift as study

        if layers is not None or prompt is not None:
            fail("--layers and --prompt need --level model")
    guarded(lambda: _run_study(ctx, study, out_path or _default_out(model, "drift"), plot,
                               "curves", **opts))


@app.command()
def compare(
    ctx: typer.Context,
    model: ModelOpt = "nemotron-3-nano-4b",
    format: FormatOpt = None,
    window: WindowOpt = None,
    checkpoint_format: CheckpointOpt = None,
    steps: StepsOpt = 1024,
    batch: BatchOpt = 2,
    seed: int = 0,
    dynamics: Dynamics = Dynamics.trained,
    ring_dtype: RingDtype = RingDtype.bf16,
    backend: BackendOpt = Backend.auto,
    device: DeviceOpt = Device.auto,
    out_path: OutOpt = None,
    plot: PlotOpt = None,
) -> None:
    """Shared vs split at equal read format: ratio of their errors."""
    from precisionlab.studies import compare as study

    opts = _study_options(model, format, window, checkpoint_format, steps, batch, seed, dynamics,
                          ring_dtype, backend, device)

    def run():
        ds = _run_study(ctx, study, out_path or _default_out(model, "compare"), plot, "curves",
                        **opts)
        out.print(_ratio_table(ds))

    guarded(run)


@app.command("window")
def window_cmd(
    ctx: typer.Context,
    model: ModelOpt = "nemotron-3-nano-4b",
    format: FormatOpt = None,
    window: Annotated[list[int] | None, typer.Option(
        "--window", "-L", help="Windows to sweep. Default: 1 4 8 16 32 64.")] = None,
    design: DesignOpt = None,
    checkpoint_format: CheckpointOpt = None,
    steps: StepsOpt = 1024,
    batch: BatchOpt = 2,
    seed: int = 0,
    dynamics: Dynamics = Dynamics.trained,
    ring_dtype: RingDtype = RingDtype.bf16,
    backend: BackendOpt = Backend.auto,
    device: DeviceOpt = Device.auto,
    out_path: OutOpt = None,
    plot: PlotOpt = None,
) -> None:
    """Sweep the window L: final error and growth per design and format."""
    from precisionlab.studies import window_sweep as study
    from precisionlab.studies.window import DEFAULT_WINDOWS

    opts = _study_options(model, format, window or list(DEFAULT_WINDOWS), checkpoint_format,
                          steps, batch, seed, dynamics, ring_dtype, backend, device)
    opts["designs"] = design or ["shared", "split"]
    guarded(lambda: _run_study(ctx, study, out_path or _default_out(model, "window"), plot,
                               "window", **opts))


@app.command()
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
    """Draw a result: drift curves, the window map, the error / traffic trade-off, or
    the error per head."""
    from precisionlab.export import load_result
    from precisionlab.plots import save_plot

    guarded(lambda: out.print(
        f"wrote {save_plot(load_result(result), out_path, kind.value, metric)}"))


SHOWN_ATTRS = ("model", "kind", "trace", "weights", "steps", "batch", "seed",
               "checkpoint_format", "ring_dtype", "dynamics", "backend", "device",
               "version_precisionlab", "command")


@app.command()
def show(
    result: Annotated[Path, typer.Argument(help="A result file (.nc, .zarr, .csv).")],
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print where it came from and one record per configuration as "
                       "JSON.")] = False,
) -> None:
    """Print a saved result's summary table and where it came from."""
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
            doc["shared_over_split"] = [
                {"format": str(f), "window": int(w),
                 "final_ratio": float(ratios.sel(format=f, window=w))}
                for f in ds["format"].values for w in ds["window"].values]
        if "meets_budget" in ds:
            doc["advice"] = _advice_doc(ds)
        print(json.dumps(_json_ready(doc), indent=2))
        return
    for k, v in about.items():
        out.print(escape(f"{k}: {v}"), highlight=False)
    out.print(_summary_table(ds, _table_title(ds)))
    if ratios is not None:
        out.print(_ratio_table(ds))
    if "meets_budget" in ds:
        _print_advice(ds, as_json=False)


def _json_ready(obj):
    """``obj`` with numpy scalars as Python numbers and NaN / inf as null (strict JSON)."""
    from precisionlab.export import plain_value

    if isinstance(obj, dict):
        return {k: _json_ready(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_json_ready(v) for v in obj]
    obj = plain_value(obj)
    return None if isinstance(obj, float) and not math.isfinite(obj) else obj


def _parse_at(at: str) -> str | int:
    """``--at``: final, max, mean, or a step index as an int (exit 2 otherwise)."""
    if at in ("final", "max", "mean"):
        return at
    if not re.fullmatch(r"-?[0-9]+", at):  # ASCII digits: str.isdigit passes '³', '٣'
        fail(f"--at must be final, max, mean or a step index, got {at!r}")
    return int(at)


class ResultSummaryError(ValueError):
    """A result file without the variables a summary needs."""


@app.command()
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
    """Check a result in CI: exit 0 if all selected configurations pass, 1 if any fails,
    2 on bad input."""
    from precisionlab import gates
    from precisionlab.export import load_result

    at_value = _parse_at(at)
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
        return checks

    checks = guarded(run)
    for c in checks:
        mark = "[green]PASS[/]" if c.passed else "[bold red]FAIL[/]"
        out.print(f"{mark} " + escape(f"{c.name}: {c.verdict(at)}"), highlight=False)
    failed = sum(not c.passed for c in checks)
    out.print(f"{len(checks) - failed} passed, {failed} failed")
    raise typer.Exit(1 if failed else 0)


STUDY_PARAMS = ("model", "format", "window", "design", "checkpoint_format", "steps", "batch",
                "seed", "dynamics", "ring_dtype", "backend", "device")


@app.command()
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
        "--format", "-f", help="Read format (repeatable). Default: fp8-e4m3 and nvfp4.")] = None,
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
    """The configuration that moves the fewest bytes per step within a drift budget:
    exit 0 with a recommendation, 1 if none meets the budget, 2 on bad input."""
    from precisionlab.export import check_writable, load_result, save_result
    from precisionlab.plots import check_plot_path, save_plot
    from precisionlab.studies import advise as study
    from precisionlab.studies import recommend
    from precisionlab.studies.advise import DEFAULT_CHECKPOINTS, DEFAULT_FORMATS, DEFAULT_WINDOWS

    at_value = _parse_at(at)
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
        opts = _study_options(model, format or list(DEFAULT_FORMATS),
                              window or list(DEFAULT_WINDOWS),
                              checkpoint_format or list(DEFAULT_CHECKPOINTS), steps, batch, seed,
                              dynamics, ring_dtype, backend, device)
        opts["designs"] = design or ["shared", "split"]
        return _decode(ctx, study, **opts, **budget)

    ds = guarded(run)
    found = _print_advice(ds, as_json)
    said = err if as_json else out  # --json keeps standard output to the JSON document
    target = out_path or (None if from_result is not None else _default_out(model, "advise"))
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


def _advice_doc(ds) -> dict:
    """An advised result's budget, pick and configurations (cheapest first), for JSON."""
    from precisionlab.studies import recommendation
    from precisionlab.studies.advise import advice_table

    return {"budget": _budget_text(ds)[1], "confident": bool(ds.attrs.get("advice_confident")),
            "recommended": recommendation(ds), "configurations": advice_table(ds)}


def _print_advice(ds, as_json: bool) -> bool:
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
        print(json.dumps(_json_ready({
            "model": a.get("model"), "steps": a.get("steps"), "batch": a.get("batch"),
            **_advice_doc(ds)}), indent=2))
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


@app.command()
def models(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """List the model presets (SSM layer shapes)."""
    from precisionlab.presets import PRESETS

    if as_json:
        print(json.dumps([p.as_dict() for p in PRESETS.values()], indent=2))
        return
    table = Table(title="model presets (one SSM layer)", title_justify="left")
    for col in ("name", "kind", "heads", "head dim", "state dim", "groups / k-heads",
                "SSM layers", "state MiB (fp32)", "source"):
        table.add_column(col)
    for p in PRESETS.values():
        src = p.source + (" [yellow](lower confidence)[/]" if p.confidence == "low" else "")
        table.add_row(p.name, p.kind, str(p.heads), str(p.head_dim), str(p.state_dim),
                      str(p.groups), str(p.ssm_layers), f"{p.state_elements * 4 / 2**20:.2f}",
                      src)
    out.print(table)


@app.command()
def formats(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """List the state formats."""
    from precisionlab import formats as fmts
    from precisionlab.formats.info import describe

    rows = [describe(n) for n in fmts.names()]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table(title="state formats", title_justify="left")
    for col in ("name", "bits/element", "block", "scale", "rounding", "max normal",
                "min subnormal"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["name"], f"{r['bits_per_element']:.3f}", str(r["block"] or "-"),
                      r["scale"], r["rounding"], f"{r['max_normal']:.6g}",
                      f"{r['min_subnormal']:.6g}")
    out.print(table)


class BenchWhat(str, Enum):
    engine = "engine"
    mamba2 = "mamba2"
    gdn = "gdn"


class Phases(str, Enum):
    aligned = "aligned"
    staggered = "staggered"


@app.command()
def bench(
    what: Annotated[BenchWhat, typer.Option(
        help="engine: emulation steps/s (CPU or GPU); mamba2 / gdn: Triton kernels vs peers "
             "(needs CUDA).")] = BenchWhat.engine,
    model: Annotated[list[str] | None, typer.Option(
        "--model", "-m", help="Preset (repeatable). Default depends on --what.")] = None,
    batch: Annotated[list[int] | None, typer.Option(help="Batch sizes (repeatable).")] = None,
    window: WindowOpt = None,
    steps: Annotated[int, typer.Option(help="Engine steps to time.")] = 64,
    device: DeviceOpt = Device.auto,
    backend: Annotated[Backend, typer.Option(
        help="Engine backend to time (--what engine).")] = Backend.torch,
    out_path: Annotated[Path | None, typer.Option(
        "--out", "-o", help="Write the results (.nc, .zarr or .json).")] = None,
    phases: Annotated[Phases, typer.Option(
        help="Kernels: every sequence at ring position 0 (aligned: the whole batch "
             "flushes together) or sequence b at position b mod L (staggered: as when a "
             "server admits sequences on different steps).")] = Phases.aligned,
    paired: Annotated[bool, typer.Option(
        "--paired", help="Kernels: time ours and the peer in turn, round after round, at "
                         "one model, batch (default 1) and window; speedups with 95% "
                         "intervals.")] = False,
    rounds: Annotated[int | None, typer.Option(
        help="Rounds of --paired (default 60).")] = None,
    layers: Annotated[int, typer.Option(
        help="--paired: layers each timed step runs in turn, ours and the peer's, "
             "each with its own state (times per layer).")] = 1,
    mamba_ssm_path: Annotated[Path | None, typer.Option(
        help="A state-spaces/mamba checkout: the Mamba-2 peer (else the installed "
             "mamba_ssm).")] = None,
) -> None:
    """Benchmarks: the emulation engine, or the fused kernels on an NVIDIA GPU."""

    def run():
        if out_path is not None:
            _check_bench_out(out_path)
        if what is BenchWhat.engine and (phases is not Phases.aligned or paired):
            fail("--phases and --paired apply to the kernel benchmarks (--what mamba2 or gdn)")
        if what is BenchWhat.engine:
            if window:
                fail("--window applies to the kernel benchmarks (--what mamba2 or gdn)")
            if len(model or []) > 1 or len(batch or []) > 1:
                fail("--what engine times one model at one batch")
        if rounds is not None and not paired:
            fail("--rounds applies to --paired")
        if layers != 1 and not paired:
            fail("--layers applies to --paired")
        if mamba_ssm_path is not None:
            if what is not BenchWhat.mamba2:
                fail("--mamba-ssm-path applies to --what mamba2")
            if not mamba_ssm_path.is_dir():
                fail(f"--mamba-ssm-path {str(mamba_ssm_path)!r} is not a folder")
        if paired:
            ds = _bench_paired(what.value, model, batch, window, rounds or 60, phases.value,
                               mamba_ssm_path, layers)
        elif what is BenchWhat.engine:
            from precisionlab.studies.bench_engine import bench_engine

            ds = bench_engine((model or ["nemotron-3-nano-4b"])[0], (batch or [8])[0], steps,
                              device=device.value, backend=backend.value)
        else:
            ds = _bench_kernels(what.value, model, batch, window, phases.value, mamba_ssm_path)
        _print_bench(ds)
        if out_path is not None:
            _write_bench(ds, out_path)

    guarded(run)


def _require_cuda(kind: str) -> None:
    """One line and exit 2 where there is no CUDA GPU for the ``kind`` kernels."""
    import torch

    if not torch.cuda.is_available():
        fail(f"the {kind} kernel benchmark needs a CUDA GPU (try --what engine on a CPU)")


def _bench_kernels(kind: str, models, batches, windows, phases: str, mamba_ssm_path=None):
    _require_cuda(kind)
    kwargs = {k: v for k, v in (("models", models), ("batches", batches), ("windows", windows))
              if v}
    kwargs["phases"] = phases
    if kind == "mamba2":
        from precisionlab.studies.bench_mamba2 import bench_mamba2

        return bench_mamba2(**kwargs, mamba_ssm_path=mamba_ssm_path)
    from precisionlab.studies.bench_gdn import bench_gdn

    return bench_gdn(**kwargs)


def _bench_paired(kind: str, models, batches, windows, rounds: int, phases: str,
                  mamba_ssm_path, layers: int = 1):
    """``--paired``: one (model, batch, window) point of the paired timing."""
    from precisionlab.presets import get_preset
    from precisionlab.studies.paired import check_paired, paired_bench

    if phases != "aligned":
        fail("--paired times aligned windows only")
    if len(models or []) > 1 or len(batches or []) > 1 or len(windows or []) > 1:
        fail("--paired times one model, one batch and one window")
    model = (models or ["nemotron-3-nano-4b" if kind == "mamba2" else "qwen3.5-4b"])[0]
    batch, window = (batches or [1])[0], (windows or [16])[0]
    model_kind = get_preset(model).kind
    if model_kind != kind:
        fail(f"--model {model} is a {model_kind} model, not {kind}")
    check_paired(model, None, batch, window, rounds, layers)
    _require_cuda(kind)
    return paired_bench(model, batch=batch, window=window, rounds=rounds,
                        mamba_ssm_path=mamba_ssm_path, layers=layers,
                        log=lambda m: err.print(m, highlight=False))


def _print_bench(ds) -> None:
    if not ds.dims:  # scalar results (engine)
        for name, var in ds.data_vars.items():
            out.print(f"{name}: {float(var):.4g}")
        for key in ("model", "batch", "designs", "device"):
            if key in ds.attrs:
                out.print(f"{key}: {ds.attrs[key]}", highlight=False)
        return
    if "speedup_low" in ds:  # --paired
        from precisionlab.studies.paired import paired_summary

        doc = paired_summary(ds)
        table = Table(title=f"{doc['model']}, batch {doc['batch']}, L = {doc['window']}, "
                            f"{doc['rounds']} paired rounds against {doc['peer']}",
                      title_justify="left")
        for col in ("kernel", "us/step", f"x {doc['peer']}", "95% interval", "rounds faster"):
            table.add_column(col)
        for k, r in doc["kernels"].items():
            table.add_row(k, f"{r['us_step']:.2f}", f"{r['speedup']:.3f}",
                          f"{r['speedup_low']:.3f} - {r['speedup_high']:.3f}",
                          f"{r['faster_share']:.0%}")
        out.print(table)
        return
    out.print(ds.to_dataframe().dropna(how="all").to_string())


BENCH_SUFFIXES = (".nc", ".zarr", ".json")  # not .csv: its tidy rows are per decode step


def _check_bench_out(path: Path) -> None:
    """Fail before a benchmark runs where its results cannot be written to ``path``
    (.nc, .zarr or .json)."""
    from precisionlab.export import check_writable

    check_writable(path, BENCH_SUFFIXES)


def _write_bench(ds, path: Path) -> None:
    from precisionlab.export import save_result

    if path.suffix.lower() == ".json":
        from precisionlab.atomic import write_json

        doc = {"attrs": {k: str(v) for k, v in ds.attrs.items()},
               "data": json.loads(ds.to_dataframe().reset_index().to_json(orient="records"))
               if ds.dims else {k: float(v) for k, v in ds.data_vars.items()}}
        write_json(path, doc, indent=2)
    else:
        save_result(ds, path)
    out.print(f"wrote {path}")


@trace_app.command("save")
def trace_save(
    out_path: Annotated[Path, typer.Option("--out", "-o", help="A .safetensors file.")],
    model: ModelOpt = "tiny-mamba2",
    steps: StepsOpt = 256,
    batch: BatchOpt = 1,
    seed: int = 0,
    dynamics: Dynamics = Dynamics.trained,
) -> None:
    """Save a synthetic trace of a preset to a file that `drift --model FILE` replays."""
    from precisionlab.studies.drift import open_model
    from precisionlab.traces import save_trace

    if out_path.suffix != ".safetensors":
        fail(f"trace files end in .safetensors, got {str(out_path)!r}")
    if out_path.is_dir():
        fail(f"cannot write {str(out_path)!r}: it is a folder")

    def run():
        trace = open_model(model, steps=steps, batch=batch, seed=seed, dynamics=dynamics.value)
        parent = out_path.parent if str(out_path.parent) else Path(".")
        if not parent.is_dir():
            fail(f"cannot write {str(out_path)!r}: folder {str(parent)!r} does not exist")
        out.print(f"wrote {save_trace(trace, out_path)} ({trace.steps} steps, batch "
                  f"{trace.batch})")

    guarded(run)


@trace_app.command("capture")
def trace_capture(
    model: Annotated[str, typer.Option("--model", "-m", help="Checkpoint directory or preset.")],
    out_path: Annotated[Path, typer.Option(
        "--out", "-o", help="Base name: one OUT.L<i>.safetensors per SSM layer i.")],
    prompt: Annotated[Path | None, typer.Option(help="Text file (default: seeded ids).")] = None,
    steps: StepsOpt = 256,
    layer: Annotated[list[int] | None, typer.Option(
        "--layer", help="Decoder-layer index of an SSM layer to record (repeatable; "
                        "default all).")] = None,
    batch: BatchOpt = 2,
    seed: int = 0,
    device: DeviceOpt = Device.auto,
    dtype: ModelDtype = ModelDtype.fp32,
) -> None:
    """Record the per-step SSM inputs of a real decode (replay with `drift --model FILE`)."""
    from precisionlab.models.capture import capture_trace

    if out_path.suffix != ".safetensors":
        fail(f"trace files end in .safetensors, got {str(out_path)!r}")

    def run():
        paths = capture_trace(model, prompt, steps, out_path, layers=layer or None, batch=batch,
                              seed=seed, device=device.value, dtype=dtype.value)
        for p in paths:
            out.print(f"wrote {p}")

    guarded(run)


@trace_app.command("info")
def trace_info(path: Annotated[Path, typer.Argument(help="A .safetensors trace.")]) -> None:
    """Describe a trace file."""
    from precisionlab.traces import SavedTrace

    def run():
        t = SavedTrace(path)
        out.print(f"{path}: {t.kind}, {t.preset.state_shape} state, {t.steps} steps, batch "
                  f"{t.batch}, source {t.source}")

    guarded(run)


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except KeyboardInterrupt:  # pragma: no cover - interactive
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()

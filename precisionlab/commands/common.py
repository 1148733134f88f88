"""Shared pieces of the command line: consoles, the one-line error exit, option
types, progress and result tables."""

from __future__ import annotations

import math
import re
import sys
import warnings
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

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


class ResultSummaryError(ValueError):
    """A result file without the variables a summary needs."""


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
    memory, into one line and exit 2; a file the run could not write or read (a full
    disk, a folder gone read-only) into one line and exit 1."""
    try:
        return fn()
    except _usage_errors() as exc:
        fail(str(exc))
    except OSError as exc:
        from precisionlab.atomic import WriteError

        where = f": {str(exc.filename)!r}" if exc.filename else ""
        fail(str(exc) if isinstance(exc, WriteError) else f"{exc.strerror or exc}{where}",
             code=1)
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


SUMMARY_CAPTION = ("B/elt: modelled bytes moved per state element per step (conventional "
                   "fp32: 8); ± 95%: half width of the final error's interval over the "
                   "batch's sequences (Student t); frontier: no other row has both less "
                   "traffic and a lower final error")


def summary_cells(ds) -> tuple[list[str], list[list[str]]]:
    """The summary table's column names and each configuration's cells, as text."""
    from precisionlab.metrics import summary_records

    model_level = "kl" in ds
    cols = ["design", "format", "window", "B/elt", "final", "± 95%", "peak", "mean", "growth",
            "frontier"]
    if model_level:
        cols += ["KL (mean)", "top-1 agree", "first divergence"]
    rows = []
    for r in summary_records(ds):
        cells = [r["design"], r["format"], str(r["window"]), f"{r['bytes_per_step']:.2f}",
                 f"{r['final']:.3e}", _half_width(r["final_ci95"]), f"{r['peak']:.3e}",
                 f"{r['mean']:.3e}", f"{r['growth']:+.2f}", "yes" if r["frontier"] else ""]
        if model_level:
            first = r["first_divergence"]
            cells += [f"{r['kl_mean']:.3e}", f"{r['top1_agree_mean']:.3f}",
                      "never" if first is None else str(first)]
        rows.append(cells)
    return cols, rows


def summary_table(ds, title: str) -> Table:
    """A result's summary as a rich table: one row per configuration."""
    cols, rows = summary_cells(ds)
    table = Table(title=title, title_justify="left", caption=SUMMARY_CAPTION,
                  caption_justify="left")
    for col in cols:
        table.add_column(col, justify="right" if col not in ("design", "format") else "left")
    for cells in rows:
        table.add_row(*cells)
    return table


def markdown_table(cols: list[str], rows: list[list[str]]) -> str:
    """A Markdown (GitHub-flavoured) table; text columns left, numbers right."""
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    align = [":---" if c in ("design", "format") else "---:" for c in cols]
    return "\n".join([line(cols), line(align), *(line(r) for r in rows)])


def _half_width(half: float) -> str:
    return "-" if half != half else f"{half:.1e}"


RATIO_TITLE = "shared / split final error (above 1: split drifts less)"


def ratio_records(ds) -> list[dict]:
    """A compare result's shared / split ratio of final errors per format and window."""
    return [{"format": str(f), "window": int(w),
             "final_ratio": float(ds["final_ratio"].sel(format=f, window=w))}
            for f in ds["format"].values for w in ds["window"].values]


def ratio_cells(ds) -> list[list[str]]:
    """:func:`ratio_records` as the rows of a (format, window, ratio) table."""
    return [[r["format"], str(r["window"]), f"{r['final_ratio']:.2f}"]
            for r in ratio_records(ds)]


def ratio_table(ds) -> Table:
    """A compare result's ratios as a rich table."""
    table = Table(title=RATIO_TITLE, title_justify="left")
    for col in ("format", "window", "ratio"):
        table.add_column(col)
    for cells in ratio_cells(ds):
        table.add_row(*cells)
    return table


def table_title(ds) -> str:
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
        if getattr(param, "is_flag", False):  # an on/off flag takes no value
            words += [flag] if value else []
            continue
        for v in value if isinstance(value, list | tuple) else [value]:
            words += [flag, str(v.value if isinstance(v, Enum) else v)]
    return shlex.join(words)


def decode_study(ctx: typer.Context, study: Callable, **kwargs):
    """Run ``study`` with a progress bar over its decode steps and the command line
    recorded in its result."""
    with _progress() as progress:
        task = progress.add_task("decoding", total=None)

        def tick(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        return study(progress=tick, command=command_line(ctx), **kwargs)


def run_study(ctx: typer.Context, study: Callable, out_path: Path | None,
               plot_path: Path | None, plot_kind: str, **kwargs):
    from precisionlab.export import check_writable, save_result
    from precisionlab.plots import check_plot_path, save_plot

    if out_path is not None:
        check_writable(out_path)
    if plot_path is not None:
        check_plot_path(plot_path)
    from precisionlab.studies import StudyWarning

    with warnings.catch_warnings():  # said below as one line, not as a Python warning
        warnings.simplefilter("ignore", StudyWarning)
        ds = decode_study(ctx, study, **kwargs)
    out.print(summary_table(ds, table_title(ds)))
    if ds.attrs.get("notes"):
        err.print(escape(f"note: {ds.attrs['notes']}"), highlight=False, soft_wrap=True)
    if out_path is not None:
        out.print(f"wrote {save_result(ds, out_path)}")
    if plot_path is not None:
        out.print(f"wrote {save_plot(ds, plot_path, plot_kind)}")
    return ds


def json_ready(obj):
    """``obj`` with numpy scalars as Python numbers and NaN / inf as null (strict JSON)."""
    from precisionlab.export import plain_value

    if isinstance(obj, dict):
        return {k: json_ready(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_ready(v) for v in obj]
    obj = plain_value(obj)
    return None if isinstance(obj, float) and not math.isfinite(obj) else obj


def parse_at(at: str) -> str | int:
    """``--at``: final, max, mean, or a step index as an int (exit 2 otherwise)."""
    if at in ("final", "max", "mean"):
        return at
    if not re.fullmatch(r"-?[0-9]+", at):  # ASCII digits: str.isdigit passes '³', '٣'
        fail(f"--at must be final, max, mean or a step index, got {at!r}")
    return int(at)


# options shared by the study commands
BackendOpt = Annotated[Backend, typer.Option(
    help="Runs the designs: torch emulation, or the fused Triton kernels (CUDA); auto takes "
         "the kernels on CUDA.")]
DeviceOpt = Annotated[Device, typer.Option(help="auto takes CUDA where there is a GPU.")]
ModelOpt = Annotated[str, typer.Option("--model", "-m", help="Preset name or trace file.")]
FormatOpt = Annotated[list[str] | None, typer.Option(
    "--format", "-f",
    help="Read format (repeatable; all: every format). Default: fp8-e4m3 and nvfp4.")]
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


def study_options(model, formats, windows, checkpoint_format, steps, batch, seed, dynamics,
                  ring_dtype, backend, device) -> dict:
    """A study's keyword arguments from the shared options, defaults filled in."""
    return dict(model=model, formats=formats or DEFAULT_FORMATS, windows=windows or [16],
                checkpoint_format=checkpoint_format or ["fp32"], steps=steps, batch=batch,
                seed=seed, dynamics=dynamics.value, ring_dtype=ring_dtype.value,
                backend=backend.value, device=device.value)


def default_out(model: str, study: str) -> Path:
    """``<study>-<model>.nc``: where a study writes its result unless told."""
    return Path(f"{study}-{Path(model).stem}.nc")

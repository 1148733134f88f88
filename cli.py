"""The ``precisionlab`` command line: drift studies, plots, CI gates, formats,
model presets and GPU benchmarks.

Each group of commands lives in ``precisionlab/commands/``; this module assembles
them into one typer app."""

from __future__ import annotations

import sys

import typer

from precisionlab.commands import advice, bench, catalog, results, studies, trace
from precisionlab.commands.common import err

app = typer.Typer(
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    help="Numerical-precision studies of SSM decode state (Mamba-2, Gated DeltaNet).",
)
trace_app = typer.Typer(no_args_is_help=True, help="Save and inspect layer-input traces.")
app.add_typer(trace_app, name="trace")

app.command()(studies.drift)
app.command()(studies.compare)
app.command("window")(studies.window_cmd)
app.command()(results.plot)
app.command()(results.show)
app.command()(results.gate)
app.command()(advice.advise)
app.command()(catalog.models)
app.command()(catalog.formats)
app.command()(bench.bench)
trace_app.command("save")(trace.trace_save)
trace_app.command("capture")(trace.trace_capture)
trace_app.command("info")(trace.trace_info)


def main() -> None:
    """Console-script entry point."""
    from precisionlab.allocator import reuse_freed_memory

    reuse_freed_memory()
    try:
        app()
    except KeyboardInterrupt:  # pragma: no cover - interactive
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()

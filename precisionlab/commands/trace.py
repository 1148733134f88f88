"""The trace commands: save, capture and info."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .common import (
    BatchOpt,
    Device,
    DeviceOpt,
    Dynamics,
    ModelDtype,
    ModelOpt,
    StepsOpt,
    fail,
    guarded,
    out,
)


def _require_writable(path: Path, *, folder_ok: bool = False) -> None:
    """One line and exit 2 unless ``path`` can be written (checked before anything
    heavy is loaded or run)."""
    from precisionlab.atomic import write_problem

    problem = write_problem(path, folder_ok=folder_ok)
    if problem:
        fail(problem)


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
    _require_writable(out_path)

    def run():
        trace = open_model(model, steps=steps, batch=batch, seed=seed, dynamics=dynamics.value)
        out.print(f"wrote {save_trace(trace, out_path)} ({trace.steps} steps, batch "
                  f"{trace.batch})")

    guarded(run)


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
    if out_path.suffix != ".safetensors":
        fail(f"trace files end in .safetensors, got {str(out_path)!r}")
    _require_writable(out_path, folder_ok=True)  # a base name: OUT.L<i>.safetensors

    def run():
        from precisionlab.models.capture import capture_trace  # loads transformers

        paths = capture_trace(model, prompt, steps, out_path, layers=layer or None, batch=batch,
                              seed=seed, device=device.value, dtype=dtype.value)
        for p in paths:
            out.print(f"wrote {p}")

    guarded(run)


def trace_info(path: Annotated[Path, typer.Argument(help="A .safetensors trace.")]) -> None:
    """Describe a trace file."""
    from precisionlab.traces import SavedTrace

    def run():
        t = SavedTrace(path)
        out.print(f"{path}: {t.kind}, {t.preset.state_shape} state, {t.steps} steps, batch "
                  f"{t.batch}, source {t.source}")

    guarded(run)

"""The study commands: drift, compare and window."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .common import (
    Backend,
    BackendOpt,
    BatchOpt,
    CheckpointOpt,
    DesignOpt,
    Device,
    DeviceOpt,
    Dynamics,
    FormatOpt,
    Level,
    ModelDtype,
    ModelOpt,
    OutOpt,
    PlotOpt,
    RingDtype,
    StepsOpt,
    WindowOpt,
    default_out,
    fail,
    guarded,
    out,
    ratio_table,
    run_study,
    study_options,
)


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
    opts = study_options(model, format, window, checkpoint_format, steps, batch, seed, dynamics,
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
    guarded(lambda: run_study(ctx, study, out_path or default_out(model, "drift"), plot,
                               "curves", **opts))


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

    opts = study_options(model, format, window, checkpoint_format, steps, batch, seed, dynamics,
                          ring_dtype, backend, device)

    def run():
        ds = run_study(ctx, study, out_path or default_out(model, "compare"), plot, "curves",
                        **opts)
        out.print(ratio_table(ds))

    guarded(run)


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

    opts = study_options(model, format, window or list(DEFAULT_WINDOWS), checkpoint_format,
                          steps, batch, seed, dynamics, ring_dtype, backend, device)
    opts["designs"] = design or ["shared", "split"]
    guarded(lambda: run_study(ctx, study, out_path or default_out(model, "window"), plot,
                               "window", **opts))

"""The bench command: the emulation engine, or the fused kernels against their peers."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from .common import (
    Backend,
    Device,
    DeviceOpt,
    WindowOpt,
    err,
    fail,
    guarded,
    out,
)


class BenchWhat(str, Enum):
    engine = "engine"
    mamba2 = "mamba2"
    gdn = "gdn"


class Phases(str, Enum):
    aligned = "aligned"
    staggered = "staggered"


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

"""The engine: advance the fp64 reference and every design in lock-step over a
trace and measure how far each design's outputs drift.

Memory is O(batch x state x designs) whatever the number of steps: the trace is
streamed, and only per-step scalars are kept.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from .designs import Design, TorchDesignRunner
from .kinds import kind_for, ring_dtype_of
from .traces import Trace

BACKENDS = ("auto", "torch", "triton")
DEVICES = ("auto", "cpu", "cuda")


class EngineError(ValueError):
    """Bad engine settings (device, backend)."""


@dataclass
class StepMetrics:
    """Errors of every design at one step, against the fp64 reference.

    ``rel_err`` and ``state_rel_err`` are (designs, batch); ``abs_err_max`` is
    (designs,); ``state_rel_err`` is NaN off flush steps.
    """

    step: int
    rel_err: torch.Tensor
    abs_err_max: torch.Tensor
    state_rel_err: torch.Tensor


def resolve_device(device: str) -> torch.device:
    """'auto' picks CUDA when available."""
    if device not in DEVICES:
        raise EngineError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)}")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise EngineError("device 'cuda' requested but no CUDA device is available")
    return torch.device(device)


def resolve_backend(backend: str, device: torch.device) -> str:
    """'auto' picks triton kernels on CUDA and torch emulation elsewhere."""
    if backend not in BACKENDS:
        raise EngineError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "auto":
        return "triton" if device.type == "cuda" and _triton_backend_available() else "torch"
    if backend == "triton" and device.type != "cuda":
        raise EngineError("backend 'triton' needs a CUDA device (use --backend torch on CPU)")
    return backend


def _triton_backend_available() -> bool:
    try:
        from .kernels import backend  # noqa: F401
    except ImportError:
        return False
    return True


def make_runner(design: Design, kind, params, batch, device, ring_dtype, seed, state0, backend):
    """Build a design runner on the chosen backend."""
    if backend == "triton":
        from .kernels.backend import make_triton_runner

        return make_triton_runner(design, kind, params, batch, device, ring_dtype, seed, state0)
    return TorchDesignRunner(design, kind, params, batch, device, ring_dtype, seed, state0)


def _rel(diff: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Per-sequence relative L2 norm over every non-batch axis."""
    num = diff.flatten(1).norm(dim=1)
    den = ref.flatten(1).norm(dim=1)
    return num / den.clamp_min(torch.finfo(den.dtype).tiny)


def run(
    trace: Trace,
    designs: Sequence[Design],
    *,
    device: str = "auto",
    backend: str = "auto",
    ring_dtype: str = "bf16",
    seed: int = 0,
    on_step: Callable[[int], None] | None = None,
) -> Iterator[StepMetrics]:
    """Yield the metrics of every design at every step of ``trace``.

    The reference consumes the same inputs the ring stores (rounded to the ring
    dtype), so every error measured is the state's storage, not the ring's
    rounding of the inputs (except GDN's ``d``, which only the ring holds).
    """
    dev = resolve_device(device)
    be = resolve_backend(backend, dev)
    rdt = ring_dtype_of(ring_dtype)
    kind = kind_for(trace.preset)
    raw_params = {k: v.to(dev) for k, v in trace.params.items()}
    params32 = kind.params({k: v.float() for k, v in raw_params.items()})
    params64 = kind.params({k: v.double() for k, v in raw_params.items()})
    batch = trace.batch
    state0 = trace.state0.to(dev) if trace.state0 is not None else None
    S_ref = (state0.double().clone() if state0 is not None
             else torch.zeros(kind.state_shape(batch), dtype=torch.float64, device=dev))
    runners = [
        make_runner(d, kind, params32, batch, dev, rdt, seed, state0, be) for d in designs
    ]
    nan = torch.full((batch,), float("nan"), dtype=torch.float64, device=dev)
    for t, raw in enumerate(trace):
        raw = {k: v.to(dev) for k, v in raw.items()}
        inp = kind.prepare(raw, params32, rdt)
        y_ref = kind.reference_step_(S_ref, inp.to(torch.float64), params64)
        rows = []  # per design: rel_err (batch), state_rel_err (batch), abs_err_max
        for r in runners:
            y, S_new = r.step(inp, t, raw)
            diff = y.double() - y_ref
            srel = nan if S_new is None else _rel(S_new.double() - S_ref, S_ref)
            rows.append(torch.cat((_rel(diff, y_ref), srel, diff.abs().max()[None])))
        table = torch.stack(rows).cpu() if rows else torch.empty(0, 2 * batch + 1)
        yield StepMetrics(  # one device-to-host copy per step
            step=t,
            rel_err=table[:, :batch],
            abs_err_max=table[:, 2 * batch],
            state_rel_err=table[:, batch:2 * batch],
        )
        if on_step is not None:
            on_step(t)

"""The engine: advance the fp64 reference and every design in lock-step over a
trace and measure how far each design's outputs drift.

Memory is O(batch x state x designs) whatever the number of steps: the trace is
streamed, and only per-step scalars are kept.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain

import torch

from .designs import Design, TorchDesignGroup
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
    (designs,); ``state_rel_err`` is NaN off flush steps; ``head_rel_err`` is each
    head's own relative output error, (designs, batch, heads), and ``log_decay`` the
    step's log state decay per head, (batch, heads)
    (:meth:`precisionlab.kinds.LayerKind.log_decay`).
    """

    step: int
    rel_err: torch.Tensor
    abs_err_max: torch.Tensor
    state_rel_err: torch.Tensor
    head_rel_err: torch.Tensor
    log_decay: torch.Tensor


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
        backend = "triton" if device.type == "cuda" and _triton_backend_available() else "torch"
    if backend == "triton" and device.type != "cuda":
        raise EngineError("backend 'triton' needs a CUDA device (use --backend torch on CPU)")
    if backend == "triton":
        from .kernels.precompile import workers_cap

        try:
            workers_cap()  # a bad PRECISIONLAB_COMPILE_WORKERS is refused before the run
        except ValueError as exc:
            raise EngineError(str(exc)) from None
    return backend


def _triton_backend_available() -> bool:
    try:
        from .kernels import backend  # noqa: F401
    except ImportError:
        return False
    return True


class _SingleLane:
    """One kernel-backend runner seen as a group of one design."""

    def __init__(self, runner):
        self.runner = runner

    def step(self, inp, t, raw):
        y, S_new = self.runner.step(inp, t, raw)
        return y[None], None if S_new is None else S_new[None]


def make_lanes(designs: Sequence[Design], kind, params, batch, device, ring_dtype, seed, state0,
               backend) -> list[tuple[list[int], object]]:
    """Runners for ``designs`` as (design indices, runner) lanes.

    On the torch backend designs that share a window run as one
    :class:`TorchDesignGroup` (one launch per op for the whole group); on the triton
    backend each design has its own fused-kernel runner.
    """
    if backend == "triton":
        from .kernels.backend import make_triton_runner

        return [([i], _SingleLane(make_triton_runner(d, kind, params, batch, device, ring_dtype,
                                                      seed, state0)))
                for i, d in enumerate(designs)]
    by_window: dict[int, list[int]] = {}
    for i, d in enumerate(designs):
        by_window.setdefault(d.window, []).append(i)
    return [(idx, TorchDesignGroup([designs[i] for i in idx], kind, params, batch, device,
                                   ring_dtype, seed, state0))
            for idx in by_window.values()]


def _rel(diff: torch.Tensor, ref_norm: torch.Tensor) -> torch.Tensor:
    """Relative L2 norm per (design, sequence) over every other axis."""
    return diff.flatten(2).norm(dim=2) / ref_norm.clamp_min(torch.finfo(ref_norm.dtype).tiny)


METRICS_LAG = 8
"""Steps the host may run ahead of the GPU before it waits for a step's metrics."""


def run(
    trace: Trace,
    designs: Sequence[Design],
    *,
    device: str = "auto",
    backend: str = "auto",
    ring_dtype: str = "bf16",
    seed: int = 0,
    on_step: Callable[[int], None] | None = None,
    precompile: bool = True,
) -> Iterator[StepMetrics]:
    """Yield the metrics of every design at every step of ``trace``.

    On the triton backend the designs' kernels are first compiled in parallel
    (``precompile``; :func:`precisionlab.kernels.precompile.precompile`), which only
    changes how long a first run on a machine takes.

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
    steps = iter(trace)
    if be == "triton" and precompile and trace.steps > 0:
        first = next(steps)
        _precompile(designs, kind, params32, batch, dev, rdt, seed, state0, first,
                    trace.steps)
        steps = chain((first,), steps)
    lanes = make_lanes(designs, kind, params32, batch, dev, rdt, seed, state0, be)
    order = torch.tensor([i for idx, _ in lanes for i in idx], dtype=torch.long)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(len(order))
    inverse = inverse.to(dev)
    nan = torch.full((1, batch), float("nan"), dtype=torch.float64, device=dev)
    pending: deque[tuple[int, torch.Tensor, torch.cuda.Event | None]] = deque()
    for t, raw in enumerate(steps):
        raw = {k: _to_device(v, dev) for k, v in raw.items()}
        inp = kind.prepare(raw, params32, rdt)
        y_ref = kind.reference_step_(S_ref, inp.to(torch.float64), params64)
        y_norm = y_ref.flatten(1).norm(dim=1)
        head_norm = y_ref.norm(dim=-1).clamp_min(torch.finfo(torch.float64).tiny)
        s_norm = None
        rows = []  # per lane: (designs, rel_err | state_rel_err | abs_err_max | head_rel_err)
        for idx, lane in lanes:
            y, S_new = lane.step(inp, t, raw)
            diff = y.double() - y_ref
            if S_new is None:
                srel = nan.expand(len(idx), batch)
            else:
                s_norm = S_ref.flatten(1).norm(dim=1) if s_norm is None else s_norm
                srel = _rel(S_new.double() - S_ref, s_norm)
            abs_max = diff.flatten(1).abs().amax(1)[:, None]
            heads = (diff.norm(dim=-1) / head_norm).flatten(1)
            rows.append(torch.cat((_rel(diff, y_norm), srel, abs_max, heads), dim=1))
        # the last row carries the step's log decay per head, shared by the designs
        decay = kind.log_decay(inp, params32).double().flatten()
        decay_row = torch.cat((nan[0, :1].expand(2 * batch + 1), decay))[None]
        table = torch.cat((torch.cat(rows)[inverse], decay_row) if rows else (decay_row,))
        pending.append(_to_host(t, table))
        while len(pending) > (METRICS_LAG if dev.type == "cuda" else 0):
            yield from _emit(pending.popleft(), batch, on_step)
    while pending:
        yield from _emit(pending.popleft(), batch, on_step)


def _precompile(designs, kind, params32, batch, dev, rdt, seed, state0, first, steps) -> None:
    """Compile the kernels of ``designs`` in parallel on the first step's inputs
    (:func:`precisionlab.kernels.backend.precompile_designs`)."""
    from .kernels.backend import precompile_designs

    raw = {k: _to_device(v, dev) for k, v in first.items()}
    precompile_designs(designs, kind, params32, batch, dev, rdt, seed, state0,
                       kind.prepare(raw, params32, rdt), raw, steps)


def _to_device(v: torch.Tensor, dev: torch.device) -> torch.Tensor:
    if dev.type == "cuda" and v.device.type == "cpu":
        return v.pin_memory().to(dev, non_blocking=True)
    return v.to(dev)


def _to_host(t: int, table: torch.Tensor) -> tuple[int, torch.Tensor, torch.cuda.Event | None]:
    """Start the step's one device-to-host copy; on CUDA it completes asynchronously."""
    if table.device.type != "cuda":
        return t, table, None
    host = torch.empty(table.shape, dtype=table.dtype, pin_memory=True)
    host.copy_(table, non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    return t, host, event


def _emit(item, batch: int, on_step: Callable[[int], None] | None) -> Iterator[StepMetrics]:
    t, table, event = item
    if event is not None:
        event.synchronize()
    designs, decay = table[:-1], table[-1, 2 * batch + 1:]
    yield StepMetrics(
        step=t,
        rel_err=designs[:, :batch],
        abs_err_max=designs[:, 2 * batch],
        state_rel_err=designs[:, batch:2 * batch],
        head_rel_err=designs[:, 2 * batch + 1:].reshape(len(designs), batch, -1),
        log_decay=decay.reshape(batch, -1),
    )
    if on_step is not None:
        on_step(t)

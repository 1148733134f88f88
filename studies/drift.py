"""The drift study: every (design, format, window) against the fp64 reference,
step by step, as an ``xarray.Dataset``."""

from __future__ import annotations

import numbers
import platform
import warnings
from collections.abc import Callable, Sequence

import numpy as np
import torch
import xarray as xr

from precisionlab import __version__, engine
from precisionlab.designs import DESIGN_KINDS, Design, make_design
from precisionlab.kinds import ring_dtype_of
from precisionlab.metrics import (
    final_sem,
    final_steps,
    growth_exponent,
    head_memory,
    is_flush_step,
    traffic,
)
from precisionlab.traces import DYNAMICS, SavedTrace, Trace, TraceError, open_trace

DEFAULT_STEPS = 2048
DEFAULT_BATCH = 2


class StudyWarning(UserWarning):
    """A study ran, but part of its result says less than it seems to (the result's
    ``notes`` attribute says what)."""


class StudyError(ValueError):
    """Bad study settings (one clear message for the user)."""


def _as_list(x: str | int | Sequence) -> list:
    """One value or several, as a list without repeats (first occurrences kept)."""
    return [x] if isinstance(x, str | int) else list(dict.fromkeys(x))


ALL_FORMATS = "all"
"""A read format name that stands for every registered format."""


def read_formats(formats: str | Sequence[str]) -> list[str]:
    """The read formats asked for, ``"all"`` expanded to every registered format (in
    registry order), each once."""
    from precisionlab import formats as registry

    out: list[str] = []
    for f in _as_list(formats):
        out += registry.names() if f == ALL_FORMATS else [f]
    return list(dict.fromkeys(out))


def build_designs(
    designs: Sequence[str], formats: Sequence[str], windows: Sequence[int],
    checkpoint_format: str | Sequence[str] = "fp32",
) -> list[Design]:
    """All (design, format, window) combinations, validated; a split design once per
    checkpoint format."""
    checkpoints = _as_list(checkpoint_format)
    if not designs or not formats or not windows or not checkpoints:
        raise StudyError("give at least one design, one format, one window and one "
                         "checkpoint format")
    out = []
    for kind in designs:
        if kind not in DESIGN_KINDS:
            raise StudyError(f"unknown design {kind!r}; choose from {', '.join(DESIGN_KINDS)}")
        for ckpt in checkpoints if kind == "split" else checkpoints[:1]:
            for fmt in formats:
                for w in windows:
                    out.append(make_design(kind, fmt, w, ckpt))
    return out


def design_label(design: Design, several_checkpoints: bool) -> str:
    """``design``'s name in a result's ``design`` coordinate: ``shared``, and ``split``
    for one checkpoint format or ``split-<checkpoint>`` (``split-fp16-sr``, ...) for each
    of several."""
    if design.kind == "split" and several_checkpoints:
        return f"split-{design.checkpoint_format}"
    return design.kind


def versions() -> dict[str, str]:
    """Package versions recorded in every result."""
    import scipy  # noqa: F401

    v = {"precisionlab": __version__, "torch": torch.__version__, "numpy": np.__version__,
         "xarray": xr.__version__, "python": platform.python_version()}
    try:
        import triton

        v["triton"] = triton.__version__
    except ImportError:  # pragma: no cover - triton is a dependency
        pass
    return v


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def open_model(model: str, *, steps: int | None, batch: int, seed: int, dynamics: str) -> Trace:
    """A preset name or a trace file, as a trace of (at most) ``steps`` steps."""
    if dynamics not in DYNAMICS:
        raise StudyError(f"unknown dynamics {dynamics!r}; choose one of {', '.join(DYNAMICS)}")
    for name, value in (("steps", steps), ("batch", batch)):
        if value is not None and (not isinstance(value, numbers.Integral) or value < 1):
            raise StudyError(f"{name} must be a positive integer, got {value!r}")
    try:
        trace = open_trace(model, steps=steps or DEFAULT_STEPS, batch=batch, seed=seed,
                           dynamics=dynamics)
    except KeyError as exc:
        raise StudyError(str(exc)) from None
    except TraceError as exc:
        raise StudyError(str(exc)) from None
    if isinstance(trace, SavedTrace) and steps is not None:
        trace.steps = min(trace.steps, steps)
    return trace


def drift(
    model: str,
    formats: str | Sequence[str],
    designs: str | Sequence[str] = ("shared", "split"),
    windows: int | Sequence[int] = (16,),
    checkpoint_format: str | Sequence[str] = "fp32",
    steps: int | None = None,
    batch: int = DEFAULT_BATCH,
    seed: int = 0,
    dynamics: str = "trained",
    ring_dtype: str = "bf16",
    backend: str = "auto",
    device: str = "auto",
    progress: Callable[[int, int], None] | None = None,
    command: str | None = None,
) -> xr.Dataset:
    """Run the drift study and return its Dataset.

    ``model`` is a preset name (synthetic trace) or a trace file.  Dimensions:
    ``design``, ``format``, ``window``, ``step``; with several checkpoint formats the
    split design appears once per format (``split-fp32``, ``split-fp16-sr``, ...).
    Variables: ``rel_err`` (relative L2 error of the outputs against the fp64
    reference, mean over the batch),
    ``rel_err_max`` (max over the batch), ``abs_err_max``, ``state_rel_err``
    (relative error of the fresh fp32 state at flush steps, NaN elsewhere),
    ``growth`` (slope of log error vs log step over output steps: ~0 flat,
    ~0.5 random walk), ``final_sem`` (standard error of the 'final' summary over the
    batch's sequences) and ``bytes_per_step`` (the design's modelled memory traffic
    per state element, :meth:`precisionlab.designs.Design.bytes_per_step`).
    """
    designs, formats, windows = _as_list(designs), read_formats(formats), _as_list(windows)
    checkpoints = _as_list(checkpoint_format)
    try:
        ring_dtype_of(ring_dtype)
        configs = build_designs(designs, formats, windows, checkpoints)
    except (ValueError, KeyError) as exc:
        raise StudyError(str(exc)) from None
    windows = list(dict.fromkeys(d.window for d in configs))
    trace = open_model(model, steps=steps, batch=batch, seed=seed, dynamics=dynamics)
    try:
        dev = engine.resolve_device(device)
        be = engine.resolve_backend(backend, dev)
    except engine.EngineError as exc:
        raise StudyError(str(exc)) from None

    n_steps = trace.steps
    config_labels = [design_label(d, len(checkpoints) > 1) for d in configs]
    labels = list(dict.fromkeys(config_labels))
    shape = (len(labels), len(formats), len(windows), n_steps)
    abs_max = np.full(shape, np.nan)
    state = np.full(shape, np.nan)
    per_sequence = np.full((*shape, trace.batch), np.nan)
    index = [(labels.index(name), formats.index(d.read_format), windows.index(d.window))
             for name, d in zip(config_labels, configs, strict=True)]
    final_start = n_steps - final_steps(n_steps, max(windows))
    heads = np.zeros(shape[:3] + (trace.preset.heads,))  # summed over the final steps
    decay = np.zeros(trace.preset.heads)  # -log decay per head, summed over the steps
    for m in engine.run(trace, configs, device=str(dev), backend=be, ring_dtype=ring_dtype,
                        seed=seed):
        t = m.step
        decay -= m.log_decay.mean(0).cpu().numpy()
        per_head = m.head_rel_err.mean(1).cpu().numpy() if t >= final_start else None
        for j, (a, b, c) in enumerate(index):
            per_sequence[a, b, c, t] = m.rel_err[j].double().cpu().numpy()
            abs_max[a, b, c, t] = float(m.abs_err_max[j])
            state[a, b, c, t] = float(m.state_rel_err[j].mean())
            if per_head is not None:
                heads[a, b, c] += per_head[j]
        if progress is not None:
            progress(t + 1, n_steps)

    rel, rel_max = per_sequence.mean(axis=-1), per_sequence.max(axis=-1)
    dims = ("design", "format", "window", "step")
    coords = {"design": labels, "format": formats, "window": [int(w) for w in windows],
              "step": np.arange(n_steps)}
    ds = xr.Dataset(
        {
            "rel_err": (dims, rel, {"long_name": "relative L2 output error (batch mean)"}),
            "rel_err_max": (dims, rel_max, {"long_name": "relative L2 output error (batch max)"}),
            "abs_err_max": (dims, abs_max, {"long_name": "max absolute output error"}),
            "state_rel_err": (dims, state,
                              {"long_name": "relative L2 state error at flush steps"}),
        },
        coords=coords,
    )
    ds["growth"] = growth_exponent(ds)
    ds["final_sem"] = final_sem(ds, per_sequence)
    ds = ds.assign_coords(head=np.arange(trace.preset.heads))
    ds["head_rel_err"] = (("design", "format", "window", "head"), heads / (n_steps - final_start),
                          {"long_name": "each head's relative output error, mean over the "
                                        "final steps and the batch"})
    ds["head_memory"] = head_memory(decay / n_steps)
    p = trace.preset
    ds.attrs.update({
        "title": f"precisionlab drift: {p.name}",
        "model": p.name,
        "kind": p.kind,
        "trace": trace.source,
        **{f"dim_{k}": v for k, v in p.dims().items()},
        "ssm_layers": p.ssm_layers,
        "seed": seed,
        "batch": trace.batch,
        "steps": n_steps,
        "checkpoint_format": ",".join(checkpoints),
        "ring_dtype": ring_dtype,
        "dynamics": getattr(trace, "dynamics", "trace"),
        "backend": be,
        "device": device_name(dev),
        **{f"version_{k}": v for k, v in versions().items()},
        "command": command or _api_call("drift", model=model, formats=formats, designs=designs,
                                        windows=windows, checkpoint_format=checkpoint_format,
                                        steps=steps, batch=batch, seed=seed, dynamics=dynamics,
                                        ring_dtype=ring_dtype, backend=backend, device=device),
    })
    ds["bytes_per_step"] = traffic(ds)
    note_unflushed(ds, windows, n_steps)
    return ds


def note_unflushed(ds: xr.Dataset, windows: Sequence[int], steps: int) -> None:
    """Warn (:class:`StudyWarning`) and set ``ds.attrs["notes"]`` where a window is
    longer than the run: its designs never flushed, so their stored copies were never
    rounded from a decoded state."""
    never = [w for w in windows if w > steps]
    if not never:
        return
    several = len(never) > 1
    note = (f"window{'s' if several else ''} {', '.join(map(str, never))} "
            f"{'are' if several else 'is'} longer than the {steps} "
            f"step{'' if steps == 1 else 's'}: "
            f"{'their' if several else 'its'} designs never flushed, so their stored state "
            "was never rounded and their error does not measure the format (raise --steps)")
    warnings.warn(note, StudyWarning, stacklevel=3)
    ds.attrs["notes"] = note


def _api_call(name: str, **kwargs) -> str:
    args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    return f"precisionlab.{name}({args})"


__all__ = ["drift", "build_designs", "design_label", "StudyError", "StudyWarning",
           "is_flush_step", "note_unflushed", "read_formats"]

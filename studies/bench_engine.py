"""Emulation speed: decode steps per second of the torch engine (reference plus
designs), the number that decides how long a drift study takes."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch
import xarray as xr

from precisionlab import engine
from precisionlab.designs import Design, shared, split
from precisionlab.traces import SyntheticTrace

from .drift import StudyError, device_name, versions


def default_designs() -> list[Design]:
    """Six designs a typical study compares."""
    return [shared("fp8-e4m3", 16), split("fp32", "fp8-e4m3", 16), shared("nvfp4", 16),
            split("fp32", "nvfp4", 16), split("fp16-sr", "nvfp4", 16), shared("fp16-sr", 16)]


def bench_engine(
    model: str = "nemotron-3-nano-4b",
    batch: int = 8,
    steps: int = 64,
    designs: Sequence[Design] | None = None,
    device: str = "auto",
    backend: str = "torch",
    warmup: int = 16,
) -> xr.Dataset:
    """Time ``steps`` engine steps after ``warmup`` (whole windows, flushes included).

    Returns a Dataset with ``ms_per_step``, ``steps_per_s`` and
    ``projected_4096_s`` (time of a 4096-step study at this rate).
    """
    for name, value, least in (("steps", steps, 1), ("batch", batch, 1), ("warmup", warmup, 0)):
        if int(value) < least:
            raise StudyError(f"{name} must be an integer >= {least}, got {value}")
    designs = list(designs or default_designs())
    dev = engine.resolve_device(device)
    backend = engine.resolve_backend(backend, dev)
    trace = SyntheticTrace(model, steps=warmup + steps, batch=batch, seed=0)
    it = engine.run(trace, designs, device=str(dev), backend=backend)
    for _ in range(warmup):
        next(it)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in it:
        pass
    sync()
    seconds = time.perf_counter() - t0
    ms = 1e3 * seconds / steps
    return xr.Dataset(
        {"ms_per_step": ((), ms), "steps_per_s": ((), 1e3 / ms),
         "projected_4096_s": ((), 4096 * ms / 1e3)},
        attrs={"model": model, "batch": batch, "steps": steps, "warmup": warmup,
               "designs": "; ".join(d.label for d in designs), "n_designs": len(designs),
               "device": device_name(dev), "backend": backend,
               **{f"version_{k}": v for k, v in versions().items()},
               "threads": torch.get_num_threads(), "numpy": np.__version__},
    )

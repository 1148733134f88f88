"""The engine's Triton backend: picks the kernel runner for a layer kind.

``make_triton_runner`` is what ``precisionlab.engine`` calls for ``backend="triton"``.
Mamba-2 runs on :class:`~precisionlab.kernels.mamba2_backend.TritonMamba2Design`;
a GDN runner is used when ``precisionlab.kernels.gdn_backend`` provides
``make_gdn_runner``.  Designs the kernels cannot run fall back to the torch
emulation with a warning, so ``backend="auto"`` never fails on them.
"""

from __future__ import annotations

import importlib
import warnings

import torch

from precisionlab.designs import Design, TorchDesignRunner

from .mamba2_backend import TritonMamba2Design, supports


def make_triton_runner(
    design: Design,
    kind,
    params,
    batch: int,
    device: torch.device,
    ring_dtype: torch.dtype,
    seed: int = 0,
    state0: torch.Tensor | None = None,
):
    """A runner with ``step(inp, t, raw) -> (y, fresh_state)`` on the GPU kernels."""
    name = getattr(kind, "name", "")
    if name == "gdn":
        try:
            gdn = importlib.import_module(f"{__package__}.gdn_backend")
        except ImportError:
            gdn = None
        if gdn is not None and hasattr(gdn, "make_gdn_runner"):
            return gdn.make_gdn_runner(design, kind, params, batch, device, ring_dtype, seed,
                                       state0)
        why = "no Triton GDN kernels yet"
    else:
        why = supports(design, kind)
        if why is None:
            return TritonMamba2Design(design, kind, params, batch, device, ring_dtype, seed,
                                      state0)
    warnings.warn(f"{design.label}: {why}; running it in torch emulation", stacklevel=2)
    return TorchDesignRunner(design, kind, params, batch, device, ring_dtype, seed, state0)

"""The engine's Triton backend: picks the kernel runner for a layer kind.

``make_triton_runner`` is what ``precisionlab.engine`` calls for ``backend="triton"``.
Mamba-2 runs on :class:`~precisionlab.kernels.mamba2_backend.TritonMamba2Design`,
Gated DeltaNet on :class:`~precisionlab.kernels.gdn_backend.TritonGDNDesign`.  Designs
the kernels cannot run fall back to the torch emulation with a warning, so
``backend="auto"`` never fails on them.
"""

from __future__ import annotations

import warnings

import torch

from precisionlab.designs import Design, TorchDesignRunner

from .gdn_backend import make_gdn_runner
from .gdn_backend import supports as gdn_supports
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
    if getattr(kind, "name", "") == "gdn":
        why = gdn_supports(design, kind)
        if why is None:
            return make_gdn_runner(design, kind, params, batch, device, ring_dtype, seed, state0)
    else:
        why = supports(design, kind)
        if why is None:
            return TritonMamba2Design(design, kind, params, batch, device, ring_dtype, seed,
                                      state0)
    warnings.warn(f"{design.label}: {why}; running it in torch emulation", stacklevel=2)
    return TorchDesignRunner(design, kind, params, batch, device, ring_dtype, seed, state0)

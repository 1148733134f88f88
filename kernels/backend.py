"""The engine's Triton backend: picks the kernel runner for a layer kind.

``make_triton_runner`` is what ``precisionlab.engine`` calls for ``backend="triton"``.
Mamba-2 runs on :class:`~precisionlab.kernels.mamba2_backend.TritonMamba2Design`,
Gated DeltaNet on :class:`~precisionlab.kernels.gdn_backend.TritonGDNDesign`.  Designs
the kernels cannot run fall back to the torch emulation with a warning, so
``backend="auto"`` never fails on them.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

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


def precompile_designs(designs: Sequence[Design], kind, params, batch: int,
                       device: torch.device, ring_dtype: torch.dtype, seed: int,
                       state0: torch.Tensor | None, inputs, raw, steps: int | None = None
                       ) -> None:
    """Compile the kernels of ``designs`` in parallel before a run
    (:func:`precisionlab.kernels.precompile.precompile`): throwaway runners walk their
    first window plus one step (at most ``steps``) on one step's ``inputs`` and ``raw``
    inputs, launching nothing.  Designs that fall back to the emulation are skipped.
    The longest windows are walked first: their kernels take longest to compile, so
    their compiles start while the rest of the walk goes on."""
    from .precompile import precompile

    def runners():
        with warnings.catch_warnings():  # a design's fallback warns in the real run
            warnings.simplefilter("ignore")
            built = [(make_triton_runner(d, kind, params, batch, device, ring_dtype, seed,
                                         state0), d.window + 1)
                     for d in sorted(designs, key=lambda d: -d.window)]
        return [(r, n if steps is None else min(n, steps)) for r, n in built
                if not isinstance(r, TorchDesignRunner)]

    precompile(runners, inputs, raw)

"""Engine backend: one Gated DeltaNet design run by the fused Triton kernels, with
the interface of ``precisionlab.designs.TorchDesignRunner`` (its torch reference).

``step(inp, t, raw)`` returns ``(y, fresh_state)`` as the torch runner does: shared(F,
L) and split(C, F, L) designs, the flush output from the fresh fp32 state, stochastic
rounding with the design seed (checkpoint) and seed + 1 (split read copy) at
``step = t``.  The kernels take the trace's raw inputs (``raw``: q, k, v, a, b) and
do the layer's preprocessing themselves (normalisation, gates, rounding of k and v
to the ring dtype), so they agree with the torch runner, which consumes the same
values prepared by ``GDNKind.prepare``, to fp32 rounding.  A step is one launch
(small batches) or a flush launch plus an output launch (large batches; ``launch``
picks); the host-side count only mirrors the device clock (the engine advances all
sequences in lock-step) and is never read back.
"""

from __future__ import annotations

import torch

from precisionlab.designs import Design

from .gdn_decode import GDNReplayCache
from .state import split_unsupported
from .tl_formats import FORMAT_IDS


def supports(design: Design, kind) -> str | None:
    """None if the kernels can run ``design`` for ``kind``, else the reason why not."""
    if getattr(kind, "name", "") != "gdn":
        return f"no Triton GDN kernels for layer kind {getattr(kind, 'name', kind)!r}"
    for f in {design.checkpoint_format, design.read_format}:
        if f not in FORMAT_IDS:
            return f"format {f!r} has no Triton kernel path"
    if design.kind == "split" and (why := split_unsupported(design.checkpoint_format,
                                                            design.read_format)):
        return why
    HV, V, K = kind.preset.state_shape
    for name, dim in (("K", K), ("V", V)):
        if dim & (dim - 1) or dim < 16:
            return f"{name} = {dim} is not a power of two >= 16"
    if HV % kind.preset.groups:
        return f"{HV} value heads are not a multiple of {kind.preset.groups} key heads"
    for f, blk in (("nvfp4", 16), ("mxfp4", 32)):
        if f in (design.checkpoint_format, design.read_format) and K % blk:
            return f"{f} needs K divisible by {blk}"
    return None


class TritonGDNDesign:
    """Runs one design over a batch on the GPU (or the Triton interpreter) with the
    fused GDN kernels.  Same constructor and ``step`` as ``TorchDesignRunner``;
    ``ckpt`` and ``read`` give the stored copies decoded to fp32."""

    def __init__(
        self,
        design: Design,
        kind,
        params,
        batch: int,
        device: torch.device,
        ring_dtype: torch.dtype,
        seed: int = 0,
        state0: torch.Tensor | None = None,
        *,
        block_v: int | None = None,
        num_warps: int | None = None,
        launch: str | None = None,
    ):
        why = supports(design, kind)
        if why is not None:
            raise ValueError(why)
        self.design, self.kind, self.params, self.seed = design, kind, params, seed
        HV, V, K = kind.preset.state_shape
        self.cache = GDNReplayCache(
            batch, kind.preset.groups, HV, K, V, window=design.window,
            checkpoint=design.checkpoint_format,
            read=None if design.kind == "shared" else design.read_format,
            ring_dtype=ring_dtype, seed=seed, device=device, block_v=block_v,
            num_warps=num_warps, launch=launch, keep_fresh=True,
        )
        self.cache.reset(state0)
        self.slots = torch.arange(batch, dtype=torch.int32, device=device)
        self.A_log = params.A_log.to(device=device, dtype=torch.float32).contiguous()
        self.dt_bias = params.dt_bias.to(device=device, dtype=torch.float32).contiguous()
        self.count = 0

    @property
    def ckpt(self) -> torch.Tensor:
        return self.cache.ckpt.decode()

    @property
    def read(self) -> torch.Tensor:
        return (self.cache.read if self.cache.read is not None else self.cache.ckpt).decode()

    def step(self, inp, t: int, raw: dict[str, torch.Tensor] | None = None
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Advance one decode step from the raw inputs (``inp`` is not used: the kernel
        prepares q, k, v, g and beta itself)."""
        if raw is None:
            raise ValueError("the Triton GDN kernels need the raw step inputs (q, k, v, a, b)")
        dev = self.slots.device
        q, k, v, a, b = (raw[n].to(dev) for n in ("q", "k", "v", "a", "b"))
        y = self.cache.step(q, k, v, a, b, self.A_log, self.dt_bias, self.slots)
        self.count += 1
        if self.count < self.design.window:
            return y, None
        self.count = 0
        return y, self.cache.fresh.clone()


def make_gdn_runner(design: Design, kind, params, batch: int, device: torch.device,
                    ring_dtype: torch.dtype, seed: int = 0,
                    state0: torch.Tensor | None = None) -> TritonGDNDesign:
    """The engine's hook (``kernels/backend.py``): a :class:`TritonGDNDesign`."""
    return TritonGDNDesign(design, kind, params, batch, device, ring_dtype, seed, state0)

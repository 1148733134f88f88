"""Engine backend: one Mamba-2 design run by the fused Triton kernels, with the
interface of ``precisionlab.designs.TorchDesignRunner`` (its torch reference).

``step(inp, t, raw)`` returns ``(y, fresh_state)`` exactly as the torch runner:
shared(F, L) and split(C, F, L) designs, the flush output from the fresh fp32
state, stochastic rounding with the design seed (checkpoint) and seed + 1 (split
read copy) at ``step = t``.  Every step is one kernel launch; the ring count the
runner keeps on the host only mirrors the device counters (the engine advances
all sequences in lock-step) and is never read back from the device.
"""

from __future__ import annotations

import torch

from precisionlab.designs import Design

from .mamba2_step import HeadParams, Mamba2Cache, mamba2_step
from .state import split_unsupported
from .tl_formats import FORMAT_IDS


def supports(design: Design, kind) -> str | None:
    """None if the kernels can run ``design`` for ``kind``, else the reason why not."""
    if getattr(kind, "name", "") != "mamba2":
        return f"no Triton kernels for layer kind {getattr(kind, 'name', kind)!r}"
    for f in {design.checkpoint_format, design.read_format}:
        if f not in FORMAT_IDS:
            return f"format {f!r} has no Triton kernel path"
    if design.kind == "split" and (why := split_unsupported(design.checkpoint_format,
                                                            design.read_format)):
        return why
    N = kind.preset.state_dim
    if N & (N - 1) or N < 16:
        return f"dstate {N} is not a power of two >= 16"
    for f, blk in (("nvfp4", 16), ("mxfp4", 32)):
        if f in (design.checkpoint_format, design.read_format) and N % blk:
            return f"{f} needs dstate divisible by {blk}"
    return None


class TritonMamba2Design:
    """Runs one design over a batch on the GPU with the fused kernels.

    Same constructor and ``step`` as ``TorchDesignRunner``; ``ckpt`` and ``read``
    give the stored copies decoded to fp32 (for inspection).
    """

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
        block_p: int | None = None,
        num_warps: int | None = None,
        launch: str | None = None,
        rows_per_program: int | None = None,
    ):
        why = supports(design, kind)
        if why is not None:
            raise ValueError(why)
        self.design, self.kind, self.params, self.seed = design, kind, params, seed
        H, P, N = kind.preset.state_shape
        self.cache = Mamba2Cache.allocate(
            batch, H, P, N, kind.preset.groups,
            checkpoint_format=design.checkpoint_format,
            read_format=None if design.kind == "shared" else design.read_format,
            window=design.window, ring_dtype=ring_dtype, device=device, seed=seed,
            keep_fresh=True, launch=launch, rows_per_program=rows_per_program,
        )
        S0 = state0 if state0 is not None else torch.zeros((batch, H, P, N), device=device)
        self.cache.load_state(S0.to(device=device, dtype=torch.float32))
        self.head = HeadParams(params.A.float().contiguous(), params.D.float().contiguous())
        self.count = 0
        self.block_p, self.num_warps = block_p, num_warps

    @property
    def ckpt(self) -> torch.Tensor:
        return self.cache.ckpt.decode()

    @property
    def read(self) -> torch.Tensor:
        return self.cache.reader.decode()

    def step(self, inp, t: int, raw: dict[str, torch.Tensor] | None = None
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Advance one decode step (prepared fp32 inputs, dt already softplus'd)."""
        z = inp.z.contiguous() if inp.z is not None else None
        y = mamba2_step(self.cache, inp.x.contiguous(), inp.dt.contiguous(),
                        inp.B.contiguous(), inp.C.contiguous(), self.head, z=z,
                        block_p=self.block_p, num_warps=self.num_warps)
        self.count += 1
        if self.count < self.design.window:
            return y, None
        self.count = 0
        return y, self.cache.fresh.clone()

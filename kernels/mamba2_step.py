"""Python entry points of the fused Mamba-2 decode kernel: the per-slot cache of a
replay design, the replay step (output or flush) and the conventional step.

Torch references: ``precisionlab.layers.mamba2.conventional_step`` (conventional),
``replay_output`` / ``fold`` / ``read_output`` driven as in
``precisionlab.designs.TorchDesignRunner.step`` (replay step).

Every launch is host-sync free and CUDA-graph capturable: ring counts and step
counters live in device tensors that the kernel itself advances.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from .codec import as_int32
from .mamba2_kernel import MODE_CONV, MODE_STEP, mamba2_kernel
from .state import StateStore
from .tl_common import RING_BF16, RING_FP16, RING_FP32
from .tl_formats import FMT_BF16_SR, FMT_FP16_SR, FMT_NVFP4, format_id

_RING_IDS = {torch.float32: RING_FP32, torch.bfloat16: RING_BF16, torch.float16: RING_FP16}
_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "bf16-sr": 2.0, "fp16-sr": 2.0,
          "fp8-e4m3": 1.0, "nvfp4": 0.5, "mxfp4": 0.5}
_BYTES_BY_ID = {format_id(name): b for name, b in _BYTES.items()}
_ARANGE: dict[tuple[int, str], torch.Tensor] = {}


@dataclass
class HeadParams:
    """Per-head constants: ``A`` (negative), optional ``D`` and ``dt_bias`` (heads,)."""

    A: torch.Tensor
    D: torch.Tensor | None = None
    dt_bias: torch.Tensor | None = None


@dataclass
class Mamba2Cache:
    """Device state of one replay design for a pool of ``slots`` sequences.

    ``ckpt`` is the checkpoint (the shared copy for shared designs); ``read`` the
    split read copy (None for shared).  The ring holds up to ``window`` entries
    per slot; ``ring_len``, ``steps`` and ``tickets`` are the per-slot counters
    the kernel advances (see :mod:`precisionlab.kernels.tl_common`).
    """

    ckpt: StateStore
    read: StateStore | None
    ring_x: torch.Tensor
    ring_B: torch.Tensor
    ring_dt: torch.Tensor
    ring_len: torch.Tensor
    steps: torch.Tensor
    tickets: torch.Tensor
    window: int
    seed: int = 0
    fresh: torch.Tensor | None = None

    @classmethod
    def allocate(
        cls,
        slots: int,
        heads: int,
        headdim: int,
        dstate: int,
        groups: int,
        *,
        checkpoint_format: str = "fp32",
        read_format: str | None = None,
        window: int = 16,
        ring_dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str = "cuda",
        seed: int = 0,
        keep_fresh: bool = False,
        speculative: bool = False,
    ) -> Mamba2Cache:
        """Zero state, empty rings.  ``read_format=None`` is a shared design;
        ``keep_fresh`` also keeps the fp32 state of every flush in ``fresh``;
        ``speculative`` gives each slot two ring halves (needed by verify)."""
        shape = (slots, heads, headdim, dstate)
        if ring_dtype not in _RING_IDS:
            raise ValueError(f"ring dtype must be fp32, bf16 or fp16, got {ring_dtype}")
        if window < 1:
            raise ValueError("window must be >= 1")
        i32 = dict(dtype=torch.int32, device=device)
        cap = 2 * window if speculative else window
        cache = cls(
            ckpt=StateStore.empty(checkpoint_format, shape, device),
            read=None if read_format is None else StateStore.empty(read_format, shape, device),
            ring_x=torch.zeros((slots, cap, heads, headdim), dtype=ring_dtype, device=device),
            ring_B=torch.zeros((slots, cap, groups, dstate), dtype=ring_dtype, device=device),
            ring_dt=torch.zeros((slots, cap, heads), dtype=torch.float32, device=device),
            ring_len=torch.zeros(slots, **i32),
            steps=torch.zeros(slots, **i32),
            tickets=torch.zeros(slots, **i32),
            window=window,
            seed=seed,
            fresh=torch.zeros(shape, dtype=torch.float32, device=device) if keep_fresh else None,
        )
        cache.load_state(torch.zeros(shape, dtype=torch.float32, device=device))
        return cache

    @property
    def split(self) -> bool:
        return self.read is not None

    @property
    def speculative(self) -> bool:
        return self.ring_x.shape[1] == 2 * self.window

    def committed(self) -> torch.Tensor:
        """Committed ring entries per slot (int32, on the device)."""
        return self.ring_len & 0xFFFF

    @property
    def reader(self) -> StateStore:
        """The copy output steps read."""
        return self.read if self.read is not None else self.ckpt

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return self.ckpt.shape

    @property
    def groups(self) -> int:
        return self.ring_B.shape[2]

    def load_state(self, S: torch.Tensor, step: int = 0) -> None:
        """Store fp32 states ``S`` (slots, heads, P, N) as the checkpoint (seed) and
        read copy (seed + 1) with the torch formats; empty the rings."""
        self.ckpt.copy_(StateStore.encode(S, self.ckpt.fmt, seed=self.seed, step=step))
        if self.read is not None:
            self.read.copy_(StateStore.encode(S, self.read.fmt, seed=self.seed + 1, step=step))
        for t in (self.ring_len, self.steps, self.tickets):
            t.zero_()

    def state_bytes(self) -> tuple[int, int]:
        """``(checkpoint bytes, read-copy bytes)`` over all slots."""
        return self.ckpt.nbytes(), self.reader.nbytes()


def slot_indices(batch: int, device: torch.device) -> torch.Tensor:
    """Cached ``arange(batch)`` int32 (batch row b uses slot b)."""
    key = (batch, str(device))
    if key not in _ARANGE:
        _ARANGE[key] = torch.arange(batch, dtype=torch.int32, device=device)
    return _ARANGE[key]


def pick_block_p(headdim: int, dstate: int, fmt_ids: tuple[int, ...],
                 block_p: int | None = None, minimum: int = 16) -> int:
    """Rows per program: the whole (padded) head matrix when nvfp4 is written or
    read, else ``block_p`` or a default of ~8 KB of stored state per program
    (at least ``minimum`` rows: replay tiles need 16 for their flush chunks)."""
    whole = triton.next_power_of_2(headdim)
    if FMT_NVFP4 in fmt_ids:
        return whole
    if block_p is not None:
        return max(minimum, min(block_p, whole))
    nbytes = min(_BYTES_BY_ID[f] for f in fmt_ids)
    rows = triton.next_power_of_2(max(1, int(8192 // (dstate * nbytes))))
    return max(minimum, min(rows, whole))


def pick_warps(block_p: int, dstate: int, num_warps: int | None = None) -> int:
    """Warps per program: ~16-32 state elements per thread (4 to 16 warps)."""
    if num_warps is not None:
        return num_warps
    return max(4, min(16, block_p * dstate // 1024))


def _strides(t: torch.Tensor | None, token_dim: bool) -> tuple[int, int]:
    if t is None:
        return 0, 0
    return t.stride(0), (t.stride(1) if token_dim else 0)


def _inner_contiguous(t: torch.Tensor, inner: int, name: str) -> None:
    if t is None:
        return
    want = 1
    for d in range(t.dim() - 1, t.dim() - 1 - inner, -1):
        if t.shape[d] != 1 and t.stride(d) != want:
            raise ValueError(f"{name} must be contiguous in its last {inner} dims")
        want *= t.shape[d]


def launch(
    mode: int,
    ckpt: StateStore,
    read: StateStore | None,
    cache: Mamba2Cache | None,
    x: torch.Tensor,
    dt: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    params: HeadParams,
    *,
    z: torch.Tensor | None,
    out: torch.Tensor,
    state_indices: torch.Tensor,
    T: int,
    dt_softplus: bool,
    seed: int,
    steps: torch.Tensor | None = None,
    block_p: int | None = None,
    num_warps: int | None = None,
    flush_rows: int = 16,
) -> None:
    """Launch :func:`mamba2_kernel` (shared by the step, conventional and verify wrappers).

    Token-major inputs (``T > 1`` or verify) are (batch, T, ...); else (batch, ...)."""
    slots, H, P, N = ckpt.shape
    if N & (N - 1):
        raise ValueError(f"dstate must be a power of two, got {N}")
    tok = x.dim() == 4
    G = B.shape[-2]
    batch = x.shape[0]
    for t, name, inner in ((x, "x", 2), (B, "B", 2), (C, "C", 2), (dt, "dt", 1), (z, "z", 2),
                           (out, "out", 2)):
        _inner_contiguous(t, inner, name)
    ck_id = ckpt.fmt_id
    rd = read if read is not None else ckpt
    ids = (ck_id, rd.fmt_id)
    bp = pick_block_p(P, N, ids, block_p, 1 if mode == MODE_CONV else 16)
    nw = pick_warps(bp, N, num_warps)
    if cache is not None:
        ring = (cache.ring_x, cache.ring_B, cache.ring_dt, cache.ring_len, cache.steps,
                cache.tickets)
        ring_id = _RING_IDS[cache.ring_x.dtype]
        rx, rB = (ring[0], ring[1]) if ring_id == RING_FP32 else (
            ring[0].view(torch.int16), ring[1].view(torch.int16))
        ring = (rx, rB, *ring[2:])
        L, LR = cache.window, cache.ring_x.shape[1]
        fresh = cache.fresh if cache.fresh is not None else ckpt.codes
    else:
        dummy = steps if steps is not None else state_indices
        ring = (ckpt.codes, ckpt.codes, ckpt.codes, dummy, dummy, _tickets_for(dummy))
        ring_id, L, LR, fresh = RING_FP32, 1, 1, ckpt.codes
    count_steps = mode == MODE_CONV and ck_id in (FMT_BF16_SR, FMT_FP16_SR)
    if count_steps and steps is None:
        raise ValueError("stochastic-rounding conventional steps need a `steps` counter tensor")
    rb = max(16, triton.next_power_of_2(L))
    need_amax = FMT_NVFP4 in (ck_id, rd.fmt_id) and mode != MODE_CONV
    grid = (H * triton.cdiv(P, bp), batch)
    mamba2_kernel[grid](
        *ckpt.kernel_args(), *rd.kernel_args(), fresh,
        *ring, state_indices,
        x, dt, B, C, z if z is not None else x, out, params.A,
        params.D if params.D is not None else params.A,
        params.dt_bias if params.dt_bias is not None else params.A,
        as_int32(seed), as_int32(seed + 1),
        *_strides(x, tok), *_strides(dt, tok), *_strides(B, tok), *_strides(C, tok),
        *_strides(z, tok), *_strides(out, tok),
        H, G, P, L, LR,
        N=N, BLOCK_P=bp, FB=min(bp, flush_rows), RB=rb, T=T, MODE=mode, CK_FMT=ck_id,
        RD_FMT=rd.fmt_id,
        SPLIT=read is not None, RING=ring_id, HAS_Z=z is not None, HAS_D=params.D is not None,
        HAS_DT_BIAS=params.dt_bias is not None, DT_SOFTPLUS=dt_softplus,
        WRITE_FRESH=cache is not None and cache.fresh is not None, COUNT_STEPS=count_steps,
        NEED_AMAX=need_amax, num_warps=nw,
    )


_TICKETS: dict[int, torch.Tensor] = {}


def _tickets_for(steps: torch.Tensor) -> torch.Tensor:
    """A zeroed ticket tensor paired with a conventional step counter."""
    key = steps.data_ptr()
    t = _TICKETS.get(key)
    if t is None or t.numel() != steps.numel() or t.device != steps.device:
        t = torch.zeros_like(steps)
        _TICKETS[key] = t
    return t


def mamba2_step(
    cache: Mamba2Cache,
    x: torch.Tensor,
    dt: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    params: HeadParams,
    *,
    z: torch.Tensor | None = None,
    state_indices: torch.Tensor | None = None,
    dt_softplus: bool = False,
    out: torch.Tensor | None = None,
    block_p: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """One replay decode step for a batch (one launch; output or flush per slot).

    ``x, z``: (batch, heads, P); ``dt``: (batch, heads) (raw when ``dt_softplus``,
    then ``softplus(dt + dt_bias)`` is applied); ``B, C``: (batch, groups, N);
    ``state_indices``: int32 (batch,) slot of each row (-1: padding, output 0).
    Appends the step to each slot's ring; a slot whose ring fills folds it into
    a new checkpoint (and read copy) and outputs from the fresh fp32 state.
    Returns ``y`` (batch, heads, P) float32 (or ``out``).
    """
    idx = state_indices if state_indices is not None else slot_indices(x.shape[0], x.device)
    if out is None:
        out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    launch(MODE_STEP, cache.ckpt, cache.read, cache, x, dt, B, C, params, z=z, out=out,
           state_indices=idx, T=1, dt_softplus=dt_softplus, seed=cache.seed,
           block_p=block_p, num_warps=num_warps)
    return out


def mamba2_conventional_step(
    state: StateStore,
    x: torch.Tensor,
    dt: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    params: HeadParams,
    *,
    z: torch.Tensor | None = None,
    state_indices: torch.Tensor | None = None,
    dt_softplus: bool = False,
    steps: torch.Tensor | None = None,
    seed: int = 0,
    out: torch.Tensor | None = None,
    block_p: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """Conventional decode step: read the state, update it in fp32, write it back.

    ``state`` in fp32, bf16, fp16 (RNE) or bf16-sr / fp16-sr (stochastic rounding
    with ``seed`` and ``step = steps[slot]``, which the kernel then increments;
    ``steps`` is an int32 (slots,) tensor).  Shapes as :func:`mamba2_step`.
    """
    idx = state_indices if state_indices is not None else slot_indices(x.shape[0], x.device)
    if out is None:
        out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    launch(MODE_CONV, state, None, None, x, dt, B, C, params, z=z, out=out, state_indices=idx,
           T=1, dt_softplus=dt_softplus, seed=seed, steps=steps, block_p=block_p,
           num_warps=num_warps)
    return out

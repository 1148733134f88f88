"""Stand-alone Triton encode/decode of state tensors (torch reference:
``precisionlab.formats.get(fmt).encode / decode``).

The fused kernels use the same device functions inline; these launches exist to
test them bit for bit and to encode initial states on the device.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .compile_worker import settle_module_keys
from .state import StateStore
from .tl_formats import (
    FMT_BF16_SR,
    FMT_FP16_SR,
    FMT_NVFP4,
    compiled_on,
    format_id,
    load_state,
    matrix_amax,
    store_state_with,
)
from .tl_mamba2_fast import store_fast


@triton.jit(do_not_specialize=["seed", "step"])
def _encode_kernel(x_ptr, c_ptr, s1_ptr, s2_ptr, P, seed, step,
                   FMT: tl.constexpr, BLOCK_P: tl.constexpr, N: tl.constexpr,
                   FAST: tl.constexpr, HW: tl.constexpr = False):
    mat = tl.program_id(1).to(tl.int64)
    offs_p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    mask_p = offs_p < P
    row = mat * P + offs_p
    S = tl.load(x_ptr + row[:, None] * N + tl.arange(0, N)[None, :], mask=mask_p[:, None],
                other=0.0)
    if HW:
        store_fast(c_ptr, s1_ptr, s2_ptr, S, mat, offs_p, mask_p, P, seed, step,
                   matrix_amax(S), FMT, BLOCK_P, N, True, True)
    else:
        store_state_with(c_ptr, s1_ptr, s2_ptr, S, mat, offs_p, mask_p, P, seed, step,
                         matrix_amax(S), FMT, BLOCK_P, N, FAST)


@triton.jit
def _decode_kernel(c_ptr, s1_ptr, s2_ptr, y_ptr, P,
                   FMT: tl.constexpr, BLOCK_P: tl.constexpr, N: tl.constexpr):
    mat = tl.program_id(1).to(tl.int64)
    offs_p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    mask_p = offs_p < P
    S = load_state(c_ptr, s1_ptr, s2_ptr, mat, offs_p, mask_p, P, FMT, BLOCK_P, N)
    row = mat * P + offs_p
    tl.store(y_ptr + row[:, None] * N + tl.arange(0, N)[None, :], S, mask=mask_p[:, None])


def as_int32(v: int) -> int:
    """A uint32 value as the int32 with the same bits (kernel scalar arguments)."""
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


def _block_p(fmt_id: int, rows: int, block_p: int | None) -> int:
    whole = triton.next_power_of_2(rows)
    if fmt_id == FMT_NVFP4:
        return whole
    return min(block_p or 16, whole)


def encode(x: torch.Tensor, fmt: str, *, seed: int = 0, step: int = 0,
           block_p: int | None = None, fast: bool = False, hw: bool = False) -> StateStore:
    """Encode ``x`` of shape (slots, heads, rows, cols) with the Triton codecs
    (``fast``: the integer-rounding encoders the fused kernels may use; ``hw``, compiled
    code only: the flush kernels' ``tl_mamba2_fast.store_fast`` encoders with the
    hardware fp8 conversion; the same bits either way)."""
    fid = format_id(fmt)
    x = x.float().contiguous()
    out = StateStore.empty(fmt, tuple(x.shape), x.device)
    s, h, rows, cols = x.shape
    bp = _block_p(fid, rows, block_p)
    _encode_kernel[(triton.cdiv(rows, bp), s * h)](
        x, *out.kernel_args(), rows, as_int32(seed), as_int32(step), FMT=fid, BLOCK_P=bp, N=cols,
        FAST=fast, HW=hw)
    return out


def encode_state(S: torch.Tensor, fmt: str, *, seed: int = 0, step: int = 0) -> StateStore:
    """``StateStore.encode`` of a (slots, heads, rows, cols) state, the same bits.  A
    stochastically rounded format is encoded by :func:`encode` where kernels run compiled:
    on CUDA the torch formats fuse that rounding with ``torch.compile``, which costs
    seconds on first use, and a run on the kernels needs none of it.  Every other case
    takes the torch formats."""
    fid = format_id(fmt)
    if (fid in (FMT_FP16_SR, FMT_BF16_SR) and compiled_on(S.device) and S.dim() == 4
            and triton.next_power_of_2(S.shape[-1]) == S.shape[-1]):
        return encode(S, fmt, seed=seed, step=step)
    return StateStore.encode(S, fmt, seed=seed, step=step)


def decode(store: StateStore, block_p: int | None = None) -> torch.Tensor:
    """Decode a store to float32 with the Triton codecs."""
    fid = store.fmt_id
    s, h, rows, cols = store.shape
    y = torch.empty((s, h, rows, cols), dtype=torch.float32, device=store.codes.device)
    bp = _block_p(fid, rows, block_p)
    _decode_kernel[(triton.cdiv(rows, bp), s * h)](*store.kernel_args(), y, rows,
                                                    FMT=fid, BLOCK_P=bp, N=cols)
    return y


settle_module_keys(__name__)  # every process looks its kernels up under one key

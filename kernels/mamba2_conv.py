"""Fused conventional Mamba-2 decode step: read the state, update it in fp32,
write it back (fp32, bf16, fp16, or bf16-sr / fp16-sr with stochastic rounding).

Torch reference: ``precisionlab.layers.mamba2.conventional_step``.

One program per (batch row, head, block of ``BLOCK_P`` headdim rows), the whole
dstate row in registers; one dependent load (the slot) before the state load.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .compile_worker import settle_module_keys
from .tl_common import dt_of, finish_slot, gate
from .tl_formats import load_state, store_state


@triton.jit(do_not_specialize=["seed"])
def mamba2_conv_kernel(
    st_c, st_s1, st_s2, steps, tickets, state_idx,
    x_ptr, dt_ptr, B_ptr, C_ptr, z_ptr, out_ptr, A_ptr, D_ptr, dtb_ptr, seed,
    s_xb, s_dtb, s_Bb, s_Cb, s_zb, s_ob,
    H, G, P,
    N: tl.constexpr, BLOCK_P: tl.constexpr, FMT: tl.constexpr, HAS_Z: tl.constexpr,
    HAS_D: tl.constexpr, HAS_DT_BIAS: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
    COUNT_STEPS: tl.constexpr,
):
    npb = tl.cdiv(P, BLOCK_P)
    pid = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    h = pid // npb
    pb = pid - h * npb
    g = h // (H // G)
    offs_p = pb * BLOCK_P + tl.arange(0, BLOCK_P)
    mask_p = offs_p < P
    offs_n = tl.arange(0, N)
    out_b = out_ptr + b * s_ob + h * P
    slot = tl.load(state_idx + b)
    if slot < 0:  # padding row: zero output, no state
        tl.store(out_b + offs_p, 0.0, mask=mask_p)
        return
    mat = slot.to(tl.int64) * H + h
    S = load_state(st_c, st_s1, st_s2, mat, offs_p, mask_p, P, FMT, BLOCK_P, N)
    x_t = tl.load(x_ptr + b * s_xb + h * P + offs_p, mask=mask_p, other=0.0).to(tl.float32)
    dtb = 0.0
    if HAS_DT_BIAS:
        dtb = tl.load(dtb_ptr + h).to(tl.float32)
    dt_t = dt_of(tl.load(dt_ptr + b * s_dtb + h), dtb, HAS_DT_BIAS, DT_SOFTPLUS)
    B_t = tl.load(B_ptr + b * s_Bb + g * N + offs_n).to(tl.float32)
    C_t = tl.load(C_ptr + b * s_Cb + g * N + offs_n).to(tl.float32)
    A_h = tl.load(A_ptr + h).to(tl.float32)
    D_h = 0.0
    if HAS_D:
        D_h = tl.load(D_ptr + h).to(tl.float32)
    z_t = 0.0
    if HAS_Z:
        z_t = tl.load(z_ptr + b * s_zb + h * P + offs_p, mask=mask_p, other=0.0).to(tl.float32)
    S = tl.exp(dt_t * A_h) * S + (dt_t * x_t)[:, None] * B_t[None, :]
    S = tl.where(mask_p[:, None], S, 0.0)
    y = tl.sum(S * C_t[None, :], axis=1)
    t = 0
    if COUNT_STEPS:
        t = tl.load(steps + slot)
    store_state(st_c, st_s1, st_s2, S, mat, offs_p, mask_p, P, seed, t, 0.0, FMT, BLOCK_P, N)
    tl.store(out_b + offs_p, gate(y, x_t, z_t, D_h, HAS_Z), mask=mask_p)
    if COUNT_STEPS:  # the slot's last program advances its step counter
        finish_slot(tickets, steps, steps, slot, H * npb, t + 1, t + 1)


settle_module_keys(__name__)  # every process looks its kernels up under one key

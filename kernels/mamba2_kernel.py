"""The fused Mamba-2 decode kernel: conventional step, replay step (output or
flush, chosen per slot on the device) and speculative verify, one launch each.

Torch reference: ``precisionlab.layers.mamba2`` (``conventional_step``,
``replay_output``, ``fold``, ``read_output``) with the design semantics of
``precisionlab.designs.TorchDesignRunner`` and ``precisionlab.speculative``.

Tiling: one program per (batch row, head, block of ``BLOCK_P`` headdim rows),
the whole dstate row ``N`` in registers, so every row-scaled format (fp8 amax
per row) is encoded by the program that owns the row.  nvfp4's per-matrix scale
needs the amax of the whole (P, N) head matrix: designs that write nvfp4 run
with ``BLOCK_P >= P`` (one program per head matrix, rows past P masked) rather
than a two-phase scheme, which would need a second launch or a grid barrier.

The ring (at most L entries of x, B, dt) is loaded once per program; entry
weights come from a cumulative sum over the window; the flush's rank-L update
is one exact (ieee) fp32 ``tl.dot``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .tl_common import (
    decay_weights,
    dt_of,
    finish_slot,
    fold_rows,
    gate,
    ring_load,
    ring_round,
    ring_rows,
    ring_store,
)
from .tl_formats import load_state, store_state

MODE_CONV = 0
MODE_STEP = 1
MODE_VERIFY = 2


@triton.jit(do_not_specialize=["seed_ck", "seed_rd"])
def mamba2_kernel(
    ck_c, ck_s1, ck_s2, rd_c, rd_s1, rd_s2, fresh_ptr,
    ring_x, ring_B, ring_dt, ring_len, steps, tickets, state_idx,
    x_ptr, dt_ptr, B_ptr, C_ptr, z_ptr, out_ptr, A_ptr, D_ptr, dtb_ptr,
    seed_ck, seed_rd,
    s_xb, s_xt, s_dtb, s_dtt, s_Bb, s_Bt, s_Cb, s_Ct, s_zb, s_zt, s_ob, s_ot,
    H, G, P, L, LR,
    N: tl.constexpr, BLOCK_P: tl.constexpr, RB: tl.constexpr, T: tl.constexpr,
    MODE: tl.constexpr, CK_FMT: tl.constexpr, RD_FMT: tl.constexpr, SPLIT: tl.constexpr,
    RING: tl.constexpr, HAS_Z: tl.constexpr, HAS_D: tl.constexpr, HAS_DT_BIAS: tl.constexpr,
    DT_SOFTPLUS: tl.constexpr, WRITE_FRESH: tl.constexpr, COUNT_STEPS: tl.constexpr,
):
    npb = tl.cdiv(P, BLOCK_P)
    pid = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    h = pid // npb
    pb = pid - h * npb
    hpg = H // G
    g = h // hpg
    offs_p = pb * BLOCK_P + tl.arange(0, BLOCK_P)
    mask_p = offs_p < P
    offs_n = tl.arange(0, N)
    offs_r = tl.arange(0, RB)

    slot = tl.load(state_idx + b)
    if slot < 0:  # padding row: zero output, no state
        for j in tl.static_range(T):
            tl.store(out_ptr + b * s_ob + j * s_ot + h * P + offs_p, 0.0, mask=mask_p)
        return
    mat = slot.to(tl.int64) * H + h
    A_h = tl.load(A_ptr + h).to(tl.float32)
    D_h = 0.0
    if HAS_D:
        D_h = tl.load(D_ptr + h).to(tl.float32)
    dtb = 0.0
    if HAS_DT_BIAS:
        dtb = tl.load(dtb_ptr + h).to(tl.float32)
    nprog = H * npb

    if MODE == MODE_CONV:
        # ---- conventional: S = exp(dt A) S + dt x B^T ; y = S C + D x -------------
        x_t = tl.load(x_ptr + b * s_xb + h * P + offs_p, mask=mask_p, other=0.0).to(tl.float32)
        dt_t = dt_of(tl.load(dt_ptr + b * s_dtb + h), dtb, HAS_DT_BIAS, DT_SOFTPLUS)
        B_t = tl.load(B_ptr + b * s_Bb + g * N + offs_n).to(tl.float32)
        C_t = tl.load(C_ptr + b * s_Cb + g * N + offs_n).to(tl.float32)
        S = load_state(ck_c, ck_s1, ck_s2, mat, offs_p, mask_p, P, CK_FMT, BLOCK_P, N)
        S = tl.exp(dt_t * A_h) * S + (dt_t * x_t)[:, None] * B_t[None, :]
        S = tl.where(mask_p[:, None], S, 0.0)
        y = tl.sum(S * C_t[None, :], axis=1)
        t = 0
        if COUNT_STEPS:
            t = tl.load(steps + slot)
        store_state(ck_c, ck_s1, ck_s2, S, mat, offs_p, mask_p, P, seed_ck, t,
                    CK_FMT, BLOCK_P, N)
        z_t = 0.0
        if HAS_Z:
            z_t = tl.load(z_ptr + b * s_zb + h * P + offs_p, mask=mask_p, other=0.0)
            z_t = z_t.to(tl.float32)
        y = gate(y, x_t, z_t, D_h, HAS_Z)
        tl.store(out_ptr + b * s_ob + h * P + offs_p, y, mask=mask_p)
        if COUNT_STEPS:
            finish_slot(tickets, steps, steps, slot, nprog, t + 1, t + 1)
    else:
        rl = tl.load(ring_len + slot)
        c = rl & 0xFFFF
        half = rl >> 16
        t = tl.load(steps + slot)
        rows = ring_rows(slot, half, offs_r, L, LR)
        # committed ring entries [0, c)
        mr = offs_r < c
        rdt = tl.load(ring_dt + rows * H + h, mask=mr, other=0.0)
        rx = ring_load(ring_x + (rows[:, None] * H + h) * P + offs_p[None, :],
                       mr[:, None] & mask_p[None, :], RING)
        rB = ring_load(ring_B + (rows[:, None] * G + g) * N + offs_n[None, :], mr[:, None], RING)

        if MODE == MODE_STEP:
            # ---- replay step: entry c = this step; flush when the ring fills -----
            x_t = tl.load(x_ptr + b * s_xb + h * P + offs_p, mask=mask_p, other=0.0)
            x_t = x_t.to(tl.float32)
            dt_t = dt_of(tl.load(dt_ptr + b * s_dtb + h), dtb, HAS_DT_BIAS, DT_SOFTPLUS)
            xr_t = ring_round(x_t, RING)
            Br_t = ring_round(tl.load(B_ptr + b * s_Bb + g * N + offs_n).to(tl.float32), RING)
            C_t = tl.load(C_ptr + b * s_Cb + g * N + offs_n).to(tl.float32)
            cur = offs_r == c
            ex = tl.where(cur[:, None], xr_t[None, :], rx)
            eB = tl.where(cur[:, None], Br_t[None, :], rB)
            edt = tl.where(cur, dt_t, rdt)
            cum = tl.cumsum(edt * A_h, axis=0)
            last, w = decay_weights(edt, cum, offs_r, c)
            if c + 1 >= L:
                S = load_state(ck_c, ck_s1, ck_s2, mat, offs_p, mask_p, P, CK_FMT, BLOCK_P, N)
                S = tl.where(mask_p[:, None], fold_rows(S, last, w, ex, eB), 0.0)
                y = tl.sum(S * C_t[None, :], axis=1)
                store_state(ck_c, ck_s1, ck_s2, S, mat, offs_p, mask_p, P, seed_ck, t,
                            CK_FMT, BLOCK_P, N)
                if SPLIT:
                    store_state(rd_c, rd_s1, rd_s2, S, mat, offs_p, mask_p, P, seed_rd, t,
                                RD_FMT, BLOCK_P, N)
                if WRITE_FRESH:
                    tl.store(fresh_ptr + (mat * P + offs_p)[:, None] * N + offs_n[None, :], S,
                             mask=mask_p[:, None])
                new_len = rl - c
            else:
                S = load_state(rd_c, rd_s1, rd_s2, mat, offs_p, mask_p, P, RD_FMT, BLOCK_P, N)
                BC = tl.sum(eB * C_t[None, :], axis=1)
                y = tl.exp(last) * tl.sum(S * C_t[None, :], axis=1)
                y = y + tl.sum((w * BC)[:, None] * ex, axis=0)
                row_c = slot.to(tl.int64) * LR + half * L + c
                ring_store(ring_x + (row_c * H + h) * P + offs_p, xr_t, mask_p, RING)
                if pb == 0:
                    tl.store(ring_dt + row_c * H + h, dt_t)
                    if h % hpg == 0:
                        ring_store(ring_B + (row_c * G + g) * N + offs_n, Br_t, offs_n < N, RING)
                new_len = rl + 1
            z_t = 0.0
            if HAS_Z:
                z_t = tl.load(z_ptr + b * s_zb + h * P + offs_p, mask=mask_p, other=0.0)
                z_t = z_t.to(tl.float32)
            y = gate(y, x_t, z_t, D_h, HAS_Z)
            tl.store(out_ptr + b * s_ob + h * P + offs_p, y, mask=mask_p)
            finish_slot(tickets, ring_len, steps, slot, nprog, new_len, t + 1)
        else:
            # ---- speculative verify: T drafts behind the commit pointer ----------
            flush = c + T > L
            if flush:  # fold the committed entries first (they fill the window)
                cum0 = tl.cumsum(rdt * A_h, axis=0)
                last0, w0 = decay_weights(rdt, cum0, offs_r, c - 1)
                S = load_state(ck_c, ck_s1, ck_s2, mat, offs_p, mask_p, P, CK_FMT, BLOCK_P, N)
                S = tl.where(mask_p[:, None], fold_rows(S, last0, w0, rx, rB), 0.0)
                base = store_state(ck_c, ck_s1, ck_s2, S, mat, offs_p, mask_p, P, seed_ck,
                                   t - 1, CK_FMT, BLOCK_P, N)
                if SPLIT:
                    base = store_state(rd_c, rd_s1, rd_s2, S, mat, offs_p, mask_p, P, seed_rd,
                                       t - 1, RD_FMT, BLOCK_P, N)
                if WRITE_FRESH:
                    tl.store(fresh_ptr + (mat * P + offs_p)[:, None] * N + offs_n[None, :], S,
                             mask=mask_p[:, None])
                c0 = c * 0
                half = 1 - half  # drafts go to the other ring half
            else:
                base = load_state(rd_c, rd_s1, rd_s2, mat, offs_p, mask_p, P, RD_FMT, BLOCK_P, N)
                c0 = c
            # drafts occupy entries [c0, c0 + T)
            j = offs_r - c0
            vd = (j >= 0) & (j < T)
            jj = tl.where(vd, j, 0).to(tl.int64)
            ix = tl.load(x_ptr + b * s_xb + jj[:, None] * s_xt + h * P + offs_p[None, :],
                         mask=vd[:, None] & mask_p[None, :], other=0.0).to(tl.float32)
            iB = tl.load(B_ptr + b * s_Bb + jj[:, None] * s_Bt + g * N + offs_n[None, :],
                         mask=vd[:, None], other=0.0).to(tl.float32)
            idt = dt_of(tl.load(dt_ptr + b * s_dtb + jj * s_dtt + h, mask=vd, other=0.0), dtb,
                        HAS_DT_BIAS, DT_SOFTPLUS)
            ix = ring_round(ix, RING)
            iB = ring_round(iB, RING)
            old = offs_r < c0
            ex = tl.where(old[:, None], rx, ix)
            eB = tl.where(old[:, None], rB, iB)
            edt = tl.where(old, rdt, tl.where(vd, idt, 0.0))
            cum = tl.cumsum(edt * A_h, axis=0)
            for k in tl.static_range(T):
                last, w = decay_weights(edt, cum, offs_r, c0 + k)
                C_k = tl.load(C_ptr + b * s_Cb + k * s_Ct + g * N + offs_n).to(tl.float32)
                x_k = tl.load(x_ptr + b * s_xb + k * s_xt + h * P + offs_p, mask=mask_p,
                              other=0.0).to(tl.float32)
                BC = tl.sum(eB * C_k[None, :], axis=1)
                y = tl.exp(last) * tl.sum(base * C_k[None, :], axis=1)
                y = y + tl.sum((w * BC)[:, None] * ex, axis=0)
                z_k = 0.0
                if HAS_Z:
                    z_k = tl.load(z_ptr + b * s_zb + k * s_zt + h * P + offs_p, mask=mask_p,
                                  other=0.0).to(tl.float32)
                y = gate(y, x_k, z_k, D_h, HAS_Z)
                tl.store(out_ptr + b * s_ob + k * s_ot + h * P + offs_p, y, mask=mask_p)
            # write the drafts into the ring (the commit pointer stays at c0)
            rows = ring_rows(slot, half, offs_r, L, LR)
            ring_store(ring_x + (rows[:, None] * H + h) * P + offs_p[None, :], ix,
                       vd[:, None] & mask_p[None, :], RING)
            if pb == 0:
                tl.store(ring_dt + rows * H + h, idt, mask=vd)
                if h % hpg == 0:
                    ring_store(ring_B + (rows[:, None] * G + g) * N + offs_n[None, :], iB,
                               vd[:, None], RING)
            if flush:
                finish_slot(tickets, ring_len, steps, slot, nprog, half << 16, t)

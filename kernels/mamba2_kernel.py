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

The ring (at most L entries of x, B, dt) is loaded once per program on output
steps; entry weights come from a cumulative sum over the window.  Flushes work
``FB`` rows at a time and re-read ring entries one by one (L1/L2-hot) for the
rank-L update, so the rarely taken flush branch needs no more registers than
the output path (register use is the kernel's, whichever branch runs): the
output steps keep their occupancy.  nvfp4 flushes take a first pass over the
chunks for the matrix amax (recomputing from L2-hot data, no extra HBM bytes).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .tl_common import (
    decay_weights,
    dt_of,
    finish_slot,
    fold_ring,
    gate,
    ring_load,
    ring_round,
    ring_store,
)
from .tl_formats import load_state, matrix_amax, store_state, tile_offsets

MODE_CONV = 0
MODE_STEP = 1
MODE_VERIFY = 2
K_MODE_CONV = tl.constexpr(MODE_CONV)
K_MODE_STEP = tl.constexpr(MODE_STEP)
K_MODE_VERIFY = tl.constexpr(MODE_VERIFY)


@triton.jit(do_not_specialize=["seed_ck", "seed_rd"])
def mamba2_kernel(
    ck_c, ck_s1, ck_s2, rd_c, rd_s1, rd_s2, fresh_ptr,
    ring_x, ring_B, ring_dt, ring_len, steps, tickets, state_idx,
    x_ptr, dt_ptr, B_ptr, C_ptr, z_ptr, out_ptr, A_ptr, D_ptr, dtb_ptr,
    seed_ck, seed_rd,
    s_xb, s_xt, s_dtb, s_dtt, s_Bb, s_Bt, s_Cb, s_Ct, s_zb, s_zt, s_ob, s_ot,
    H, G, P, L, LR,
    N: tl.constexpr, BLOCK_P: tl.constexpr, FB: tl.constexpr, RB: tl.constexpr, T: tl.constexpr,
    MODE: tl.constexpr, CK_FMT: tl.constexpr, RD_FMT: tl.constexpr, SPLIT: tl.constexpr,
    RING: tl.constexpr, HAS_Z: tl.constexpr, HAS_D: tl.constexpr, HAS_DT_BIAS: tl.constexpr,
    DT_SOFTPLUS: tl.constexpr, WRITE_FRESH: tl.constexpr, COUNT_STEPS: tl.constexpr,
    NEED_AMAX: tl.constexpr,
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
    # scalar int64 bases; tensors below carry int32 offsets only
    x_b = x_ptr + b * s_xb + h * P
    z_b = z_ptr + b * s_zb + h * P
    out_b = out_ptr + b * s_ob + h * P
    dt_b = dt_ptr + b * s_dtb + h
    B_b = B_ptr + b * s_Bb + g * N
    C_b = C_ptr + b * s_Cb + g * N

    slot = tl.load(state_idx + b)
    if slot < 0:  # padding row: zero output, no state
        for j in tl.static_range(T):
            tl.store(out_b + j * s_ot + offs_p, 0.0, mask=mask_p)
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
    fresh_b = fresh_ptr + mat * P * N

    if MODE == K_MODE_CONV:
        # ---- conventional: S = exp(dt A) S + dt x B^T ; y = S C + D x -------------
        x_t = tl.load(x_b + offs_p, mask=mask_p, other=0.0).to(tl.float32)
        dt_t = dt_of(tl.load(dt_b), dtb, HAS_DT_BIAS, DT_SOFTPLUS)
        B_t = tl.load(B_b + offs_n).to(tl.float32)
        C_t = tl.load(C_b + offs_n).to(tl.float32)
        S = load_state(ck_c, ck_s1, ck_s2, mat, offs_p, mask_p, P, CK_FMT, BLOCK_P, N)
        S = tl.exp(dt_t * A_h) * S + (dt_t * x_t)[:, None] * B_t[None, :]
        S = tl.where(mask_p[:, None], S, 0.0)
        y = tl.sum(S * C_t[None, :], axis=1)
        t = 0
        if COUNT_STEPS:
            t = tl.load(steps + slot)
        store_state(ck_c, ck_s1, ck_s2, S, mat, offs_p, mask_p, P, seed_ck, t, 0.0,
                    CK_FMT, BLOCK_P, N)
        z_t = 0.0
        if HAS_Z:
            z_t = tl.load(z_b + offs_p, mask=mask_p, other=0.0).to(tl.float32)
        y = gate(y, x_t, z_t, D_h, HAS_Z)
        tl.store(out_b + offs_p, y, mask=mask_p)
        if COUNT_STEPS:
            finish_slot(tickets, steps, steps, slot, nprog, t + 1, t + 1)
    else:
        rl = tl.load(ring_len + slot)
        c = rl & 0xFFFF
        half = rl >> 16
        t = tl.load(steps + slot)
        win = slot.to(tl.int64) * LR + half * L  # first ring row of this window
        rx_b = ring_x + (win * H + h) * P
        rB_b = ring_B + (win * G + g) * N
        rdt_b = ring_dt + win * H + h
        ox = offs_r[:, None] * (H * P) + offs_p[None, :]
        oB = offs_r[:, None] * (G * N) + offs_n[None, :]
        rdt = tl.load(rdt_b + offs_r * H, mask=offs_r < c, other=0.0)
        n_rows = P - pb * BLOCK_P  # rows of this tile inside the matrix

        if MODE == K_MODE_STEP:
            # ---- replay step: entry c = this step; flush when the ring fills -----
            dt_t = dt_of(tl.load(dt_b), dtb, HAS_DT_BIAS, DT_SOFTPLUS)
            Br_t = ring_round(tl.load(B_b + offs_n).to(tl.float32), RING)
            C_t = tl.load(C_b + offs_n).to(tl.float32)
            edt = tl.where(offs_r == c, dt_t, rdt)
            cum = tl.cumsum(edt * A_h, axis=0)
            last, w = decay_weights(edt, cum, offs_r, c)
            if c + 1 >= L:
                # flush, FB rows at a time: S = exp(Lambda) S_c + sum_i w_i x_i B_i^T
                w_c = tl.sum(tl.where(offs_r == c, w, 0.0), axis=0)
                amax = 0.0
                if NEED_AMAX:  # nvfp4 matrix scale: a first pass for the amax
                    for ch in range(BLOCK_P // FB):
                        if ch * FB < n_rows:
                            rows = pb * BLOCK_P + ch * FB + tl.arange(0, FB)
                            m = rows < P
                            x_c = tl.load(x_b + rows, mask=m, other=0.0).to(tl.float32)
                            acc = fold_ring(tl.zeros([FB, N], tl.float32), w, offs_r, c, rx_b,
                                            rB_b, rows, m, H * P, G * N, N, RB, RING)
                            acc += (w_c * ring_round(x_c, RING))[:, None] * Br_t[None, :]
                            S = load_state(ck_c, ck_s1, ck_s2, mat, rows, m, P, CK_FMT, FB, N)
                            S = tl.where(m[:, None], tl.exp(last) * S + acc, 0.0)
                            amax = tl.maximum(amax, matrix_amax(S))
                for ch in range(BLOCK_P // FB):
                    if ch * FB < n_rows:
                        rows = pb * BLOCK_P + ch * FB + tl.arange(0, FB)
                        m = rows < P
                        x_c = tl.load(x_b + rows, mask=m, other=0.0).to(tl.float32)
                        acc = fold_ring(tl.zeros([FB, N], tl.float32), w, offs_r, c, rx_b, rB_b,
                                        rows, m, H * P, G * N, N, RB, RING)
                        acc += (w_c * ring_round(x_c, RING))[:, None] * Br_t[None, :]
                        S = load_state(ck_c, ck_s1, ck_s2, mat, rows, m, P, CK_FMT, FB, N)
                        S = tl.where(m[:, None], tl.exp(last) * S + acc, 0.0)
                        y = tl.sum(S * C_t[None, :], axis=1)
                        z_c = 0.0
                        if HAS_Z:
                            z_c = tl.load(z_b + rows, mask=m, other=0.0).to(tl.float32)
                        tl.store(out_b + rows, gate(y, x_c, z_c, D_h, HAS_Z), mask=m)
                        store_state(ck_c, ck_s1, ck_s2, S, mat, rows, m, P, seed_ck, t, amax,
                                    CK_FMT, FB, N)
                        if SPLIT:
                            store_state(rd_c, rd_s1, rd_s2, S, mat, rows, m, P, seed_rd, t, amax,
                                        RD_FMT, FB, N)
                        if WRITE_FRESH:
                            tl.store(fresh_b + tile_offsets(rows, N), S, mask=m[:, None])
                new_len = rl - c
            else:
                # output: y = exp(Lambda) S_read C + sum_i w_i (B_i . C) x_i + D x
                x_t = tl.load(x_b + offs_p, mask=mask_p, other=0.0).to(tl.float32)
                xr_t = ring_round(x_t, RING)
                mr = offs_r < c
                rx = ring_load(rx_b + ox, mr[:, None] & mask_p[None, :], RING)
                rB = ring_load(rB_b + oB, mr[:, None], RING)
                cur = offs_r == c
                ex = tl.where(cur[:, None], xr_t[None, :], rx)
                eB = tl.where(cur[:, None], Br_t[None, :], rB)
                S = load_state(rd_c, rd_s1, rd_s2, mat, offs_p, mask_p, P, RD_FMT, BLOCK_P, N)
                BC = tl.sum(eB * C_t[None, :], axis=1)
                y = tl.exp(last) * tl.sum(S * C_t[None, :], axis=1)
                y = y + tl.sum((w * BC)[:, None] * ex, axis=0)
                z_t = 0.0
                if HAS_Z:
                    z_t = tl.load(z_b + offs_p, mask=mask_p, other=0.0).to(tl.float32)
                tl.store(out_b + offs_p, gate(y, x_t, z_t, D_h, HAS_Z), mask=mask_p)
                ring_store(rx_b + c * (H * P) + offs_p, xr_t, mask_p, RING)
                if pb == 0:
                    tl.store(rdt_b + c * H, dt_t)
                    if h % hpg == 0:
                        ring_store(rB_b + c * (G * N) + offs_n, Br_t, offs_n < N, RING)
                new_len = rl + 1
            finish_slot(tickets, ring_len, steps, slot, nprog, new_len, t + 1)
        else:
            # ---- speculative verify: T drafts behind the commit pointer ----------
            flush = c + T > L
            if flush:  # fold the committed entries first (they fill the window)
                cum0 = tl.cumsum(rdt * A_h, axis=0)
                last0, w0 = decay_weights(rdt, cum0, offs_r, c - 1)
                amax = 0.0
                if NEED_AMAX:
                    for ch in range(BLOCK_P // FB):
                        if ch * FB < n_rows:
                            rows = pb * BLOCK_P + ch * FB + tl.arange(0, FB)
                            m = rows < P
                            acc = fold_ring(tl.zeros([FB, N], tl.float32), w0, offs_r, c, rx_b,
                                            rB_b, rows, m, H * P, G * N, N, RB, RING)
                            S = load_state(ck_c, ck_s1, ck_s2, mat, rows, m, P, CK_FMT, FB, N)
                            S = tl.where(m[:, None], tl.exp(last0) * S + acc, 0.0)
                            amax = tl.maximum(amax, matrix_amax(S))
                for ch in range(BLOCK_P // FB):
                    if ch * FB < n_rows:
                        rows = pb * BLOCK_P + ch * FB + tl.arange(0, FB)
                        m = rows < P
                        acc = fold_ring(tl.zeros([FB, N], tl.float32), w0, offs_r, c, rx_b, rB_b,
                                        rows, m, H * P, G * N, N, RB, RING)
                        S = load_state(ck_c, ck_s1, ck_s2, mat, rows, m, P, CK_FMT, FB, N)
                        S = tl.where(m[:, None], tl.exp(last0) * S + acc, 0.0)
                        store_state(ck_c, ck_s1, ck_s2, S, mat, rows, m, P, seed_ck, t - 1, amax,
                                    CK_FMT, FB, N)
                        if SPLIT:
                            store_state(rd_c, rd_s1, rd_s2, S, mat, rows, m, P, seed_rd, t - 1,
                                        amax, RD_FMT, FB, N)
                        if WRITE_FRESH:
                            tl.store(fresh_b + tile_offsets(rows, N), S, mask=m[:, None])
                tl.debug_barrier()  # the drafts below read the copy just written
                c0 = c * 0
                half = 1 - half  # drafts go to the other ring half
            else:
                c0 = c
            base = load_state(rd_c, rd_s1, rd_s2, mat, offs_p, mask_p, P, RD_FMT, BLOCK_P, N)
            # committed entries [0, c0) from the ring, drafts at [c0, c0 + T)
            old = offs_r < c0
            rx = ring_load(rx_b + ox, old[:, None] & mask_p[None, :], RING)
            rB = ring_load(rB_b + oB, old[:, None], RING)
            j = offs_r - c0
            vd = (j >= 0) & (j < T)
            jj = tl.where(vd, j, 0)
            ix = tl.load(x_b + jj[:, None] * s_xt + offs_p[None, :],
                         mask=vd[:, None] & mask_p[None, :], other=0.0).to(tl.float32)
            iB = tl.load(B_b + jj[:, None] * s_Bt + offs_n[None, :], mask=vd[:, None],
                         other=0.0).to(tl.float32)
            idt = dt_of(tl.load(dt_b + jj * s_dtt, mask=vd, other=0.0), dtb, HAS_DT_BIAS,
                        DT_SOFTPLUS)
            ix = ring_round(ix, RING)
            iB = ring_round(iB, RING)
            ex = tl.where(old[:, None], rx, ix)
            eB = tl.where(old[:, None], rB, iB)
            edt = tl.where(old, rdt, tl.where(vd, idt, 0.0))
            cum = tl.cumsum(edt * A_h, axis=0)
            for k in tl.static_range(T):
                last, w = decay_weights(edt, cum, offs_r, c0 + k)
                C_k = tl.load(C_b + k * s_Ct + offs_n).to(tl.float32)
                x_k = tl.load(x_b + k * s_xt + offs_p, mask=mask_p, other=0.0).to(tl.float32)
                BC = tl.sum(eB * C_k[None, :], axis=1)
                y = tl.exp(last) * tl.sum(base * C_k[None, :], axis=1)
                y = y + tl.sum((w * BC)[:, None] * ex, axis=0)
                z_k = 0.0
                if HAS_Z:
                    z_k = tl.load(z_b + k * s_zt + offs_p, mask=mask_p, other=0.0)
                    z_k = z_k.to(tl.float32)
                tl.store(out_b + k * s_ot + offs_p, gate(y, x_k, z_k, D_h, HAS_Z), mask=mask_p)
            # write the drafts into the ring (the commit pointer stays at c0)
            win = slot.to(tl.int64) * LR + half * L
            ring_store(ring_x + (win * H + h) * P + ox, ix, vd[:, None] & mask_p[None, :], RING)
            if pb == 0:
                tl.store(ring_dt + win * H + h + offs_r * H, idt, mask=vd)
                if h % hpg == 0:
                    ring_store(ring_B + (win * G + g) * N + oB, iB, vd[:, None], RING)
            if flush:
                finish_slot(tickets, ring_len, steps, slot, nprog, half << 16, t)

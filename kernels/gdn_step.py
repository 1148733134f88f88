"""GDN decode-step kernels: the conventional step, the fused replay launch (output
tiles, and a flushing row's flush, in one launch) and the staged step's prep and
output launches.  The launch modes and counter protocols are described in
:mod:`.gdn_decode`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .compile_worker import settle_module_keys
from .gdn_device import (
    _delta,
    _gate_inputs,
    _gate_values,
    _gates,
    _load,
    _prep_qk,
    _prep_qk_from,
    _qk_raw,
    _row_head,
    _staged_rows,
    _store,
    _tile_ring,
)
from .gdn_extra import load_tile, tile_dots
from .gdn_flush import _flush_rows
from .tl_common import (
    finish_slot,
    ring_decode,
    ring_load,
    ring_load_raw,
    ring_round,
    ring_store,
    softplus,
)
from .tl_dots import nvfp4_word_order, split_f16, tf32_hi
from .tl_formats import K_BF16_SR, K_FP16_SR, K_NONE, K_NVFP4
from .tl_prefetch import l2_demote_lines


@triton.jit
def _out_tile(codes, sc, s2v, gr, Dr, v, g, beta, out, ring_k, ring_v, ring_d, ring_g, ring_b,
              ring_kk, bidx, hk, h, vb, rbase, n, valid, q, k, kqs, kk, kq, HK: tl.constexpr,
              HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
              L: tl.constexpr, RP: tl.constexpr, FMT: tl.constexpr, RING: tl.constexpr):
    """Output rows ``vb * BV ..`` of head h from their loaded tile and ring entries
    (``gr``, ``Dr`` from :func:`_tile_ring`; entries outside ``valid`` are dropped
    here) and the step's ``v`` rows (ring-rounded), ``g`` and ``beta``: ``o``, ``d``;
    unless the slot flushes (n = L - 1), store o and append d, v (and, for the head's
    first tile, g and beta; for the group's first head, k and its ring products) at ring
    position n."""
    offs_v = vb * BV + tl.arange(0, BV)
    offs_r = tl.arange(0, RP)
    gr = tl.where(valid, gr, 0.0)
    DrT = tl.where(valid[:, None], ring_decode(Dr, RING), 0.0)
    Sk0, Sq0 = tile_dots(codes, sc, s2v, k, q, K, BV, FMT)
    cum = tl.cumsum(gr, axis=0)
    Gs = tl.sum(gr, axis=0)
    w = tl.where(valid, tl.exp(Gs - cum), 0.0)
    eG = tl.exp(Gs)
    Sk = eG * Sk0 + tl.sum(DrT * (w * kk)[:, None], axis=0)
    Sq = eG * Sq0 + tl.sum(DrT * (w * kq)[:, None], axis=0)
    alpha = tl.exp(g)
    d = beta * (v - alpha * Sk)
    o = alpha * Sq + d * kqs
    if n != L - 1:
        tl.store(out + (bidx * HV + h) * V + offs_v, o)
        pos = rbase + n
        ring_store(ring_d + (pos * HV + h) * V + offs_v, ring_round(d, RING), offs_v < V, RING)
        ring_store(ring_v + (pos * HV + h) * V + offs_v, v, offs_v < V, RING)
        if vb == 0:
            tl.store(ring_g + pos * HV + h, g)
            tl.store(ring_b + pos * HV + h, beta)
            if h % (HV // HK) == 0:
                offs_k = tl.arange(0, K)
                ring_store(ring_k + (pos * HK + hk) * K + offs_k, k, offs_k < K, RING)
                tl.store(ring_kk + (pos * HK + hk) * RP + offs_r, tl.where(valid, kk, 0.0))


@triton.jit(do_not_specialize=["seed"])
def _conventional_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log, dt_bias, state_idx, out,
    data, s1, s2, ring_len, steps, tickets, seed,
    HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
    FMT: tl.constexpr, RING: tl.constexpr,
):
    pid_v, pid_bh, bidx, h, hk, slot = _row_head(state_idx, HK, HV)
    # the step's inputs do not depend on the slot: loaded beside its index, not after it
    offs_v = pid_v * BV + tl.arange(0, BV)
    q_in, k_in = _qk_raw(q_ptr + (bidx * HK + hk) * K, k_ptr + (bidx * HK + hk) * K, K)
    v_in = tl.load(v_ptr + (bidx * HV + h) * V + offs_v)
    a_in, b_in, A_in, dtb_in = _gate_inputs(a_ptr + pid_bh, b_ptr + pid_bh, A_log, dt_bias, h)
    if slot >= 0:
        SR: tl.constexpr = (FMT == K_BF16_SR) or (FMT == K_FP16_SR)
        mat = slot.to(tl.int64) * HV + h
        S = _load(data, s1, s2, mat, offs_v, V, BV, K, FMT)
        q, k, qn, kn = _prep_qk_from(q_in, k_in, K, RING)
        v = ring_round(v_in.to(tl.float32), RING)
        g, beta = _gate_values(a_in, b_in, A_in, dtb_in)
        S = _delta(S, k, v, tl.exp(g), beta)
        o = tl.sum(S * q[None, :], axis=1)
        if SR:
            step = tl.load(steps + slot)
        else:
            step = 0
        _store(S, data, s1, s2, mat, offs_v, seed, step, V, BV, K, FMT)
        tl.store(out + (bidx * HV + h) * V + offs_v, o)
        if SR:
            finish_slot(tickets, ring_len, steps, slot, HV * (V // BV), 0, step + 1)


@triton.jit(do_not_specialize=["seed"])
def _replay_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log, dt_bias, state_idx, skip, out,
    c_data, c_s1, c_s2, f_data, f_s1, f_s2,
    ring_k, ring_v, ring_d, ring_g, ring_b, ring_kk, tickets, fresh, scr, sync, seed,
    HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
    TPP: tl.constexpr, NS: tl.constexpr, FB: tl.constexpr, FNS: tl.constexpr, L: tl.constexpr,
    R: tl.constexpr,
    RP: tl.constexpr, LOG2RP: tl.constexpr, C_FMT: tl.constexpr, F_FMT: tl.constexpr,
    RING: tl.constexpr, FUSED: tl.constexpr, FRESH: tl.constexpr, DOT: tl.constexpr,
    EAGER: tl.constexpr, FAST: tl.constexpr = False,
):
    """One decode step of a plain replay cache.  Grid ``(HV * (V // BV) // TPP, B)``:
    program p of batch row b streams TPP consecutive tiles (BV rows of one v-head;
    all in one k-head group) of the stored copy (the read copy, or the checkpoint in a
    shared design: F_FMT = K_NONE) through a ``num_stages = NS`` software pipeline.
    Per program: q, k and the k-head's ring products ``k_i . k``, ``k_i . q`` once;
    per tile: the output rows and the ring appends.  At the window's last position a
    slot flushes instead: its programs' own tiles (FUSED), or nothing (split launch:
    the flush launch before did it and set ``skip`` for the row, so this program loads
    nothing).  The clock: read at the start (L2), advanced by one fire-and-forget
    atomic at the end, after a barrier (every warp has read it by then).

    EAGER (one-tile programs): the ring tiles (k, g, d) are loaded whole, right after
    the slot index and together with the clock and the state tile, and masked by the
    ring position in registers: no load waits for the clock (small batches, where the
    chain of round trips is the step's time).  One-tile programs skip the output tile's
    arithmetic at a flush step (it would store nothing).  FAST: the fused flush's encoders
    from ``tl_formats.encode_tile_with(..., FAST=True)`` (the same bits).  An nvfp4 copy
    in tiles of fewer than V rows (FUSED): the matrix scale needs the whole matrix, so
    every program folds its own rows into the checkpoint and the matrix's fp32 scratch
    ``scr`` (V rows per (batch row, v-head)) and posts its amax at ``sync`` (two words
    per (batch row, v-head)); the last of the head's programs to post encodes the
    nvfp4 copy of all V rows (:func:`_encode_posted`)."""
    pid = tl.program_id(0)
    bidx = tl.program_id(1)
    NVB: tl.constexpr = V // BV
    GRP: tl.constexpr = HV // HK
    # an nvfp4 copy in part-matrix tiles: the matrix's NVB programs share its amax
    PARTS: tl.constexpr = NVB if (BV < V) and ((C_FMT == K_NVFP4) or (F_FMT == K_NVFP4)) else 0
    tau0 = pid * TPP
    hk = tau0 // (GRP * NVB)
    slot = tl.load(state_idx + bidx)
    # the step's inputs do not depend on the slot: loaded beside its index, so q and k
    # are normalised while the state tile is in flight (small batches: the step's time
    # is its chain of round trips)
    q_in, k_in = _qk_raw(q_ptr + (bidx * HK + hk) * K, k_ptr + (bidx * HK + hk) * K, K)
    if TPP == 1:
        h0 = tau0 // NVB
        v_in = tl.load(v_ptr + (bidx * HV + h0) * V + (tau0 % NVB) * BV + tl.arange(0, BV))
        a_in, b_in, A_in, dtb_in = _gate_inputs(a_ptr + bidx * HV + h0, b_ptr + bidx * HV + h0,
                                                A_log, dt_bias, h0)
    if FUSED:
        live = True
    else:
        live = tl.load(skip + bidx) == 0
    if slot >= 0:
        if F_FMT != K_NONE:
            r_data, r_s1, r_s2 = f_data, f_s1, f_s2
            R_FMT: tl.constexpr = F_FMT
        else:
            r_data, r_s1, r_s2 = c_data, c_s1, c_s2
            R_FMT: tl.constexpr = C_FMT
        offs_k = tl.arange(0, K)
        offs_r = tl.arange(0, RP)
        rbase = slot.to(tl.int64) * R
        if TPP == 1:  # one tile: its load is the first after the slot's
            offs_v0 = (tau0 % NVB) * BV + tl.arange(0, BV)
            codes0, sc0, s20 = load_tile(r_data, r_s1, r_s2, slot.to(tl.int64) * HV + tau0 // NVB,
                                         offs_v0, (offs_v0 < V) & live, V, K, R_FMT)
            if EAGER:  # every ring row, before the clock is back
                lm = (offs_r < R) & live
                Kraw = ring_load_raw(ring_k + (rbase * HK + hk) * K + offs_r[:, None] * (HK * K)
                                     + offs_k[None, :], lm[:, None], RING)
                gr0, Dr0 = _tile_ring(ring_g, ring_d, rbase, tau0 // NVB, offs_v0, lm, HV, V,
                                      RP, RING)
        clock = tl.load(tickets + slot, cache_modifier=".cg")
        q, k, qn, kn = _prep_qk_from(q_in, k_in, K, RING)
        kqs = tl.sum(k * q, axis=0)
        t = clock // (HV * NVB // TPP)
        n = t % L
        valid = (offs_r < n) & live
        if EAGER and TPP == 1:
            Kr = tl.where(valid[:, None], ring_decode(Kraw, RING), 0.0)
        else:
            Kr = ring_load(ring_k + (rbase * HK + hk) * K + offs_r[:, None] * (HK * K)
                           + offs_k[None, :], valid[:, None], RING)
        kk = tl.sum(Kr * k[None, :], axis=1)
        kq = tl.sum(Kr * q[None, :], axis=1)
        if TPP == 1:
            if not EAGER:
                gr0, Dr0 = _tile_ring(ring_g, ring_d, rbase, tau0 // NVB, offs_v0, valid, HV, V,
                                      RP, RING)
            if n != L - 1:  # a flushing row stores no output tile: the flush starts at once
                g0, beta0 = _gate_values(a_in, b_in, A_in, dtb_in)
                _out_tile(codes0, sc0, s20, gr0, Dr0, ring_round(v_in.to(tl.float32), RING), g0,
                          beta0, out, ring_k, ring_v, ring_d, ring_g, ring_b, ring_kk, bidx, hk,
                          h0, tau0 % NVB, rbase, n, valid, q, k, kqs, kk, kq, HK, HV, K, V, BV,
                          L, RP, R_FMT, RING)
        else:
            for i in tl.range(0, TPP, num_stages=NS):
                tau = tau0 + i
                h = tau // NVB
                offs_v = (tau % NVB) * BV + tl.arange(0, BV)
                codes, sc, s2v = load_tile(r_data, r_s1, r_s2, slot.to(tl.int64) * HV + h,
                                           offs_v, (offs_v < V) & live, V, K, R_FMT)
                gr, Dr = _tile_ring(ring_g, ring_d, rbase, h, offs_v, valid, HV, V, RP, RING)
                v = ring_round(tl.load(v_ptr + (bidx * HV + h) * V + offs_v).to(tl.float32),
                               RING)
                g, beta = _gates(a_ptr + bidx * HV + h, b_ptr + bidx * HV + h, A_log, dt_bias, h)
                _out_tile(codes, sc, s2v, gr, Dr, v, g, beta, out, ring_k, ring_v, ring_d,
                          ring_g, ring_b, ring_kk, bidx, hk, h, tau % NVB, rbase, n, valid, q,
                          k, kqs, kk, kq, HK, HV, K, V, BV, L, RP, R_FMT, RING)
        if FUSED:
            if n == L - 1:
                for i in range(0, TPP):
                    tau = tau0 + i
                    h = tau // NVB
                    g, beta = _gates(a_ptr + bidx * HV + h, b_ptr + bidx * HV + h, A_log,
                                     dt_bias, h)
                    um = bidx * HV + h  # (batch row, v-head): the PARTS programs' scratch
                    _flush_rows(c_data, c_s1, c_s2, f_data, f_s1, f_s2, fresh, ring_k, ring_v,
                                ring_g, ring_b, ring_kk, v_ptr + (bidx * HV + h) * V,
                                out + (bidx * HV + h) * V, rbase, h, hk,
                                slot.to(tl.int64) * HV + h, (tau % NVB) * BV, n, q, k, g, beta,
                                seed, t, HK, HV, K, V, BV, FB, FNS, RP, LOG2RP, C_FMT, F_FMT,
                                RING, True, FRESH, DOT, True,
                                scr + (um.to(tl.int64) * V + (tau % NVB) * BV) * K, False, FAST,
                                sync=sync + um * 2, PARTS=PARTS)
        tl.debug_barrier()  # every warp has read the clock: now advance it
        tl.atomic_add(tickets + slot, 1, sem="relaxed")


@triton.jit
def _group_gates(a_ptr, b_ptr, A_log, dt_bias, bidx, hs, mj, HV: tl.constexpr):
    """``(g, beta)`` of value heads ``hs`` (a k-head group; ``mj`` masks padding)."""
    a = tl.load(a_ptr + bidx * HV + hs, mask=mj, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + bidx * HV + hs, mask=mj, other=0.0).to(tl.float32)
    A = tl.load(A_log + hs, mask=mj, other=0.0).to(tl.float32)
    dtb = tl.load(dt_bias + hs, mask=mj, other=0.0).to(tl.float32)
    return -tl.exp(A) * softplus(a + dtb), 1.0 / (1.0 + tl.exp(-b))


@triton.jit
def _group_coefs(Kr, gr, q, k, valid):
    """A k-head group's ring products and decays from its ring k rows ``Kr`` (RP, K)
    and its heads' ring g ``gr`` (GP, RP), both zero where not ``valid``: ``k_i . k``,
    ``k_i . q``, ``k . q``, the weights ``w = e^{G - c_i}`` (GP, RP) and ``G`` (GP,)."""
    kk = tl.sum(Kr * k[None, :], axis=1)
    kq = tl.sum(Kr * q[None, :], axis=1)
    kqs = tl.sum(k * q, axis=0)
    cum = tl.cumsum(gr, axis=1)
    Gs = tl.sum(gr, axis=1)
    w = tl.where(valid[None, :], tl.exp(Gs[:, None] - cum), 0.0)
    return kk, kq, kqs, w, Gs


@triton.jit
def _group_append(ring_k, ring_kk, ring_g, ring_b, pos, hk, hs, mj, k, kk, g, beta, valid, ok,
                  HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, RP: tl.constexpr,
                  RING: tl.constexpr):
    """Append a k-head group's step at ring row ``pos`` (where ``ok``): k, its products
    with the earlier entries (``ring_kk``), its heads' g and beta."""
    offs_k = tl.arange(0, K)
    offs_r = tl.arange(0, RP)
    ring_store(ring_k + (pos * HK + hk) * K + offs_k, k, (offs_k < K) & ok, RING)
    tl.store(ring_kk + (pos * HK + hk) * RP + offs_r, tl.where(valid, kk, 0.0), mask=ok)
    tl.store(ring_g + pos * HV + hs, g, mask=mj & ok)
    tl.store(ring_b + pos * HV + hs, beta, mask=mj & ok)


@triton.jit
def _kq_parts(k, q, MMA: tl.constexpr):
    """k and q as two parts each for tensor-core row sums: MMA 1 fp16
    :func:`tl_dots.split_f16` parts, MMA 2 fp32 tf32 heads and remainders."""
    if MMA == 1:
        k_hi, k_lo = split_f16(k)
        q_hi, q_lo = split_f16(q)
    else:
        k_hi = tf32_hi(k)
        q_hi = tf32_hi(q)
        k_lo = k - k_hi
        q_lo = q - q_hi
    return k_hi, k_lo, q_hi, q_lo


@triton.jit
def _store_kept(ptrs, value, mask, KEEP: tl.constexpr):
    """``tl.store``, with the ``evict_last`` L2 policy where ``KEEP`` (rows that every
    program of the next launch reads while that launch streams the state through L2)."""
    if KEEP:
        tl.store(ptrs, value, mask=mask, eviction_policy="evict_last")
    else:
        tl.store(ptrs, value, mask=mask)


@triton.jit
def _prep_kernel(
    q_ptr, k_ptr, a_ptr, b_ptr, A_log, dt_bias, state_idx, ring_k, ring_g, ring_b, ring_kk,
    tickets, pqk, pco, pn,
    HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, L: tl.constexpr, R: tl.constexpr,
    RP: tl.constexpr, CW: tl.constexpr, GP: tl.constexpr, RING: tl.constexpr,
    EAGER: tl.constexpr, CONC: tl.constexpr = False, MMA: tl.constexpr = 0,
    KEEP: tl.constexpr = False, RELEASE: tl.constexpr = False,
):
    """Staged launch, first of the output step: one program per (k-head, batch row).
    Reads the slot's clock (and advances it: HK programs per slot), prepares q and k,
    and computes the ring products ``k_i . k``, ``k_i . q`` once per k-head; for the
    group's value heads (a ``(GP, RP)`` tile, one row per head) the gates, the decay
    weights ``w_i = e^{G - c_i}`` and the output launch's coefficients ``w_i k_i . k``,
    ``w_i k_i . q`` (``pco`` row: those two RP vectors, then ``e^G``, ``alpha``,
    ``beta``, ``k . q``).  Appends k, its products, g and beta at ring position n and
    writes ``pn[b]`` = n (-1 where the row flushes or has no slot: the output launch
    skips it; a flushing row gets nothing but its clock tick).  CONC (the flush launch
    on another stream, which may run later): the flush stream advances the clocks
    (:func:`clocks.advance_clocks_kernel`, ordered after this launch by an event) and
    this launch leaves them alone.  No branches: every
    load but the masked ring reads (none with EAGER: the ring k and g tiles are read
    whole and masked in registers) is issued with the slot index, next to the clock.
    MMA (the output launch's row sums as tensor-core products): ``pqk`` gets k and q
    as two parts each (rows k hi, k lo, q hi, q lo): MMA 1 (fp8, nvfp4 copies) float16
    :func:`tl_dots.split_f16` parts, MMA 2 (fp32) float32 tf32 heads and remainders;
    MMA 0 their float32 values (q, k).  KEEP: ``pqk``, ``pco`` and ``pn`` are stored with
    the ``evict_last`` L2 policy.  RELEASE (compiled only: inline PTX): a flushing row's
    ``pqk`` and ``pco`` lines, kept by its last output step and dead until its next one,
    go back to the normal eviction priority, so they do not hold L2 through the flush."""
    hk = tl.program_id(0)
    bidx = tl.program_id(1)
    GRP: tl.constexpr = HV // HK
    offs_k = tl.arange(0, K)
    offs_r = tl.arange(0, RP)
    offs_j = tl.arange(0, GP)
    slot = tl.load(state_idx + bidx)
    live = slot >= 0
    slot64 = tl.maximum(slot, 0).to(tl.int64)
    rbase = slot64 * R
    mj = offs_j < GRP
    hs = hk * GRP + offs_j  # the group's value heads
    kptr = ring_k + (rbase * HK + hk) * K + offs_r[:, None] * (HK * K) + offs_k[None, :]
    gptr = ring_g + rbase * HV + hs[:, None] + offs_r[None, :] * HV
    if EAGER:
        Kraw = ring_load_raw(kptr, (offs_r < R)[:, None] & live, RING)
        graw = tl.load(gptr, mask=mj[:, None] & (offs_r < R)[None, :] & live, other=0.0)
    g, beta = _group_gates(a_ptr, b_ptr, A_log, dt_bias, bidx, hs, mj, HV)
    clock = tl.load(tickets + slot64, mask=live, other=0, cache_modifier=".cg")
    q, k, qn, kn = _prep_qk(q_ptr + (bidx * HK + hk) * K, k_ptr + (bidx * HK + hk) * K, K, RING)
    n = (clock // HK) % L
    valid = offs_r < n
    if EAGER:
        Kr = tl.where(valid[:, None], ring_decode(Kraw, RING), 0.0)
        gr = tl.where(valid[None, :], graw, 0.0)
    else:
        Kr = ring_load(kptr, valid[:, None] & live, RING)
        gr = tl.load(gptr, mask=mj[:, None] & valid[None, :] & live, other=0.0)
    kk, kq, kqs, w, Gs = _group_coefs(Kr, gr, q, k, valid)
    ok = live & (n != L - 1)
    pos = rbase + n
    _group_append(ring_k, ring_kk, ring_g, ring_b, pos, hk, hs, mj, k, kk, g, beta, valid, ok,
                  HK, HV, K, RP, RING)
    if MMA != 0:
        qb = pqk + (bidx * HK + hk) * (4 * K)
        k_hi, k_lo, q_hi, q_lo = _kq_parts(k, q, MMA)
        _store_kept(qb + offs_k, k_hi, ok, KEEP)
        _store_kept(qb + K + offs_k, k_lo, ok, KEEP)
        _store_kept(qb + 2 * K + offs_k, q_hi, ok, KEEP)
        _store_kept(qb + 3 * K + offs_k, q_lo, ok, KEEP)
    else:
        qb = pqk + (bidx * HK + hk) * (2 * K)
        _store_kept(qb + offs_k, q, ok, KEEP)
        _store_kept(qb + K + offs_k, k, ok, KEEP)
    cb = pco + (bidx * HV + hs) * CW  # (GP,) row starts
    m2 = mj[:, None] & ok
    _store_kept(cb[:, None] + offs_r[None, :], w * kk[None, :], m2, KEEP)
    _store_kept(cb[:, None] + RP + offs_r[None, :], w * kq[None, :], m2, KEEP)
    mo = mj & ok
    _store_kept(cb + 2 * RP, tl.exp(Gs), mo, KEEP)
    _store_kept(cb + 2 * RP + 1, tl.exp(g), mo, KEEP)
    _store_kept(cb + 2 * RP + 2, beta, mo, KEEP)
    _store_kept(cb + 2 * RP + 3, tl.zeros_like(beta) + kqs, mo, KEEP)
    _store_kept(pn + bidx, tl.where(ok, n, -1), hk == 0, KEEP)
    if RELEASE:
        if live & (n == L - 1):
            if MMA != 0:
                LINE: tl.constexpr = 64  # float16 elements per 128-byte line
            else:
                LINE: tl.constexpr = 32
            l2_demote_lines(qb + tl.arange(0, K // 16) * LINE)  # the row's 8K bytes
            l2_demote_lines(cb[:, None] + offs_r[None, :])
            l2_demote_lines(cb[:, None] + RP + offs_r[None, :])
            l2_demote_lines(cb + 2 * RP)
            l2_demote_lines(cb + 2 * RP + 3)
    if not CONC:
        tl.debug_barrier()  # every warp has read the clock: now advance it
        tl.atomic_add(tickets + slot64, 1, mask=live, sem="relaxed")


@triton.jit
def _out_kernel(
    v_ptr, state_idx, out, r_data, r_s1, r_s2, ring_v, ring_d, pqk, pco, pn,
    HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
    TPP: tl.constexpr, NS: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, CW: tl.constexpr,
    FMT: tl.constexpr, RING: tl.constexpr, MMA: tl.constexpr = 0, EVICT: tl.constexpr = False,
):
    """Staged launch, second of the output step.  Grid ``(HV * (V // BV) // TPP, B)``:
    TPP tiles of BV rows (one k-head group) of the stored copy.  Everything a tile
    needs besides its rows of the copy and of the ring's d comes from the prep
    launch (``pqk``: q, k; ``pco``: the head's ring coefficients and scalars;
    ``pn``: the ring position), so every load is issued once the slot index and the
    position (two independent loads) are back, and no program reduces over the
    ring's k.  Stores o and appends d, v at ring position n.  Rows with ``pn < 0``
    (flushing or padding) return after that load: at a flush step of the whole batch
    the launch costs next to nothing (a masked body took 65-85 us on an H200).  MMA
    (fp8, nvfp4 or fp32 copies): a tile's row sums are tensor-core products with the split k
    and q the prep launch left in ``pqk`` (:func:`_staged_rows`).  ``EVICT``: the tiles'
    loads stream with the ``evict_first`` L2 policy (``load_tile``)."""
    pid = tl.program_id(0)
    bidx = tl.program_id(1)
    NVB: tl.constexpr = V // BV
    GRP: tl.constexpr = HV // HK
    tau0 = pid * TPP
    hk = tau0 // (GRP * NVB)
    slot = tl.load(state_idx + bidx)
    n = tl.load(pn + bidx)
    if n >= 0:  # (pn < 0 where the slot is missing too)
        slot64 = tl.maximum(slot, 0).to(tl.int64)
        rbase = slot64 * R
        offs_r = tl.arange(0, RP)
        offs_k = tl.arange(0, K)
        valid = offs_r < n
        if MMA != 0:
            offs_c = tl.arange(0, 16)
            rows_kq = offs_k
            if FMT == K_NVFP4:  # the element order of the decoded words
                rows_kq = nvfp4_word_order(offs_k)
            KQ = tl.load(pqk + (bidx * HK + hk) * (4 * K) + offs_c[None, :] * K
                         + rows_kq[:, None], mask=(offs_c < 4)[None, :], other=0.0)
            q = 0.0
            k = 0.0
        else:
            qb = pqk + (bidx * HK + hk) * (2 * K)
            q = tl.load(qb + offs_k)
            k = tl.load(qb + K + offs_k)
            KQ = None
        pos = rbase + n
        for i in tl.range(0, TPP, num_stages=NS):
            tau = tau0 + i
            h = tau // NVB
            offs_v = (tau % NVB) * BV + tl.arange(0, BV)
            mrow = offs_v < V
            codes, sc, s2v = load_tile(r_data, r_s1, r_s2, slot64 * HV + h, offs_v, mrow, V, K,
                                       FMT, MMA != 0, EVICT)
            Dr = ring_load(ring_d + (rbase * HV + h) * V + offs_r[:, None] * (HV * V)
                           + offs_v[None, :], valid[:, None] & mrow[None, :], RING)
            v = ring_round(tl.load(v_ptr + (bidx * HV + h) * V + offs_v, mask=mrow,
                                   other=0.0).to(tl.float32), RING)
            o, d = _staged_rows(codes, sc, s2v, k, q, Dr, pco + (bidx * HV + h) * CW, v, K,
                                BV, RP, FMT, RING, KQ)
            tl.store(out + (bidx * HV + h) * V + offs_v, o, mask=mrow)
            ring_store(ring_d + (pos * HV + h) * V + offs_v, ring_round(d, RING), mrow, RING)
            ring_store(ring_v + (pos * HV + h) * V + offs_v, v, mrow, RING)


settle_module_keys(__name__)  # every process looks its kernels up under one key

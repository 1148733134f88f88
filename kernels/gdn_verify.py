"""GDN speculative verify: the outputs of T drafts from one read of the stored copy
(one launch, or a prep launch and an output launch whose row sums are one tensor-core
product per tile), drafts written behind the commit pointer.  Commit is the flush launch
plus :func:`.gdn_flush._commit_counters`.  Described in :mod:`.gdn_decode`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .compile_worker import settle_module_keys
from .gdn_device import (
    _gates,
    _prep_qk,
    _ring_cols,
    _ring_kg,
    _row_head,
    _staged_rows,
    _step_inputs,
)
from .gdn_extra import load_tile, tile_dots
from .tl_common import ring_load, ring_round, ring_store
from .tl_dots import dot_fp32, tile_values
from .tl_formats import K_FP32


@triton.jit
def _verify_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log, dt_bias, state_idx, out,
    r_data, r_s1, r_s2, ring_k, ring_v, ring_d, ring_g, ring_b, ring_kk, ring_len,
    T: tl.constexpr, HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BV: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, FMT: tl.constexpr,
    RING: tl.constexpr, NS: tl.constexpr,
):
    """Outputs of T draft steps from the read copy + committed ring entries, one read
    of the copy's block (kept packed in registers; each draft reduces it against its k
    and q).  Draft j is an output step at ring position ``n + j`` whose earlier entries
    include drafts 0..j-1: they join the program's ring tiles (k, the ring-rounded d,
    the log-decay) in registers as they are computed, and are written to the ring
    behind the commit pointer (no counter changes)."""
    pid_v, pid_bh, bidx, h, hk, slot = _row_head(state_idx, HK, HV)
    if slot >= 0:
        offs_v = pid_v * BV + tl.arange(0, BV)
        offs_k = tl.arange(0, K)
        offs_r = tl.arange(0, RP)
        mat = slot.to(tl.int64) * HV + h
        codes, sc, s2v = load_tile(r_data, r_s1, r_s2, mat, offs_v, offs_v < V, V, K, FMT)
        n = tl.load(ring_len + slot)
        rbase = slot.to(tl.int64) * R
        Kall, gr = _ring_kg(ring_k, ring_g, rbase, hk, h, offs_r < n, HK, HV, K, RP, RING)
        Dall = _ring_cols(ring_d, rbase, h, offs_v, offs_r < n, HV, V, RP, RING)  # (RP, BV)
        cum = tl.cumsum(gr, axis=0)  # log-decay through each entry (drafts added below)
        A_in = tl.sum(gr, axis=0)  # log-decay before the current draft
        for j in tl.range(0, T, num_stages=NS):
            m = n + j
            valid = offs_r < m
            row = bidx * T + j
            q, k, v, g, beta = _step_inputs(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log, dt_bias,
                                            row, h, hk, offs_v, HK, HV, K, V, RING)
            Sk0, Sq0 = tile_dots(codes, sc, s2v, k, q, K, BV, FMT)
            kk = tl.sum(Kall * k[None, :], axis=1)
            kq = tl.sum(Kall * q[None, :], axis=1)
            w = tl.where(valid, tl.exp(A_in - cum), 0.0)
            eA = tl.exp(A_in)
            Sk = eA * Sk0 + tl.sum(Dall * (w * kk)[:, None], axis=0)
            Sq = eA * Sq0 + tl.sum(Dall * (w * kq)[:, None], axis=0)
            alpha = tl.exp(g)
            d = beta * (v - alpha * Sk)
            o = alpha * Sq + d * tl.sum(k * q, axis=0)
            dr = ring_round(d, RING)
            tl.store(out + (row * HV + h) * V + offs_v, o)
            pos = rbase + m
            ring_store(ring_d + (pos * HV + h) * V + offs_v, dr, offs_v < V, RING)
            ring_store(ring_v + (pos * HV + h) * V + offs_v, v, offs_v < V, RING)
            if pid_v == 0:
                tl.store(ring_g + pos * HV + h, g)
                tl.store(ring_b + pos * HV + h, beta)
                if h % (HV // HK) == 0:
                    ring_store(ring_k + (pos * HK + hk) * K + offs_k, k, offs_k < K, RING)
                    tl.store(ring_kk + (pos * HK + hk) * RP + offs_r, tl.where(valid, kk, 0.0))
            Kall = tl.where(offs_r[:, None] == m, k[None, :], Kall)
            Dall = tl.where(offs_r[:, None] == m, dr[None, :], Dall)
            A_in = A_in + g
            cum = tl.where(offs_r == m, A_in, cum)


@triton.jit
def _vprep_kernel(
    q_ptr, k_ptr, a_ptr, b_ptr, A_log, dt_bias, state_idx, ring_k, ring_g, ring_b, ring_kk,
    ring_len, pqk, pco, pn,
    T: tl.constexpr, TP: tl.constexpr, HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr,
    R: tl.constexpr, RP: tl.constexpr, CW: tl.constexpr, RING: tl.constexpr,
):
    """Staged verify, first launch: one program per (k-head, batch row) prepares the T
    drafts' q and k, their products with the committed ring entries and the earlier
    drafts (``k_i . k_j``, ``k_i . q_j``), and per value head of the group and draft
    the coefficients ``w_ji k_i . k_j``, ``w_ji k_i . q_j`` (``w_ji = e^{A_j - c_i}``)
    and scalars ``e^{A_j}``, ``alpha_j``, ``beta_j``, ``k_j . q_j`` (``pco`` row ``b T +
    j``); writes the drafts' k, products, g and beta behind the commit pointer and
    ``pn[b]`` = committed entries (-1: no slot)."""
    hk = tl.program_id(0)
    bidx = tl.program_id(1)
    GRP: tl.constexpr = HV // HK
    offs_k = tl.arange(0, K)
    offs_r = tl.arange(0, RP)
    offs_t = tl.arange(0, TP)
    slot = tl.load(state_idx + bidx)
    if slot >= 0:
        n = tl.load(ring_len + slot)
        rbase = slot.to(tl.int64) * R
        Kall = ring_load(ring_k + (rbase * HK + hk) * K + offs_r[:, None] * (HK * K)
                         + offs_k[None, :], (offs_r < n)[:, None], RING)
        KKt = tl.zeros((TP, RP), dtype=tl.float32)
        KQt = tl.zeros((TP, RP), dtype=tl.float32)
        KQS = tl.zeros((TP,), dtype=tl.float32)
        for j in tl.static_range(T):
            m = n + j
            valid = offs_r < m
            row = bidx * T + j
            q, k, qn, kn = _prep_qk(q_ptr + (row * HK + hk) * K, k_ptr + (row * HK + hk) * K,
                                    K, RING)
            kk = tl.where(valid, tl.sum(Kall * k[None, :], axis=1), 0.0)
            kq = tl.where(valid, tl.sum(Kall * q[None, :], axis=1), 0.0)
            qb = pqk + (row * HK + hk) * (2 * K)
            tl.store(qb + offs_k, q)
            tl.store(qb + K + offs_k, k)
            pos = rbase + m
            ring_store(ring_k + (pos * HK + hk) * K + offs_k, k, offs_k < K, RING)
            tl.store(ring_kk + (pos * HK + hk) * RP + offs_r, kk)
            KKt = tl.where(offs_t[:, None] == j, kk[None, :], KKt)
            KQt = tl.where(offs_t[:, None] == j, kq[None, :], KQt)
            KQS = tl.where(offs_t == j, tl.sum(k * q, axis=0), KQS)
            Kall = tl.where(offs_r[:, None] == m, k[None, :], Kall)
        for jj in tl.static_range(GRP):
            h = hk * GRP + jj
            gr = tl.load(ring_g + rbase * HV + h + offs_r * HV, mask=offs_r < n, other=0.0)
            cum = tl.cumsum(gr, axis=0)  # log-decay through each entry (drafts added below)
            A_in = tl.sum(gr, axis=0)  # log-decay before the current draft
            for j in tl.static_range(T):
                m = n + j
                valid = offs_r < m
                row = bidx * T + j
                g, beta = _gates(a_ptr + row * HV + h, b_ptr + row * HV + h, A_log, dt_bias, h)
                sel = offs_t[:, None] == j
                kk = tl.sum(tl.where(sel, KKt, 0.0), axis=0)
                kq = tl.sum(tl.where(sel, KQt, 0.0), axis=0)
                kqs = tl.sum(tl.where(offs_t == j, KQS, 0.0), axis=0)
                w = tl.where(valid, tl.exp(A_in - cum), 0.0)
                cb = pco + (row * HV + h) * CW
                tl.store(cb + offs_r, w * kk)
                tl.store(cb + RP + offs_r, w * kq)
                offs_s = tl.arange(0, 4)
                sv = tl.where(offs_s == 0, tl.exp(A_in), tl.where(
                    offs_s == 1, tl.exp(g), tl.where(offs_s == 2, beta, kqs)))
                tl.store(cb + 2 * RP + offs_s, sv)
                pos = rbase + m
                tl.store(ring_g + pos * HV + h, g)
                tl.store(ring_b + pos * HV + h, beta)
                A_in = A_in + g
                cum = tl.where(offs_r == m, A_in, cum)
        if hk == 0:
            tl.store(pn + bidx, n)
    else:
        if hk == 0:
            tl.store(pn + bidx, -1)


@triton.jit
def _verify_tile(state_idx, pn, r_data, r_s1, r_s2, bidx, HK: tl.constexpr, HV: tl.constexpr,
                 K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, R: tl.constexpr,
                 FMT: tl.constexpr):
    """The tile of a verify output program (grid ``(HV * (V // BV), B)``): its v-head
    and k-head, the committed ring length ``n`` (-1: nothing to verify), the ring's
    base row, the tile's rows and row mask, and its stored codes."""
    NVB: tl.constexpr = V // BV
    pid = tl.program_id(0)
    h = pid // NVB
    slot = tl.load(state_idx + bidx)
    n = tl.load(pn + bidx)
    slot64 = tl.maximum(slot, 0).to(tl.int64)
    offs_v = (pid % NVB) * BV + tl.arange(0, BV)
    mrow = (offs_v < V) & (slot >= 0) & (n >= 0)
    codes, sc, s2v = load_tile(r_data, r_s1, r_s2, slot64 * HV + h, offs_v, mrow, V, K, FMT)
    return h, h // (HV // HK), n, slot64 * R, offs_v, mrow, codes, sc, s2v


@triton.jit
def _write_draft(out, ring_d, ring_v, row, pos, h, offs_v, mrow, o, d, v, HV: tl.constexpr,
                 V: tl.constexpr, RING: tl.constexpr):
    """A verified draft's output and its ring entries (d, v) at ring row ``pos``;
    returns the ring-rounded d."""
    dr = ring_round(d, RING)
    tl.store(out + (row * HV + h) * V + offs_v, o, mask=mrow)
    ring_store(ring_d + (pos * HV + h) * V + offs_v, dr, mrow, RING)
    ring_store(ring_v + (pos * HV + h) * V + offs_v, v, mrow, RING)
    return dr


@triton.jit
def _vout_kernel(
    v_ptr, state_idx, out, r_data, r_s1, r_s2, ring_v, ring_d, pqk, pco, pn,
    T: tl.constexpr, HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BV: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, CW: tl.constexpr, FMT: tl.constexpr,
    RING: tl.constexpr,
):
    """Staged verify, second launch.  Grid ``(HV * (V // BV), B)``: one tile of BV rows,
    read once and kept packed in registers; draft j reduces it against its k and q,
    adds the ring's d rows (committed entries and drafts 0..j-1, joined in registers)
    weighted by the prep launch's coefficients, and writes o and its d, v behind the
    commit pointer."""
    bidx = tl.program_id(1)
    h, hk, n, rbase, offs_v, mrow, codes, sc, s2v = _verify_tile(
        state_idx, pn, r_data, r_s1, r_s2, bidx, HK, HV, K, V, BV, R, FMT)
    offs_r = tl.arange(0, RP)
    offs_k = tl.arange(0, K)
    Dall = ring_load(ring_d + (rbase * HV + h) * V + offs_r[:, None] * (HV * V)
                     + offs_v[None, :], (offs_r < n)[:, None] & mrow[None, :], RING)
    for j in tl.static_range(T):
        row = bidx * T + j
        qb = pqk + (row * HK + hk) * (2 * K)
        q = tl.load(qb + offs_k)
        k = tl.load(qb + K + offs_k)
        v = ring_round(tl.load(v_ptr + (row * HV + h) * V + offs_v, mask=mrow,
                               other=0.0).to(tl.float32), RING)
        o, d = _staged_rows(codes, sc, s2v, k, q, Dall, pco + (row * HV + h) * CW, v, K, BV,
                            RP, FMT)
        dr = _write_draft(out, ring_d, ring_v, row, rbase + n + j, h, offs_v, mrow, o, d, v,
                          HV, V, RING)
        Dall = tl.where(offs_r[:, None] == n + j, dr[None, :], Dall)


@triton.jit
def _vout_mm_kernel(
    v_ptr, state_idx, out, r_data, r_s1, r_s2, ring_v, ring_d, pqk, pco, pn,
    T: tl.constexpr, TP: tl.constexpr, TQ: tl.constexpr, HK: tl.constexpr, HV: tl.constexpr,
    K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, R: tl.constexpr, RP: tl.constexpr,
    CW: tl.constexpr, FMT: tl.constexpr, RING: tl.constexpr,
):
    """Staged verify, second launch, as matrix products (``verify_launch="staged-dot"``).
    Grid as :func:`_vout_kernel`.  All T drafts' reductions of the tile come from one
    tensor-core product ``X [k_0 .. k_{T-1} q_0 .. q_{T-1}]`` (TQ >= 2T columns; the
    tile's values exact in tf32, the vectors split, ~fp32 accuracy), the committed
    ring's part from one more (``D^T [coefficients]``); only the drafts' own
    contributions to each other (``T (T - 1) / 2`` rows) stay sequential.  A bf16/fp16
    ring (RING != 0, ``tl_common.RING_FP32``) is exact in tf32 and is not split."""
    bidx = tl.program_id(1)
    h, hk, n, rbase, offs_v, mrow, codes, sc, s2v = _verify_tile(
        state_idx, pn, r_data, r_s1, r_s2, bidx, HK, HV, K, V, BV, R, FMT)
    offs_r = tl.arange(0, RP)
    offs_k = tl.arange(0, K)
    offs_t = tl.arange(0, TP)
    offs_c = tl.arange(0, TQ)
    # column c: draft c's k (c < T) or draft c - T's q (T <= c < 2T); zero beyond
    isk = offs_c < T
    used = offs_c < 2 * T
    dc = tl.where(isk, offs_c, offs_c - T)
    crow = bidx * T + tl.where(used, dc, 0)
    KQ = tl.load(pqk + ((crow * HK + hk) * (2 * K) + tl.where(isk, K, 0))[None, :]
                 + offs_k[:, None], mask=used[None, :], other=0.0)
    cbase = pco + (crow * HV + h) * CW
    eA = tl.load(cbase + 2 * RP, mask=used, other=0.0)
    CKQ = tl.load(cbase[None, :] + tl.where(isk, 0, RP)[None, :] + offs_r[:, None],
                  mask=used[None, :] & (offs_r < n)[:, None], other=0.0)
    Dc = ring_load(ring_d + (rbase * HV + h) * V + offs_r[:, None] * (HV * V)
                   + offs_v[None, :], (offs_r < n)[:, None] & mrow[None, :], RING)
    X, rs = tile_values(codes, sc, s2v, FMT, BV, K)
    P = dot_fp32(X, KQ, FMT != K_FP32, False)
    Tm = P * rs[:, None] * eA[None, :] + dot_fp32(tl.trans(Dc), CKQ, RING != 0, False)
    Dd = tl.zeros((TP, BV), dtype=tl.float32)  # the drafts' ring-rounded d
    for j in tl.static_range(T):
        row = bidx * T + j
        cb = pco + (row * HV + h) * CW
        alpha = tl.load(cb + 2 * RP + 1)
        beta = tl.load(cb + 2 * RP + 2)
        kqs = tl.load(cb + 2 * RP + 3)
        Sk = tl.sum(tl.where(offs_c[None, :] == j, Tm, 0.0), axis=1)
        Sq = tl.sum(tl.where(offs_c[None, :] == T + j, Tm, 0.0), axis=1)
        if j > 0:  # the earlier drafts' d, weighted by this draft's coefficients
            md = offs_t < j
            ck = tl.load(cb + n + offs_t, mask=md, other=0.0)
            cq = tl.load(cb + RP + n + offs_t, mask=md, other=0.0)
            Sk += tl.sum(Dd * ck[:, None], axis=0)
            Sq += tl.sum(Dd * cq[:, None], axis=0)
        v = ring_round(tl.load(v_ptr + (row * HV + h) * V + offs_v, mask=mrow,
                               other=0.0).to(tl.float32), RING)
        d = beta * (v - alpha * Sk)
        o = alpha * Sq + d * kqs
        dr = _write_draft(out, ring_d, ring_v, row, rbase + n + j, h, offs_v, mrow, o, d, v,
                          HV, V, RING)
        Dd = tl.where(offs_t[:, None] == j, dr[None, :], Dd)


settle_module_keys(__name__)  # every process looks its kernels up under one key

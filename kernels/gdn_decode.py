"""Fused Triton kernels for Gated DeltaNet decoding: conventional step, replay
(output or flush, one launch per step), speculative verify of T drafts and commit.

Every kernel takes the raw per-step inputs (``q``, ``k`` per k-head, ``v`` per
v-head, gate pre-activations ``a``, ``b``) and does the layer's preprocessing in
fp32: L2-normalise q and k (q scaled by ``K**-0.5``), round k and v to the ring
dtype (the values the ring stores; the step uses them everywhere),
``g = -exp(A_log) softplus(a + dt_bias)``, ``beta = sigmoid(b)``.

Sequences index state slots through ``state_indices`` (a negative index skips the
sequence).  Per-slot counters (int32 device tensors, the protocol of
``tl_common.finish_slot``): ``ring_len`` (committed ring entries), ``steps`` (the
slot's decode steps, the SR step), ``tickets``.  The last program of a slot to finish
publishes the new counters, so a step is one launch, needs no host sync and can be
captured in a CUDA graph.  Stochastic rounding indexes elements row-major over the
whole (slots, v_heads, V, K) pool (the torch emulation's batch index when slot b
holds sequence b).

Grid of every kernel: ``(V // BV, batch * v_heads)``; a program owns BV rows of one
value head's state with the full K in registers, so the flush (S_c k_i, the
triangular recompute of d_i, the rank-L fold) runs in one pass per row block.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .codec import as_int32
from .gdn_extra import qk_at, read_dots
from .state import StateStore
from .tl_common import (
    RING_BF16,
    RING_FP16,
    RING_FP32,
    finish_slot,
    ring_load,
    ring_round,
    ring_store,
    softplus,
)
from .tl_formats import (
    FMT_BF16_SR,
    FMT_FP16_SR,
    FMT_NONE,
    K_BF16_SR,
    K_FP16_SR,
    K_NONE,
    K_NVFP4,
    load_state,
    matrix_amax,
    store_state,
)

RING_IDS = {torch.float32: RING_FP32, torch.bfloat16: RING_BF16, torch.float16: RING_FP16}
_RING_STORAGE = {torch.float32: torch.float32, torch.bfloat16: torch.int16,
                 torch.float16: torch.int16}


# ---------------------------------------------------------------- device helpers
@triton.jit
def _gates(a_ptr, b_ptr, A_log, dt_bias, h):
    """``(g, beta)`` of value head ``h`` (fp32 scalars)."""
    a = tl.load(a_ptr).to(tl.float32)
    b = tl.load(b_ptr).to(tl.float32)
    A = tl.load(A_log + h).to(tl.float32)
    dtb = tl.load(dt_bias + h).to(tl.float32)
    g = -tl.exp(A) * softplus(a + dtb)
    beta = 1.0 / (1.0 + tl.exp(-b))
    return g, beta


@triton.jit
def _norms(q_ptr, k_ptr, K: tl.constexpr):
    """L2 norms of the raw q and k rows, clamped at 1e-6 (``F.normalize``)."""
    offs_k = tl.arange(0, K)
    q = tl.load(q_ptr + offs_k).to(tl.float32)
    k = tl.load(k_ptr + offs_k).to(tl.float32)
    qn = tl.maximum(tl.sqrt_rn(tl.sum(q * q, axis=0)), 1e-6)
    kn = tl.maximum(tl.sqrt_rn(tl.sum(k * k, axis=0)), 1e-6)
    return qn, kn


@triton.jit
def _prep_qk(q_ptr, k_ptr, K: tl.constexpr, RING: tl.constexpr):
    """Normalised q (scaled by K**-0.5), k rounded to the ring dtype (fp32 (K,) each),
    and the two clamped norms."""
    qn, kn = _norms(q_ptr, k_ptr, K)
    q, k = qk_at(q_ptr, k_ptr, tl.arange(0, K), qn, kn, K, RING)
    return q, k, qn, kn


@triton.jit
def _delta(S, k, v, alpha, beta):
    """One gated delta-rule update of a (BV, K) block: returns the new block."""
    Sk = tl.sum(S * k[None, :], axis=1)
    d = beta * (v - alpha * Sk)
    return alpha * S + d[:, None] * k[None, :]


@triton.jit
def _fold_ring(S, ring_k, ring_v, ring_g, ring_b, slot, h, hk, offs_v, n,
               HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
               R: tl.constexpr, RP: tl.constexpr, RING: tl.constexpr):
    """Re-run the delta rule over ring entries 0..n-1 of (slot, head) on block S.

    The n entries are loaded at once (one memory round trip, not one per entry) and
    picked out of registers entry by entry."""
    offs_k = tl.arange(0, K)
    offs_r = tl.arange(0, RP)
    rmask = offs_r < n
    rk = ring_k + (slot.to(tl.int64) * R * HK + hk) * K
    rv = ring_v + (slot.to(tl.int64) * R * HV + h) * V
    rs = slot.to(tl.int64) * R * HV + h
    Kr = ring_load(rk + offs_r[:, None] * (HK * K) + offs_k[None, :], rmask[:, None], RING)
    Vr = ring_load(rv + offs_r[None, :] * (HV * V) + offs_v[:, None], rmask[None, :], RING)
    gr = tl.load(ring_g + rs + offs_r * HV, mask=rmask, other=0.0)
    br = tl.load(ring_b + rs + offs_r * HV, mask=rmask, other=0.0)
    for i in range(0, R):  # constant trip count (the interpreter cannot loop to a loaded n)
        if i < n:
            ki = tl.sum(tl.where(offs_r[:, None] == i, Kr, 0.0), axis=0)
            vi = tl.sum(tl.where(offs_r[None, :] == i, Vr, 0.0), axis=1)
            gi = tl.sum(tl.where(offs_r == i, gr, 0.0), axis=0)
            bi = tl.sum(tl.where(offs_r == i, br, 0.0), axis=0)
            S = _delta(S, ki, vi, tl.exp(gi), bi)
    return S


@triton.jit
def _ring_part(Sk0, Sq0, ring_k, ring_d, ring_g, slot, hk, h, offs_v, n, k, q,
               HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
               R: tl.constexpr, RP: tl.constexpr, RING: tl.constexpr):
    """``(S_{t-1} k, S_{t-1} q)`` for the rows of a block, with S_{t-1} the stored copy
    (whose products with k and q are ``Sk0``, ``Sq0``) decayed over ring entries
    0..n-1 plus their rank-1 terms."""
    offs_k = tl.arange(0, K)
    offs_r = tl.arange(0, RP)
    rmask = offs_r < n
    rk = ring_k + (slot.to(tl.int64) * R * HK + hk) * K
    rd = ring_d + (slot.to(tl.int64) * R * HV + h) * V
    rs = slot.to(tl.int64) * R * HV + h
    kr = ring_load(rk + offs_r[:, None] * (HK * K) + offs_k[None, :], rmask[:, None], RING)
    dr = ring_load(rd + offs_r[None, :] * (HV * V) + offs_v[:, None], rmask[None, :], RING)
    gr = tl.load(ring_g + rs + offs_r * HV, mask=rmask, other=0.0)
    cum = tl.cumsum(gr, axis=0)
    G = tl.sum(gr, axis=0)
    w = tl.where(rmask, tl.exp(G - cum), 0.0)
    wk = w * tl.sum(kr * k[None, :], axis=1)
    wq = w * tl.sum(kr * q[None, :], axis=1)
    eG = tl.exp(G)
    Sk = eG * Sk0 + tl.sum(dr * wk[None, :], axis=1)
    Sq = eG * Sq0 + tl.sum(dr * wq[None, :], axis=1)
    return Sk, Sq


@triton.jit
def _append(ring_k, ring_v, ring_g, ring_b, slot, h, hk, pid_v, offs_v, pos, k, v, g, beta,
            HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
            R: tl.constexpr, RING: tl.constexpr):
    """Write this step's k (one program per k-head), v slice, g and beta at ``pos``."""
    offs_k = tl.arange(0, K)
    base = slot.to(tl.int64) * R + pos
    if (h % (HV // HK) == 0) & (pid_v == 0):
        ring_store(ring_k + (base * HK + hk) * K + offs_k, k, offs_k < K, RING)
    ring_store(ring_v + (base * HV + h) * V + offs_v, v, offs_v < V, RING)
    if pid_v == 0:
        tl.store(ring_g + base * HV + h, g)
        tl.store(ring_b + base * HV + h, beta)


@triton.jit
def _load(data, s1, s2, mat, offs_v, V: tl.constexpr, BV: tl.constexpr, K: tl.constexpr,
          FMT: tl.constexpr):
    return load_state(data, s1, s2, mat, offs_v, offs_v < V, V, FMT, BV, K)


@triton.jit
def _store(S, data, s1, s2, mat, offs_v, seed, step, V: tl.constexpr, BV: tl.constexpr,
           K: tl.constexpr, FMT: tl.constexpr):
    if FMT == K_NVFP4:
        amax = matrix_amax(S)  # the program holds the whole matrix (BV == V)
    else:
        amax = 0.0
    store_state(data, s1, s2, S, mat, offs_v, offs_v < V, V, seed, step, amax, FMT, BV, K)


# ------------------------------------------------------------------------ kernels
@triton.jit(do_not_specialize=["seed"])
def _conventional_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log, dt_bias, state_idx, out,
    data, s1, s2, ring_len, steps, tickets, seed,
    HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
    FMT: tl.constexpr, RING: tl.constexpr,
):
    pid_v = tl.program_id(0)
    pid_bh = tl.program_id(1)
    bidx = pid_bh // HV
    h = pid_bh % HV
    hk = h // (HV // HK)
    slot = tl.load(state_idx + bidx)
    if slot >= 0:
        SR: tl.constexpr = (FMT == K_BF16_SR) or (FMT == K_FP16_SR)
        offs_v = pid_v * BV + tl.arange(0, BV)
        mat = slot.to(tl.int64) * HV + h
        S = _load(data, s1, s2, mat, offs_v, V, BV, K, FMT)
        q, k, qn, kn = _prep_qk(q_ptr + (bidx * HK + hk) * K, k_ptr + (bidx * HK + hk) * K, K, RING)
        v = ring_round(tl.load(v_ptr + (bidx * HV + h) * V + offs_v).to(tl.float32), RING)
        g, beta = _gates(a_ptr + pid_bh, b_ptr + pid_bh, A_log, dt_bias, h)
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


@triton.jit
def _flush_body(S, k, v, q, alpha, beta, c_data, c_s1, c_s2, f_data, f_s1, f_s2,
                ring_k, ring_v, ring_g, ring_b, fresh, slot, h, hk, mat, offs_v, n, seed, t,
                HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                BV: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, C_FMT: tl.constexpr,
                F_FMT: tl.constexpr, RING: tl.constexpr, FRESH: tl.constexpr,
                WITH_STEP: tl.constexpr):
    """Fold ring entries 0..n-1 (and, if WITH_STEP, this step) into the decoded
    checkpoint block ``S``; write the checkpoint (and read copy, and the fp32 state to
    ``fresh`` if FRESH); return the new block."""
    S = _fold_ring(S, ring_k, ring_v, ring_g, ring_b, slot, h, hk, offs_v, n, HK, HV, K, V, R,
                   RP, RING)
    if WITH_STEP:
        S = _delta(S, k, v, alpha, beta)
    if FRESH:
        offs_k = tl.arange(0, K)
        tl.store(fresh + mat * (V * K) + offs_v[:, None] * K + offs_k[None, :], S)
    _store(S, c_data, c_s1, c_s2, mat, offs_v, seed, t, V, BV, K, C_FMT)
    if F_FMT != K_NONE:
        _store(S, f_data, f_s1, f_s2, mat, offs_v, seed + 1, t, V, BV, K, F_FMT)
    return S


@triton.jit
def _output_body(k, v, q, g, alpha, beta, r_data, r_s1, r_s2, ring_k, ring_v, ring_d, ring_g,
                 ring_b, slot, h, hk, mat, pid_v, offs_v, n,
                 HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                 BV: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, FMT: tl.constexpr,
                 RING: tl.constexpr):
    """Output step from the stored copy ``r_*`` and ring entries 0..n-1; appends this
    step at position n; returns the output rows."""
    Sk0, Sq0 = read_dots(r_data, r_s1, r_s2, mat, offs_v, k, q, V, K, BV, FMT)
    Sk, Sq = _ring_part(Sk0, Sq0, ring_k, ring_d, ring_g, slot, hk, h, offs_v, n, k, q,
                        HK, HV, K, V, R, RP, RING)
    d = beta * (v - alpha * Sk)
    o = alpha * Sq + d * tl.sum(k * q, axis=0)
    pos = (slot.to(tl.int64) * R + n) * HV + h
    ring_store(ring_d + pos * V + offs_v, ring_round(d, RING), offs_v < V, RING)
    _append(ring_k, ring_v, ring_g, ring_b, slot, h, hk, pid_v, offs_v, n, k, v, g, beta,
            HK, HV, K, V, R, RING)
    return o


@triton.jit
def _step_inputs(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log, dt_bias, row, h, hk, offs_v,
                 HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                 RING: tl.constexpr):
    """Prepared q, k, v (block rows), g, beta of token row ``row`` for value head h."""
    q, k, qn, kn = _prep_qk(q_ptr + (row * HK + hk) * K, k_ptr + (row * HK + hk) * K, K, RING)
    v = ring_round(tl.load(v_ptr + (row * HV + h) * V + offs_v).to(tl.float32), RING)
    g, beta = _gates(a_ptr + row * HV + h, b_ptr + row * HV + h, A_log, dt_bias, h)
    return q, k, v, g, beta


@triton.jit(do_not_specialize=["seed"])
def _replay_step_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log, dt_bias, state_idx, out,
    c_data, c_s1, c_s2, f_data, f_s1, f_s2,
    ring_k, ring_v, ring_d, ring_g, ring_b, ring_len, steps, tickets, fresh, seed,
    HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
    L: tl.constexpr, R: tl.constexpr, RP: tl.constexpr,
    C_FMT: tl.constexpr, F_FMT: tl.constexpr, RING: tl.constexpr, MODE: tl.constexpr,
    FRESH: tl.constexpr,
):
    """One decode step.  MODE 0: an output step from the read copy + ring or (when
    the ring then holds L entries) a flush, in one launch.  MODE 1: output steps only,
    after :func:`_flush_kernel` has flushed the other slots (it leaves the counters
    alone; this launch resets their ring).  A shared design passes F_FMT = K_NONE
    and the checkpoint serves the outputs."""
    pid_v = tl.program_id(0)
    pid_bh = tl.program_id(1)
    bidx = pid_bh // HV
    h = pid_bh % HV
    hk = h // (HV // HK)
    nprog = HV * (V // BV)
    slot = tl.load(state_idx + bidx)
    if slot >= 0:
        n = tl.load(ring_len + slot)
        t = tl.load(steps + slot)
        is_flush = n + 1 >= L
        offs_v = pid_v * BV + tl.arange(0, BV)
        mat = slot.to(tl.int64) * HV + h
        if F_FMT != K_NONE:
            r_data, r_s1, r_s2 = f_data, f_s1, f_s2
            R_FMT: tl.constexpr = F_FMT
        else:
            r_data, r_s1, r_s2 = c_data, c_s1, c_s2
            R_FMT: tl.constexpr = C_FMT
        if is_flush:
            if MODE == 0:
                q, k, v, g, beta = _step_inputs(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log,
                                                dt_bias, bidx, h, hk, offs_v, HK, HV, K, V,
                                                RING)
                S = _load(c_data, c_s1, c_s2, mat, offs_v, V, BV, K, C_FMT)
                S = _flush_body(S, k, v, q, tl.exp(g), beta, c_data, c_s1, c_s2, f_data,
                                f_s1, f_s2, ring_k, ring_v, ring_g, ring_b, fresh, slot, h,
                                hk, mat, offs_v, n, seed, t, HK, HV, K, V, BV, R, RP, C_FMT,
                                F_FMT, RING, FRESH, True)
                tl.store(out + (bidx * HV + h) * V + offs_v, tl.sum(S * q[None, :], axis=1))
            finish_slot(tickets, ring_len, steps, slot, nprog, 0, t + 1)
        else:
            q, k, v, g, beta = _step_inputs(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log, dt_bias,
                                            bidx, h, hk, offs_v, HK, HV, K, V, RING)
            o = _output_body(k, v, q, g, tl.exp(g), beta, r_data, r_s1, r_s2, ring_k, ring_v,
                             ring_d, ring_g, ring_b, slot, h, hk, mat, pid_v, offs_v, n,
                             HK, HV, K, V, BV, R, RP, R_FMT, RING)
            tl.store(out + (bidx * HV + h) * V + offs_v, o)
            finish_slot(tickets, ring_len, steps, slot, nprog, n + 1, t + 1)


@triton.jit(do_not_specialize=["seed", "B"])
def _flush_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log, dt_bias, state_idx, accepted, out,
    c_data, c_s1, c_s2, f_data, f_s1, f_s2,
    ring_k, ring_v, ring_g, ring_b, ring_len, steps, fresh, seed, B,
    HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
    L: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, BP: tl.constexpr,
    C_FMT: tl.constexpr, F_FMT: tl.constexpr, RING: tl.constexpr, FRESH: tl.constexpr,
    COMMIT: tl.constexpr,
):
    """Persistent flush launch: every program reads the ring counts of all B sequences
    (one vector load), enumerates the (flushing sequence, head, row block) units and
    takes every G-th one; with nothing to flush it returns at once.  A step flush
    (COMMIT 0: ring + this step, L entries) writes the step's output; a commit flush
    (COMMIT 1: ring_len + accepted >= L committed entries) writes none.  No counter
    is written here: the launch that follows advances them."""
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    offs_b = tl.arange(0, BP)
    sl = tl.load(state_idx + offs_b, mask=offs_b < B, other=-1)
    nb = tl.load(ring_len + tl.maximum(sl, 0), mask=sl >= 0, other=0)
    if COMMIT:
        nb += tl.load(accepted + offs_b, mask=offs_b < B, other=0)
        flag = (sl >= 0) & (nb >= L)
    else:
        flag = (sl >= 0) & (nb + 1 >= L)
    fl = flag.to(tl.int32)
    cum = tl.cumsum(fl, axis=0)
    NVB: tl.constexpr = V // BV
    units = tl.sum(fl, axis=0) * (HV * NVB)
    u = pid
    while u < units:
        j = u // (HV * NVB)
        h = (u // NVB) % HV
        pid_v = u % NVB
        bidx = tl.sum(tl.where(flag & (cum == j + 1), offs_b, 0), axis=0)
        hk = h // (HV // HK)
        slot = tl.load(state_idx + bidx)
        n = tl.load(ring_len + slot)
        t = tl.load(steps + slot)
        offs_v = pid_v * BV + tl.arange(0, BV)
        mat = slot.to(tl.int64) * HV + h
        S = _load(c_data, c_s1, c_s2, mat, offs_v, V, BV, K, C_FMT)
        if COMMIT:
            n_acc = tl.load(accepted + bidx)
            _flush_body(S, S, S, S, 0.0, 0.0, c_data, c_s1, c_s2, f_data, f_s1, f_s2,
                        ring_k, ring_v, ring_g, ring_b, fresh, slot, h, hk, mat, offs_v,
                        n + n_acc, seed, t + n_acc - 1, HK, HV, K, V, BV, R, RP, C_FMT, F_FMT,
                        RING, FRESH, False)
        else:
            q, k, v, g, beta = _step_inputs(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log, dt_bias,
                                            bidx, h, hk, offs_v, HK, HV, K, V, RING)
            S = _flush_body(S, k, v, q, tl.exp(g), beta, c_data, c_s1, c_s2, f_data, f_s1,
                            f_s2, ring_k, ring_v, ring_g, ring_b, fresh, slot, h, hk, mat,
                            offs_v, n, seed, t, HK, HV, K, V, BV, R, RP, C_FMT, F_FMT, RING,
                            FRESH, True)
            tl.store(out + (bidx * HV + h) * V + offs_v, tl.sum(S * q[None, :], axis=1))
        u += G


@triton.jit
def _commit_counters(accepted, state_idx, ring_len, steps, B, L: tl.constexpr,
                     BLOCK: tl.constexpr):
    """After a commit flush: ring_len += accepted (0 where it reached L); steps too."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    sl = tl.load(state_idx + offs, mask=offs < B, other=-1)
    ok = sl >= 0
    s = tl.maximum(sl, 0)
    acc = tl.load(accepted + offs, mask=ok, other=0)
    m = tl.load(ring_len + s, mask=ok, other=0) + acc
    tl.store(ring_len + s, tl.where(m >= L, 0, m), mask=ok)
    tl.store(steps + s, tl.load(steps + s, mask=ok, other=0) + acc, mask=ok)


@triton.jit
def _verify_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log, dt_bias, state_idx, out,
    r_data, r_s1, r_s2, ring_k, ring_v, ring_d, ring_g, ring_b, ring_len,
    T: tl.constexpr, TP: tl.constexpr,
    HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
    R: tl.constexpr, RP: tl.constexpr, FMT: tl.constexpr, RING: tl.constexpr,
):
    """Outputs of T draft steps from the read copy + committed ring entries; drafts
    are written to the ring behind the commit pointer (no counter changes).  The copy's
    block is re-read per draft (from L1/L2 after the first)."""
    pid_v = tl.program_id(0)
    pid_bh = tl.program_id(1)
    bidx = pid_bh // HV
    h = pid_bh % HV
    hk = h // (HV // HK)
    slot = tl.load(state_idx + bidx)
    if slot >= 0:
        n = tl.load(ring_len + slot)
        offs_v = pid_v * BV + tl.arange(0, BV)
        offs_k = tl.arange(0, K)
        offs_r = tl.arange(0, RP)
        offs_t = tl.arange(0, TP)
        mat = slot.to(tl.int64) * HV + h
        rmask = offs_r < n
        rk = ring_k + (slot.to(tl.int64) * R * HK + hk) * K
        rd = ring_d + (slot.to(tl.int64) * R * HV + h) * V
        rs = slot.to(tl.int64) * R * HV + h
        kr = ring_load(rk + offs_r[:, None] * (HK * K) + offs_k[None, :], rmask[:, None], RING)
        dr = ring_load(rd + offs_r[None, :] * (HV * V) + offs_v[:, None], rmask[None, :], RING)
        gr = tl.load(ring_g + rs + offs_r * HV, mask=rmask, other=0.0)
        cum = tl.cumsum(gr, axis=0)
        G = tl.sum(gr, axis=0)
        Dd = tl.zeros((BV, TP), dtype=tl.float32)
        Kd = tl.zeros((TP, K), dtype=tl.float32)
        cumd = tl.zeros((TP,), dtype=tl.float32)
        for j in range(0, T):  # a loop, not unrolled: one draft's registers at a time
            bj = bidx * T + j
            q, k, v, g, beta = _step_inputs(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log, dt_bias,
                                            bj, h, hk, offs_v, HK, HV, K, V, RING)
            alpha = tl.exp(g)
            Sk, Sq = read_dots(r_data, r_s1, r_s2, mat, offs_v, k, q, V, K, BV, FMT)
            w = tl.where(rmask, tl.exp(G - cum), 0.0)
            eG = tl.exp(G)
            Sk = eG * Sk + tl.sum(dr * (w * tl.sum(kr * k[None, :], axis=1))[None, :], axis=1)
            Sq = eG * Sq + tl.sum(dr * (w * tl.sum(kr * q[None, :], axis=1))[None, :], axis=1)
            wd = tl.where(offs_t < j, tl.exp(G - cumd), 0.0)  # earlier drafts
            Sk += tl.sum(Dd * (wd * tl.sum(Kd * k[None, :], axis=1))[None, :], axis=1)
            Sq += tl.sum(Dd * (wd * tl.sum(Kd * q[None, :], axis=1))[None, :], axis=1)
            d = beta * (v - alpha * Sk)
            o = alpha * Sq + d * tl.sum(k * q, axis=0)
            dq = ring_round(d, RING)
            tl.store(out + (bj * HV + h) * V + offs_v, o)
            pos = n + j
            ring_store(ring_d + ((slot.to(tl.int64) * R + pos) * HV + h) * V + offs_v, dq,
                       offs_v < V, RING)
            _append(ring_k, ring_v, ring_g, ring_b, slot, h, hk, pid_v, offs_v, pos, k, v, g,
                    beta, HK, HV, K, V, R, RING)
            Dd = tl.where(offs_t[None, :] == j, dq[:, None], Dd)
            Kd = tl.where(offs_t[:, None] == j, k[None, :], Kd)
            G = G + g
            cumd = tl.where(offs_t == j, G, cumd)


# ------------------------------------------------------------------------- host
def _pow2_at_least(n: int, lo: int = 2) -> int:
    return max(lo, triton.next_power_of_2(max(1, n)))


def _check_shapes(q: torch.Tensor, v: torch.Tensor, K: int, V: int) -> None:
    for name, dim in (("K", K), ("V", V)):
        if dim & (dim - 1) or dim < 16:
            raise ValueError(f"{name} must be a power of two >= 16, got {dim}")
    if q.shape[-1] != K or v.shape[-1] != V:
        raise ValueError(f"q/k last axis must be K={K} and v's V={V}")


def default_config(batch: int, v_heads: int, V: int, K: int, whole_matrix: bool = False,
                   kernel: str = "replay") -> tuple[int, int]:
    """``(BV, num_warps)``: rows of V per program and warps, by batch size.

    ``whole_matrix`` (an nvfp4 copy is written) forces BV = V: its matrix scale
    needs the whole (V, K) matrix in one program.
    """
    if whole_matrix:
        bv = V
    elif batch * v_heads >= 1024:
        bv = min(V, 64 if kernel == "replay" else 32)
    else:
        bv = min(V, 16)
    nw = max(1, min(16, bv * K // 1024))
    return bv, triton.next_power_of_2(nw)


def empty_store(fmt: str, shape: tuple[int, int, int, int], device) -> StateStore:
    """A zero-filled :class:`StateStore` (scales included)."""
    st = StateStore.empty(fmt, shape, device)
    for t in st.tensors():
        t.zero_()
    return st


def store_into(dst: StateStore, S: torch.Tensor, *, seed: int, step: int,
               slots: torch.Tensor | None = None) -> None:
    """Encode ``S`` with the torch formats into ``dst`` (all slots or ``slots``)."""
    src = StateStore.encode(S, dst.fmt, seed=seed, step=step)
    for mine, theirs in zip(dst.tensors(), src.tensors(), strict=True):
        if slots is None:
            mine.copy_(theirs.reshape(mine.shape))
        else:
            mine[slots] = theirs.reshape(mine[slots].shape)


class SlotCounters:
    """Per-slot int32 counters of the kernels: ``ring_len``, ``steps``, ``tickets``."""

    def __init__(self, slots: int, device):
        self.ring_len = torch.zeros(slots, dtype=torch.int32, device=device)
        self.steps = torch.zeros(slots, dtype=torch.int32, device=device)
        self.tickets = torch.zeros(slots, dtype=torch.int32, device=device)

    def args(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.ring_len, self.steps, self.tickets

    def reset(self, slots: torch.Tensor | None = None) -> None:
        for t in self.args():
            if slots is None:
                t.zero_()
            else:
                t[slots] = 0


def conventional_step(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
    A_log: torch.Tensor, dt_bias: torch.Tensor, state: StateStore,
    state_indices: torch.Tensor, *, out: torch.Tensor | None = None,
    counters: SlotCounters | None = None, seed: int = 0,
    kv_dtype: torch.dtype = torch.float32, block_v: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """Conventional GDN decode step in place on ``state`` (any kernel format; the
    state is decoded, updated in fp32 and re-encoded).

    ``q``, ``k``: (B, HK, K); ``v``: (B, HV, V); ``a``, ``b``: (B, HV); ``state_indices``:
    (B,) int32 slots.  ``kv_dtype`` rounds normalised k and v first (the ring dtype of a
    replay design; fp32 = no rounding).  Stochastic rounding (bf16-sr, fp16-sr) needs
    ``counters`` (the slot's step counter keys the random bits with ``seed``).
    Returns the fp32 output (B, HV, V).
    """
    B, HK, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    _check_shapes(q, v, K, V)
    if state.fmt_id in (FMT_BF16_SR, FMT_FP16_SR) and counters is None:
        raise ValueError("stochastic rounding needs the per-slot step counters")
    bv, nw = default_config(B, HV, V, K, state.fmt == "nvfp4", kernel="conventional")
    bv, nw = block_v or bv, num_warps or nw
    if V % bv:
        raise ValueError(f"block_v {bv} does not divide V = {V}")
    if out is None:
        out = torch.empty((B, HV, V), dtype=torch.float32, device=q.device)
    cargs = counters.args() if counters is not None else (state_indices,) * 3
    _conventional_kernel[(V // bv, B * HV)](
        q.contiguous(), k.contiguous(), v.contiguous(), a.contiguous(), b.contiguous(),
        A_log, dt_bias, state_indices, out, *state.kernel_args(), *cargs, as_int32(seed),
        HK, HV, K, V, bv, state.fmt_id, RING_IDS[kv_dtype], num_warps=nw,
    )
    return out


class GDNReplayCache:
    """Device-side state of a replay design for a pool of ``slots`` sequences.

    ``checkpoint`` is the recursion's format (fp32, bf16, fp16, bf16-sr, fp16-sr, or a
    packed format for a shared design); ``read`` the read copy's format (None: shared,
    outputs read the checkpoint).  ``window`` is L; ``drafts`` the largest number of
    speculative drafts verified at once (the ring holds L - 1 + drafts entries).
    ``launch``: "fused" (one launch per step, branching per slot on its ring count)
    or "split" (a persistent flush launch that returns at once where no slot flushes,
    then an output launch with the output path's smaller register footprint and its
    own block ``out_block_v`` / ``out_num_warps``); verify has ``verify_block_v`` /
    ``verify_num_warps``.
    ``block_v`` / ``num_warps`` configure the fused kernel and the flush launches.
    """

    def __init__(
        self, slots: int, k_heads: int, v_heads: int, K: int, V: int, *, window: int,
        checkpoint: str = "fp32", read: str | None = None,
        ring_dtype: torch.dtype = torch.bfloat16, drafts: int = 0, seed: int = 0,
        device: torch.device | str = "cuda", batch_hint: int | None = None,
        block_v: int | None = None, num_warps: int | None = None, launch: str = "fused",
        out_block_v: int | None = None, out_num_warps: int | None = None,
        verify_block_v: int | None = None, verify_num_warps: int | None = None,
        keep_fresh: bool = False,
    ):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if launch not in ("fused", "split"):
            raise ValueError(f"launch must be 'fused' or 'split', got {launch!r}")
        if v_heads % k_heads:
            raise ValueError(f"v_heads ({v_heads}) must be a multiple of k_heads ({k_heads})")
        self.slots, self.HK, self.HV, self.K, self.V = slots, k_heads, v_heads, K, V
        self.L, self.T, self.seed, self.launch = window, drafts, seed, launch
        self.R = window + max(drafts - 1, 0)
        self.RP = _pow2_at_least(self.R)
        self.ring_dtype, self.ring_id = ring_dtype, RING_IDS[ring_dtype]
        shape = (slots, v_heads, V, K)
        self.ckpt = empty_store(checkpoint, shape, device)
        self.read = empty_store(read, shape, device) if read is not None else None
        whole = "nvfp4" in (checkpoint, read)
        bv, nw = default_config(batch_hint or slots, v_heads, V, K, whole)
        self.BV, self.num_warps = block_v or bv, num_warps or nw
        if whole and self.BV != V:
            raise ValueError("an nvfp4 copy needs block_v == V")
        obv, onw = default_config(batch_hint or slots, v_heads, V, K, False)
        self.out_BV, self.out_num_warps = out_block_v or obv, out_num_warps or onw
        self.verify_BV = verify_block_v or min(V, 32)
        self.verify_num_warps = verify_num_warps or 4
        for bv_ in (self.BV, self.out_BV, self.verify_BV):
            if V % bv_:
                raise ValueError(f"block_v {bv_} does not divide V = {V}")
        R, rdt = self.R, _RING_STORAGE[ring_dtype]
        self.ring_k = torch.zeros((slots, R, k_heads, K), dtype=rdt, device=device)
        self.ring_v = torch.zeros((slots, R, v_heads, V), dtype=rdt, device=device)
        self.ring_d = torch.zeros((slots, R, v_heads, V), dtype=rdt, device=device)
        self.ring_g = torch.zeros((slots, R, v_heads), dtype=torch.float32, device=device)
        self.ring_beta = torch.zeros((slots, R, v_heads), dtype=torch.float32, device=device)
        self.counters = SlotCounters(slots, device)
        dev = torch.device(device)
        self.n_sm = (torch.cuda.get_device_properties(dev).multi_processor_count
                     if dev.type == "cuda" else 2)
        self.flush_ctas_per_sm = 4
        self.fresh = (torch.zeros(shape, dtype=torch.float32, device=device) if keep_fresh
                      else None)
        """fp32 state of each slot's last flush (``keep_fresh=True``), for inspection."""

    @property
    def ring_len(self) -> torch.Tensor:
        return self.counters.ring_len

    @property
    def steps(self) -> torch.Tensor:
        return self.counters.steps

    def ring(self, name: str) -> torch.Tensor:
        """A ring field as float values (k, v, d in the ring dtype; g, beta fp32)."""
        t = getattr(self, f"ring_{name}")
        return t.view(self.ring_dtype) if t.dtype == torch.int16 else t

    def reset(self, S0: torch.Tensor | None = None, slots: torch.Tensor | None = None) -> None:
        """Load a float state (zeros if None) into checkpoint and read copy (encoded by
        the torch formats, SR step 0) and clear the counters of ``slots`` (all if None)."""
        device = self.ring_g.device
        if S0 is None:
            n = self.slots if slots is None else len(slots)
            S0 = torch.zeros((n, self.HV, self.V, self.K), device=device)
        S0 = S0.to(device=device, dtype=torch.float32)
        store_into(self.ckpt, S0, seed=self.seed, step=0, slots=slots)
        if self.read is not None:
            store_into(self.read, S0, seed=self.seed + 1, step=0, slots=slots)
        self.counters.reset(slots)

    def _copies(self):
        c, f = self.ckpt, self.read
        fargs = f.kernel_args() if f is not None else c.kernel_args()
        f_id = f.fmt_id if f is not None else FMT_NONE
        return c, fargs, f_id

    # -- steps -------------------------------------------------------------
    def step(self, q, k, v, a, b, A_log, dt_bias, state_indices, out=None) -> torch.Tensor:
        """One decode step for the B sequences (shapes as :func:`conventional_step`)."""
        B = q.shape[0]
        _check_shapes(q, v, self.K, self.V)
        if out is None:
            out = torch.empty((B, self.HV, self.V), dtype=torch.float32, device=q.device)
        c, fargs, f_id = self._copies()
        args = (q.contiguous(), k.contiguous(), v.contiguous(), a.contiguous(), b.contiguous(),
                A_log, dt_bias, state_indices, out, *c.kernel_args(), *fargs,
                self.ring_k, self.ring_v, self.ring_d, self.ring_g, self.ring_beta,
                *self.counters.args(),
                self.fresh if self.fresh is not None else self.ring_g, as_int32(self.seed))
        tail = (self.L, self.R, self.RP, c.fmt_id, f_id, self.ring_id)
        fresh = self.fresh is not None
        heads = (self.HK, self.HV, self.K, self.V)
        if self.launch == "fused":
            _replay_step_kernel[(self.V // self.BV, B * self.HV)](
                *args, *heads, self.BV, *tail, 0, fresh, num_warps=self.num_warps)
        else:
            self._flush(q, k, v, a, b, A_log, dt_bias, state_indices, state_indices, out,
                        commit=False)
            _replay_step_kernel[(self.V // self.out_BV, B * self.HV)](
                *args, *heads, self.out_BV, *tail, 1, fresh, num_warps=self.out_num_warps)
        return out

    def _flush(self, q, k, v, a, b, A_log, dt_bias, state_indices, accepted, out, commit: bool
               ) -> None:
        """The persistent flush launch (returns at once where nothing flushes)."""
        B = state_indices.shape[0]
        c, fargs, f_id = self._copies()
        units = B * self.HV * (self.V // self.BV)
        grid = (max(1, min(units, self.n_sm * self.flush_ctas_per_sm)),)
        _flush_kernel[grid](
            q, k, v, a, b, A_log, dt_bias, state_indices, accepted, out, *c.kernel_args(),
            *fargs, self.ring_k, self.ring_v, self.ring_g, self.ring_beta,
            self.counters.ring_len, self.counters.steps,
            self.fresh if self.fresh is not None else self.ring_g, as_int32(self.seed), B,
            self.HK, self.HV, self.K, self.V, self.BV, self.L, self.R, self.RP,
            _pow2_at_least(B, 256), c.fmt_id, f_id, self.ring_id, self.fresh is not None,
            commit, num_warps=self.num_warps,
        )

    def verify(self, q, k, v, a, b, A_log, dt_bias, state_indices, out=None) -> torch.Tensor:
        """Outputs of T drafts per sequence: q, k (B, T, HK, K), v (B, T, HV, V),
        a, b (B, T, HV).  Drafts go behind the commit pointer; call :meth:`commit`."""
        B, T = q.shape[0], q.shape[1]
        if T > max(self.T, 1):
            raise ValueError(f"this cache was built for at most {self.T} drafts, got {T}")
        _check_shapes(q, v, self.K, self.V)
        if out is None:
            out = torch.empty((B, T, self.HV, self.V), dtype=torch.float32, device=q.device)
        r = self.read if self.read is not None else self.ckpt
        _verify_kernel[(self.V // self.verify_BV, B * self.HV)](
            q.contiguous(), k.contiguous(), v.contiguous(), a.contiguous(), b.contiguous(),
            A_log, dt_bias, state_indices, out, *r.kernel_args(),
            self.ring_k, self.ring_v, self.ring_d, self.ring_g, self.ring_beta,
            self.counters.ring_len, T, _pow2_at_least(T), self.HK, self.HV, self.K, self.V,
            self.verify_BV, self.R, self.RP, r.fmt_id, self.ring_id,
            num_warps=self.verify_num_warps,
        )
        return out

    def commit(self, accepted: torch.Tensor, state_indices: torch.Tensor) -> None:
        """Advance each sequence's commit pointer by ``accepted`` (B,) int32 drafts;
        slots holding L or more committed entries are flushed (SR step = the slot's
        step counter of its last committed draft).  Two launches: the persistent flush
        (returns at once where nothing flushes) and the counter update."""
        B = accepted.shape[0]
        d = self.ring_g  # unused input pointers of a commit flush
        self._flush(d, d, d, d, d, d, d, state_indices, accepted, d, commit=True)
        _commit_counters[(triton.cdiv(B, 256),)](
            accepted, state_indices, self.counters.ring_len, self.counters.steps, B, self.L,
            256)

    def nbytes(self) -> dict[str, int]:
        """Bytes of the checkpoint, read copy and ring."""
        ring = sum(t.numel() * t.element_size() for t in
                   (self.ring_k, self.ring_v, self.ring_d, self.ring_g, self.ring_beta))
        return {"checkpoint": self.ckpt.nbytes(),
                "read": self.read.nbytes() if self.read is not None else 0, "ring": ring}

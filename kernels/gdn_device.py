"""Triton device functions shared by the GDN decode kernels (``gdn_step``, ``gdn_flush``,
``gdn_verify``): the step's inputs (gates, normalised q and k), state tiles in and out,
ring tiles, and the staged launches' output rows from the prep launch's coefficients.
The launch modes and protocols are described in :mod:`.gdn_decode`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .gdn_extra import tile_dots
from .tl_common import ring_load, ring_load_raw, ring_round, softplus
from .tl_dots import F16_SPLIT_SCALE, NVFP4_WORD_SCALE, dot_fp32, fp8_tile_dot, nvfp4_word_dot
from .tl_formats import K_FP8, K_NVFP4, div_shared, load_state, matrix_amax, store_state


@triton.jit
def _row_head(state_idx, HK: tl.constexpr, HV: tl.constexpr):
    """``(pid_v, pid_bh, bidx, h, hk, slot)`` of a program on a ``(row blocks, batch *
    v-heads)`` grid: its block of V rows, batch row, v-head, k-head and state slot."""
    pid_v = tl.program_id(0)
    pid_bh = tl.program_id(1)
    bidx = pid_bh // HV
    h = pid_bh % HV
    return pid_v, pid_bh, bidx, h, h // (HV // HK), tl.load(state_idx + bidx)


@triton.jit
def _gate_inputs(a_ptr, b_ptr, A_log, dt_bias, h):
    """The raw ``(a, b, A_log, dt_bias)`` of value head ``h`` (fp32 scalars): loads a
    kernel can issue early and turn into gates (:func:`_gate_values`) later."""
    a = tl.load(a_ptr).to(tl.float32)
    b = tl.load(b_ptr).to(tl.float32)
    A = tl.load(A_log + h).to(tl.float32)
    dtb = tl.load(dt_bias + h).to(tl.float32)
    return a, b, A, dtb


@triton.jit
def _gate_values(a, b, A, dtb):
    """``(g, beta)`` from :func:`_gate_inputs`."""
    g = -tl.exp(A) * softplus(a + dtb)
    beta = 1.0 / (1.0 + tl.exp(-b))
    return g, beta


@triton.jit
def _gates(a_ptr, b_ptr, A_log, dt_bias, h):
    """``(g, beta)`` of value head ``h`` (fp32 scalars)."""
    a, b, A, dtb = _gate_inputs(a_ptr, b_ptr, A_log, dt_bias, h)
    return _gate_values(a, b, A, dtb)


@triton.jit
def _qk_raw(q_ptr, k_ptr, K: tl.constexpr):
    """The raw q and k rows as fp32 (K,) vectors."""
    offs_k = tl.arange(0, K)
    return tl.load(q_ptr + offs_k).to(tl.float32), tl.load(k_ptr + offs_k).to(tl.float32)


@triton.jit
def _prep_qk_from(q, k, K: tl.constexpr, RING: tl.constexpr):
    """:func:`_prep_qk` of rows already loaded (:func:`_qk_raw`): a kernel issues those
    loads beside the slot index's, so the normalisation runs while the state is in
    flight instead of after it."""
    qn = tl.maximum(tl.sqrt_rn(tl.sum(q * q, axis=0)), 1e-6)
    kn = tl.maximum(tl.sqrt_rn(tl.sum(k * k, axis=0)), 1e-6)
    return div_shared(q, qn) * (K**-0.5), ring_round(div_shared(k, kn), RING), qn, kn


@triton.jit
def _prep_qk(q_ptr, k_ptr, K: tl.constexpr, RING: tl.constexpr):
    """Normalised q (scaled by K**-0.5; L2 norms clamped at 1e-6, as ``F.normalize``), k
    rounded to the ring dtype (fp32 (K,) each), and the two clamped norms.  Each row is
    divided by its norm through one correctly rounded reciprocal and a corrected
    product (``tl_formats.div_shared``: IEEE division's values wherever ``|x| >
    2**-100``)."""
    q, k = _qk_raw(q_ptr, k_ptr, K)
    return _prep_qk_from(q, k, K, RING)


@triton.jit
def _step_inputs(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log, dt_bias, row, h, hk, offs_v,
                 HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                 RING: tl.constexpr):
    """Prepared q, k, v (rows ``offs_v``), g, beta of token row ``row`` for value head h."""
    q, k, qn, kn = _prep_qk(q_ptr + (row * HK + hk) * K, k_ptr + (row * HK + hk) * K, K, RING)
    v = ring_round(tl.load(v_ptr + (row * HV + h) * V + offs_v).to(tl.float32), RING)
    g, beta = _gates(a_ptr + row * HV + h, b_ptr + row * HV + h, A_log, dt_bias, h)
    return q, k, v, g, beta


@triton.jit
def _delta(S, k, v, alpha, beta):
    """One gated delta-rule update of a (BV, K) block: returns the new block."""
    Sk = tl.sum(S * k[None, :], axis=1)
    d = beta * (v - alpha * Sk)
    return alpha * S + d[:, None] * k[None, :]


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


@triton.jit
def _ring_kg(ring_k, ring_g, rbase, hk, h, valid, HK: tl.constexpr, HV: tl.constexpr,
             K: tl.constexpr, RP: tl.constexpr, RING: tl.constexpr):
    """Ring k rows ``(RP, K)`` of k-head hk and g ``(RP,)`` of head h; entries where
    ``valid`` is false are not read (zero).  ``rbase``: the slot's first ring row
    (int64)."""
    offs_k = tl.arange(0, K)
    offs_r = tl.arange(0, RP)
    Kr = ring_load(ring_k + (rbase * HK + hk) * K + offs_r[:, None] * (HK * K) + offs_k[None, :],
                   valid[:, None], RING)
    gr = tl.load(ring_g + rbase * HV + h + offs_r * HV, mask=valid, other=0.0)
    return Kr, gr


@triton.jit
def _ring_rows(ring_x, rbase, h, offs_v, valid, HV: tl.constexpr, V: tl.constexpr,
               RP: tl.constexpr, RING: tl.constexpr, RAW: tl.constexpr = False):
    """Rows ``offs_v`` of ring field ``ring_x`` (v or d) of head h as a ``(rows, RP)``
    tile (entries where ``valid`` is false are zero); RAW: as stored, undecoded (a
    prefetch that does not stall; ``ring_decode`` at the use)."""
    offs_r = tl.arange(0, RP)
    ptrs = ring_x + (rbase * HV + h) * V + offs_r[None, :] * (HV * V) + offs_v[:, None]
    if RAW:
        x = ring_load_raw(ptrs, valid[None, :], RING)
    else:
        x = ring_load(ptrs, valid[None, :], RING)
    return x


@triton.jit
def _ring_cols(ring_x, rbase, h, offs_v, valid, HV: tl.constexpr, V: tl.constexpr,
               RP: tl.constexpr, RING: tl.constexpr):
    """:func:`_ring_rows` transposed: a ``(RP, rows)`` tile (the rows contiguous along
    the fast axis; reduced over the entries this costs fewer registers)."""
    offs_r = tl.arange(0, RP)
    return ring_load(ring_x + (rbase * HV + h) * V + offs_r[:, None] * (HV * V) + offs_v[None, :],
                     valid[:, None], RING)


@triton.jit
def _tile_ring(ring_g, ring_d, rbase, h, offs_v, lmask, HV: tl.constexpr, V: tl.constexpr,
               RP: tl.constexpr, RING: tl.constexpr):
    """Raw ring g ``(RP,)`` of head h and d ``(RP, rows)`` (rows ``offs_v``) where
    ``lmask`` (entries) holds; :func:`_out_tile` masks them by the live entries."""
    offs_r = tl.arange(0, RP)
    gr = tl.load(ring_g + rbase * HV + h + offs_r * HV, mask=lmask, other=0.0)
    Dr = ring_load_raw(ring_d + (rbase * HV + h) * V + offs_r[:, None] * (HV * V)
                       + offs_v[None, :], lmask[:, None], RING)
    return gr, Dr


@triton.jit
def _staged_rows(codes, sc, s2v, k, q, Dr, cb, v, K: tl.constexpr, BV: tl.constexpr,
                 RP: tl.constexpr, FMT: tl.constexpr, RING: tl.constexpr = 0, KQ=None):
    """Output ``o`` and delta ``d`` of a tile's rows (staged launch) from its stored
    codes, the ring's d rows ``Dr`` (RP, BV) and the prep launch's coefficients at
    ``cb``: ring weights for ``S k`` and ``S q`` (RP each), the decay, alpha, beta and
    ``k . q``.  ``KQ`` (fp8, nvfp4 or fp32 tiles): the split k
    and q as one (K, 16) operand (columns k hi, k lo, q hi, q lo; :func:`_kq_parts`)
    instead of ``k``, ``q``: an fp8 or nvfp4 tile's row sums are one fp16 tensor-core
    product (:func:`tl_dots.fp8_tile_dot`, :func:`tl_dots.nvfp4_word_dot`), an fp32
    tile's two tf32 ones (its tf32 head and remainder), the ring's part one more
    (``RING``: the ring dtype, exact in tf32 unless fp32)."""
    offs_r = tl.arange(0, RP)
    ck = tl.load(cb + offs_r)
    cq = tl.load(cb + RP + offs_r)
    eG = tl.load(cb + 2 * RP)
    alpha = tl.load(cb + 2 * RP + 1)
    beta = tl.load(cb + 2 * RP + 2)
    kqs = tl.load(cb + 2 * RP + 3)
    if KQ is None:
        Sk0, Sq0 = tile_dots(codes, sc, s2v, k, q, K, BV, FMT)
        Sk = eG * Sk0 + tl.sum(Dr * ck[:, None], axis=0)
        Sq = eG * Sq0 + tl.sum(Dr * cq[:, None], axis=0)
    else:
        # columns 0, 1: S k (k's two fp16 parts, then the ring's d weighted by ck);
        # 2, 3: S q likewise; both sums in one product each, no cross-lane reductions
        c = tl.arange(0, KQ.shape[1])
        C = tl.where((c == 0)[None, :], ck[:, None], tl.where((c == 2)[None, :], cq[:, None],
                                                               0.0))
        if FMT == K_FP8:
            P = fp8_tile_dot(codes, KQ) * (eG * sc * (1.0 / F16_SPLIT_SCALE))[:, None]
        elif FMT == K_NVFP4:
            P = nvfp4_word_dot(codes, sc, KQ, BV, K) * (
                eG * s2v * (NVFP4_WORD_SCALE / F16_SPLIT_SCALE))
        else:
            P = dot_fp32(codes, KQ, False, True) * eG
        P = dot_fp32(tl.trans(Dr), C, RING != 0, False, acc=P)
        Sk = tl.sum(tl.where((c < 2)[None, :], P, 0.0), axis=1)
        Sq = tl.sum(tl.where(((c >= 2) & (c < 4))[None, :], P, 0.0), axis=1)
    d = beta * (v - alpha * Sk)
    return alpha * Sq + d * kqs, d

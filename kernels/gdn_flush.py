"""GDN flush: the window's ring folded into the checkpoint from the checkpoint itself
(the delta rule over the window in WY form), the checkpoint and read copy written, and
the flush launch of the split and staged steps (persistent or one program per unit) with
the speculative commit's counters.  :func:`_flush_rows` is also the fused launch's
flush.  The math and the launch modes are described in :mod:`.gdn_decode`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .compile_worker import settle_module_keys
from .gdn_device import _gates, _prep_qk, _ring_kg, _ring_rows
from .gdn_extra import inv_unit_lower, load_tile
from .tl_common import (
    at_flushing_row,
    batch_slots,
    first_unit,
    flushing_rows,
    next_unit,
    post_amax_part,
    ring_decode,
    ring_round,
    units_done,
)
from .tl_dots import dot_fp32
from .tl_formats import (
    K_FP8,
    K_FP32,
    K_NONE,
    K_NVFP4,
    decode_tile,
    flush_amax,
    fp8_encode_hw,
    is_16bit,
    load_state,
    matrix_amax,
    store_codes,
    store_rounded_with,
    store_state_with,
    stored_values,
)
from .tl_prefetch import l2_prefetch_lines, l2_prefetch_rows


@triton.jit
def _fold_chunk(c_data, c_s1, c_s2, s2_old, ring_v, v_row, rbase, h, mat, offs_v, n, valid, Kr,
                br, ec, Tm, w, e_last, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                FB: tl.constexpr, RP: tl.constexpr, C_FMT: tl.constexpr, RING: tl.constexpr,
                STEP: tl.constexpr, DOT: tl.constexpr, ck_desc=None, TMA: tl.constexpr = False,
                row0=0, v_raw=None):
    """Fresh fp32 rows ``offs_v`` (FB of them): the window's d recomputed from the
    checkpoint rows, ``D = RHS (I + N)^-T``, then ``e^{c_L} S_c + (w D) K``.  An nvfp4
    checkpoint decodes with ``s2_old``, its matrix scale read before the first chunk
    was rewritten.  TMA (a dense checkpoint, V a multiple of FB): the rows come through
    the tensor descriptor ``ck_desc`` over ``(slots * HV * V, K)`` (``row0``: the first
    of ``offs_v``).  ``v_raw``: the rows' ring v entries as loaded ahead
    (:func:`_next_v_raw`), else loaded here."""
    if TMA:
        S = decode_tile(ck_desc.load([(mat * V + row0).to(tl.int32), 0]), 0.0, 0.0, C_FMT,
                        FB, K)
    elif C_FMT == K_NVFP4:
        codes, sc, s2_now = load_tile(c_data, c_s1, c_s2, mat, offs_v, offs_v < V, V, K, C_FMT)
        S = decode_tile(codes, sc, s2_old, C_FMT, FB, K)
    else:
        S = load_state(c_data, c_s1, c_s2, mat, offs_v, offs_v < V, V, C_FMT, FB, K)
    if v_raw is None:
        Vr = _ring_rows(ring_v, rbase, h, offs_v, valid, HV, V, RP, RING)
    else:
        Vr = ring_decode(v_raw, RING)
    if STEP:  # this step's entry, at ring position n
        vt = ring_round(tl.load(v_row + offs_v).to(tl.float32), RING)
        Vr = tl.where(tl.arange(0, RP)[None, :] == n, vt[:, None], Vr)
    P = _dot_exact_b(S, tl.trans(Kr), DOT)  # S_c k_i, (FB, RP)
    # explicit fma (no contraction left to the compiler): an nvfp4 flush computes these
    # rows twice (amax pass, encode pass) and both must give the same bits
    rhs = br[None, :] * tl.fma(-ec[None, :], P, Vr)
    if DOT == "ieee":
        D = tl.dot(rhs, tl.trans(Tm), input_precision="ieee")
    else:
        D = dot_fp32(rhs, tl.trans(Tm), False, False)
    return _dot_exact_b(D * w[None, :], Kr, DOT, e_last * S)


@triton.jit
def _dot_exact_b(a, b, DOT: tl.constexpr, acc=None):
    """``a @ b`` to ~fp32 accuracy.  DOT "tf32x2": ``b`` must be exact in tf32 (a ring
    in bf16 or fp16); ``a`` is split into its tf32 head (truncated bits) and the exact
    remainder: two tensor-core passes.  "tf32x3": both operands split so (three passes;
    explicit, so two loops computing the same rows give the same bits).  Else
    ``tl.dot`` with that input precision.  (``tl_dots.dot_fp32``'s splits.)"""
    if DOT == "tf32x2":
        r = dot_fp32(a, b, False, True, acc)
    elif DOT == "tf32x3":
        r = dot_fp32(a, b, False, False, acc)
    else:
        r = tl.dot(a, b, acc=acc, input_precision=DOT)
    return r


@triton.jit
def _next_v_raw(ring_v, rbase, h, v0, c, valid, NC: tl.constexpr, HV: tl.constexpr,
                V: tl.constexpr, FB: tl.constexpr, RP: tl.constexpr, RING: tl.constexpr):
    """The raw ring v rows of chunk ``c`` of the unit at row ``v0`` (the last chunk for
    ``c >= NC``): loaded one chunk ahead, their latency hides behind a chunk's fold."""
    offs_v = v0 + tl.minimum(c, NC - 1) * FB + tl.arange(0, FB)
    return _ring_rows(ring_v, rbase, h, offs_v, valid, HV, V, RP, RING, True)


@triton.jit
def _prefetch_chunk(c_data, ring_v, rbase, h, mat, row, valid, HV: tl.constexpr, K: tl.constexpr,
                    V: tl.constexpr, FB: tl.constexpr, RP: tl.constexpr, C_FMT: tl.constexpr):
    """L2 prefetch of what the flush chunk of rows ``[row, row + FB)`` of matrix ``mat``
    will load: its checkpoint rows and their ring entries of v (a ``row`` past the
    matrix is taken as its last)."""
    l2_prefetch_rows(c_data, mat, row, V, FB, C_FMT, K)
    r = tl.minimum(row, V - 1)
    l2_prefetch_lines(ring_v + (rbase * HV + h) * V + tl.where(valid, tl.arange(0, RP), 0) *
                      (HV * V) + r)


@triton.jit
def _flush_rows(c_data, c_s1, c_s2, f_data, f_s1, f_s2, fresh, ring_k, ring_v, ring_g, ring_b,
                ring_kk, v_row, out_row, rbase, h, hk, mat, v0, n, q, k, g, beta, seed, t,
                HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                BVF: tl.constexpr, FB: tl.constexpr, FNS: tl.constexpr, RP: tl.constexpr,
                LOG2RP: tl.constexpr,
                C_FMT: tl.constexpr, F_FMT: tl.constexpr, RING: tl.constexpr,
                STEP: tl.constexpr, FRESH: tl.constexpr, DOT: tl.constexpr,
                NOLICM: tl.constexpr = True, scr=None, SCRATCH: tl.constexpr = False,
                FAST: tl.constexpr = False, PF: tl.constexpr = 0, ck_desc=None,
                TMA: tl.constexpr = False, HW: tl.constexpr = False,
                SUBST: tl.constexpr = False, sync=None, PARTS: tl.constexpr = 0,
                VPRE: tl.constexpr = False, EVICT: tl.constexpr = False):
    """Flush rows ``[v0, v0 + BVF)`` of matrix ``mat``: fold ring entries ``0..n-1``
    (and, if STEP, this step as entry n: k, v from ``v_row``, g, beta; its output
    ``S q`` goes to ``out_row``) into the checkpoint; write the checkpoint, the read
    copy (F_FMT) and the fp32 state to ``fresh`` (FRESH).  SR step ``t``.

    The products ``k_i . k_j`` (j < i) come from ``ring_kk`` (row i written with entry
    i); this step's row is computed here.

    An nvfp4 copy folded in several chunks needs the matrix amax first: by default
    (SCRATCH 0) a first pass folds every chunk for the amax only and the second folds
    them again and writes; with SCRATCH the first pass also writes everything that
    needs no amax and the fp32 rows to ``scr`` (the unit's ``(BVF, K)`` scratch), and
    the second pass only encodes the nvfp4 copies from those rows (the same fp32 values,
    so the same bits).  FAST: ``tl_formats.encode_tile_with(..., FAST=True)`` encoders.
    PF (compiled code only): L2 prefetch of the first PF chunks before the set-up, then
    of the chunk PF ahead at the top of every chunk.  TMA: the checkpoint rows through
    the tensor descriptor ``ck_desc`` (:func:`_fold_chunk`).  HW: an fp8 read copy by
    the hardware conversion (:func:`_write_rows`).  SUBST: the window's triangular
    system inverted by forward substitution (``gdn_extra.inv_unit_lower``; fewer
    instructions per thread in a one-warp program).  PARTS > 0 (an nvfp4 copy whose
    matrix is flushed by PARTS programs, BVF rows each): ``scr`` is row v0's place in the
    matrix's fp32 scratch (row ``v`` at ``scr + (v - v0) * K``) and ``sync`` two int32
    words, the matrix
    amax's bits and a count of programs done (both zero between flushes); each program
    folds and writes its rows as the SCRATCH pass does and posts its amax, and the last
    one to post encodes the nvfp4 copies of all V rows (:func:`_encode_posted`).  VPRE:
    a chunk's ring v rows are loaded while the chunk before it folds (the single-pass
    chunk loop).  EVICT: the checkpoint's and read copy's final stores evict first from
    L2 (:func:`_write_rows`; not the scratch rows, which the second pass reads).

    A 16-bit checkpoint beside an nvfp4 copy that the flush encodes: the checkpoint's
    rounding is drawn once per fold of a chunk, for the amax, and its values go on to the
    checkpoint's store and the copy (``ROUNDED`` in :func:`_write_rows`; with SCRATCH or
    PARTS the scratch holds them).  The default multi-chunk loop folds every chunk twice
    and so draws it twice."""
    offs_r = tl.arange(0, RP)
    valid = offs_r < n
    NCH: tl.constexpr = BVF // FB
    if PF > 0:
        for d in tl.static_range(min(PF, NCH)):
            _prefetch_chunk(c_data, ring_v, rbase, h, mat, v0 + d * FB, valid, HV, K, V, FB, RP,
                            C_FMT)
    Kr, gr = _ring_kg(ring_k, ring_g, rbase, hk, h, valid, HK, HV, K, RP, RING)
    br = tl.load(ring_b + rbase * HV + h + offs_r * HV, mask=valid, other=0.0)
    KK = tl.load(ring_kk + (rbase * HK + hk) * RP + offs_r[:, None] * (HK * RP) + offs_r[None, :],
                 mask=valid[:, None], other=0.0)
    if STEP:
        KK = tl.where(offs_r[:, None] == n, tl.sum(Kr * k[None, :], axis=1)[None, :], KK)
        Kr = tl.where(offs_r[:, None] == n, k[None, :], Kr)
        gr = tl.where(offs_r == n, g, gr)
        br = tl.where(offs_r == n, beta, br)
        ent = offs_r <= n
    else:
        ent = valid
    cum = tl.cumsum(gr, axis=0)
    c_last = tl.sum(gr, axis=0)
    lower = (offs_r[None, :] < offs_r[:, None]) & ent[:, None]
    dec = tl.exp(tl.where(lower, cum[:, None] - cum[None, :], 0.0))
    Tm = inv_unit_lower(tl.where(lower, br[:, None] * dec * KK, 0.0), RP, LOG2RP, SUBST)
    w = tl.where(ent, tl.exp(c_last - cum), 0.0)
    ec = tl.exp(cum)
    e_last = tl.exp(c_last)
    NC: tl.constexpr = BVF // FB
    AMAX: tl.constexpr = (C_FMT == K_NVFP4) or (F_FMT == K_NVFP4)
    C4: tl.constexpr = C_FMT == K_NVFP4
    F4: tl.constexpr = F_FMT == K_NVFP4
    RCK: tl.constexpr = F4 and is_16bit(C_FMT)
    amax = 0.0
    if C_FMT == K_NVFP4:
        s2_old = tl.load(c_s2 + mat)
    else:
        s2_old = 0.0
    if (PARTS > 0) or (AMAX and SCRATCH and NC > 1):
        # first pass: fold, write what needs no amax, keep the fp32 rows (``scr``: row
        # v0's place; with PARTS inside the matrix's scratch, which starts v0 rows before)
        offs_k = tl.arange(0, K)
        for c in tl.range(0, NC, num_stages=FNS, disable_licm=NOLICM):
            if PF > 0:
                _prefetch_chunk(c_data, ring_v, rbase, h, mat, v0 + (c + PF) * FB, valid, HV, K,
                                V, FB, RP, C_FMT)
            offs_v = v0 + c * FB + tl.arange(0, FB)
            Sn = _fold_chunk(c_data, c_s1, c_s2, s2_old, ring_v, v_row, rbase, h, mat,
                             offs_v, n, valid, Kr, br, ec, Tm, w, e_last, HV, K, V, FB, RP,
                             C_FMT, RING, STEP, DOT, ck_desc, TMA, v0 + c * FB)
            if RCK:  # the scratch keeps the checkpoint's values, which the copy encodes
                Sr = stored_values(Sn, mat, offs_v, V, seed, t, C_FMT, FB, K)
                amax = tl.maximum(amax, matrix_amax(Sr))
            else:
                Sr = Sn
                amax = tl.maximum(amax, flush_amax(Sn, mat, offs_v, V, seed, t, C_FMT, F_FMT,
                                                   FB, K))
            tl.store(scr + (offs_v - v0)[:, None] * K + offs_k[None, :], Sr)
            _write_rows(Sn, 0.0, c_data, c_s1, c_s2, f_data, f_s1, f_s2, fresh, out_row, mat,
                        offs_v, q, seed, t, K, V, FB, C_FMT, F_FMT, STEP, FRESH, not C4,
                        not F4, FAST, HW, EVICT=EVICT, Sr_in=Sr, ROUNDED=RCK)
        if PARTS > 0:  # the last of the matrix's programs encodes all its rows
            _encode_posted(sync, amax, scr - v0 * K, c_data, c_s1, c_s2, f_data, f_s1, f_s2,
                           mat, seed, t, K, V, FB, FNS, PARTS, C_FMT, F_FMT, FAST, RCK)
        else:  # second pass: the nvfp4 copies of the unit's rows
            tl.debug_barrier()  # the scratch rows are read back by other threads
            for c in tl.range(0, NC, num_stages=FNS, disable_licm=NOLICM):
                offs_v = v0 + c * FB + tl.arange(0, FB)
                Sn = tl.load(scr + (offs_v - v0)[:, None] * K + offs_k[None, :])
                _write_rows(Sn, amax, c_data, c_s1, c_s2, f_data, f_s1, f_s2, fresh, out_row,
                            mat, offs_v, q, seed, t, K, V, FB, C_FMT, F_FMT, False, False, C4,
                            F4, FAST, EVICT=EVICT, Sr_in=Sn, ROUNDED=RCK)
    elif NC == 1:
        offs_v = v0 + tl.arange(0, FB)
        Sn = _fold_chunk(c_data, c_s1, c_s2, s2_old, ring_v, v_row, rbase, h, mat, offs_v, n,
                         valid, Kr, br, ec, Tm, w, e_last, HV, K, V, FB, RP, C_FMT, RING, STEP,
                         DOT, ck_desc, TMA, v0)
        Sr = Sn
        if RCK:
            Sr = stored_values(Sn, mat, offs_v, V, seed, t, C_FMT, FB, K)
            amax = matrix_amax(Sr)
        elif AMAX:
            amax = flush_amax(Sn, mat, offs_v, V, seed, t, C_FMT, F_FMT, FB, K)
        _write_rows(Sn, amax, c_data, c_s1, c_s2, f_data, f_s1, f_s2, fresh, out_row, mat,
                    offs_v, q, seed, t, K, V, FB, C_FMT, F_FMT, STEP, FRESH, True, True, FAST,
                    HW, ck_desc, TMA, v0, EVICT, Sr, RCK)
    else:
        if AMAX:  # first pass: the matrix amax only (the second reads L2-hot data)
            for c in tl.range(0, NC, num_stages=FNS, disable_licm=NOLICM):
                offs_v = v0 + c * FB + tl.arange(0, FB)
                Sn = _fold_chunk(c_data, c_s1, c_s2, s2_old, ring_v, v_row, rbase, h, mat,
                                 offs_v, n, valid, Kr, br, ec, Tm, w, e_last, HV, K, V, FB, RP,
                                 C_FMT, RING, STEP, DOT, ck_desc, TMA, v0 + c * FB)
                amax = tl.maximum(amax, flush_amax(Sn, mat, offs_v, V, seed, t, C_FMT, F_FMT,
                                                   FB, K))
        if VPRE:
            v_next = _next_v_raw(ring_v, rbase, h, v0, 0, valid, NC, HV, V, FB, RP, RING)
        for c in tl.range(0, NC, num_stages=FNS, disable_licm=NOLICM):
            if PF > 0:
                _prefetch_chunk(c_data, ring_v, rbase, h, mat, v0 + (c + PF) * FB, valid, HV, K,
                                V, FB, RP, C_FMT)
            offs_v = v0 + c * FB + tl.arange(0, FB)
            if VPRE:
                v_raw = v_next
                v_next = _next_v_raw(ring_v, rbase, h, v0, c + 1, valid, NC, HV, V, FB, RP,
                                     RING)
            else:
                v_raw = None
            Sn = _fold_chunk(c_data, c_s1, c_s2, s2_old, ring_v, v_row, rbase, h, mat, offs_v,
                             n, valid, Kr, br, ec, Tm, w, e_last, HV, K, V, FB, RP, C_FMT, RING,
                             STEP, DOT, ck_desc, TMA, v0 + c * FB, v_raw)
            _write_rows(Sn, amax, c_data, c_s1, c_s2, f_data, f_s1, f_s2, fresh, out_row, mat,
                        offs_v, q, seed, t, K, V, FB, C_FMT, F_FMT, STEP, FRESH, True, True,
                        FAST, HW, ck_desc, TMA, v0 + c * FB, EVICT)


@triton.jit
def _encode_posted(sync, amax, scr, c_data, c_s1, c_s2, f_data, f_s1, f_s2, mat, seed, t,
                   K: tl.constexpr, V: tl.constexpr, FB: tl.constexpr, FNS: tl.constexpr,
                   PARTS: tl.constexpr, C_FMT: tl.constexpr, F_FMT: tl.constexpr,
                   FAST: tl.constexpr, ROUNDED: tl.constexpr = False):
    """Post this program's part of a matrix flushed by PARTS programs
    (:func:`tl_common.post_amax_part`); the last of them encodes the nvfp4 copies of all
    V rows from the scratch (ROUNDED: it holds a 16-bit checkpoint's stored values)."""
    last, amax_mat = post_amax_part(sync, amax, PARTS)
    if last:
        offs_k = tl.arange(0, K)
        for c in tl.range(0, V // FB, num_stages=FNS):
            offs_v = c * FB + tl.arange(0, FB)
            Sn = tl.load(scr + offs_v[:, None] * K + offs_k[None, :], cache_modifier=".cg")
            _write_rows(Sn, amax_mat, c_data, c_s1, c_s2, f_data, f_s1, f_s2, scr, scr, mat,
                        offs_v, 0.0, seed, t, K, V, FB, C_FMT, F_FMT, False, False,
                        C_FMT == K_NVFP4, F_FMT == K_NVFP4, FAST, Sr_in=Sn, ROUNDED=ROUNDED)


@triton.jit
def _write_rows(Sn, amax, c_data, c_s1, c_s2, f_data, f_s1, f_s2, fresh, out_row, mat, offs_v,
                q, seed, t, K: tl.constexpr, V: tl.constexpr, FB: tl.constexpr,
                C_FMT: tl.constexpr, F_FMT: tl.constexpr, STEP: tl.constexpr,
                FRESH: tl.constexpr, W_C: tl.constexpr = True, W_F: tl.constexpr = True,
                FAST: tl.constexpr = False, HW: tl.constexpr = False, ck_desc=None,
                TMA: tl.constexpr = False, row0=0, EVICT: tl.constexpr = False, Sr_in=None,
                ROUNDED: tl.constexpr = False):
    """Store fresh rows: the fp32 state (FRESH), the checkpoint (W_C; SR seed), the read
    copy of the checkpoint's stored values (W_F; seed + 1) and, for a step flush, the
    step's output ``S q``.  ROUNDED (a 16-bit checkpoint): ``Sr_in`` holds the
    checkpoint's stored values already (``tl_formats.stored_values``); the checkpoint is stored
    from them (``tl_formats.store_rounded_with``) and the copy encodes them, with no
    second draw of the rounding.  HW (compiled code only): an fp8 read copy by the hardware
    conversion
    (``tl_formats.fp8_encode_hw``, the same bits).  TMA with an fp32 checkpoint: the
    rows go out through the tensor descriptor ``ck_desc`` (a bulk store from shared
    memory; ``row0``: the first of ``offs_v``).  EVICT: the checkpoint's and read copy's
    plain stores evict first from L2 (they are not read again in the flush)."""
    mrow = offs_v < V
    if FRESH:
        offs_k = tl.arange(0, K)
        tl.store(fresh + mat * (V * K) + offs_v[:, None] * K + offs_k[None, :], Sn)
    Sr = Sn  # what the read copy encodes: the checkpoint's stored values
    if ROUNDED:
        Sr = Sr_in
        if W_C:
            store_rounded_with(c_data, c_s1, c_s2, Sr, mat, offs_v, mrow, V, C_FMT, FB, K, FAST,
                               EVICT)
    elif W_C and TMA and (C_FMT == K_FP32):
        ck_desc.store([(mat * V + row0).to(tl.int32), 0], Sn)
    elif W_C:
        Sc = store_state_with(c_data, c_s1, c_s2, Sn, mat, offs_v, mrow, V, seed, t, amax,
                              C_FMT, FB, K, FAST, EVICT)
        if C_FMT != K_FP32:
            Sr = Sc
    elif W_F and (F_FMT != K_NONE) and (C_FMT != K_FP32):
        Sr = stored_values(Sn, mat, offs_v, V, seed, t, C_FMT, FB, K)
    if W_F and HW and (F_FMT == K_FP8):
        codes, s1 = fp8_encode_hw(Sr)
        store_codes(f_data, f_s1, f_s2, codes, s1, 0.0, mat, offs_v, mrow, V, F_FMT, FB, K,
                    EVICT)
    elif W_F and (F_FMT != K_NONE):
        store_state_with(f_data, f_s1, f_s2, Sr, mat, offs_v, mrow, V, seed + 1, t, amax,
                         F_FMT, FB, K, FAST, EVICT)
    if STEP:
        tl.store(out_row + offs_v, tl.sum(Sn * q[None, :], axis=1))


@triton.jit
def _flush_unit(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log, dt_bias, out, c_data, c_s1, c_s2,
                f_data, f_s1, f_s2, ring_k, ring_v, ring_g, ring_b, ring_kk, fresh, scr, seed,
                bidx, slot, h, part, n, t,
                HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                BVF: tl.constexpr, FB: tl.constexpr, FNS: tl.constexpr, R: tl.constexpr,
                RP: tl.constexpr, LOG2RP: tl.constexpr, C_FMT: tl.constexpr,
                F_FMT: tl.constexpr, RING: tl.constexpr, FRESH: tl.constexpr,
                COMMIT: tl.constexpr, DOT: tl.constexpr, NOLICM: tl.constexpr,
                SCRATCH: tl.constexpr, FAST: tl.constexpr, PF: tl.constexpr = 0,
                ck_desc=None, TMA: tl.constexpr = False, HW: tl.constexpr = False,
                SUBST: tl.constexpr = False, VPRE: tl.constexpr = False,
                EVICT: tl.constexpr = False):
    """One flush unit: rows ``part * BVF ..`` of head h of ``slot`` (batch row bidx)."""
    hk = h // (HV // HK)
    mat = slot.to(tl.int64) * HV + h
    rbase = slot.to(tl.int64) * R
    if COMMIT:
        _flush_rows(c_data, c_s1, c_s2, f_data, f_s1, f_s2, fresh, ring_k, ring_v, ring_g,
                    ring_b, ring_kk, v_ptr, out, rbase, h, hk, mat, part * BVF, n, 0.0, 0.0,
                    0.0, 0.0, seed, t, HK, HV, K, V, BVF, FB, FNS, RP, LOG2RP, C_FMT, F_FMT,
                    RING, False, FRESH, DOT, NOLICM, scr, SCRATCH, FAST, PF, ck_desc, TMA,
                    HW, SUBST, VPRE=VPRE, EVICT=EVICT)
    else:
        q, k, qn, kn = _prep_qk(q_ptr + (bidx * HK + hk) * K, k_ptr + (bidx * HK + hk) * K,
                                K, RING)
        g, beta = _gates(a_ptr + bidx * HV + h, b_ptr + bidx * HV + h, A_log, dt_bias, h)
        _flush_rows(c_data, c_s1, c_s2, f_data, f_s1, f_s2, fresh, ring_k, ring_v, ring_g,
                    ring_b, ring_kk, v_ptr + (bidx * HV + h) * V,
                    out + (bidx * HV + h) * V, rbase, h, hk, mat, part * BVF, n, q, k, g,
                    beta, seed, t, HK, HV, K, V, BVF, FB, FNS, RP, LOG2RP, C_FMT, F_FMT,
                    RING, True, FRESH, DOT, NOLICM, scr, SCRATCH, FAST, PF, ck_desc, TMA,
                    HW, SUBST, VPRE=VPRE, EVICT=EVICT)


@triton.jit(do_not_specialize=["seed", "B"])
def _flush_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log, dt_bias, state_idx, accepted, skip, out,
    c_data, c_s1, c_s2, f_data, f_s1, f_s2,
    ring_k, ring_v, ring_g, ring_b, ring_kk, ring_len, steps, tickets, fresh, scr, seed, B,
    HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BVF: tl.constexpr,
    FB: tl.constexpr, FNS: tl.constexpr, L: tl.constexpr, R: tl.constexpr, RP: tl.constexpr,
    LOG2RP: tl.constexpr, BP: tl.constexpr, PCLK: tl.constexpr,
    C_FMT: tl.constexpr, F_FMT: tl.constexpr, RING: tl.constexpr, FRESH: tl.constexpr,
    COMMIT: tl.constexpr, DOT: tl.constexpr, NOLICM: tl.constexpr,
    UNITS: tl.constexpr = False, SCRATCH: tl.constexpr = False, FAST: tl.constexpr = False,
    PF: tl.constexpr = 0, ck_desc=None, TMA: tl.constexpr = False, HW: tl.constexpr = False,
    SUBST: tl.constexpr = False, work=None, CLAIM: tl.constexpr = False,
    VPRE: tl.constexpr = False, EVICT: tl.constexpr = False,
):
    """Persistent flush launch: every program reads the ring positions of all B
    sequences (one vector load), enumerates the (flushing sequence, head, BVF-row
    block) units and takes every G-th one; with nothing to flush it returns at once.
    A step flush (COMMIT 0: the clock's position is L - 1; ring + this step) writes
    the step's output, and program 0 writes ``skip`` (1 where the row flushed) for
    the output launch that follows; a commit flush (COMMIT 1: ring_len + accepted >= L
    committed entries) writes none.  No counter is written here.

    UNITS: one program per unit instead, grid ``(HV * V // BVF, B)``: a program reads
    its row's slot and clock (two scalar loads) and returns unless the row flushes, so
    the hardware overlaps one unit's set-up (ring tiles, triangular inverse) with
    another's streaming.  SCRATCH (nvfp4 copies in several chunks): the unit's fp32
    rows go to ``scr`` (per program of a persistent launch, per unit with UNITS) and
    the second pass encodes from there instead of folding again.

    CLAIM (persistent launch): a program claims its next unit from the counter
    ``work[0]`` instead of taking every G-th one, so programs that start late or run
    slow take fewer units; ``work[1]`` counts the programs done, and the last one
    clears both words for the next flush (``tl_common.first_unit`` / ``next_unit`` /
    ``units_done``).  EVICT: the checkpoint's and read copy's stores evict first from
    L2."""
    NU: tl.constexpr = V // BVF
    if UNITS:
        u = tl.program_id(0)
        bidx = tl.program_id(1)
        h = u // NU
        part = u % NU
        sl = tl.load(state_idx + bidx)
        sl0 = tl.maximum(sl, 0)
        if COMMIT:
            acc = tl.load(accepted + bidx)
            n = tl.load(ring_len + sl0) + acc
            t = tl.load(steps + sl0) + acc - 1
            flag = (sl >= 0) & (n >= L)
        else:
            t = tl.load(tickets + sl0) // PCLK
            n = L - 1
            flag = (sl >= 0) & (t % L == L - 1)
            if u == 0:
                tl.store(skip + bidx, flag.to(tl.int32))
        if flag:
            _flush_unit(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log, dt_bias, out, c_data, c_s1,
                        c_s2, f_data, f_s1, f_s2, ring_k, ring_v, ring_g, ring_b, ring_kk,
                        fresh, scr + (sl0.to(tl.int64) * (HV * NU) + u) * (BVF * K), seed,
                        bidx, sl0, h, part, n, t, HK, HV, K, V, BVF, FB, FNS, R, RP, LOG2RP,
                        C_FMT, F_FMT, RING, FRESH, COMMIT, DOT, NOLICM, SCRATCH, FAST, PF,
                        ck_desc, TMA, HW, SUBST, VPRE, EVICT)
    else:
        pid = tl.program_id(0)
        G = tl.num_programs(0)
        offs_b, inb, live, sl0 = batch_slots(state_idx, B, BP)
        if COMMIT:
            acc = tl.load(accepted + offs_b, mask=inb, other=0)
            nb = tl.load(ring_len + sl0, mask=live, other=0) + acc
            tb = tl.load(steps + sl0, mask=live, other=0) + acc - 1  # SR step: last committed
            flag = live & (nb >= L)
        else:
            tb = tl.load(tickets + sl0, mask=live, other=0) // PCLK
            nb = tb % L
            flag = live & (nb == L - 1)
            if pid == 0:
                tl.store(skip + offs_b, flag.to(tl.int32), mask=inb)
        key, units = flushing_rows(flag, HV * NU)
        scr_p = scr + pid.to(tl.int64) * (BVF * K)
        u = first_unit(pid, units, work, CLAIM)
        while u < units:
            j = u // (HV * NU)
            h = (u // NU) % HV
            part = u % NU
            # the unit's sequence, slot, entry count and SR step from the vectors above: the
            # unit's loads need no scalar round trip first
            bidx = at_flushing_row(key, j, offs_b)
            slot = at_flushing_row(key, j, sl0)
            if COMMIT:
                n = at_flushing_row(key, j, nb)
            else:
                n = L - 1
            t = at_flushing_row(key, j, tb)
            _flush_unit(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log, dt_bias, out, c_data, c_s1,
                        c_s2, f_data, f_s1, f_s2, ring_k, ring_v, ring_g, ring_b, ring_kk, fresh,
                        scr_p, seed, bidx, slot, h, part, n, t, HK, HV, K, V, BVF, FB, FNS, R, RP,
                        LOG2RP, C_FMT, F_FMT, RING, FRESH, COMMIT, DOT, NOLICM, SCRATCH, FAST,
                        PF, ck_desc, TMA, HW, SUBST, VPRE, EVICT)
            if SCRATCH:
                tl.debug_barrier()  # the next unit rewrites the scratch rows
            u = next_unit(u, G, work, CLAIM)
        units_done(units, work, G, CLAIM)


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


settle_module_keys(__name__)  # every process looks its kernels up under one key

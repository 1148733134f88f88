"""Fused Triton kernels for Gated DeltaNet decoding: conventional step, replay
(output steps and flushes), speculative verify of T drafts and commit.

Every kernel takes the raw per-step inputs (``q``, ``k`` per k-head, ``v`` per
v-head, gate pre-activations ``a``, ``b``) and does the layer's preprocessing in
fp32: L2-normalise q and k (q scaled by ``K**-0.5``), round k and v to the ring
dtype (the values the ring stores; the step uses them everywhere),
``g = -exp(A_log) softplus(a + dt_bias)``, ``beta = sigmoid(b)``.

Sequences index state slots through ``state_indices`` (a negative index skips the
sequence).

**Counters.**  A plain replay cache keeps one int32 clock per slot (``tickets``).
Every program of the step's replay launch reads it once at its start (from L2) and
adds 1 at its very end -- a fire-and-forget relaxed atomic behind a barrier, so all
of the program's warps have read the clock before its own increment.  With ``P``
programs per slot, every program of a launch reads a value in ``[kP, kP + P - 1]``
(only the launch's other P - 1 increments can precede it), so ``k = clock // P`` is
the slot's step count and ``k mod L`` its ring position.  Nothing waits on a counter
and nothing is published: no host sync, CUDA-graph capturable.  Speculative caches
keep explicit ``ring_len`` (committed entries) and ``steps`` that only the commit
writes.  The conventional kernel's stochastic rounding uses ``steps`` with
``tl_common.finish_slot``.

**Output step.**  Grid ``(HV * (V // BV) // TPP, batch)``: a program streams TPP
tiles (BV rows of one v-head each, all in one k-head group) of the stored copy
through a ``tl.range(num_stages=NS)`` software pipeline (the tile loads become
``cp.async`` copies to shared memory, so the bytes in flight cost no registers).
Once per program: q, k and the k-head's ring products ``k_i . k``, ``k_i . q``
(``(RP, K)`` ring tile, masked by the ring position so only live entries are read).
Per tile: its two row sums against k and q, the ring's d rows weighted by those
products and the decay, ``S_{t-1} k = e^G S k + sum_i e^{G - c_i} (k_i . k) d_i``
(likewise for q), then ``d``, ``o`` and the appends (d, v; g, beta once per head;
k and the row of products ``k_i . k`` once per k-head, in ``ring_kk``).  A one-tile
program (small batches) issues its tile load right after the slot index.

**Flush** (the delta rule over the window, from the checkpoint), per unit of BVF
rows of one head, in chunks of FB rows (a pipelined loop): ``P = S_c K^T`` (one
``tl.dot``), the window's d recomputed as ``D = RHS (I + N)^-T`` with ``N_ij = beta_i
e^{c_i - c_j} k_i . k_j`` (j < i; the products from ``ring_kk``, the inverse once
per unit: by repeated squaring, or by forward substitution in one-warp programs), and
the rank-L fold ``S = e^{c_L} S_c + (w D) K`` (another ``tl.dot``).  The two large
products run in ``dot_precision``: "tf32x2" (the ring's k is exact in tf32, so only
the other operand is split: two tensor-core passes, ~fp32 accuracy), "tf32x3" or
"ieee"; ``RHS (I + N)^-T`` in three explicitly split tf32 passes (fp32 FMAs under
"ieee"), the inverse in ieee fp32.  An nvfp4 copy needs its whole matrix's amax before it can
encode: its flush units are whole matrices with two passes over the chunks (the
first only for the amax; the recompute reads L2-hot data).  ``flush_tma``: a dense
checkpoint's chunks arrive by TMA (tensor-descriptor bulk copies into shared memory,
issued ahead by the chunk loop's pipeline), which leaves the loads out of the
registers and lets one warp hold a whole unit (the staged default for an fp32
checkpoint with no read copy or an fp8 one); an fp32 checkpoint's fresh chunks go
back through the same descriptor (TMA bulk stores from shared memory).

Launch modes of a step: ``"fused"`` -- one launch; a flushing slot's programs run
the output loop (results unused) and then flush their own tiles; ``"split"`` -- a
persistent flush launch over the flushing slots' units (it returns at once where
nothing flushes, and leaves a per-row flag), then the output launch, whose programs
of flushing slots load nothing and only advance the clock.  The fused kernel
carries the flush path's registers, so large batches use "split", or "staged" (the
default there): the flush launch, a prep launch that reads and advances the clock
(one program per sequence and k-head) and an output launch that skips flushing rows
(an fp8 or nvfp4 copy's tiles there: their row sums as one fp16 tensor-core product
with k and q split in two fp16 parts each, ``out_mma``).
On a GPU the staged flush launch runs on a second stream beside the other two
(``concurrent_flush``): they touch disjoint rows, and as either the flush or the prep
launch may run first, the prep launch then leaves the clocks alone, and a one-program
launch on the flush's stream, behind the flush and (an event) the prep launch,
advances them (``clocks.advance_clocks_kernel``, shared with the Mamba-2 split step).

**Verify** (T drafts from one read of the stored copy, kept packed in registers):
draft j is an output step at ring position ``n + j``; drafts 0..j-1 join the
program's ring tiles (k, the ring-rounded d, the log-decay) in registers as they
are computed, and are written behind the commit pointer.  Commit = the persistent
flush launch (committed entries >= L) plus a counter launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .clocks import FlushStream, advance_clocks_kernel
from .codec import as_int32
from .gdn_extra import (
    inv_unit_lower,
    load_tile,
    qk_at,
    tile_dots,
)
from .state import DENSE_FORMATS, StateStore
from .tl_common import (
    RING_BF16,
    RING_FP16,
    RING_FP32,
    finish_slot,
    post_amax_part,
    ring_decode,
    ring_load,
    ring_load_raw,
    ring_round,
    ring_store,
    softplus,
)
from .tl_dots import (
    F16_SPLIT_SCALE,
    NVFP4_WORD_SCALE,
    dot_fp32,
    fp8_tile_dot,
    nvfp4_word_dot,
    nvfp4_word_order,
    split_f16,
    tf32_hi,
    tile_values,
)
from .tl_formats import (
    FMT_BF16_SR,
    FMT_FP16_SR,
    FMT_NONE,
    K_BF16_SR,
    K_FP8,
    K_FP16_SR,
    K_FP32,
    K_NONE,
    K_NVFP4,
    compiled_on,
    decode_tile,
    fp8_encode_hw,
    load_state,
    matrix_amax,
    store_codes,
    store_state,
    store_state_with,
)
from .tl_prefetch import l2_prefetch_lines, l2_prefetch_rows

RING_IDS = {torch.float32: RING_FP32, torch.bfloat16: RING_BF16, torch.float16: RING_FP16}
_RING_STORAGE = {torch.float32: torch.float32, torch.bfloat16: torch.int16,
                 torch.float16: torch.int16}
DOT_PRECISIONS = ("tf32x2", "tf32x3", "ieee")
LAUNCHES = ("fused", "split", "staged")
FLUSH_GRIDS = ("persistent", "units")
VERIFY_LAUNCHES = ("single", "staged", "staged-dot")
FLUSH_PASSES = ("recompute", "scratch")


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
               RP: tl.constexpr, RING: tl.constexpr):
    """Rows ``offs_v`` of ring field ``ring_x`` (v or d) of head h as a ``(rows, RP)``
    tile (entries where ``valid`` is false are zero)."""
    offs_r = tl.arange(0, RP)
    return ring_load(ring_x + (rbase * HV + h) * V + offs_r[None, :] * (HV * V) + offs_v[:, None],
                     valid[None, :], RING)


@triton.jit
def _ring_cols(ring_x, rbase, h, offs_v, valid, HV: tl.constexpr, V: tl.constexpr,
               RP: tl.constexpr, RING: tl.constexpr):
    """:func:`_ring_rows` transposed: a ``(RP, rows)`` tile (the rows contiguous along
    the fast axis; reduced over the entries this costs fewer registers)."""
    offs_r = tl.arange(0, RP)
    return ring_load(ring_x + (rbase * HV + h) * V + offs_r[:, None] * (HV * V) + offs_v[None, :],
                     valid[:, None], RING)


@triton.jit
def _fold_chunk(c_data, c_s1, c_s2, s2_old, ring_v, v_row, rbase, h, mat, offs_v, n, valid, Kr,
                br, ec, Tm, w, e_last, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                FB: tl.constexpr, RP: tl.constexpr, C_FMT: tl.constexpr, RING: tl.constexpr,
                STEP: tl.constexpr, DOT: tl.constexpr, ck_desc=None, TMA: tl.constexpr = False,
                row0=0):
    """Fresh fp32 rows ``offs_v`` (FB of them): the window's d recomputed from the
    checkpoint rows, ``D = RHS (I + N)^-T``, then ``e^{c_L} S_c + (w D) K``.  An nvfp4
    checkpoint decodes with ``s2_old``, its matrix scale read before the first chunk
    was rewritten.  TMA (a dense checkpoint, V a multiple of FB): the rows come through
    the tensor descriptor ``ck_desc`` over ``(slots * HV * V, K)`` (``row0``: the first
    of ``offs_v``)."""
    if TMA:
        S = decode_tile(ck_desc.load([(mat * V + row0).to(tl.int32), 0]), 0.0, 0.0, C_FMT,
                        FB, K)
    elif C_FMT == K_NVFP4:
        codes, sc, s2_now = load_tile(c_data, c_s1, c_s2, mat, offs_v, offs_v < V, V, K, C_FMT)
        S = decode_tile(codes, sc, s2_old, C_FMT, FB, K)
    else:
        S = load_state(c_data, c_s1, c_s2, mat, offs_v, offs_v < V, V, C_FMT, FB, K)
    Vr = _ring_rows(ring_v, rbase, h, offs_v, valid, HV, V, RP, RING)
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
                SUBST: tl.constexpr = False, sync=None, PARTS: tl.constexpr = 0):
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
    one to post encodes the nvfp4 copies of all V rows (:func:`_encode_posted`)."""
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
            amax = tl.maximum(amax, matrix_amax(Sn))
            tl.store(scr + (offs_v - v0)[:, None] * K + offs_k[None, :], Sn)
            _write_rows(Sn, 0.0, c_data, c_s1, c_s2, f_data, f_s1, f_s2, fresh, out_row, mat,
                        offs_v, q, seed, t, K, V, FB, C_FMT, F_FMT, STEP, FRESH, not C4,
                        not F4, FAST, HW)
        if PARTS > 0:  # the last of the matrix's programs encodes all its rows
            _encode_posted(sync, amax, scr - v0 * K, c_data, c_s1, c_s2, f_data, f_s1, f_s2,
                           mat, seed, t, K, V, FB, FNS, PARTS, C_FMT, F_FMT, FAST)
        else:  # second pass: the nvfp4 copies of the unit's rows
            tl.debug_barrier()  # the scratch rows are read back by other threads
            for c in tl.range(0, NC, num_stages=FNS, disable_licm=NOLICM):
                offs_v = v0 + c * FB + tl.arange(0, FB)
                Sn = tl.load(scr + (offs_v - v0)[:, None] * K + offs_k[None, :])
                _write_rows(Sn, amax, c_data, c_s1, c_s2, f_data, f_s1, f_s2, fresh, out_row,
                            mat, offs_v, q, seed, t, K, V, FB, C_FMT, F_FMT, False, False, C4,
                            F4, FAST)
    elif NC == 1:
        offs_v = v0 + tl.arange(0, FB)
        Sn = _fold_chunk(c_data, c_s1, c_s2, s2_old, ring_v, v_row, rbase, h, mat, offs_v, n,
                         valid, Kr, br, ec, Tm, w, e_last, HV, K, V, FB, RP, C_FMT, RING, STEP,
                         DOT, ck_desc, TMA, v0)
        if AMAX:
            amax = matrix_amax(Sn)
        _write_rows(Sn, amax, c_data, c_s1, c_s2, f_data, f_s1, f_s2, fresh, out_row, mat,
                    offs_v, q, seed, t, K, V, FB, C_FMT, F_FMT, STEP, FRESH, True, True, FAST,
                    HW, ck_desc, TMA, v0)
    else:
        if AMAX:  # first pass: the matrix amax only (the second reads L2-hot data)
            for c in tl.range(0, NC, num_stages=FNS, disable_licm=NOLICM):
                offs_v = v0 + c * FB + tl.arange(0, FB)
                Sn = _fold_chunk(c_data, c_s1, c_s2, s2_old, ring_v, v_row, rbase, h, mat,
                                 offs_v, n, valid, Kr, br, ec, Tm, w, e_last, HV, K, V, FB, RP,
                                 C_FMT, RING, STEP, DOT, ck_desc, TMA, v0 + c * FB)
                amax = tl.maximum(amax, matrix_amax(Sn))
        for c in tl.range(0, NC, num_stages=FNS, disable_licm=NOLICM):
            if PF > 0:
                _prefetch_chunk(c_data, ring_v, rbase, h, mat, v0 + (c + PF) * FB, valid, HV, K,
                                V, FB, RP, C_FMT)
            offs_v = v0 + c * FB + tl.arange(0, FB)
            Sn = _fold_chunk(c_data, c_s1, c_s2, s2_old, ring_v, v_row, rbase, h, mat, offs_v,
                             n, valid, Kr, br, ec, Tm, w, e_last, HV, K, V, FB, RP, C_FMT, RING,
                             STEP, DOT, ck_desc, TMA, v0 + c * FB)
            _write_rows(Sn, amax, c_data, c_s1, c_s2, f_data, f_s1, f_s2, fresh, out_row, mat,
                        offs_v, q, seed, t, K, V, FB, C_FMT, F_FMT, STEP, FRESH, True, True,
                        FAST, HW, ck_desc, TMA, v0 + c * FB)


@triton.jit
def _encode_posted(sync, amax, scr, c_data, c_s1, c_s2, f_data, f_s1, f_s2, mat, seed, t,
                   K: tl.constexpr, V: tl.constexpr, FB: tl.constexpr, FNS: tl.constexpr,
                   PARTS: tl.constexpr, C_FMT: tl.constexpr, F_FMT: tl.constexpr,
                   FAST: tl.constexpr):
    """Post this program's part of a matrix flushed by PARTS programs
    (:func:`tl_common.post_amax_part`); the last of them encodes the nvfp4 copies of all
    V rows from the scratch."""
    last, amax_mat = post_amax_part(sync, amax, PARTS)
    if last:
        offs_k = tl.arange(0, K)
        for c in tl.range(0, V // FB, num_stages=FNS):
            offs_v = c * FB + tl.arange(0, FB)
            Sn = tl.load(scr + offs_v[:, None] * K + offs_k[None, :], cache_modifier=".cg")
            _write_rows(Sn, amax_mat, c_data, c_s1, c_s2, f_data, f_s1, f_s2, scr, scr, mat,
                        offs_v, 0.0, seed, t, K, V, FB, C_FMT, F_FMT, False, False,
                        C_FMT == K_NVFP4, F_FMT == K_NVFP4, FAST)


@triton.jit
def _write_rows(Sn, amax, c_data, c_s1, c_s2, f_data, f_s1, f_s2, fresh, out_row, mat, offs_v,
                q, seed, t, K: tl.constexpr, V: tl.constexpr, FB: tl.constexpr,
                C_FMT: tl.constexpr, F_FMT: tl.constexpr, STEP: tl.constexpr,
                FRESH: tl.constexpr, W_C: tl.constexpr = True, W_F: tl.constexpr = True,
                FAST: tl.constexpr = False, HW: tl.constexpr = False, ck_desc=None,
                TMA: tl.constexpr = False, row0=0):
    """Store fresh rows: the fp32 state (FRESH), the checkpoint (W_C; SR seed), the read
    copy (W_F; seed + 1) and, for a step flush, the step's output ``S q``.  HW (compiled
    code only): an fp8 read copy by the hardware conversion
    (``tl_formats.fp8_encode_hw``, the same bits).  TMA with an fp32 checkpoint: the
    rows go out through the tensor descriptor ``ck_desc`` (a bulk store from shared
    memory; ``row0``: the first of ``offs_v``)."""
    mrow = offs_v < V
    if FRESH:
        offs_k = tl.arange(0, K)
        tl.store(fresh + mat * (V * K) + offs_v[:, None] * K + offs_k[None, :], Sn)
    if W_C and TMA and (C_FMT == K_FP32):
        ck_desc.store([(mat * V + row0).to(tl.int32), 0], Sn)
    elif W_C:
        store_state_with(c_data, c_s1, c_s2, Sn, mat, offs_v, mrow, V, seed, t, amax, C_FMT,
                         FB, K, FAST)
    if W_F and HW and (F_FMT == K_FP8):
        codes, s1 = fp8_encode_hw(Sn)
        store_codes(f_data, f_s1, f_s2, codes, s1, 0.0, mat, offs_v, mrow, V, F_FMT, FB, K)
    elif W_F and (F_FMT != K_NONE):
        store_state_with(f_data, f_s1, f_s2, Sn, mat, offs_v, mrow, V, seed + 1, t, amax,
                         F_FMT, FB, K, FAST)
    if STEP:
        tl.store(out_row + offs_v, tl.sum(Sn * q[None, :], axis=1))


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
def _out_tile(codes, sc, s2v, gr, Dr, v_ptr, a_ptr, b_ptr, A_log, dt_bias, out, ring_k, ring_v,
              ring_d, ring_g, ring_b, ring_kk, bidx, hk, h, vb, rbase, n, valid, q, k, kqs, kk,
              kq, HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
              BV: tl.constexpr, L: tl.constexpr, RP: tl.constexpr, FMT: tl.constexpr,
              RING: tl.constexpr):
    """Output rows ``vb * BV ..`` of head h from their loaded tile and ring entries
    (``gr``, ``Dr`` from :func:`_tile_ring`; entries outside ``valid`` are dropped
    here): ``o``, ``d``; unless the slot flushes (n = L - 1), store o and append d, v
    (and, for the head's first tile, g and beta; for the group's first head, k and its
    ring products) at ring position n."""
    offs_v = vb * BV + tl.arange(0, BV)
    offs_r = tl.arange(0, RP)
    v = ring_round(tl.load(v_ptr + (bidx * HV + h) * V + offs_v).to(tl.float32), RING)
    g, beta = _gates(a_ptr + bidx * HV + h, b_ptr + bidx * HV + h, A_log, dt_bias, h)
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
        q, k, qn, kn = _prep_qk(q_ptr + (bidx * HK + hk) * K, k_ptr + (bidx * HK + hk) * K, K,
                                RING)
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
                _out_tile(codes0, sc0, s20, gr0, Dr0, v_ptr, a_ptr, b_ptr, A_log, dt_bias, out,
                          ring_k, ring_v, ring_d, ring_g, ring_b, ring_kk, bidx, hk, tau0 // NVB,
                          tau0 % NVB, rbase, n, valid, q, k, kqs, kk, kq, HK, HV, K, V, BV, L,
                          RP, R_FMT, RING)
        else:
            for i in tl.range(0, TPP, num_stages=NS):
                tau = tau0 + i
                h = tau // NVB
                offs_v = (tau % NVB) * BV + tl.arange(0, BV)
                codes, sc, s2v = load_tile(r_data, r_s1, r_s2, slot.to(tl.int64) * HV + h,
                                           offs_v, (offs_v < V) & live, V, K, R_FMT)
                gr, Dr = _tile_ring(ring_g, ring_d, rbase, h, offs_v, valid, HV, V, RP, RING)
                _out_tile(codes, sc, s2v, gr, Dr, v_ptr, a_ptr, b_ptr, A_log, dt_bias, out,
                          ring_k, ring_v, ring_d, ring_g, ring_b, ring_kk, bidx, hk, h,
                          tau % NVB, rbase, n, valid, q, k, kqs, kk, kq, HK, HV, K, V, BV, L,
                          RP, R_FMT, RING)
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
def _prep_kernel(
    q_ptr, k_ptr, a_ptr, b_ptr, A_log, dt_bias, state_idx, ring_k, ring_g, ring_b, ring_kk,
    tickets, pqk, pco, pn,
    HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, L: tl.constexpr, R: tl.constexpr,
    RP: tl.constexpr, CW: tl.constexpr, GP: tl.constexpr, RING: tl.constexpr,
    EAGER: tl.constexpr, CONC: tl.constexpr = False, MMA: tl.constexpr = 0,
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
    MMA 0 their float32 values (q, k)."""
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
        tl.store(qb + offs_k, k_hi, mask=ok)
        tl.store(qb + K + offs_k, k_lo, mask=ok)
        tl.store(qb + 2 * K + offs_k, q_hi, mask=ok)
        tl.store(qb + 3 * K + offs_k, q_lo, mask=ok)
    else:
        qb = pqk + (bidx * HK + hk) * (2 * K)
        tl.store(qb + offs_k, q, mask=ok)
        tl.store(qb + K + offs_k, k, mask=ok)
    cb = pco + (bidx * HV + hs) * CW  # (GP,) row starts
    m2 = mj[:, None] & ok
    tl.store(cb[:, None] + offs_r[None, :], w * kk[None, :], mask=m2)
    tl.store(cb[:, None] + RP + offs_r[None, :], w * kq[None, :], mask=m2)
    mo = mj & ok
    tl.store(cb + 2 * RP, tl.exp(Gs), mask=mo)
    tl.store(cb + 2 * RP + 1, tl.exp(g), mask=mo)
    tl.store(cb + 2 * RP + 2, beta, mask=mo)
    tl.store(cb + 2 * RP + 3, tl.zeros_like(beta) + kqs, mask=mo)
    tl.store(pn + bidx, tl.where(ok, n, -1), mask=hk == 0)
    if not CONC:
        tl.debug_barrier()  # every warp has read the clock: now advance it
        tl.atomic_add(tickets + slot64, 1, mask=live, sem="relaxed")


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


@triton.jit
def _out_kernel(
    v_ptr, state_idx, out, r_data, r_s1, r_s2, ring_v, ring_d, pqk, pco, pn,
    HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
    TPP: tl.constexpr, NS: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, CW: tl.constexpr,
    FMT: tl.constexpr, RING: tl.constexpr, MMA: tl.constexpr = 0,
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
    and q the prep launch left in ``pqk`` (:func:`_staged_rows`)."""
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
                                       FMT, MMA != 0)
            Dr = ring_load(ring_d + (rbase * HV + h) * V + offs_r[:, None] * (HV * V)
                           + offs_v[None, :], valid[:, None] & mrow[None, :], RING)
            v = ring_round(tl.load(v_ptr + (bidx * HV + h) * V + offs_v, mask=mrow,
                                   other=0.0).to(tl.float32), RING)
            o, d = _staged_rows(codes, sc, s2v, k, q, Dr, pco + (bidx * HV + h) * CW, v, K,
                                BV, RP, FMT, RING, KQ)
            tl.store(out + (bidx * HV + h) * V + offs_v, o, mask=mrow)
            ring_store(ring_d + (pos * HV + h) * V + offs_v, ring_round(d, RING), mrow, RING)
            ring_store(ring_v + (pos * HV + h) * V + offs_v, v, mrow, RING)


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
                SUBST: tl.constexpr = False):
    """One flush unit: rows ``part * BVF ..`` of head h of ``slot`` (batch row bidx)."""
    hk = h // (HV // HK)
    mat = slot.to(tl.int64) * HV + h
    rbase = slot.to(tl.int64) * R
    if COMMIT:
        _flush_rows(c_data, c_s1, c_s2, f_data, f_s1, f_s2, fresh, ring_k, ring_v, ring_g,
                    ring_b, ring_kk, v_ptr, out, rbase, h, hk, mat, part * BVF, n, 0.0, 0.0,
                    0.0, 0.0, seed, t, HK, HV, K, V, BVF, FB, FNS, RP, LOG2RP, C_FMT, F_FMT,
                    RING, False, FRESH, DOT, NOLICM, scr, SCRATCH, FAST, PF, ck_desc, TMA,
                    HW, SUBST)
    else:
        q, k, qn, kn = _prep_qk(q_ptr + (bidx * HK + hk) * K, k_ptr + (bidx * HK + hk) * K,
                                K, RING)
        g, beta = _gates(a_ptr + bidx * HV + h, b_ptr + bidx * HV + h, A_log, dt_bias, h)
        _flush_rows(c_data, c_s1, c_s2, f_data, f_s1, f_s2, fresh, ring_k, ring_v, ring_g,
                    ring_b, ring_kk, v_ptr + (bidx * HV + h) * V,
                    out + (bidx * HV + h) * V, rbase, h, hk, mat, part * BVF, n, q, k, g,
                    beta, seed, t, HK, HV, K, V, BVF, FB, FNS, RP, LOG2RP, C_FMT, F_FMT,
                    RING, True, FRESH, DOT, NOLICM, scr, SCRATCH, FAST, PF, ck_desc, TMA,
                    HW, SUBST)


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
    SUBST: tl.constexpr = False,
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
    the second pass encodes from there instead of folding again."""
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
                        ck_desc, TMA, HW, SUBST)
    else:
        pid = tl.program_id(0)
        G = tl.num_programs(0)
        offs_b = tl.arange(0, BP)
        inb = offs_b < B
        sl = tl.load(state_idx + offs_b, mask=inb, other=-1)
        live = sl >= 0
        sl0 = tl.maximum(sl, 0)
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
        fl = flag.to(tl.int32)
        key = tl.where(flag, tl.cumsum(fl, axis=0), 0)  # j + 1 at the j-th flushing row
        units = tl.sum(fl, axis=0) * (HV * NU)
        scr_p = scr + pid.to(tl.int64) * (BVF * K)
        u = pid
        while u < units:
            j = u // (HV * NU)
            h = (u // NU) % HV
            part = u % NU
            # the unit's sequence, slot, entry count and SR step from the vectors above: the
            # unit's loads need no scalar round trip first
            sel = key == j + 1
            bidx = tl.sum(tl.where(sel, offs_b, 0), axis=0)
            slot = tl.sum(tl.where(sel, sl0, 0), axis=0)
            if COMMIT:
                n = tl.sum(tl.where(sel, nb, 0), axis=0)
            else:
                n = L - 1
            t = tl.sum(tl.where(sel, tb, 0), axis=0)
            _flush_unit(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log, dt_bias, out, c_data, c_s1,
                        c_s2, f_data, f_s1, f_s2, ring_k, ring_v, ring_g, ring_b, ring_kk, fresh,
                        scr_p, seed, bidx, slot, h, part, n, t, HK, HV, K, V, BVF, FB, FNS, R, RP,
                        LOG2RP, C_FMT, F_FMT, RING, FRESH, COMMIT, DOT, NOLICM, SCRATCH, FAST,
                        PF, ck_desc, TMA, HW, SUBST)
            if SCRATCH:
                tl.debug_barrier()  # the next unit rewrites the scratch rows
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
    pid_v = tl.program_id(0)
    pid_bh = tl.program_id(1)
    bidx = pid_bh // HV
    h = pid_bh % HV
    hk = h // (HV // HK)
    slot = tl.load(state_idx + bidx)
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


# ------------------------------------------------------------------------- host
def _pow2_at_least(n: int, lo: int = 2) -> int:
    return max(lo, triton.next_power_of_2(max(1, n)))


def _check_shapes(q: torch.Tensor, v: torch.Tensor, K: int, V: int) -> None:
    for name, dim in (("K", K), ("V", V)):
        if dim & (dim - 1) or dim < 16:
            raise ValueError(f"{name} must be a power of two >= 16, got {dim}")
    if q.shape[-1] != K or v.shape[-1] != V:
        raise ValueError(f"q/k last axis must be K={K} and v's V={V}")


def _pow2(name: str, x: int, lo: int = 16) -> int:
    if x < lo or x & (x - 1):
        raise ValueError(f"{name} must be a power of two >= {lo}, got {x}")
    return x


def default_config(batch: int, v_heads: int, V: int, K: int, whole_matrix: bool = False,
                   kernel: str = "conventional") -> tuple[int, int]:
    """``(BV, num_warps)`` of the conventional kernel: rows of V per program and warps.
    ``whole_matrix`` (an nvfp4 state) forces BV = V: its matrix scale needs the whole
    (V, K) matrix in one program."""
    bv = V if whole_matrix else min(V, 32 if batch * v_heads >= 1024 else 16)
    return bv, triton.next_power_of_2(max(1, min(16, bv * K // 1024)))


_MMA_KINDS = {"fp8-e4m3": 1, "nvfp4": 1, "fp32": 2}
"""Copies whose output tiles can be read by tensor-core products (``out_mma``) and
the prep launch's form of k and q for them (:func:`_prep_kernel`'s ``MMA``)."""
_OUT_CFG = {"fp32": (16, 1, 1, 1), "fp8-e4m3": (128, 2, 2, 2), "nvfp4": (128, 2, 4, 2),
            "mxfp4": (64, 2, 1, 1)}
"""Staged output launch by the format it reads: rows per tile, warps, tiles per program
(at most a k-head group's), pipeline stages (fp8 and nvfp4 copies: tensor-core row sums,
``out_mma``).  nvfp4 tiles decoded from words (sixteenth H200 run, qwen3.5-122b output
step us): 4 tiles per program 96.5 / 98.3 / 98.2 against 99.5 / 100.3 / 100.2 with 2; fp8
copies lost with 4 (112.7 / 113.8 against 111.2 / 110.8)."""


def replay_defaults(batch: int, k_heads: int, v_heads: int, V: int, K: int, checkpoint: str,
                    read: str | None) -> dict:
    """Launch configuration of a replay cache by batch size and formats (keywords of
    :class:`GDNReplayCache`).  Small batches: one fused launch of 16-row programs (ring
    tiles loaded eagerly).  Large batches (batch * v_heads >= 1024): "staged" -- a
    persistent flush launch (whole-head units folded in 16-row chunks, 2-stage
    pipeline; as many programs as fit at once under its register cap), a prep launch
    (one program per sequence and k-head) and an output launch of small tiles
    (16-64 rows, 1-2 warps: many resident programs, each waiting only for the slot
    index and the ring position before all its loads); verify "staged-dot" (16-row
    tiles, 1 warp: every draft's reductions of a tile as one tensor-core product);
    integer-rounding encoders in the flushes; an nvfp4 flush keeps its first pass's
    fp32 rows in a per-program scratch instead of folding twice.  Picked from sweeps on
    an H200 (qwen3.5-4b, batch 256, L = 16: verify 593 -> 328 us; the flush launch
    capped at 128 registers, 4 programs per SM: nvfp4 split 225 -> 166 us per step, fp8
    split 171 -> 165); the staged prep launch uses plain (masked) ring loads (14.8 vs
    16.3 us eager); batch-1 verify programs of 4 warps (18.8 against 22.2 us with 2).
    The units flush grid (one program per unit) flushes faster, but on the main stream
    its launch costs every output step ~14 us when nothing flushes.  On a GPU the staged flush
    launch runs on a second stream beside the prep and output launches
    (``concurrent_flush``: its empty launch leaves the critical path; 158.8 -> 154.5
    us per fp8 split step, 204.0 -> 201.5 replay fp32).  With the flush off the
    critical path, the last sweep (same session) picked one-warp prep programs (fp8
    156.8 -> 155.0 us per step), loop-invariant code motion in the flush's chunk loop
    (fp8 -> 154.0, fp32 202.3 -> 201.3), each within ~2%, and for nvfp4 copies the
    units grid (164.3 -> 161.4), which stays opt-in: its scratch pass keeps one fp32
    block per unit of every slot, a full fp32 copy of the state (537 MB at batch 256,
    qwen3.5-4b) against 34 MB for the persistent grid's per-program blocks.  The flush
    prefetches the next chunk into L2 (eighth run, flush us: fp32 805 -> 784, fp8 1090
    -> 1055; nvfp4 1256 -> 1264, so not there).  A dense checkpoint's chunks come by TMA
    (``flush_tma``; tenth run, flush us, 4-warp programs: fp8 1096 -> 999 with 168
    registers, 3 per SM and 3 stages, fp32 802 -> 780; nvfp4 1309 -> 1322, so not
    there; at 128 registers, 4 per SM, TMA spilled and lost: fp8 1085, fp32 854), which
    also frees the registers the loads held, so fewer warps per program pay: the
    replay fp32 and fp8-copy flushes in 1-warp programs (255 registers, 8 per SM, one
    stage: fp32 467 us, fp8 743; fp8 in 2-warp programs, 4 per SM, 3 stages: 845;
    offline sm_90 warp-instructions per 16-row chunk: fp32 2768 -> 1178, fp8 5080 ->
    3057).  The fp8 copy is encoded by the hardware conversion (``hw_fp8``; eleventh
    run: fp8 flush 749 -> 609 us, 132.3 -> 122.8 us per step); with it, two stages
    lost (742 us), as did TMA-loaded nvfp4 flushes in 1- or 2-warp programs (1353 /
    1324 against 1312 us) and 2 or 3 stages for fp32 (570 / 555 against 468).  Twelfth
    run (same-process timings, qwen3.5-4b / 122b): the window's deltas by split tf32
    tensor-core passes instead of fp32 FMAs and the fp32 checkpoint stored by TMA
    (fp32 flush 476 -> 411 / 934 -> 843 us, fp8 616 -> 549), the triangular system by
    forward substitution in one-warp flush programs (fp32 410 -> 383 / 841 -> 754,
    fp8 551 -> 494), the fp8 encoder's finite-tile path (fp8 493 -> 467 / 965 -> 915);
    re-timed then, two chunks of L2 prefetch (415 / 525 against 381 / 482 us), none
    (419) or two stages at 6 per SM (392 / 531) still lost.  An fp8 copy's output
    tiles are read by tensor-core products (``out_mma``; thirteenth run, qwen3.5-4b /
    122b, output step us): with 16-row 1-warp tiles 89.4 -> 90.8 / 160.6 -> 159.2, so
    its instructions (818 -> 462 per tile, offline sm_90) were not what held it back,
    but with fewer instructions per row larger programs pay: 128-row tiles of 2 warps,
    two per program in a 2-stage pipeline, 68.5 / 111.2 (64-row 2-warp tiles 74.5 /
    129.4; 128-row 2-warp tiles alone 74.7 / 122.4).  An nvfp4 copy's tiles the same
    way: 84.7 -> 82.5 / 150.4 -> 142.1 (64-row 2-warp tiles, the CUDA-core default
    before, 85.6 / 149.4 with tensor-core sums).  fp32 tiles by two tf32 passes lost
    (161.2 -> 182.5 us, 119 registers per thread)."""
    whole = "nvfp4" in (checkpoint, read)
    if batch * v_heads < 1024:
        # 16-row programs.  An nvfp4 copy: 16-row programs (each flushes its rows, the
        # last of a head's to post its amax encodes the copy) on grids of at most 512
        # of them, else whole-matrix programs (H200, us per step, against the parent
        # tree whose head's first program flushed the whole matrix: batch 1 qwen3.5-4b
        # 12.2 -> 9.0, qwen3.5-122b 15.0-15.8 -> 10.3 against 13.6-14.0 with 128-row
        # programs; batch 4 16-row programs lost, 14.9 / 22.2 against 13.9 / 16.5)
        bv = min(V, 16)
        if whole and batch * v_heads * (V // bv) > 512:
            bv = V
        # warps per program by grid size (H200, us per step, L = 16).  fp32 tiles: 2
        # warps once the grid passes 384 programs (178 registers, 5 per SM, against 3 of
        # 4 warps at 136: qwen3.5-122b batch 1 12.1-12.2 -> 9.6-9.9, batch 4 25.2 ->
        # 22.1, qwen3.5-4b batch 4 16.2 -> 14.0), 8 below (qwen3.5-4b batch 1: faster
        # than 4 in eight paired timings, 8.25-8.43 -> 7.92-8.39).  An fp8 copy of an fp32
        # checkpoint: 1 warp once the grid passes 384 programs (255 registers;
        # qwen3.5-122b batch 1 9.23-9.25 -> 8.68-8.82, batch 4 19.8-20.0 -> 17.9-18.1,
        # batch 12 45.3-45.4 -> 38.5-38.6; qwen3.5-4b batch 4 13.3 -> 12.8-13.1, batch 12
        # 26.5 -> 22.9-23.1), else 4 (qwen3.5-4b batch 1: 7.67-8.21 against 7.79-8.45
        # with 2)
        programs = batch * v_heads * (V // bv)
        big = programs > 384
        if (read or checkpoint) == "fp32":
            nw = 2 if big else 8
        elif read == "fp8-e4m3" and checkpoint == "fp32":
            nw = 1 if big else 4
        else:
            nw = 4
        return dict(launch="fused", block_v=bv, num_warps=nw, maxnreg=None,
                    tiles_per_program=1, stages=1, flush_chunk=min(bv, 16), flush_stages=1,
                    out_maxnreg=None, verify_maxnreg=None, prep_maxnreg=None,
                    flush_ctas_per_sm=4,
                    out_block_v=min(V, 16), out_num_warps=2, out_tiles_per_program=1,
                    out_stages=1, verify_block_v=min(V, 16), verify_num_warps=4,
                    verify_stages=1, eager=True, prep_num_warps=2,
                    verify_launch="single", flush_licm=False, flush_grid="persistent",
                    flush_pass="recompute", fast_encode=True, concurrent_flush=False,
                    flush_prefetch=0, flush_tma=False, hw_fp8=False,
                    out_mma=False)
    out_fmt = read or checkpoint
    obv, onw, otpp, ons = _OUT_CFG.get(out_fmt, (16, 1, 1, 1))
    obv = min(V, obv)
    while (v_heads // k_heads * (V // obv)) % otpp:  # tiles of a k-head group
        otpp //= 2
    # TMA chunk loads for a dense checkpoint without nvfp4 copies; with an nvfp4 read
    # copy where the flush has at most 8192 units (batch x v-heads), in 1-warp programs
    # (seventeenth run, flush us against 4-warp programs with plain loads, in one process:
    # qwen3.5-4b 1128 / 1147 / 1148 against 1203-1213; qwen3.5-122b 2381 / 2475 / 2447
    # against 2384-2419, so not there)
    nv_tma = read == "nvfp4" and batch * v_heads <= 8192
    tma = checkpoint in DENSE_FORMATS and (nv_tma or not whole)
    # flush programs (warps, registers, programs per SM, pipeline stages)
    if tma and read in (None, "fp8-e4m3", "nvfp4"):
        fw, fr, fc, fs = 1, 255, 8, 1
    elif tma:
        fw, fr, fc, fs = 4, 168, 3, 2
    else:
        fw, fr, fc, fs = 4, 128, 4, 2
    return dict(launch="staged", block_v=V, num_warps=fw, maxnreg=fr,
                tiles_per_program=1, stages=1, flush_chunk=16, flush_stages=fs, out_maxnreg=0,
                verify_maxnreg=0, prep_maxnreg=0, flush_ctas_per_sm=fc,
                out_block_v=obv, out_num_warps=onw, out_tiles_per_program=otpp,
                out_stages=ons if otpp > 1 else 1, verify_block_v=min(V, 16),
                verify_num_warps=1, verify_stages=2,
                eager=False, prep_num_warps=1, verify_launch="staged-dot",
                flush_licm=not whole, flush_grid="persistent",
                flush_pass="scratch", fast_encode=True, concurrent_flush=True,
                flush_prefetch=0 if whole else 1, flush_tma=tma,
                hw_fp8=read == "fp8-e4m3", out_mma=out_fmt in ("fp8-e4m3", "nvfp4"))


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
    """Per-slot int32 counters: ``ring_len`` and ``steps`` (speculative caches; the
    conventional kernel's SR step), ``tickets`` (a plain replay cache's clock; the
    conventional kernel's tickets)."""

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
    bv, nw = default_config(B, HV, V, K, state.fmt == "nvfp4")
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
    speculative drafts verified at once (a speculative cache: :meth:`verify` and
    :meth:`commit` instead of :meth:`step`; the ring holds L - 1 + drafts entries).

    Launch configuration (defaults: :func:`replay_defaults` for ``batch_hint``):

    * ``launch``: ``"fused"`` (one launch per step: programs of ``block_v``-row tiles,
      ``tiles_per_program`` of them in a ``stages``-deep pipeline, ``num_warps``; a
      flushing slot's programs flush their own tiles) or ``"split"`` (a persistent
      flush launch over units of ``block_v`` rows with ``num_warps`` and
      ``flush_ctas_per_sm`` programs per SM, then the output launch: ``out_block_v``,
      ``out_tiles_per_program``, ``out_stages``, ``out_num_warps``).  Tiles per program
      must lie in one k-head group (divide ``v_heads // k_heads * V // block``).
    * ``flush_chunk``: rows a flush folds at once (FB; at least 16).
    * ``flush_stages``: software-pipeline depth of a flush unit's chunk loop.
    * ``dot_precision``: the flush's two large products (``S_c K^T``, the rank-L fold):
      ``"tf32x2"`` (two tensor-core passes: the other operand, the ring's k, must be
      exact in tf32 -- a bf16 or fp16 ring; with an fp32 ring it means ``"tf32x3"``),
      ``"tf32x3"`` (three passes) or ``"ieee"`` (fp32 FMAs).  Default: ``"tf32x2"``.
      The window's deltas ``RHS (I + N)^-T`` take three explicitly split tf32 passes
      unless ``"ieee"``.
    * ``verify_block_v`` / ``verify_num_warps`` / ``verify_stages``: the verify kernel.
    * ``flush_grid``: ``"persistent"`` (default) or ``"units"`` (the split/staged flush
      launch as one program per (row, head, block_v rows) unit; programs of rows that
      do not flush return after two scalar loads).
    * ``flush_pass``: ``"recompute"`` (a chunked nvfp4 flush folds every chunk twice,
      once for the matrix amax; the fused launch's default) or ``"scratch"`` (the
      first pass keeps the fp32 rows in a global scratch, the second only encodes them;
      the staged launch's default).
    * ``concurrent_flush``: the staged step's flush launch on a second CUDA stream,
      forked and joined around the prep and output launches (default on a GPU; the
      launches touch disjoint rows).
    * ``flush_prefetch``: L2 prefetch in the flush (compiled code only), chunks ahead
      of the one being folded (0: none).
    * ``flush_tma``: the staged flush launch loads a dense checkpoint's (fp32 or 16-bit)
      chunks through a tensor descriptor (TMA bulk copies into shared memory on Hopper,
      issued ahead by the chunk loop's ``flush_stages``-deep pipeline) and stores an
      fp32 checkpoint's fresh chunks back through it.  On by default in the staged
      launch where no copy is nvfp4.
    * ``hw_fp8``: the staged flush encodes an fp8 read copy with the hardware
      conversion (compiled code only; ``tl_formats.fp8_encode_hw``, the encoder of
      the Mamba-2 flush, the same bits).  On by default in the staged launch (offline
      sm_90 it cuts the fp8 flush's chunk loop from 3051 to 2036 instructions; on an
      H200, qwen3.5-4b, batch 256, L = 16: flush 749 -> 609 us).
    * ``out_mma``: the staged output launch's row sums as tensor-core products
      (:func:`_staged_rows`; fp8 and nvfp4 copies in fp16, fp32 ones in two tf32
      passes).  On by default in the staged launch for fp8 and nvfp4 copies.
    * ``fast_encode``: the flush's encoders by integer rounding (default; the same
      bits as the reference encoders of ``tl_formats``, which ``False`` selects), in
      the flush launch and in the fused launch's own flushes.
    * ``maxnreg`` (fused or flush launch), ``out_maxnreg``, ``verify_maxnreg``,
      ``prep_maxnreg`` (the staged prep launch): register caps per thread (0: none, the
      compiler's choice; None: the default).

    An nvfp4 copy is written whole-matrix (its matrix scale): a split or staged flush
    unit, or a speculative cache's commit unit, owns all V rows (``block_v`` must be V
    there); in the fused launch with a smaller ``block_v`` a head's programs each fold
    their rows and the last of them to post its part of the matrix amax encodes the copy
    of all V rows.
    """

    def __init__(
        self, slots: int, k_heads: int, v_heads: int, K: int, V: int, *, window: int,
        checkpoint: str = "fp32", read: str | None = None,
        ring_dtype: torch.dtype = torch.bfloat16, drafts: int = 0, seed: int = 0,
        device: torch.device | str = "cuda", batch_hint: int | None = None,
        launch: str | None = None, block_v: int | None = None, num_warps: int | None = None,
        tiles_per_program: int | None = None, stages: int | None = None,
        out_block_v: int | None = None, out_num_warps: int | None = None,
        out_tiles_per_program: int | None = None, out_stages: int | None = None,
        verify_block_v: int | None = None, verify_num_warps: int | None = None,
        verify_stages: int | None = None, flush_chunk: int | None = None,
        flush_stages: int | None = None, dot_precision: str = "tf32x2",
        flush_ctas_per_sm: int | None = None, maxnreg: int | None = None,
        out_maxnreg: int | None = None, verify_maxnreg: int | None = None,
        prep_maxnreg: int | None = None, eager: bool | None = None,
        prep_num_warps: int | None = None,
        verify_launch: str | None = None, flush_licm: bool | None = None, keep_fresh: bool = False,
        flush_grid: str | None = None, flush_pass: str | None = None,
        fast_encode: bool | None = None, concurrent_flush: bool | None = None,
        flush_prefetch: int | None = None, flush_tma: bool | None = None,
        hw_fp8: bool | None = None, out_mma: bool | None = None,
    ):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if v_heads % k_heads:
            raise ValueError(f"v_heads ({v_heads}) must be a multiple of k_heads ({k_heads})")
        if dot_precision not in DOT_PRECISIONS:
            raise ValueError(f"dot_precision must be one of {DOT_PRECISIONS}, got "
                             f"{dot_precision!r}")
        self.slots, self.HK, self.HV, self.K, self.V = slots, k_heads, v_heads, K, V
        self.L, self.T, self.seed = window, drafts, seed
        self.R = window + max(drafts - 1, 0)
        self.RP = _pow2_at_least(self.R, 16)
        self.LOG2RP = self.RP.bit_length() - 1
        self.ring_dtype, self.ring_id = ring_dtype, RING_IDS[ring_dtype]
        self.dot = ("tf32x3" if dot_precision == "tf32x2" and ring_dtype == torch.float32
                    else dot_precision)
        shape = (slots, v_heads, V, K)
        self.ckpt = empty_store(checkpoint, shape, device)
        self.read = empty_store(read, shape, device) if read is not None else None
        cfg = replay_defaults(batch_hint or slots, k_heads, v_heads, V, K, checkpoint, read)
        given = dict(launch=launch, block_v=block_v, num_warps=num_warps,
                     tiles_per_program=tiles_per_program, stages=stages,
                     flush_chunk=flush_chunk, out_block_v=out_block_v,
                     out_num_warps=out_num_warps, out_tiles_per_program=out_tiles_per_program,
                     out_stages=out_stages, flush_stages=flush_stages, maxnreg=maxnreg,
                     out_maxnreg=out_maxnreg, verify_maxnreg=verify_maxnreg,
                     prep_maxnreg=prep_maxnreg,
                     flush_ctas_per_sm=flush_ctas_per_sm, eager=eager,
                     prep_num_warps=prep_num_warps, verify_launch=verify_launch,
                     flush_licm=flush_licm, flush_grid=flush_grid, flush_pass=flush_pass,
                     fast_encode=fast_encode, concurrent_flush=concurrent_flush,
                     flush_prefetch=flush_prefetch, flush_tma=flush_tma, hw_fp8=hw_fp8,
                     out_mma=out_mma,
                     verify_block_v=verify_block_v,
                     verify_num_warps=verify_num_warps, verify_stages=verify_stages)
        if out_block_v is not None and out_tiles_per_program is None:
            cfg["out_tiles_per_program"] = 1
        if block_v is not None:
            if tiles_per_program is None:
                cfg["tiles_per_program"] = 1
            if flush_chunk is None:
                cfg["flush_chunk"] = min(block_v, cfg["flush_chunk"])
        cfg.update({k: v for k, v in given.items() if v is not None})
        if cfg["launch"] != "staged":  # defaults of the staged launch only
            cfg["out_mma"] = bool(out_mma)
            cfg["flush_tma"] = bool(flush_tma)
        if ((cfg["launch"] != "fused" or drafts) and block_v is None
                and "nvfp4" in (checkpoint, read)):
            cfg["block_v"] = V  # flush (and commit) units of whole matrices: the matrix scale
        self.config = cfg
        """The launch configuration in use (keywords of this class)."""
        self.launch = cfg["launch"]
        if self.launch not in LAUNCHES:
            raise ValueError(f"launch must be one of {LAUNCHES}, got {self.launch!r}")
        self.eager, self.prep_num_warps = bool(cfg["eager"]), cfg["prep_num_warps"]
        self.verify_launch = cfg["verify_launch"]
        self.flush_licm = bool(cfg["flush_licm"])
        self.flush_grid, self.flush_pass = cfg["flush_grid"], cfg["flush_pass"]
        self.fast_encode = bool(cfg["fast_encode"])
        self.concurrent_flush = bool(cfg["concurrent_flush"])
        self.flush_prefetch = int(cfg["flush_prefetch"])
        if self.flush_prefetch < 0:
            raise ValueError(f"flush_prefetch must be >= 0, got {self.flush_prefetch}")
        self.flush_tma = bool(cfg["flush_tma"])
        self.hw_fp8 = bool(cfg["hw_fp8"])
        self.out_mma = bool(cfg["out_mma"])
        out_fmt = read if read is not None else checkpoint
        if self.out_mma and (self.launch != "staged" or out_fmt not in _MMA_KINDS):
            raise ValueError(f"out_mma needs the staged launch and a copy to read in "
                             f"{' or '.join(_MMA_KINDS)}, got launch {self.launch!r}, "
                             f"copy {out_fmt!r}")
        self._mma = _MMA_KINDS[out_fmt] if self.out_mma else 0
        if self.flush_tma and (self.launch != "staged" or checkpoint not in DENSE_FORMATS):
            raise ValueError(f"flush_tma needs the staged launch and a dense checkpoint "
                             f"({', '.join(DENSE_FORMATS)}), got launch {self.launch!r}, "
                             f"checkpoint {checkpoint!r}")
        self._flush_stream = FlushStream()
        if self.flush_grid not in FLUSH_GRIDS:
            raise ValueError(f"flush_grid must be one of {FLUSH_GRIDS}, got {self.flush_grid!r}")
        if self.flush_pass not in FLUSH_PASSES:
            raise ValueError(f"flush_pass must be one of {FLUSH_PASSES}, got "
                             f"{self.flush_pass!r}")
        if self.verify_launch not in VERIFY_LAUNCHES:
            raise ValueError(f"verify_launch must be one of {VERIFY_LAUNCHES}, got "
                             f"{self.verify_launch!r}")
        self._vscratch = None
        self._fscratch = None
        self._pscratch = None
        self.compiled: dict = {}
        """The last compiled kernel of each launch (``n_regs``, ``n_spills``: tuning aid)."""
        self.BV, self.num_warps = cfg["block_v"], cfg["num_warps"]
        self.TPP, self.stages = cfg["tiles_per_program"], cfg["stages"]
        self.out_BV, self.out_num_warps = cfg["out_block_v"], cfg["out_num_warps"]
        self.out_TPP, self.out_stages = cfg["out_tiles_per_program"], cfg["out_stages"]
        self.verify_BV, self.verify_num_warps = cfg["verify_block_v"], cfg["verify_num_warps"]
        self.verify_stages = cfg["verify_stages"]
        self.FB, self.flush_stages = cfg["flush_chunk"], cfg["flush_stages"]
        self.maxnreg, self.out_maxnreg = cfg["maxnreg"] or None, cfg["out_maxnreg"] or None
        self.verify_maxnreg = cfg["verify_maxnreg"] or None
        self.prep_maxnreg = cfg["prep_maxnreg"] or None
        whole = "nvfp4" in (checkpoint, read)
        if whole and self.BV != V and (self.launch != "fused" or self.T):
            raise ValueError("an nvfp4 copy needs block_v == V (flush units of whole "
                             "matrices) outside the fused launch and in speculative caches")
        for name, bv_ in (("block_v", self.BV), ("out_block_v", self.out_BV),
                          ("verify_block_v", self.verify_BV), ("flush_chunk", self.FB)):
            _pow2(name, bv_)
            if V % bv_:
                raise ValueError(f"{name} {bv_} does not divide V = {V}")
        if self.BV % self.FB:
            raise ValueError(f"flush_chunk {self.FB} does not divide block_v {self.BV}")
        group = v_heads // k_heads
        for name, tpp, bv_ in (("tiles_per_program", self.TPP, self.BV),
                               ("out_tiles_per_program", self.out_TPP, self.out_BV)):
            if tpp < 1 or (group * (V // bv_)) % tpp:
                raise ValueError(f"{name} {tpp} must divide the {group * (V // bv_)} tiles of "
                                 "a k-head group")
        R, rdt = self.R, _RING_STORAGE[ring_dtype]
        self.ring_k = torch.zeros((slots, R, k_heads, K), dtype=rdt, device=device)
        self.ring_v = torch.zeros((slots, R, v_heads, V), dtype=rdt, device=device)
        self.ring_d = torch.zeros((slots, R, v_heads, V), dtype=rdt, device=device)
        self.ring_g = torch.zeros((slots, R, v_heads), dtype=torch.float32, device=device)
        self.ring_beta = torch.zeros((slots, R, v_heads), dtype=torch.float32, device=device)
        self.ring_kk = torch.zeros((slots, R, k_heads, self.RP), dtype=torch.float32,
                                   device=device)
        """Row i: ``k_j . k_i`` for the entries j < i (written with entry i; the flush's
        triangular system)."""
        self.counters = SlotCounters(slots, device)
        dev = torch.device(device)
        self.n_sm = (torch.cuda.get_device_properties(dev).multi_processor_count
                     if dev.type == "cuda" else 2)
        self.flush_ctas_per_sm = cfg["flush_ctas_per_sm"]
        self._skip = torch.zeros(max(slots, batch_hint or 0), dtype=torch.int32, device=device)
        self.CW = 2 * self.RP + 8
        self._scratch = self._staged_scratch(max(slots, batch_hint or 0), device)
        self.fresh = (torch.zeros(shape, dtype=torch.float32, device=device) if keep_fresh
                      else None)
        """fp32 state of each slot's last flush (``keep_fresh=True``), for inspection."""

    def _staged_scratch(self, B: int, device) -> tuple[torch.Tensor, ...]:
        """The staged launch's per-step buffers: prepared q, k per (row, k-head) (fp32, or
        two parts each: fp16 in the same bytes, tf32 parts in twice them); ring
        coefficients and scalars per (row, v-head); the ring position per row."""
        if self.launch != "staged":
            return ()
        qk = (4 if self._mma == 2 else 2) * self.K
        return (torch.zeros((B, self.HK, qk), dtype=torch.float32, device=device),
                torch.zeros((B, self.HV, self.CW), dtype=torch.float32, device=device),
                torch.zeros((B,), dtype=torch.int32, device=device))

    @property
    def programs_per_slot(self) -> int:
        """Programs per slot of the launch that advances the clock."""
        if self.launch == "staged":
            return self.HK
        if self.launch == "fused":
            return self.HV * (self.V // self.BV) // self.TPP
        return self.HV * (self.V // self.out_BV) // self.out_TPP

    @property
    def steps(self) -> torch.Tensor:
        """Decode steps (committed tokens) per slot, int32 on the device."""
        if self.T:
            return self.counters.steps
        return self.counters.tickets // self.programs_per_slot

    @property
    def ring_len(self) -> torch.Tensor:
        """Entries in each slot's ring since its checkpoint, int32 on the device."""
        if self.T:
            return self.counters.ring_len
        return self.steps % self.L

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

    def _skip_flags(self, B: int) -> torch.Tensor:
        if self._skip.numel() < B:
            self._skip = torch.zeros(B, dtype=torch.int32, device=self._skip.device)
        return self._skip

    # -- steps -------------------------------------------------------------
    def step(self, q, k, v, a, b, A_log, dt_bias, state_indices, out=None) -> torch.Tensor:
        """One decode step for the B sequences (shapes as :func:`conventional_step`)."""
        if self.T:
            raise RuntimeError("a speculative cache (drafts > 0) advances by verify + commit")
        B = q.shape[0]
        _check_shapes(q, v, self.K, self.V)
        if out is None:
            out = torch.empty((B, self.HV, self.V), dtype=torch.float32, device=q.device)
        q, k, v, a, b = (t.contiguous() for t in (q, k, v, a, b))
        c, fargs, f_id = self._copies()
        skip = self._skip_flags(B)
        fresh = self.fresh if self.fresh is not None else self.ring_g
        heads = (self.HK, self.HV, self.K, self.V)
        fused = self.launch == "fused"
        if self.launch == "staged" and self.concurrent_flush and q.is_cuda:
            self._staged_concurrent(q, k, v, a, b, A_log, dt_bias, state_indices, out)
            return out
        if not fused:
            self._flush(q, k, v, a, b, A_log, dt_bias, state_indices, state_indices, out,
                        commit=False)
        if self.launch == "staged":
            self._staged(q, k, v, a, b, A_log, dt_bias, state_indices, out)
            return out
        if fused:
            bv, nw, tpp, ns = self.BV, self.num_warps, self.TPP, self.stages
            mr = self.maxnreg
        else:
            bv, nw, tpp, ns = self.out_BV, self.out_num_warps, self.out_TPP, self.out_stages
            mr = self.out_maxnreg
        self.compiled["replay"] = _replay_kernel[(self.HV * (self.V // bv) // tpp, B)](
            q, k, v, a, b, A_log, dt_bias, state_indices, skip, out, *c.kernel_args(), *fargs,
            self.ring_k, self.ring_v, self.ring_d, self.ring_g, self.ring_beta, self.ring_kk,
            self.counters.tickets, fresh, *self._part_scratch(B, fused),
            as_int32(self.seed), *heads, bv, tpp, ns,
            min(self.FB, bv), self.flush_stages, self.L, self.R, self.RP, self.LOG2RP, c.fmt_id,
            f_id, self.ring_id, fused, self.fresh is not None, self.dot,
            self.eager and tpp == 1, self.fast_encode, num_warps=nw, maxnreg=mr,
        )
        return out

    def _part_scratch(self, B: int, fused: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """The fused launch's buffers for an nvfp4 copy flushed in part-matrix programs:
        fp32 rows of every (batch row, v-head) matrix and its two sync words (zero
        between flushes; the kernel clears them).  Placeholders otherwise."""
        whole = "nvfp4" in (self.ckpt.fmt, self.read.fmt if self.read is not None else None)
        if not (fused and whole and self.BV < self.V):
            return self.ring_g, self._skip
        if self._pscratch is None or self._pscratch[1].shape[0] < B * self.HV * 2:
            dev = self.ring_g.device
            self._pscratch = (
                torch.empty(B * self.HV * self.V * self.K, dtype=torch.float32, device=dev),
                torch.zeros(B * self.HV * 2, dtype=torch.int32, device=dev))
        return self._pscratch

    def _staged_concurrent(self, q, k, v, a, b, A_log, dt_bias, state_indices, out) -> None:
        """The staged step with the flush launch on a second stream, beside the prep and
        output launches (a fork and a join; CUDA-graph capturable).  They touch
        disjoint rows -- a flushing row's programs of the other two do nothing -- and
        either may run first, so neither reads a clock the other advanced: the prep
        launch leaves the clocks alone, and a one-program launch on the flush's stream,
        behind the flush launch and an event recorded after the prep launch, advances
        them (:func:`clocks.advance_clocks_kernel`)."""
        self._flush_stream.step(
            q.device,
            lambda: self._prep_launch(q, k, a, b, A_log, dt_bias, state_indices,
                                      concurrent=True),
            lambda: self._out_launch(v, state_indices, out),
            lambda: self._flush(q, k, v, a, b, A_log, dt_bias, state_indices, state_indices,
                                out, commit=False),
            lambda: self._advance_clocks(state_indices))

    def _advance_clocks(self, state_indices) -> None:
        """The concurrent staged step's clock advance: on the flush's stream, behind the
        flush launch and the prep launch (:func:`clocks.advance_clocks_kernel`)."""
        B = state_indices.shape[0]
        self.compiled["advance"] = advance_clocks_kernel[(1,)](
            self.counters.tickets, state_indices, B, self.HK, _pow2_at_least(B, 256),
            num_warps=4)

    def _staged(self, q, k, v, a, b, A_log, dt_bias, state_indices, out,
                concurrent: bool = False) -> None:
        """The staged output step: the prep launch, then the output launch."""
        self._prep_launch(q, k, a, b, A_log, dt_bias, state_indices, concurrent)
        self._out_launch(v, state_indices, out)

    def _prep_launch(self, q, k, a, b, A_log, dt_bias, state_indices,
                     concurrent: bool = False) -> None:
        B = q.shape[0]
        if self._scratch[0].shape[0] < B:
            self._scratch = self._staged_scratch(B, q.device)
        pqk, pco, pn = self._scratch
        if self._mma == 1:
            pqk = pqk.view(torch.float16)
        self.compiled["prep"] = _prep_kernel[(self.HK, B)](
            q, k, a, b, A_log, dt_bias, state_indices, self.ring_k, self.ring_g, self.ring_beta,
            self.ring_kk, self.counters.tickets, pqk, pco, pn, self.HK, self.HV, self.K, self.L,
            self.R, self.RP, self.CW, _pow2_at_least(self.HV // self.HK, 1), self.ring_id,
            self.eager, CONC=concurrent, MMA=self._mma, num_warps=self.prep_num_warps,
            maxnreg=self.prep_maxnreg,
        )

    def _out_launch(self, v, state_indices, out) -> None:
        B = v.shape[0]
        pqk, pco, pn = self._scratch
        r = self.read if self.read is not None else self.ckpt
        bv, tpp = self.out_BV, self.out_TPP
        if self._mma == 1:
            pqk = pqk.view(torch.float16)
        self.compiled["out"] = _out_kernel[(self.HV * (self.V // bv) // tpp, B)](
            v, state_indices, out, *r.kernel_args(), self.ring_v, self.ring_d, pqk, pco, pn,
            self.HK, self.HV, self.K, self.V, bv, tpp, self.out_stages, self.R, self.RP, self.CW,
            r.fmt_id, self.ring_id, self._mma, num_warps=self.out_num_warps,
            maxnreg=self.out_maxnreg,
        )

    def _flush_scratch(self, programs: int, B: int) -> torch.Tensor | None:
        """fp32 rows of the scratch flush pass (None where it is not used): one
        ``(block_v, K)`` block per persistent program, or per unit of every slot."""
        whole = "nvfp4" in (self.ckpt.fmt, self.read.fmt if self.read is not None else "")
        if self.flush_pass != "scratch" or not whole or self.BV == self.FB:
            return None
        n = self.slots * self.HV * (self.V // self.BV) if self.flush_grid == "units" \
            else programs
        if self._fscratch is None or self._fscratch.numel() < n * self.BV * self.K:
            self._fscratch = torch.empty(n * self.BV * self.K, dtype=torch.float32,
                                         device=self.ring_g.device)
        return self._fscratch

    def _flush(self, q, k, v, a, b, A_log, dt_bias, state_indices, accepted, out,
               commit: bool) -> None:
        """The flush launch (returns at once where nothing flushes): persistent, or one
        program per unit (``flush_grid="units"``)."""
        B = state_indices.shape[0]
        c, fargs, f_id = self._copies()
        NU = self.V // self.BV
        units = B * self.HV * NU
        if self.flush_grid == "units":
            grid = (self.HV * NU, B)
        else:
            grid = (max(1, min(units, self.n_sm * self.flush_ctas_per_sm)),)
        scr = self._flush_scratch(grid[0], B)
        self.compiled["flush"] = _flush_kernel[grid](
            q, k, v, a, b, A_log, dt_bias, state_indices, accepted, self._skip_flags(B), out,
            *c.kernel_args(), *fargs, self.ring_k, self.ring_v, self.ring_g, self.ring_beta,
            self.ring_kk, self.counters.ring_len, self.counters.steps, self.counters.tickets,
            self.fresh if self.fresh is not None else self.ring_g,
            scr if scr is not None else self.ring_g, as_int32(self.seed), B,
            self.HK, self.HV, self.K, self.V, self.BV, self.FB, self.flush_stages, self.L, self.R,
            self.RP,
            self.LOG2RP, _pow2_at_least(B, 256), self.programs_per_slot, c.fmt_id, f_id,
            self.ring_id, self.fresh is not None, commit, self.dot, not self.flush_licm,
            self.flush_grid == "units", scr is not None, self.fast_encode,
            self.flush_prefetch if compiled_on(q.device) else 0,
            self.ckpt.rows_descriptor(self.FB) if self.flush_tma else None, self.flush_tma,
            self.hw_fp8 and compiled_on(q.device), self.num_warps == 1,
            num_warps=self.num_warps, maxnreg=self.maxnreg,
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
        if self.verify_launch.startswith("staged"):
            self._verify_staged(q, k, v, a, b, A_log, dt_bias, state_indices, out, r, T)
            return out
        _verify_kernel[(self.V // self.verify_BV, B * self.HV)](
            q.contiguous(), k.contiguous(), v.contiguous(), a.contiguous(), b.contiguous(),
            A_log, dt_bias, state_indices, out, *r.kernel_args(),
            self.ring_k, self.ring_v, self.ring_d, self.ring_g, self.ring_beta, self.ring_kk,
            self.counters.ring_len, T, self.HK, self.HV, self.K, self.V, self.verify_BV, self.R,
            self.RP, r.fmt_id, self.ring_id, self.verify_stages,
            num_warps=self.verify_num_warps, maxnreg=self.verify_maxnreg,
        )
        return out

    def _verify_staged(self, q, k, v, a, b, A_log, dt_bias, state_indices, out, r, T: int
                       ) -> None:
        """Verify as two launches: per (row, k-head) the drafts' products and
        coefficients, then one read of each tile for all drafts."""
        B = q.shape[0]
        dev = q.device
        if self._vscratch is None or self._vscratch[2].shape[0] < B or \
                self._vscratch[0].shape[0] < B * T:
            self._vscratch = (
                torch.zeros((B * T, self.HK, 2 * self.K), dtype=torch.float32, device=dev),
                torch.zeros((B * T, self.HV, self.CW), dtype=torch.float32, device=dev),
                torch.zeros((B,), dtype=torch.int32, device=dev))
        pqk, pco, pn = self._vscratch
        q, k, v, a, b = (t.contiguous() for t in (q, k, v, a, b))
        self.compiled["vprep"] = _vprep_kernel[(self.HK, B)](
            q, k, a, b, A_log, dt_bias, state_indices, self.ring_k, self.ring_g, self.ring_beta,
            self.ring_kk, self.counters.ring_len, pqk, pco, pn, T, _pow2_at_least(T, 2),
            self.HK, self.HV, self.K, self.R, self.RP, self.CW, self.ring_id,
            num_warps=self.prep_num_warps,
        )
        bv = self.verify_BV
        if self.verify_launch == "staged-dot":
            self.compiled["vout"] = _vout_mm_kernel[(self.HV * (self.V // bv), B)](
                v, state_indices, out, *r.kernel_args(), self.ring_v, self.ring_d, pqk, pco,
                pn, T, _pow2_at_least(T, 2), _pow2_at_least(2 * T, 16), self.HK, self.HV,
                self.K, self.V, bv, self.R, self.RP, self.CW, r.fmt_id, self.ring_id,
                num_warps=self.verify_num_warps, maxnreg=self.verify_maxnreg,
            )
            return
        self.compiled["vout"] = _vout_kernel[(self.HV * (self.V // bv), B)](
            v, state_indices, out, *r.kernel_args(), self.ring_v, self.ring_d, pqk, pco, pn,
            T, self.HK, self.HV, self.K, self.V, bv, self.R, self.RP, self.CW, r.fmt_id,
            self.ring_id, num_warps=self.verify_num_warps, maxnreg=self.verify_maxnreg,
        )

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
                   (self.ring_k, self.ring_v, self.ring_d, self.ring_g, self.ring_beta,
                    self.ring_kk))
        return {"checkpoint": self.ckpt.nbytes(),
                "read": self.read.nbytes() if self.read is not None else 0, "ring": ring}

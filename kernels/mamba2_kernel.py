"""The fused Mamba-2 replay kernel: one launch per decode step (each slot takes
the output path or the flush path on the device) and speculative verify.

Torch reference: ``precisionlab.layers.mamba2`` (``replay_output``, ``fold``,
``read_output``) driven as ``precisionlab.designs.TorchDesignRunner.step`` and
``precisionlab.speculative.SpeculativeDecoder.verify``.

Work split: one program per (batch row, ``HPP`` heads of one B/C group).  The
group's ring of B (and each draft's B.C) is loaded and reduced once per program;
the program then streams its heads' state in ``[BLOCK_P, N]`` tiles, issuing
the loads of tile q+1 before computing tile q, so each program keeps a tile in
flight instead of waiting on a chain of dependent loads.  The only load before
the first state tile is the slot index.

``ROW_SPLIT`` (small batches, where latency and not bandwidth decides): one
program per (batch row, head, ``BLOCK_P``-row tile), so a step has ``NPB`` times
more programs, each one tile deep; every load of its output path (the whole ring,
masked afterwards) is issued before the clock's value is used, and a flush folds
only the program's rows.  An nvfp4 copy's matrix amax needs every row: there each
program also keeps its fresh fp32 rows (beside a 16-bit checkpoint, the checkpoint's
stored values, its rounding drawn once) in a scratch of the head's matrix and posts its
amax (``tl_common.post_amax_part``), and the last of the head's programs to post
encodes the nvfp4 copies of all rows from the scratch.

Flushes go head by head in ``FB``-row chunks: ``S = exp(Lambda) S_c + (w x)^T B``
as one tensor-core ``tl.dot`` in tf32x3 (three-pass, ~fp32 accuracy, few
registers), then encoding: every row-scaled format (fp8 amax per row) is encoded
by the chunk that owns the row; nvfp4's per-matrix scale takes a first pass over
the head's chunks for its amax (recomputed from L1/L2-hot data: no extra HBM
traffic, no second launch, no grid barrier).

Counters: a plain cache advances a per-slot clock with one fire-and-forget atomic
per program (``k = clock // programs_per_slot`` is the step, ``k mod L`` the ring
position; see ``tl_common``), issued at the program's end behind a barrier: every
warp reads the clock at the start and uses it throughout, and without the barrier
a slow warp could read the value after its own program's increment (and, for the
slot's last program, compute the next step).  Speculative caches keep explicit ``ring_len`` /
``steps`` that only the commit kernel writes.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .compile_worker import settle_module_keys
from .tl_common import (
    decay_weights,
    dt_of,
    gate,
    post_amax_part,
    ring_decode,
    ring_load,
    ring_load_raw,
    ring_round,
    ring_store,
)
from .tl_formats import (
    K_NVFP4,
    decode_tile,
    flush_amax,
    is_16bit,
    load_codes,
    load_state,
    matrix_amax,
    store_state,
    stored_values,
    tile_offsets,
)
from .tl_mamba2_fast import store_fast, store_read_fast, store_rounded_fast, store_split_fast

MODE_STEP = 1
MODE_VERIFY = 2
K_MODE_STEP = tl.constexpr(MODE_STEP)
K_MODE_VERIFY = tl.constexpr(MODE_VERIFY)


@triton.jit
def _tile_rows(q, h0, H, NPB: tl.constexpr, BLOCK_P: tl.constexpr):
    """Head and headdim rows of output tile ``q`` of a program."""
    h = tl.minimum(h0 + q // NPB, H - 1)
    rows = (q % NPB) * BLOCK_P + tl.arange(0, BLOCK_P)
    return h, rows


@triton.jit
def _encode_posted(sync, amax, scr, ck_c, ck_s1, ck_s2, rd_c, rd_s1, rd_s2, mat, P, seed_ck,
                   seed_rd, step, CK_FMT: tl.constexpr, RD_FMT: tl.constexpr,
                   SPLIT: tl.constexpr, FB: tl.constexpr, N: tl.constexpr,
                   PARTS: tl.constexpr, NQH: tl.constexpr, HW_CVT: tl.constexpr,
                   ROUNDED: tl.constexpr = False):
    """Post this program's part of a head flushed by PARTS row-split programs
    (:func:`tl_common.post_amax_part`); the last of them encodes the nvfp4 copies of all
    P rows (NQH chunks) from the head's fp32 scratch ``scr`` (row ``p`` at ``scr + p * N``;
    ROUNDED: it holds a 16-bit checkpoint's stored values)."""
    last, amax_mat = post_amax_part(sync, amax, PARTS)
    if last:
        for qq in range(NQH):
            rows = qq * FB + tl.arange(0, FB)
            m = rows < P
            Sn = tl.load(scr + tile_offsets(rows, N), mask=m[:, None], other=0.0,
                         cache_modifier=".cg")
            if CK_FMT == K_NVFP4:
                store_fast(ck_c, ck_s1, ck_s2, Sn, mat, rows, m, P, seed_ck, step, amax_mat,
                           CK_FMT, FB, N, HW_CVT, True)
            if ROUNDED:
                store_fast(rd_c, rd_s1, rd_s2, Sn, mat, rows, m, P, seed_rd, step, amax_mat,
                           RD_FMT, FB, N, HW_CVT, True)
            elif SPLIT and (RD_FMT == K_NVFP4):
                store_read_fast(rd_c, rd_s1, rd_s2, Sn, mat, rows, m, P, seed_ck, seed_rd, step,
                                amax_mat, CK_FMT, RD_FMT, FB, N, HW_CVT, True)


@triton.jit
def head_consts(h, A_ptr, D_ptr, dtb_ptr, HAS_D: tl.constexpr, HAS_DT_BIAS: tl.constexpr):
    """Head ``h``'s ``A`` and, where given, ``D`` and ``dt_bias`` (else 0) in fp32."""
    A_h = tl.load(A_ptr + h).to(tl.float32)
    D_h = 0.0
    if HAS_D:
        D_h = tl.load(D_ptr + h).to(tl.float32)
    dtb = 0.0
    if HAS_DT_BIAS:
        dtb = tl.load(dtb_ptr + h).to(tl.float32)
    return A_h, D_h, dtb


@triton.jit
def tile_inputs(h, rows, m, ring_mask, rx_b, rdt_b, x_b, z_b, dt_b, A_ptr, D_ptr, dtb_ptr,
                offs_r, H, HP, P, RING: tl.constexpr, HAS_Z: tl.constexpr, HAS_D: tl.constexpr,
                HAS_DT_BIAS: tl.constexpr):
    """Head ``h``'s constants and the raw inputs of its output rows ``rows`` (mask
    ``m``): ring x rows and ring dt of entries ``ring_mask``, x, z (0 without z), dt.
    ``HP`` is ``H * P``, the ring's stride per entry."""
    rx = ring_load_raw(rx_b + h * P + offs_r[:, None] * HP + rows[None, :],
                       ring_mask[:, None] & m[None, :], RING)
    rdt = tl.load(rdt_b + h + offs_r * H, mask=ring_mask, other=0.0)
    x = tl.load(x_b + h * P + rows, mask=m, other=0.0)
    z = 0.0
    if HAS_Z:
        z = tl.load(z_b + h * P + rows, mask=m, other=0.0)
    dt_raw = tl.load(dt_b + h)
    A_h, D_h, dtb = head_consts(h, A_ptr, D_ptr, dtb_ptr, HAS_D, HAS_DT_BIAS)
    return A_h, D_h, dtb, rx, rdt, x, z, dt_raw


@triton.jit
def _fold_chunk(ck_c, ck_s1, ck_s2, s2_old, mat, rows, m, P, rx_h, HP, offs_r, n_ring, last, w,
                eB, x_cur, c_cur, CK_FMT: tl.constexpr, FB: tl.constexpr, N: tl.constexpr,
                RING: tl.constexpr, CUR: tl.constexpr):
    """Fresh fp32 state of ``FB`` rows: ``exp(Lambda) S_c + sum_i (w_i x_i) B_i^T`` over
    ring entries ``[0, n_ring)`` (and entry ``c_cur`` = ``x_cur`` when ``CUR``).  An nvfp4
    checkpoint is decoded with ``s2_old``, its matrix scale read before the flush
    rewrote any chunk (a later chunk must not see the new scale)."""
    if CK_FMT == K_NVFP4:
        codes, s1, s2 = load_codes(ck_c, ck_s1, ck_s2, mat, rows, m, P, CK_FMT, FB, N)
        S = tl.where(m[:, None], decode_tile(codes, s1, s2_old, CK_FMT, FB, N), 0.0)
    else:
        S = load_state(ck_c, ck_s1, ck_s2, mat, rows, m, P, CK_FMT, FB, N)
    mr = offs_r < n_ring
    ex = ring_load(rx_h + offs_r[:, None] * HP + rows[None, :], mr[:, None] & m[None, :], RING)
    if CUR:
        ex = tl.where((offs_r == c_cur)[:, None], ring_round(x_cur, RING)[None, :], ex)
    upd = tl.dot(tl.trans(ex * w[:, None]), eB, input_precision="tf32x3")
    # an explicit fma: the nvfp4 amax pass and the encode pass must get the same bits
    decay = tl.zeros([FB, N], tl.float32) + tl.exp(last)
    return tl.where(m[:, None], tl.fma(S, decay, upd), 0.0)


@triton.jit
def fold_committed(ck_c, ck_s1, ck_s2, rd_c, rd_s1, rd_s2, fresh_ptr, mat, P, rx_h, HP, offs_r,
                   c, last, w, rB, seed_ck, seed_rd, step, CK_FMT: tl.constexpr,
                   RD_FMT: tl.constexpr, FB: tl.constexpr, NQ: tl.constexpr, N: tl.constexpr,
                   RING: tl.constexpr, SPLIT: tl.constexpr, NEED_AMAX: tl.constexpr,
                   WRITE_FRESH: tl.constexpr):
    """Fold ring entries ``0..c-1`` (weights ``last``, ``w``) into the checkpoint of
    matrix ``mat`` in ``NQ`` chunks of ``FB`` rows and write the checkpoint, the read
    copy (SPLIT) and the fp32 state (WRITE_FRESH) with SR step ``step``: the flush a
    verify does before drafts would overrun the window.  nvfp4 takes a first pass for
    the matrix amax; an nvfp4 checkpoint decodes with its scale from before the flush."""
    s2_old = 0.0
    if CK_FMT == K_NVFP4:
        s2_old = tl.load(ck_s2 + mat)
    amax = 0.0
    if NEED_AMAX:
        for qq in range(NQ):
            rows = qq * FB + tl.arange(0, FB)
            Sn = _fold_chunk(ck_c, ck_s1, ck_s2, s2_old, mat, rows, rows < P, P, rx_h, HP,
                             offs_r, c, last, w, rB, 0.0, 0, CK_FMT, FB, N, RING, False)
            amax = tl.maximum(amax, flush_amax(Sn, mat, rows, P, seed_ck, step, CK_FMT,
                                               RD_FMT, FB, N))
    for qq in range(NQ):
        rows = qq * FB + tl.arange(0, FB)
        m = rows < P
        Sn = _fold_chunk(ck_c, ck_s1, ck_s2, s2_old, mat, rows, m, P, rx_h, HP, offs_r, c,
                         last, w, rB, 0.0, 0, CK_FMT, FB, N, RING, False)
        Sc = store_state(ck_c, ck_s1, ck_s2, Sn, mat, rows, m, P, seed_ck, step, amax, CK_FMT,
                         FB, N)
        if SPLIT:  # the read copy of the checkpoint's stored values
            store_state(rd_c, rd_s1, rd_s2, Sc, mat, rows, m, P, seed_rd, step, amax, RD_FMT,
                        FB, N)
        if WRITE_FRESH:
            tl.store(fresh_ptr + mat * P * N + tile_offsets(rows, N), Sn, mask=m[:, None])


@triton.jit(do_not_specialize=["seed_ck", "seed_rd"])
def mamba2_kernel(
    ck_c, ck_s1, ck_s2, rd_c, rd_s1, rd_s2, fresh_ptr,
    ring_x, ring_B, ring_dt, ring_len, steps, tickets, state_idx,
    x_ptr, dt_ptr, B_ptr, C_ptr, z_ptr, out_ptr, A_ptr, D_ptr, dtb_ptr, scr_ptr, sync_ptr,
    seed_ck, seed_rd,
    s_xb, s_xt, s_dtb, s_dtt, s_Bb, s_Bt, s_Cb, s_Ct, s_zb, s_zt, s_ob, s_ot,
    H, G, P, L, LR,
    N: tl.constexpr, BLOCK_P: tl.constexpr, NPB: tl.constexpr, HPP: tl.constexpr,
    NT: tl.constexpr, FB: tl.constexpr, NQ: tl.constexpr, RB: tl.constexpr, T: tl.constexpr,
    TB: tl.constexpr,
    MODE: tl.constexpr, CK_FMT: tl.constexpr, RD_FMT: tl.constexpr, SPLIT: tl.constexpr,
    RING: tl.constexpr, HAS_Z: tl.constexpr, HAS_D: tl.constexpr, HAS_DT_BIAS: tl.constexpr,
    DT_SOFTPLUS: tl.constexpr, WRITE_FRESH: tl.constexpr, NEED_AMAX: tl.constexpr,
    OUT_ONLY: tl.constexpr = False, ROW_SPLIT: tl.constexpr = False,
    HW_CVT: tl.constexpr = False, NQH: tl.constexpr = 0,
):
    b = tl.program_id(1).to(tl.int64)
    if ROW_SPLIT:  # a program per (head, BLOCK_P-row tile): tile q0 of head h0
        h0 = tl.program_id(0) // NPB
        q0 = tl.program_id(0) % NPB
    else:
        h0 = tl.program_id(0) * HPP
        q0 = 0
    hpg = H // G
    g = h0 // hpg
    offs_n = tl.arange(0, N)
    offs_r = tl.arange(0, RB)
    x_b = x_ptr + b * s_xb
    z_b = z_ptr + b * s_zb
    out_b = out_ptr + b * s_ob
    dt_b = dt_ptr + b * s_dtb
    B_b = B_ptr + b * s_Bb + g * N
    C_b = C_ptr + b * s_Cb + g * N
    HP = H * P

    slot = tl.load(state_idx + b)
    if slot < 0:  # padding row: zero outputs, no state
        for q in range(NT):
            h, rows = _tile_rows(q0 + q, h0, H, NPB, BLOCK_P)
            for k in tl.static_range(T):
                tl.store(out_b + k * s_ot + h * P + rows, 0.0, mask=rows < P)
        return
    mat0 = slot.to(tl.int64) * H
    # first state tile of the output path (raw codes): depends on the slot only (and,
    # in a split step's output launch, on the row's position: none at its flush)
    h_0, rows_0 = _tile_rows(q0, h0, H, NPB, BLOCK_P)
    m_0 = rows_0 < P
    if OUT_ONLY:  # output launch of a split step: ring_len holds pos[row]
        c_out = tl.load(ring_len + b)
        m_0 = m_0 & (c_out != L - 1)
    cc, cs1, cs2 = load_codes(rd_c, rd_s1, rd_s2, mat0 + h_0, rows_0, m_0, P, RD_FMT,
                              BLOCK_P, N)

    if MODE == K_MODE_STEP:
        if OUT_ONLY:
            c = c_out
            t = 0
        else:
            clock = tl.load(tickets + slot)  # advanced at the program's end, after a barrier
            if ROW_SPLIT:
                k_step = clock // ((H // HPP) * NPB)
            else:
                k_step = clock // (H // HPP)
            c = k_step % L
            t = k_step
        half = 0
    else:
        rl = tl.load(ring_len + slot)
        c = rl & 0xFFFF
        half = rl >> 16
        t = tl.load(steps + slot)
    win = slot.to(tl.int64) * LR + half * L  # first ring row of this window
    rx_b = ring_x + win * HP
    rB_b = ring_B + (win * G + g) * N
    rdt_b = ring_dt + win * H
    oB = offs_r[:, None] * (G * N) + offs_n[None, :]

    if MODE == K_MODE_STEP:
        # ======================= replay step ====================================
        B_t = ring_round(tl.load(B_b + offs_n).to(tl.float32), RING)
        C_t = tl.load(C_b + offs_n).to(tl.float32)
        if ROW_SPLIT:
            # latency (small batches): the output path's loads are all issued before
            # the clock's value is needed (whole ring, masked afterwards)
            full = offs_r < L
            rB = ring_load(rB_b + oB, full[:, None], RING)
            A_h, D_h, dtb, rx, rdt, x, z, dt_raw = tile_inputs(
                h_0, rows_0, rows_0 < P, full, rx_b, rdt_b, x_b, z_b, dt_b, A_ptr, D_ptr,
                dtb_ptr, offs_r, H, HP, P, RING, HAS_Z, HAS_D, HAS_DT_BIAS)
            mr = offs_r < c
            rB = tl.where(mr[:, None], rB, 0.0)
            rx = tl.where(mr[:, None], rx, tl.zeros_like(rx))
            rdt = tl.where(mr, rdt, 0.0)
        else:
            rB = ring_load(rB_b + oB, (offs_r < c)[:, None], RING)
        eB = tl.where((offs_r == c)[:, None], B_t[None, :], rB)
        if c + 1 >= L:
            # ---- flush: fold all L entries, write checkpoint (+ read copy) -------
            # rows from r0 (a row-split program's own rows).  nvfp4 needs the whole
            # head's amax: a whole-head program takes a first pass for it; row-split
            # programs post theirs and the head's last one encodes the copies
            PARTS: tl.constexpr = NPB if NEED_AMAX and ROW_SPLIT else 0
            # (PARTS, a 16-bit checkpoint beside an nvfp4 copy: its rounding drawn once,
            # for its store, the amax and the scratch the copy encodes)
            RCK: tl.constexpr = ((PARTS > 0) and SPLIT and (RD_FMT == K_NVFP4)
                                 and is_16bit(CK_FMT))
            r0 = q0 * BLOCK_P
            for hh in range(HPP * (1 - OUT_ONLY)):  # (the split flush launch did it)
                h = h0 + hh
                mat = mat0 + h
                A_h, D_h, dtb = head_consts(h, A_ptr, D_ptr, dtb_ptr, HAS_D, HAS_DT_BIAS)
                dt_h = dt_of(tl.load(dt_b + h), dtb, HAS_DT_BIAS, DT_SOFTPLUS)
                rdt = tl.load(rdt_b + h + offs_r * H, mask=offs_r < c, other=0.0)
                edt = tl.where(offs_r == c, dt_h, rdt)
                last, w = decay_weights(edt, tl.cumsum(edt * A_h, axis=0), offs_r, c)
                s2_old = 0.0
                if CK_FMT == K_NVFP4:
                    s2_old = tl.load(ck_s2 + mat)
                amax = 0.0
                if NEED_AMAX and not ROW_SPLIT:  # nvfp4 matrix scale: the head's amax
                    for qq in range(NQ):
                        rows = qq * FB + tl.arange(0, FB)
                        m = rows < P
                        x_c = tl.load(x_b + h * P + rows, mask=m, other=0.0).to(tl.float32)
                        Sn = _fold_chunk(ck_c, ck_s1, ck_s2, s2_old, mat, rows, m, P,
                                         rx_b + h * P, HP, offs_r, c, last, w, eB, x_c, c,
                                         CK_FMT, FB, N, RING, True)
                        amax = tl.maximum(amax, flush_amax(Sn, mat, rows, P, seed_ck, t,
                                                           CK_FMT, RD_FMT, FB, N))
                for qq in range(NQ):
                    rows = r0 + qq * FB + tl.arange(0, FB)
                    m = rows < P
                    x_c = tl.load(x_b + h * P + rows, mask=m, other=0.0).to(tl.float32)
                    Sn = _fold_chunk(ck_c, ck_s1, ck_s2, s2_old, mat, rows, m, P,
                                     rx_b + h * P, HP, offs_r, c, last, w, eB, x_c, c,
                                     CK_FMT, FB, N, RING, True)
                    y = tl.sum(Sn * C_t[None, :], axis=1)
                    z_c = 0.0
                    if HAS_Z:
                        z_c = tl.load(z_b + h * P + rows, mask=m, other=0.0).to(tl.float32)
                    tl.store(out_b + h * P + rows, gate(y, x_c, z_c, D_h, HAS_Z), mask=m)
                    # the division-free encoders (same bits as tl_formats'); with
                    # PARTS the nvfp4 copies wait for the head's amax
                    W_CK: tl.constexpr = (PARTS == 0) or (CK_FMT != K_NVFP4)
                    W_RD: tl.constexpr = SPLIT and ((PARTS == 0) or (RD_FMT != K_NVFP4))
                    Sr = Sn
                    if RCK:
                        Sr = stored_values(Sn, mat, rows, P, seed_ck, t, CK_FMT, FB, N)
                        store_rounded_fast(ck_c, ck_s1, ck_s2, Sr, mat, rows, m, P, CK_FMT, FB,
                                           N)
                    elif W_CK and W_RD:
                        store_split_fast(ck_c, ck_s1, ck_s2, rd_c, rd_s1, rd_s2, Sn, mat, rows,
                                         m, P, seed_ck, seed_rd, t, amax, CK_FMT, RD_FMT, FB,
                                         N, HW_CVT, True)
                    elif W_CK:
                        store_fast(ck_c, ck_s1, ck_s2, Sn, mat, rows, m, P, seed_ck, t,
                                   amax, CK_FMT, FB, N, HW_CVT, True)
                    elif W_RD:
                        store_read_fast(rd_c, rd_s1, rd_s2, Sn, mat, rows, m, P, seed_ck,
                                        seed_rd, t, amax, CK_FMT, RD_FMT, FB, N, HW_CVT, True)
                    if WRITE_FRESH:
                        tl.store(fresh_ptr + mat * P * N + tile_offsets(rows, N), Sn,
                                 mask=m[:, None])
                    if RCK:  # (masked rows are 0)
                        amax = tl.maximum(amax, matrix_amax(Sr))
                    elif PARTS > 0:
                        amax = tl.maximum(amax, flush_amax(  # (masked rows are 0)
                            Sn, mat, rows, P, seed_ck, t, CK_FMT, RD_FMT, FB, N))
                    if PARTS > 0:
                        tl.store(scr_ptr + (b * H + h) * P * N + tile_offsets(rows, N), Sr,
                                 mask=m[:, None])
                if PARTS > 0:
                    _encode_posted(sync_ptr + (b * H + h) * 2, amax,
                                   scr_ptr + (b * H + h) * P * N, ck_c, ck_s1, ck_s2, rd_c,
                                   rd_s1, rd_s2, mat, P, seed_ck, seed_rd, t, CK_FMT,
                                   RD_FMT, SPLIT, FB, N, PARTS, NQH, HW_CVT, RCK)
        else:
            # ---- output: y = exp(L) S_read C + sum_i w_i (B_i.C) x_i + D x --------
            BC = tl.sum(eB * C_t[None, :], axis=1)
            mr = offs_r < c
            if not ROW_SPLIT:  # (loaded above when ROW_SPLIT)
                # small inputs of tile 0; tile q+1's raw loads are issued before tile q
                # is computed and converted only when used, so the prefetch never stalls
                A_h, D_h, dtb, rx, rdt, x, z, dt_raw = tile_inputs(
                    h_0, rows_0, rows_0 < P, mr, rx_b, rdt_b, x_b, z_b, dt_b, A_ptr, D_ptr,
                    dtb_ptr, offs_r, H, HP, P, RING, HAS_Z, HAS_D, HAS_DT_BIAS)
            for q in range(NT):
                h, rows = _tile_rows(q0 + q, h0, H, NPB, BLOCK_P)
                m = rows < P
                # ---- prefetch tile q + 1 (raw)
                h2, rows2 = _tile_rows(q0 + q + 1, h0, H, NPB, BLOCK_P)
                m2 = (rows2 < P) & (q + 1 < NT)
                cc2, cs12, cs22 = load_codes(rd_c, rd_s1, rd_s2, mat0 + h2, rows2, m2, P, RD_FMT,
                                             BLOCK_P, N)
                A2, D2, dtb2, rx2, rdt2, x2, z2, dt_raw2 = tile_inputs(
                    h2, rows2, m2, mr, rx_b, rdt_b, x_b, z_b, dt_b, A_ptr, D_ptr, dtb_ptr,
                    offs_r, H, HP, P, RING, HAS_Z, HAS_D, HAS_DT_BIAS)
                # ---- compute tile q
                S = decode_tile(cc, cs1, cs2, RD_FMT, BLOCK_P, N)  # masked rows decode to 0
                dt = dt_of(dt_raw, dtb, HAS_DT_BIAS, DT_SOFTPLUS)
                edt = tl.where(offs_r == c, dt, rdt)
                last, w = decay_weights(edt, tl.cumsum(edt * A_h, axis=0), offs_r, c)
                xf = x.to(tl.float32)
                xr = ring_round(xf, RING)
                ex = tl.where((offs_r == c)[:, None], xr[None, :], ring_decode(rx, RING))
                y = tl.exp(last) * tl.sum(S * C_t[None, :], axis=1)
                y = y + tl.sum((w * BC)[:, None] * ex, axis=0)
                tl.store(out_b + h * P + rows, gate(y, xf, z.to(tl.float32), D_h, HAS_Z), mask=m)
                ring_store(rx_b + c * HP + h * P + rows, xr, m, RING)
                if (q0 + q) % NPB == 0:
                    tl.store(rdt_b + c * H + h, dt)
                cc, cs1, cs2, rx, rdt, x, z, dt_raw = cc2, cs12, cs22, rx2, rdt2, x2, z2, dt_raw2
                A_h, D_h, dtb = A2, D2, dtb2
            if ROW_SPLIT:
                first = (h0 % hpg == 0) & (q0 == 0)
            else:
                first = h0 % hpg == 0
            if first:
                ring_store(rB_b + c * (G * N) + offs_n, B_t, offs_n < N, RING)
        if OUT_ONLY:  # split step: the clock counts steps, nobody here reads it
            if tl.program_id(0) == 0:
                tl.atomic_add(tickets + slot, 1, sem="relaxed")
        else:
            # every warp of the program has read (and used) the clock: only now advance
            # it, so no warp can see this program's own increment
            tl.debug_barrier()
            tl.atomic_add(tickets + slot, 1, sem="relaxed")
    else:
        # ======================= speculative verify =============================
        if c + T > L:  # fold the committed entries first (they fill the window)
            rB = ring_load(rB_b + oB, (offs_r < c)[:, None], RING)
            for hh in range(HPP):
                h = h0 + hh
                mat = mat0 + h
                A_h, D_h, dtb = head_consts(h, A_ptr, D_ptr, dtb_ptr, HAS_D, HAS_DT_BIAS)
                rdt = tl.load(rdt_b + h + offs_r * H, mask=offs_r < c, other=0.0)
                last, w = decay_weights(rdt, tl.cumsum(rdt * A_h, axis=0), offs_r, c - 1)
                fold_committed(ck_c, ck_s1, ck_s2, rd_c, rd_s1, rd_s2, fresh_ptr, mat, P,
                               rx_b + h * P, HP, offs_r, c, last, w, rB, seed_ck, seed_rd,
                               t - 1, CK_FMT, RD_FMT, FB, NQ, N, RING, SPLIT, NEED_AMAX,
                               WRITE_FRESH)
            tl.debug_barrier()  # the drafts below read the copy just written
            cc, cs1, cs2 = load_codes(rd_c, rd_s1, rd_s2, mat0 + h_0, rows_0, rows_0 < P, P,
                                      RD_FMT, BLOCK_P, N)
            c0 = c * 0
            half = 1 - half  # drafts go to the other ring half
        else:
            c0 = c
        win = slot.to(tl.int64) * LR + half * L
        rx_b = ring_x + win * HP
        rB_b = ring_B + (win * G + g) * N
        rdt_b = ring_dt + win * H
        # committed entries [0, c0) from the ring, drafts at [c0, c0 + T)
        old = offs_r < c0
        j = offs_r - c0
        vd = (j >= 0) & (j < T)
        jj = tl.where(vd, j, 0)
        rB = ring_load(rB_b + oB, old[:, None], RING)
        iB = tl.load(B_b + jj[:, None] * s_Bt + offs_n[None, :], mask=vd[:, None], other=0.0)
        iB = ring_round(iB.to(tl.float32), RING)
        eB = tl.where(old[:, None], rB, iB)
        offs_t = tl.arange(0, TB)
        BCm = tl.zeros([TB, RB], tl.float32)
        for k in tl.static_range(T):
            C_k = tl.load(C_b + k * s_Ct + offs_n).to(tl.float32)
            BCk = tl.sum(eB * C_k[None, :], axis=1)
            BCm = tl.where((offs_t == k)[:, None], BCk[None, :], BCm)
        if h0 % hpg == 0:
            ring_store(rB_b + oB, iB, vd[:, None], RING)
        for q in range(NT):
            h, rows = _tile_rows(q, h0, H, NPB, BLOCK_P)
            m = rows < P
            A_h, D_h, dtb = head_consts(h, A_ptr, D_ptr, dtb_ptr, HAS_D, HAS_DT_BIAS)
            rx = ring_load(rx_b + h * P + offs_r[:, None] * HP + rows[None, :],
                           old[:, None] & m[None, :], RING)
            ix = tl.load(x_b + jj[:, None] * s_xt + h * P + rows[None, :],
                         mask=vd[:, None] & m[None, :], other=0.0).to(tl.float32)
            ix = ring_round(ix, RING)
            rdt = tl.load(rdt_b + h + offs_r * H, mask=old, other=0.0)
            idt = dt_of(tl.load(dt_b + jj * s_dtt + h, mask=vd, other=0.0), dtb, HAS_DT_BIAS,
                        DT_SOFTPLUS)
            # prefetch the next state tile
            h2, rows2 = _tile_rows(q + 1, h0, H, NPB, BLOCK_P)
            m2 = (rows2 < P) & (q + 1 < NT)
            cc2, cs12, cs22 = load_codes(rd_c, rd_s1, rd_s2, mat0 + h2, rows2, m2, P, RD_FMT,
                                         BLOCK_P, N)
            S = decode_tile(cc, cs1, cs2, RD_FMT, BLOCK_P, N)
            ex = tl.where(old[:, None], rx, ix)
            edt = tl.where(old, rdt, tl.where(vd, idt, 0.0))
            cum = tl.cumsum(edt * A_h, axis=0)
            for k in tl.static_range(T):
                last, w = decay_weights(edt, cum, offs_r, c0 + k)
                BCk = tl.sum(tl.where((offs_t == k)[:, None], BCm, 0.0), axis=0)
                C_k = tl.load(C_b + k * s_Ct + offs_n).to(tl.float32)
                x_k = tl.load(x_b + k * s_xt + h * P + rows, mask=m, other=0.0).to(tl.float32)
                y = tl.exp(last) * tl.sum(S * C_k[None, :], axis=1)
                y = y + tl.sum((w * BCk)[:, None] * ex, axis=0)
                z_k = 0.0
                if HAS_Z:
                    z_k = tl.load(z_b + k * s_zt + h * P + rows, mask=m, other=0.0)
                    z_k = z_k.to(tl.float32)
                tl.store(out_b + k * s_ot + h * P + rows, gate(y, x_k, z_k, D_h, HAS_Z), mask=m)
            # the drafts go into the ring behind the commit pointer
            ring_store(rx_b + offs_r[:, None] * HP + h * P + rows[None, :], ix,
                       vd[:, None] & m[None, :], RING)
            if q % NPB == 0:
                tl.store(rdt_b + offs_r * H + h, idt, mask=vd)
            cc, cs1, cs2 = cc2, cs12, cs22


settle_module_keys(__name__)  # every process looks its kernels up under one key

"""Split-launch Mamba-2 replay step: a persistent flush launch, then a light output
launch (the large-batch path of :func:`precisionlab.kernels.mamba2_step.mamba2_step`).

Torch reference: ``precisionlab.layers.mamba2`` (``replay_output``, ``fold``,
``read_output``) driven as ``precisionlab.designs.TorchDesignRunner.step`` -- the
same arithmetic as the one-launch kernel of ``mamba2_kernel``.

**Counters.**  A split cache's clock ``tickets[slot]`` is the slot's step count
itself.  The flush launch runs first: every program reads the clocks of all batch
rows (one vector load), program 0 writes each row's ring position ``pos[b] =
tickets mod L`` (-1 for padding rows), and the rows at position ``L - 1`` flush.
The output launch reads ``pos[b]`` (never the clock) and program 0 of each row adds
1 to the clock (fire and forget).  Only one program ever writes a clock and no
program of that launch reads it, so there is no read/increment race; no host
synchronisation, CUDA-graph capturable.

**Concurrent flush** (``SplitConfig.concurrent_flush``, "heads" output with the
weights launch): the flush launch runs on a second stream beside the weights and
output launches, which touch other rows.  Either stream may run first, so no launch
of the step may advance a clock: the weights launch writes ``pos``, the output launch
leaves the clocks, and :func:`clocks.advance_clocks_kernel`, on the flush's stream
behind the flush launch and an event recorded after the weights launch, advances
them.

**Flush launch** (persistent: ``programs`` CTAs): units are (flushing row, head,
block of ``FB * NQ`` rows), taken every ``programs``-th; with nothing to flush a
program returns after its two vector loads.  A unit folds its rows in ``FB``-row
chunks: ``S = e^Lambda S_c + (w x)^T B`` (tensor cores: ``fold_dot``), writes the
step's output, the checkpoint, the read copy (and the fp32 state when kept).  nvfp4
needs the whole matrix's amax: its units are whole heads folded twice (amax pass,
then the encode pass from L2-hot data; an nvfp4 checkpoint is decoded with the
matrix scale read before its first chunk is rewritten).  ``FAST_ENC``
(``SplitConfig.flush_encoder="fast"``, the default) encodes nvfp4 with
``tl_mamba2_fast.nvfp4_encode_fast`` (same bits, fewer instructions) and, when a
chunk holds the whole head (``flush_rows >= headdim``), folds it once.  ``PF``
(``SplitConfig.flush_prefetch``, compiled code only): every chunk first asks the L2 for
the chunk ``PF`` ahead (into the program's next unit); ``EV`` (``evict_first``): the
copies' stores evict first from L2; ``TMA`` (``flush_tma``): a dense checkpoint's
chunks are loaded through a tensor descriptor (on Hopper, bulk copies into shared
memory that the chunk loop's pipeline issues ahead, holding no registers).

**Output launch** (``SplitConfig.out_kernel``): rows that flush this step load
nothing; the step's ring appends (x rows, dt per head, B per group) happen here.

* "heads" (:func:`m2_out_heads_kernel`, the default for 1-byte and 4-bit copies):
  grid ``(H / HPP, batch)``; per head (a ``tl.range(num_stages=NS)`` loop) one
  coefficient per ring entry (the decay weight times ``B_i . C``), loaded from
  :func:`m2_weights_kernel` (a launch before it; ``SplitConfig.out_weights="launch"``)
  or computed by the program, then the head's ``NPB`` tiles unrolled: the
  packed-domain row dot ``S C`` (``tl_mamba2_fast.row_dot``), the ring's x rows, the
  gate; with ``PFO`` (``out_prefetch``) a program ends by asking the L2 for the rows
  of the program ``PFO`` launches later.  With ``PAIRS`` (``out_pairs``) a program
  takes two heads whose rows, one run of tiles, fill every tile (headdim 80 in 32-row
  tiles), the tile they share taking each row's weights from its own head; with
  ``AHEAD`` (``out_ahead``) the unrolled run's loads go one or two tiles ahead, with
  ``LOOP`` (``out_pair_loop``, the default for 4-bit copies) the run is a pipelined
  loop whose tile loads are asynchronous copies issued ``NS - 1`` tiles ahead.  One-warp
  programs: the H200 sweeps showed the tile loop issue-bound, and the per-row and
  per-entry vector work of a 4-warp program is repeated by every warp.
* "tiles" (:func:`m2_out_kernel`): grid ``(H * NPB / TPP, batch)``, a pipelined loop
  over ``TPP`` tiles (per-head work per tile).
* "group" (the default for fp32 / 16-bit copies): the one-launch kernel of
  ``mamba2_kernel`` with ``OUT_ONLY`` (its flush branch compiled out, one tile
  prefetched in registers).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .compile_worker import settle_module_keys
from .mamba2_kernel import head_consts, tile_inputs
from .tl_common import (
    K_RING_FP32,
    at_flushing_row,
    batch_slots,
    decay_weights,
    dt_of,
    first_unit,
    flushing_rows,
    gate,
    next_unit,
    ring_decode,
    ring_load,
    ring_round,
    ring_store,
    units_done,
)
from .tl_formats import (
    K_FP8,
    K_MXFP4,
    K_NVFP4,
    decode_tile,
    flush_amax,
    is_16bit,
    load_codes,
    matrix_amax,
    stored_values,
    tile_offsets,
)
from .tl_mamba2_fast import (
    TWO63,
    fold_dot,
    row_dot,
    store_fast,
    store_read_fast,
    store_rounded_fast,
    store_split_fast,
)
from .tl_prefetch import l2_prefetch_lines, l2_prefetch_rows


@triton.jit
def _fold(ck_c, ck_s1, ck_s2, s2_old, mat, rows, m, P, rx_h, HP, offs_r, c, w, decay, eB,
          x_cur, CK_FMT: tl.constexpr, FB: tl.constexpr, N: tl.constexpr, RING: tl.constexpr,
          ZERO_PAD: tl.constexpr, ck_desc=None, row0=0, TMA: tl.constexpr = False):
    """Fresh fp32 state of rows ``rows``: ``decay S_c + sum_i (w_i x_i) B_i^T`` over ring
    entries ``[0, c)`` and this step's ``x_cur`` at entry ``c``.  An nvfp4 checkpoint is
    decoded with ``s2_old`` (its matrix scale before this flush).  ``ZERO_PAD`` (a
    matrix amax follows): rows past ``P`` are exactly zero; otherwise they are whatever
    the masked loads give (zeros, unless B is not finite) and are never stored.  ``TMA``
    (a dense checkpoint, headdim a multiple of FB): the checkpoint rows come through
    the tensor descriptor ``ck_desc`` (rows of all matrices, ``(slots * H * P, N)``)
    from row ``row0`` of the matrix."""
    if TMA:
        codes = ck_desc.load([(mat * P + row0).to(tl.int32), 0])
        s1 = 0.0
        s2 = 0.0
    else:
        codes, s1, s2 = load_codes(ck_c, ck_s1, ck_s2, mat, rows, m, P, CK_FMT, FB, N)
    if CK_FMT == K_NVFP4:
        s2 = s2_old
    S = decode_tile(codes, s1, s2, CK_FMT, FB, N)
    if ZERO_PAD:  # (without: masked loads already give zero codes and scales)
        S = tl.where(m[:, None], S, 0.0)
    ex = ring_load(rx_h + offs_r[:, None] * HP + rows[None, :],
                   (offs_r < c)[:, None] & m[None, :], RING)
    ex = tl.where((offs_r == c)[:, None], ring_round(x_cur, RING)[None, :], ex)
    # explicit splits (fold_dot): an nvfp4 flush computes its rows twice, same bits
    Sn = fold_dot(tl.trans(ex), w, eB, S * decay, RING != K_RING_FP32)
    if ZERO_PAD:
        Sn = tl.where(m[:, None], Sn, 0.0)
    return Sn


@triton.jit
def _chunk(ck_c, ck_s1, ck_s2, s2_old, mat, r0, q, P, x_h, rx_h, HP, offs_r, c, w, decay, eB,
           CK_FMT: tl.constexpr, FB: tl.constexpr, N: tl.constexpr, RING: tl.constexpr,
           ZERO_PAD: tl.constexpr, ck_desc=None, TMA: tl.constexpr = False):
    """Chunk ``q`` of a flush unit starting at row ``r0``: its rows, their mask, this
    step's x and the fresh fp32 rows (:func:`_fold`)."""
    rows = r0 + q * FB + tl.arange(0, FB)
    m = rows < P
    x_c = tl.load(x_h + rows, mask=m, other=0.0).to(tl.float32)
    Sn = _fold(ck_c, ck_s1, ck_s2, s2_old, mat, rows, m, P, rx_h, HP, offs_r, c, w, decay, eB,
               x_c, CK_FMT, FB, N, RING, ZERO_PAD, ck_desc, r0 + q * FB, TMA)
    return rows, m, x_c, Sn


@triton.jit
def _prefetch_chunk(ck_c, rx_h, x_h, z_h, mat, row, P, HP, offs_r, c, CK_FMT: tl.constexpr,
                    FB: tl.constexpr, N: tl.constexpr, HAS_Z: tl.constexpr):
    """L2 prefetch of what the flush chunk of rows ``[row, row + FB)`` of matrix ``mat``
    will load: its checkpoint rows (one bulk prefetch; rows past ``P`` are left out),
    its ring entries ``[0, c)`` of x, this step's x and gate rows."""
    l2_prefetch_rows(ck_c, mat, row, P, FB, CK_FMT, N)
    row = tl.minimum(row, P - 1)
    u8: tl.constexpr = tl.pointer_type(tl.uint8)
    l2_prefetch_lines(tl.where(offs_r < c, (rx_h + offs_r * HP + row).to(u8),
                               (x_h + row + offs_r * 0).to(u8)))
    if HAS_Z:
        l2_prefetch_lines(z_h + row + tl.zeros([1], tl.int32))


@triton.jit
def _write_copies(Sn, ck_c, ck_s1, ck_s2, rd_c, rd_s1, rd_s2, fresh_ptr, mat, rows, m, P,
                  seed_ck, seed_rd, t, amax, CK_FMT: tl.constexpr, RD_FMT: tl.constexpr,
                  FB: tl.constexpr, N: tl.constexpr, HW_CVT: tl.constexpr,
                  FAST_ENC: tl.constexpr, ONE_PASS: tl.constexpr, W_CK: tl.constexpr,
                  W_RD: tl.constexpr, W_FRESH: tl.constexpr, EVICT: tl.constexpr = False,
                  Sr=None, ROUNDED: tl.constexpr = False):
    """Store fresh rows: the checkpoint (``W_CK``), the read copy of its stored values
    (``W_RD``), the fp32 state (``W_FRESH``); ``EVICT``: the copies' stores evict first
    from L2.  ROUNDED (a 16-bit checkpoint): ``Sr`` holds the checkpoint's stored values
    already (``tl_formats.stored_values``), and both copies are stored from them with no
    second draw of the rounding."""
    if ROUNDED:
        if W_CK:
            store_rounded_fast(ck_c, ck_s1, ck_s2, Sr, mat, rows, m, P, CK_FMT, FB, N, EVICT)
        if W_RD:
            store_fast(rd_c, rd_s1, rd_s2, Sr, mat, rows, m, P, seed_rd, t, amax, RD_FMT, FB,
                       N, HW_CVT, FAST_ENC, ONE_PASS, EVICT)
    elif W_CK and W_RD:
        store_split_fast(ck_c, ck_s1, ck_s2, rd_c, rd_s1, rd_s2, Sn, mat, rows, m, P, seed_ck,
                         seed_rd, t, amax, CK_FMT, RD_FMT, FB, N, HW_CVT, FAST_ENC, ONE_PASS,
                         EVICT)
    elif W_CK:
        store_fast(ck_c, ck_s1, ck_s2, Sn, mat, rows, m, P, seed_ck, t, amax, CK_FMT, FB, N,
                   HW_CVT, FAST_ENC, ONE_PASS, EVICT)
    elif W_RD:
        store_read_fast(rd_c, rd_s1, rd_s2, Sn, mat, rows, m, P, seed_ck, seed_rd, t, amax,
                        CK_FMT, RD_FMT, FB, N, HW_CVT, FAST_ENC, ONE_PASS, EVICT)
    if W_FRESH:
        tl.store(fresh_ptr + mat * P * N + tile_offsets(rows, N), Sn, mask=m[:, None])


@triton.jit
def _flush_out(Sn, C_t, x_c, z_ptr, out_ptr, bidx, s_zb, s_ob, h, P, rows, m, D_h,
               HAS_Z: tl.constexpr):
    """The step's output rows from the fresh state (gated)."""
    y = tl.sum(Sn * C_t[None, :], axis=1)
    z_c = 0.0
    if HAS_Z:
        z_c = tl.load(z_ptr + bidx * s_zb + h * P + rows, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + bidx * s_ob + h * P + rows, gate(y, x_c, z_c, D_h, HAS_Z), mask=m)


@triton.jit
def m2_weights_kernel(
    wts, ring_B, ring_dt, tickets, state_idx, dt_ptr, B_ptr, C_ptr, A_ptr, dtb_ptr,
    s_dtb, s_Bb, s_Cb, H, G, L, LR,
    N: tl.constexpr, RB: tl.constexpr, HPG: tl.constexpr, RING: tl.constexpr,
    HAS_DT_BIAS: tl.constexpr, DT_SOFTPLUS: tl.constexpr, pos=None,
    CONC: tl.constexpr = False,
):
    """Ring weights for :func:`m2_out_heads_kernel` (``WEIGHTS``;
    ``SplitConfig.out_weights="launch"``), a program per (B/C group ``g``, batch row
    ``b``), launched between the flush and output launches (it reads the clock, which
    the output launch advances).  Per head of the group, for rows that neither pad nor
    flush: the weight of each ring entry before ``c``, ``dt_i e^(Lambda_c - Lambda_i)
    (B_i . C)``, then ``dt B_c . C`` (this step's entry), ``e^Lambda_c`` and ``dt``, as
    ``RB + 4`` floats at ``wts[(b H + h) (RB + 4)]``.  The group's ring of B is loaded
    once; its heads (``HPG`` >= heads per group) are one ``[HPG, RB]`` tile.

    ``CONC`` (the flush launch on a second stream): the group-0 programs write the
    rows' ring positions to ``pos`` for the output launch; the clocks are advanced by
    :func:`clocks.advance_clocks_kernel`, which the streams order after this launch."""
    g = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    slot = tl.load(state_idx + b)
    c = tl.load(tickets + tl.maximum(slot, 0)) % L
    if CONC and (g == 0):
        tl.store(pos + b, tl.where(slot >= 0, c, -1))
    if (slot >= 0) & (c != L - 1):
        offs_n = tl.arange(0, N)
        offs_r = tl.arange(0, RB)
        hpg = H // G
        win = slot.to(tl.int64) * LR
        mr = offs_r < c
        rB = ring_load(ring_B + (win * G + g) * N + offs_r[:, None] * (G * N) +
                       offs_n[None, :], mr[:, None], RING)
        B_t = ring_round(tl.load(B_ptr + b * s_Bb + g * N + offs_n).to(tl.float32), RING)
        C_t = tl.load(C_ptr + b * s_Cb + g * N + offs_n).to(tl.float32)
        BC = tl.sum(rB * C_t[None, :], axis=1)  # entries < c (0 elsewhere)
        BCc = tl.sum(B_t * C_t, axis=0)  # this step's entry
        offs_h = tl.arange(0, HPG)
        mh = offs_h < hpg
        heads = g * hpg + offs_h
        A_h = tl.load(A_ptr + heads, mask=mh, other=0.0).to(tl.float32)
        dtb = 0.0
        if HAS_DT_BIAS:
            dtb = tl.load(dtb_ptr + heads, mask=mh, other=0.0).to(tl.float32)
        dt = dt_of(tl.load(dt_ptr + b * s_dtb + heads, mask=mh, other=0.0), dtb, HAS_DT_BIAS,
                   DT_SOFTPLUS)
        rdt = tl.load(ring_dt + win * H + heads[:, None] + offs_r[None, :] * H,
                      mask=mh[:, None] & mr[None, :], other=0.0)
        at_c = (offs_r == c)[None, :]
        cum = tl.cumsum(tl.where(at_c, dt[:, None], rdt) * A_h[:, None], axis=1)
        last = tl.sum(tl.where(at_c, cum, 0.0), axis=1)
        w = tl.where(mr[None, :], rdt * tl.exp(last[:, None] - cum), 0.0) * BC[None, :]
        w_b = wts + (b * H + heads) * (RB + 4)
        tl.store(w_b[:, None] + offs_r[None, :], w, mask=mh[:, None])
        four = tl.arange(0, 4)[None, :]
        tl.store(w_b[:, None] + RB + four,
                 tl.where(four == 0, (dt * BCc)[:, None],
                          tl.where(four == 1, tl.exp(last)[:, None], dt[:, None])),
                 mask=mh[:, None])


@triton.jit
def _unit(u, key, offs_b, sl0, k, H, UPH, ROWS: tl.constexpr):
    """Flush unit ``u``: its batch row, slot, clock, head and first row (a unit past
    the last gives row and slot 0)."""
    j = u // (H * UPH)
    rem = u % (H * UPH)
    bidx = at_flushing_row(key, j, offs_b).to(tl.int64)
    slot = at_flushing_row(key, j, sl0).to(tl.int64)
    t = at_flushing_row(key, j, k)
    return bidx, slot, t, rem // UPH, (rem % UPH) * ROWS


@triton.jit
def _prefetch_ahead(ck_c, ring_x, x_ptr, z_ptr, q, slot, bidx, h, r0, slot2, bidx2, h2, r02,
                    s_xb, s_zb, H, P, HP, LR, offs_r, c, CK_FMT: tl.constexpr, FB: tl.constexpr,
                    NQ: tl.constexpr, N: tl.constexpr, PF: tl.constexpr, HAS_Z: tl.constexpr):
    """L2 prefetch of the chunk ``PF`` after chunk ``q`` of the unit (slot, bidx, h, r0):
    one of its own, or of the program's next unit (slot2, bidx2, h2, r02)."""
    qn = q + PF
    nxt = qn >= NQ
    sl = tl.where(nxt, slot2, slot)
    bi = tl.where(nxt, bidx2, bidx)
    hh = tl.where(nxt, h2, h)
    row = tl.where(nxt, r02 + (qn - NQ) * FB, r0 + qn * FB)
    _prefetch_chunk(ck_c, ring_x + sl * LR * HP + hh * P, x_ptr + bi * s_xb + hh * P,
                    z_ptr + bi * s_zb + hh * P, sl * H + hh, row, P, HP, offs_r, c, CK_FMT, FB,
                    N, HAS_Z)


@triton.jit(do_not_specialize=["seed_ck", "seed_rd", "Bsz"])
def m2_flush_kernel(
    ck_c, ck_s1, ck_s2, rd_c, rd_s1, rd_s2, fresh_ptr,
    ring_x, ring_B, ring_dt, tickets, state_idx, pos,
    x_ptr, dt_ptr, B_ptr, C_ptr, z_ptr, out_ptr, A_ptr, D_ptr, dtb_ptr,
    seed_ck, seed_rd, s_xb, s_dtb, s_Bb, s_Cb, s_zb, s_ob,
    Bsz, H, G, P, L, LR,
    N: tl.constexpr, BP: tl.constexpr, FB: tl.constexpr, NQ: tl.constexpr, UPH: tl.constexpr,
    RB: tl.constexpr, NSF: tl.constexpr, CK_FMT: tl.constexpr, RD_FMT: tl.constexpr,
    SPLIT: tl.constexpr, RING: tl.constexpr, HAS_Z: tl.constexpr, HAS_D: tl.constexpr,
    HAS_DT_BIAS: tl.constexpr, DT_SOFTPLUS: tl.constexpr, WRITE_FRESH: tl.constexpr,
    NEED_AMAX: tl.constexpr, HW_CVT: tl.constexpr, FAST_ENC: tl.constexpr = False,
    ONE_PASS: tl.constexpr = False, scr=None, SCRATCH: tl.constexpr = False,
    PF: tl.constexpr = 0, EV: tl.constexpr = False, ck_desc=None, TMA: tl.constexpr = False,
    CONC: tl.constexpr = False, work=None, CLAIM: tl.constexpr = False,
):
    """The split step's persistent flush launch: every program enumerates the flushing
    rows' (row, head, row block) units and takes every nprog-th one, or, CLAIM, claims
    its units one at a time from the counter ``work`` (``tl_common.first_unit``; then
    the chunks prefetched ahead stop at the unit's end)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    offs_b, inb, live, sl0 = batch_slots(state_idx, Bsz, BP)
    k = tl.load(tickets + sl0, mask=live, other=0)
    cpos = k % L
    if (pid == 0) and not CONC:  # (CONC: the weights launch writes them)
        tl.store(pos + offs_b, tl.where(live, cpos, -1), mask=inb)
    key, units = flushing_rows(live & (cpos == L - 1), H * UPH)
    offs_n = tl.arange(0, N)
    offs_r = tl.arange(0, RB)
    HP = H * P
    c = L - 1
    C4: tl.constexpr = CK_FMT == K_NVFP4
    R4: tl.constexpr = SPLIT and (RD_FMT == K_NVFP4)
    SCR: tl.constexpr = SCRATCH and NEED_AMAX and not ONE_PASS
    RCK: tl.constexpr = R4 and is_16bit(CK_FMT)  # (the scratch pass: one rounding draw)
    if SCR:
        scr_p = scr + pid.to(tl.int64) * (FB * NQ * N)
    u = first_unit(pid, units, work, CLAIM)
    first = u
    while u < units:
        bidx, slot, t, h, r0 = _unit(u, key, offs_b, sl0, k, H, UPH, FB * NQ)
        if PF > 0:  # L2 prefetch: a program's first chunks, then PF chunks ahead
            if u == first:
                for d in tl.static_range(PF):
                    _prefetch_chunk(ck_c, ring_x + slot * LR * HP + h * P,
                                    x_ptr + bidx * s_xb + h * P, z_ptr + bidx * s_zb + h * P,
                                    slot * H + h, r0 + d * FB, P, HP, offs_r, c, CK_FMT, FB,
                                    N, HAS_Z)
            u2 = u if CLAIM else u + nprog  # the program's next unit, where known
            bidx2, slot2, _t, h2, r02 = _unit(u2, key, offs_b, sl0, k, H, UPH, FB * NQ)
        g = h // (H // G)
        mat = slot * H + h
        win = slot * LR
        A_h, D_h, dtb = head_consts(h, A_ptr, D_ptr, dtb_ptr, HAS_D, HAS_DT_BIAS)
        dt_h = dt_of(tl.load(dt_ptr + bidx * s_dtb + h), dtb, HAS_DT_BIAS, DT_SOFTPLUS)
        rdt = tl.load(ring_dt + win * H + h + offs_r * H, mask=offs_r < c, other=0.0)
        edt = tl.where(offs_r == c, dt_h, rdt)
        last, w = decay_weights(edt, tl.cumsum(edt * A_h, axis=0), offs_r, c)
        decay = tl.exp(last)
        B_t = ring_round(tl.load(B_ptr + bidx * s_Bb + g * N + offs_n).to(tl.float32), RING)
        C_t = tl.load(C_ptr + bidx * s_Cb + g * N + offs_n).to(tl.float32)
        rB = ring_load(ring_B + (win * G + g) * N + offs_r[:, None] * (G * N) + offs_n[None, :],
                       (offs_r < c)[:, None], RING)
        eB = tl.where((offs_r == c)[:, None], B_t[None, :], rB)
        rx_h = ring_x + win * HP + h * P
        x_h = x_ptr + bidx * s_xb + h * P
        s2_old = 0.0
        if CK_FMT == K_NVFP4:
            s2_old = tl.load(ck_s2 + mat)
        amax = 0.0
        # ONE_PASS (FAST_ENC, the whole head in one chunk): the encoder takes the amax
        # from the chunk itself (one fold, no second pass)
        if SCR:  # nvfp4, scratch pass: fold once; what needs no amax is written now
            for q in tl.range(0, NQ, num_stages=NSF):
                if PF > 0:
                    _prefetch_ahead(ck_c, ring_x, x_ptr, z_ptr, q, slot, bidx, h, r0, slot2,
                                    bidx2, h2, r02, s_xb, s_zb, H, P, HP, LR, offs_r, c, CK_FMT,
                                    FB, NQ, N, PF, HAS_Z)
                rows, m, x_c, Sn = _chunk(ck_c, ck_s1, ck_s2, s2_old, mat, r0, q, P, x_h, rx_h,
                                          HP, offs_r, c, w, decay, eB, CK_FMT, FB, N, RING,
                                          NEED_AMAX, ck_desc, TMA)
                if RCK:  # the scratch keeps the checkpoint's values, which the copy encodes
                    Sr = stored_values(Sn, mat, rows, P, seed_ck, t, CK_FMT, FB, N)
                    amax = tl.maximum(amax, matrix_amax(Sr))
                else:
                    Sr = Sn
                    amax = tl.maximum(amax, flush_amax(Sn, mat, rows, P, seed_ck, t, CK_FMT,
                                                       RD_FMT, FB, N))
                _flush_out(Sn, C_t, x_c, z_ptr, out_ptr, bidx, s_zb, s_ob, h, P, rows, m, D_h,
                           HAS_Z)
                _write_copies(Sn, ck_c, ck_s1, ck_s2, rd_c, rd_s1, rd_s2, fresh_ptr, mat, rows,
                              m, P, seed_ck, seed_rd, t, amax, CK_FMT, RD_FMT, FB, N, HW_CVT,
                              FAST_ENC, False, not C4, SPLIT and not R4, WRITE_FRESH, EV, Sr,
                              RCK)
                tl.store(scr_p + tile_offsets(q * FB + tl.arange(0, FB), N), Sr)
            tl.debug_barrier()  # the scratch rows are read back by other threads
            for q in tl.range(0, NQ, num_stages=NSF):  # the nvfp4 copies from the scratch
                rows = r0 + q * FB + tl.arange(0, FB)
                Sn = tl.load(scr_p + tile_offsets(q * FB + tl.arange(0, FB), N))
                _write_copies(Sn, ck_c, ck_s1, ck_s2, rd_c, rd_s1, rd_s2, fresh_ptr, mat, rows,
                              rows < P, P, seed_ck, seed_rd, t, amax, CK_FMT, RD_FMT, FB, N,
                              HW_CVT, FAST_ENC, False, C4, R4, False, EV, Sn, RCK)
            tl.debug_barrier()  # the next unit rewrites the scratch rows
        else:
            if NEED_AMAX and not ONE_PASS:  # nvfp4: the whole matrix's amax first
                for q in range(NQ):
                    rows, m, x_c, Sn = _chunk(ck_c, ck_s1, ck_s2, s2_old, mat, r0, q, P, x_h,
                                              rx_h, HP, offs_r, c, w, decay, eB, CK_FMT, FB, N,
                                              RING, NEED_AMAX, ck_desc, TMA)
                    amax = tl.maximum(amax, flush_amax(Sn, mat, rows, P, seed_ck, t, CK_FMT, RD_FMT,
                                                   FB, N))
            for q in tl.range(0, NQ, num_stages=NSF):
                if PF > 0:
                    _prefetch_ahead(ck_c, ring_x, x_ptr, z_ptr, q, slot, bidx, h, r0, slot2,
                                    bidx2, h2, r02, s_xb, s_zb, H, P, HP, LR, offs_r, c, CK_FMT,
                                    FB, NQ, N, PF, HAS_Z)
                rows, m, x_c, Sn = _chunk(ck_c, ck_s1, ck_s2, s2_old, mat, r0, q, P, x_h, rx_h,
                                          HP, offs_r, c, w, decay, eB, CK_FMT, FB, N, RING,
                                          NEED_AMAX, ck_desc, TMA)
                _flush_out(Sn, C_t, x_c, z_ptr, out_ptr, bidx, s_zb, s_ob, h, P, rows, m, D_h,
                           HAS_Z)
                _write_copies(Sn, ck_c, ck_s1, ck_s2, rd_c, rd_s1, rd_s2, fresh_ptr, mat, rows,
                              m, P, seed_ck, seed_rd, t, amax, CK_FMT, RD_FMT, FB, N, HW_CVT,
                              FAST_ENC, ONE_PASS, True, SPLIT, WRITE_FRESH, EV)
        u = next_unit(u, nprog, work, CLAIM)
    units_done(units, work, nprog, CLAIM)


@triton.jit
def _out_tile(codes, s1, s2, rx, rdt, x, z, dt_raw, A_h, D_h, dtb, c, offs_r, C_t, Ce, Co, BC,
              out_row, rx_c, rdt_c, rows, m, first_of_head,
              RD_FMT: tl.constexpr, BLOCK_P: tl.constexpr, N: tl.constexpr, RING: tl.constexpr,
              HAS_Z: tl.constexpr, HAS_DT_BIAS: tl.constexpr, DT_SOFTPLUS: tl.constexpr):
    """One output tile: ``y = e^Lambda S C + sum_i w_i (B_i . C) x_i + D x`` (gated),
    stored with the ring appends of this step at entry ``c``."""
    dt = dt_of(dt_raw, dtb, HAS_DT_BIAS, DT_SOFTPLUS)
    edt = tl.where(offs_r == c, dt, rdt)
    last, w = decay_weights(edt, tl.cumsum(edt * A_h, axis=0), offs_r, c)
    xf = x.to(tl.float32)
    xr = ring_round(xf, RING)
    ex = tl.where((offs_r == c)[:, None], xr[None, :], ring_decode(rx, RING))
    y = tl.exp(last) * row_dot(codes, s1, s2, C_t, Ce, Co, RD_FMT, BLOCK_P, N)
    y = y + tl.sum((w * BC)[:, None] * ex, axis=0)
    tl.store(out_row + rows, gate(y, xf, z.to(tl.float32), D_h, HAS_Z), mask=m)
    ring_store(rx_c + rows, xr, m, RING)
    if first_of_head:
        tl.store(rdt_c, dt)


@triton.jit
def _tile_of_head(codes, s1, s2, h, rows, first_of_head, c, offs_r, mr, C_t, Ce, Co, BC,
                  rx_b, rdt_b, x_b, z_b, dt_b, out_b, A_ptr, D_ptr, dtb_ptr, H, P,
                  RD_FMT: tl.constexpr, BLOCK_P: tl.constexpr, N: tl.constexpr,
                  RING: tl.constexpr, HAS_Z: tl.constexpr, HAS_D: tl.constexpr,
                  HAS_DT_BIAS: tl.constexpr, DT_SOFTPLUS: tl.constexpr):
    """Tile ``rows`` of head ``h`` whose stored codes are loaded: the head's constants,
    its ring rows and inputs, then :func:`_out_tile`."""
    m = rows < P
    HP = H * P
    A_h, D_h, dtb, rx, rdt, x, z, dt_raw = tile_inputs(
        h, rows, m, mr, rx_b, rdt_b, x_b, z_b, dt_b, A_ptr, D_ptr, dtb_ptr, offs_r, H, HP, P,
        RING, HAS_Z, HAS_D, HAS_DT_BIAS)
    _out_tile(codes, s1, s2, rx, rdt, x, z, dt_raw, A_h, D_h, dtb, c, offs_r, C_t,
              Ce, Co, BC, out_b + h * P, rx_b + c * HP + h * P, rdt_b + c * H + h, rows, m,
              first_of_head, RD_FMT, BLOCK_P, N, RING, HAS_Z, HAS_DT_BIAS, DT_SOFTPLUS)


@triton.jit
def m2_out_kernel(
    rd_c, rd_s1, rd_s2, ring_x, ring_B, ring_dt, tickets, state_idx, pos,
    x_ptr, dt_ptr, B_ptr, C_ptr, z_ptr, out_ptr, A_ptr, D_ptr, dtb_ptr,
    s_xb, s_dtb, s_Bb, s_Cb, s_zb, s_ob,
    H, G, P, L, LR,
    N: tl.constexpr, BLOCK_P: tl.constexpr, NPB: tl.constexpr, TPP: tl.constexpr,
    NS: tl.constexpr, RB: tl.constexpr, RD_FMT: tl.constexpr, RING: tl.constexpr,
    HAS_Z: tl.constexpr, HAS_D: tl.constexpr, HAS_DT_BIAS: tl.constexpr,
    DT_SOFTPLUS: tl.constexpr,
):
    pid = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    slot = tl.load(state_idx + b)
    c = tl.load(pos + b)  # ring position (written by the flush launch); -1: padding
    tau0 = pid * TPP
    h0 = tau0 // NPB
    live = (slot >= 0) & (c != L - 1)
    mat0 = slot.to(tl.int64) * H
    out_b = out_ptr + b * s_ob
    if TPP == 1:  # one tile: its load is the first after the slot's
        rows0 = (tau0 % NPB) * BLOCK_P + tl.arange(0, BLOCK_P)
        cc0, cs10, cs20 = load_codes(rd_c, rd_s1, rd_s2, mat0 + h0, rows0, (rows0 < P) & live,
                                     P, RD_FMT, BLOCK_P, N)
    if slot < 0:  # padding row: zero outputs
        for i in range(TPP):
            rows = ((tau0 + i) % NPB) * BLOCK_P + tl.arange(0, BLOCK_P)
            tl.store(out_b + ((tau0 + i) // NPB) * P + rows, 0.0, mask=rows < P)
        return
    if pid == 0:
        tl.atomic_add(tickets + slot, 1, sem="relaxed")  # nobody in this launch reads it
    if c != L - 1:
        hpg = H // G
        g = h0 // hpg
        offs_n = tl.arange(0, N)
        offs_r = tl.arange(0, RB)
        HP = H * P
        win = slot.to(tl.int64) * LR
        rx_b = ring_x + win * HP
        rdt_b = ring_dt + win * H
        rB_g = ring_B + (win * G + g) * N
        x_b = x_ptr + b * s_xb
        z_b = z_ptr + b * s_zb
        dt_b = dt_ptr + b * s_dtb
        B_t = ring_round(tl.load(B_ptr + b * s_Bb + g * N + offs_n).to(tl.float32), RING)
        C_t = tl.load(C_ptr + b * s_Cb + g * N + offs_n).to(tl.float32)
        Ce = tl.load(C_ptr + b * s_Cb + g * N + 2 * tl.arange(0, N // 2)).to(tl.float32) * TWO63
        Co = tl.load(C_ptr + b * s_Cb + g * N + 2 * tl.arange(0, N // 2) + 1).to(tl.float32)
        Co = Co * TWO63
        mr = offs_r < c
        rB = ring_load(rB_g + offs_r[:, None] * (G * N) + offs_n[None, :], mr[:, None], RING)
        eB = tl.where((offs_r == c)[:, None], B_t[None, :], rB)
        BC = tl.sum(eB * C_t[None, :], axis=1)
        if TPP == 1:
            _tile_of_head(cc0, cs10, cs20, h0, rows0, tau0 % NPB == 0, c, offs_r, mr, C_t, Ce,
                          Co, BC, rx_b, rdt_b, x_b, z_b, dt_b, out_b, A_ptr, D_ptr, dtb_ptr,
                          H, P, RD_FMT, BLOCK_P, N, RING, HAS_Z, HAS_D, HAS_DT_BIAS,
                          DT_SOFTPLUS)
        else:
            for i in tl.range(0, TPP, num_stages=NS):
                tau = tau0 + i
                h = tau // NPB
                rows = (tau % NPB) * BLOCK_P + tl.arange(0, BLOCK_P)
                cc, cs1, cs2 = load_codes(rd_c, rd_s1, rd_s2, mat0 + h, rows, rows < P, P,
                                          RD_FMT, BLOCK_P, N)
                _tile_of_head(cc, cs1, cs2, h, rows, tau % NPB == 0, c, offs_r, mr, C_t, Ce,
                              Co, BC, rx_b, rdt_b, x_b, z_b, dt_b, out_b, A_ptr, D_ptr,
                              dtb_ptr, H, P, RD_FMT, BLOCK_P, N, RING, HAS_Z, HAS_D,
                              HAS_DT_BIAS, DT_SOFTPLUS)
        if tau0 % (NPB * hpg) == 0:  # the group's first tile appends B
            ring_store(rB_g + c * (G * N) + offs_n, B_t, offs_n < N, RING)


@triton.jit
def _prefetch_out(rd_c, rd_s1, ring_x, mat, h, slot, c, P, HP, LR, offs_r, RD_FMT: tl.constexpr,
                  N: tl.constexpr, HPP: tl.constexpr, RING: tl.constexpr):
    """L2 prefetch of what an output program of heads ``[h, h + HPP)`` of matrix ``mat``
    (slot ``slot``, ring position ``c``) will load: the heads' stored rows (one bulk
    prefetch), their scales and their ring rows of x before ``c``."""
    u8: tl.constexpr = tl.pointer_type(tl.uint8)
    l2_prefetch_rows(rd_c, mat // HPP, 0, HPP * P, HPP * P, RD_FMT, N)  # HPP heads at once
    lines = tl.arange(0, 8) * 128
    if RD_FMT == K_FP8:
        SB: tl.constexpr = 4
    elif RD_FMT == K_NVFP4:
        SB: tl.constexpr = N // 16
    elif RD_FMT == K_MXFP4:
        SB: tl.constexpr = N // 32
    else:
        SB: tl.constexpr = 0
    if SB > 0:
        l2_prefetch_lines(rd_s1.to(u8) + mat * P * SB + tl.minimum(lines, HPP * P * SB - 1))
    if RING == K_RING_FP32:
        XB: tl.constexpr = 4
    else:
        XB: tl.constexpr = 2
    ent = tl.where(offs_r < c, offs_r, 0)
    rows = (ring_x + slot * LR * HP + ent[:, None] * HP + h * P).to(u8)
    l2_prefetch_lines(rows + tl.minimum(tl.arange(0, 4) * 128, HPP * P * XB - 1)[None, :])


@triton.jit
def _heads_load(rows, rd_c, rd_s1, rd_s2, mat, h, P, HP, offs_r, mr, rx_b, x_b, z_b,
                RD_FMT: tl.constexpr, BT: tl.constexpr, N: tl.constexpr, RING: tl.constexpr,
                HAS_Z: tl.constexpr, WORDS: tl.constexpr):
    """The loads of output rows ``rows`` (``BT`` of them) of head ``h``: the stored codes
    (4-bit ones as int32 words with WORDS) and scales, the ring's x rows, this step's x
    and gate rows."""
    return _rows_load(rows, rows < P, rd_c, rd_s1, rd_s2, mat, h, P, HP, offs_r, mr, rx_b,
                      x_b, z_b, RD_FMT, BT, N, RING, HAS_Z, WORDS)


@triton.jit
def _rows_load(rows, m, rd_c, rd_s1, rd_s2, mat, h, P, HP, offs_r, mr, rx_b, x_b, z_b,
               RD_FMT: tl.constexpr, BT: tl.constexpr, N: tl.constexpr, RING: tl.constexpr,
               HAS_Z: tl.constexpr, WORDS: tl.constexpr):
    """:func:`_heads_load` of the rows ``rows`` where ``m`` (rows of ``mat``'s head and,
    past ``P``, of the heads after it)."""
    codes, s1, s2 = load_codes(rd_c, rd_s1, rd_s2, mat, rows, m, P, RD_FMT, BT, N, WORDS)
    rx = ring_load(rx_b + h * P + offs_r[:, None] * HP + rows[None, :],
                   mr[:, None] & m[None, :], RING)
    xf = tl.load(x_b + h * P + rows, mask=m, other=0.0).to(tl.float32)
    z = 0.0
    if HAS_Z:
        z = tl.load(z_b + h * P + rows, mask=m, other=0.0).to(tl.float32)
    return codes, s1, s2, rx, xf, z


@triton.jit
def _row_output(eL, dot, ring, wc, x):
    """A row's output before the gate, ``e^Lambda (S c) + ring + w_c x``, by explicit
    fused multiply-adds: every output program rounds it the same way, whatever the
    compiler would contract (a pipelined loop contracted differently: 1-ulp changes)."""
    return tl.fma(wc, x, tl.fma(eL, dot, ring))


@triton.jit
def _heads_finish(rows, loaded, h, P, HP, c, rx_b, out_b, C_t, Ce, Co, eL, wbc, wc, D_h,
                  RD_FMT: tl.constexpr, BT: tl.constexpr, N: tl.constexpr, RING: tl.constexpr,
                  HAS_Z: tl.constexpr):
    """Output rows ``rows`` of head ``h`` from what :func:`_heads_load` gave: the
    packed-domain row dot, the ring's x rows, the gate; appends x at entry ``c``."""
    codes, s1, s2, rx, xf, z = loaded
    m = rows < P
    xr = ring_round(xf, RING)
    y = _row_output(eL, row_dot(codes, s1, s2, C_t, Ce, Co, RD_FMT, BT, N),
                    tl.sum(wbc[:, None] * rx, axis=0), wc, xr)
    tl.store(out_b + h * P + rows, gate(y, xf, z, D_h, HAS_Z), mask=m)
    ring_store(rx_b + c * HP + h * P + rows, xr, m, RING)


@triton.jit
def _heads_tile(rows, rd_c, rd_s1, rd_s2, mat, h, P, HP, c, offs_r, mr, rx_b, x_b, z_b, out_b,
                C_t, Ce, Co, eL, wbc, wc, D_h, RD_FMT: tl.constexpr, BT: tl.constexpr,
                N: tl.constexpr, RING: tl.constexpr, HAS_Z: tl.constexpr, WORDS: tl.constexpr):
    """Output rows ``rows`` (``BT`` of them) of head ``h`` (:func:`m2_out_heads_kernel`):
    their loads, then :func:`_heads_finish`."""
    loaded = _heads_load(rows, rd_c, rd_s1, rd_s2, mat, h, P, HP, offs_r, mr, rx_b, x_b, z_b,
                         RD_FMT, BT, N, RING, HAS_Z, WORDS)
    _heads_finish(rows, loaded, h, P, HP, c, rx_b, out_b, C_t, Ce, Co, eL, wbc, wc, D_h,
                  RD_FMT, BT, N, RING, HAS_Z)


@triton.jit
def _head_weights(wts, b, H, h, offs_r, D_ptr, RB: tl.constexpr, HAS_D: tl.constexpr):
    """Head ``h``'s ring weights of batch row ``b`` from :func:`m2_weights_kernel`: the
    entries before ``c``, this step's entry, ``e^Lambda_c``, ``dt``; and its D."""
    w_b = wts + (b * H + h) * (RB + 4)
    wbc = tl.load(w_b + offs_r)
    wc = tl.load(w_b + RB)
    eL = tl.load(w_b + RB + 1)
    dt = tl.load(w_b + RB + 2)
    D_h = 0.0
    if HAS_D:
        D_h = tl.load(D_ptr + h).to(tl.float32)
    return wbc, wc, eL, dt, D_h


@triton.jit
def _pair_load(q: tl.constexpr, rd_c, rd_s1, rd_s2, mat, h, P, HP, offs_r, mr, rx_b, x_b, z_b,
               PC: tl.constexpr, RD_FMT: tl.constexpr, BT: tl.constexpr, N: tl.constexpr,
               RING: tl.constexpr, HAS_Z: tl.constexpr, WORDS: tl.constexpr):
    """The loads of tile ``q`` of heads ``h`` and ``h + 1`` (headdim ``PC``) as one run
    of ``BT``-row tiles (:func:`_pair_heads`): a tile of one head as that head's rows; the
    tile holding the end of ``h`` and the start of ``h + 1`` as rows of ``h`` continued
    (two heads' stored rows, scales, ring rows, inputs and outputs are contiguous), its
    nvfp4 matrix scale per row."""
    rows = q * BT + tl.arange(0, BT)
    if (q + 1) * BT <= PC:
        loaded = _heads_load(rows, rd_c, rd_s1, rd_s2, mat, h, P, HP, offs_r, mr, rx_b, x_b,
                             z_b, RD_FMT, BT, N, RING, HAS_Z, WORDS)
    elif q * BT >= PC:
        loaded = _heads_load(rows - PC, rd_c, rd_s1, rd_s2, mat + 1, h + 1, P, HP, offs_r, mr,
                             rx_b, x_b, z_b, RD_FMT, BT, N, RING, HAS_Z, WORDS)
    else:
        loaded = _straddle_load(rows, None, rd_c, rd_s1, rd_s2, mat, h, P, HP, offs_r, mr,
                                rx_b, x_b, z_b, RD_FMT, BT, N, RING, HAS_Z, WORDS)
    return loaded


@triton.jit
def _next_scale(rd_s2, mat, RD_FMT: tl.constexpr):
    """The nvfp4 matrix scale of the head after ``mat`` (0 for other formats)."""
    s2_b = 0.0
    if RD_FMT == K_NVFP4:
        s2_b = tl.load(rd_s2 + mat + 1)
    return s2_b


@triton.jit
def _straddle_load(rows, s2_b, rd_c, rd_s1, rd_s2, mat, h, P, HP, offs_r, mr, rx_b, x_b, z_b,
                   RD_FMT: tl.constexpr, BT: tl.constexpr, N: tl.constexpr,
                   RING: tl.constexpr, HAS_Z: tl.constexpr, WORDS: tl.constexpr):
    """The loads of rows ``rows`` of head ``h`` continued into ``h + 1`` (rows from ``P``
    on), an nvfp4 copy's matrix scale per row (``s2_b``: :func:`_next_scale`, loaded here
    behind the rows where None)."""
    codes, s1, s2, rx, xf, z = _rows_load(rows, rows < 2 * P, rd_c, rd_s1, rd_s2, mat, h, P,
                                          HP, offs_r, mr, rx_b, x_b, z_b, RD_FMT, BT, N, RING,
                                          HAS_Z, WORDS)
    if s2_b is None:
        s2_b = _next_scale(rd_s2, mat, RD_FMT)
    if RD_FMT == K_NVFP4:
        s2 = tl.where(rows < P, s2, s2_b)[:, None]
    return codes, s1, s2, rx, xf, z


@triton.jit
def _pair_finish(q: tl.constexpr, loaded, h, P, HP, c, rx_b, out_b, C_t, Ce, Co, wbc_a, wc_a,
                 eL_a, D_a, wbc_b, wc_b, eL_b, D_b, PC: tl.constexpr, RD_FMT: tl.constexpr,
                 BT: tl.constexpr, N: tl.constexpr, RING: tl.constexpr,
                 HAS_Z: tl.constexpr):
    """Output rows of tile ``q`` of a head pair from what :func:`_pair_load` gave: a tile
    of one head by :func:`_heads_finish`; the shared tile takes each row's ring weights,
    decay, D from its own head."""
    rows = q * BT + tl.arange(0, BT)
    if (q + 1) * BT <= PC:
        _heads_finish(rows, loaded, h, P, HP, c, rx_b, out_b, C_t, Ce, Co, eL_a, wbc_a, wc_a,
                      D_a, RD_FMT, BT, N, RING, HAS_Z)
    elif q * BT >= PC:
        _heads_finish(rows - PC, loaded, h + 1, P, HP, c, rx_b, out_b, C_t, Ce, Co, eL_b,
                      wbc_b, wc_b, D_b, RD_FMT, BT, N, RING, HAS_Z)
    else:
        _straddle_finish(rows, loaded, h, P, HP, c, rx_b, out_b, C_t, Ce, Co, wbc_a, wc_a, eL_a,
                         D_a, wbc_b, wc_b, eL_b, D_b, RD_FMT, BT, N, RING, HAS_Z)


@triton.jit
def _straddle_finish(rows, loaded, h, P, HP, c, rx_b, out_b, C_t, Ce, Co, wbc_a, wc_a, eL_a,
                     D_a, wbc_b, wc_b, eL_b, D_b, RD_FMT: tl.constexpr, BT: tl.constexpr,
                     N: tl.constexpr, RING: tl.constexpr, HAS_Z: tl.constexpr):
    """Output rows ``rows`` of heads ``h`` (``rows < P``) and ``h + 1`` (the others, as
    rows of ``h`` continued) from their loads: each row's ring weights, decay and D
    from its own head."""
    codes, s1, s2, rx, xf, z = loaded
    m = rows < 2 * P
    a = rows < P
    xr = ring_round(xf, RING)
    # each row's ring weights from its head: one product and one sum per ring element
    y = _row_output(tl.where(a, eL_a, eL_b), row_dot(codes, s1, s2, C_t, Ce, Co, RD_FMT, BT, N),
                    tl.sum(tl.where(a[None, :], wbc_a[:, None], wbc_b[:, None]) * rx, axis=0),
                    tl.where(a, wc_a, wc_b), xr)
    tl.store(out_b + h * P + rows, gate(y, xf, z, tl.where(a, D_a, D_b), HAS_Z), mask=m)
    ring_store(rx_b + c * HP + h * P + rows, xr, m, RING)


@triton.jit
def _pair_heads(rd_c, rd_s1, rd_s2, wts, b, H, h, mat, P, HP, c, offs_r, mr, rx_b, rdt_b,
                x_b, z_b, out_b, C_t, Ce, Co, D_ptr, PC: tl.constexpr, BLOCK_P: tl.constexpr,
                N: tl.constexpr, RB: tl.constexpr, RD_FMT: tl.constexpr, RING: tl.constexpr,
                HAS_Z: tl.constexpr, HAS_D: tl.constexpr, WORDS: tl.constexpr,
                AHEAD: tl.constexpr = 0, LOOP: tl.constexpr = False, NS: tl.constexpr = 1):
    """Heads ``h`` and ``h + 1`` (headdim ``PC``, not a multiple of ``BLOCK_P``; ``2 PC``
    is) as one run of ``2 PC / BLOCK_P`` tiles: no masked rows, and the tile that holds
    the end of ``h`` and the start of ``h + 1`` takes each row's weights from its head
    (:func:`_pair_finish`).  A headdim of 80 in 32-row tiles: 5 tiles per two heads
    instead of 6, a sixth of them masked rows (a headdim that is a multiple of
    ``BLOCK_P`` runs as its heads' tiles, none shared).  ``AHEAD`` (1 or 2): the loads of
    the tile that many places later go out before a tile's row dot and stores, so that
    many tiles' bytes are in flight behind the one being finished.  ``LOOP``: the tiles
    in a ``tl.range`` loop of ``NS`` stages instead (its loads become asynchronous copies
    into shared memory), each computed as a straddling tile (:func:`_straddle_finish`):
    the same bits, a third of the code."""
    wbc_a, wc_a, eL_a, dt_a, D_a = _head_weights(wts, b, H, h, offs_r, D_ptr, RB, HAS_D)
    wbc_b, wc_b, eL_b, dt_b, D_b = _head_weights(wts, b, H, h + 1, offs_r, D_ptr, RB, HAS_D)
    NT: tl.constexpr = 2 * PC // BLOCK_P
    if LOOP:  # every tile as a straddling one, in a loop (NS stages) instead of unrolled
        s2_b = _next_scale(rd_s2, mat, RD_FMT)
        for q in tl.range(0, NT, num_stages=NS):
            rows = q * BLOCK_P + tl.arange(0, BLOCK_P)
            loaded = _straddle_load(rows, s2_b, rd_c, rd_s1, rd_s2, mat, h, P, HP, offs_r, mr,
                                    rx_b, x_b, z_b, RD_FMT, BLOCK_P, N, RING, HAS_Z, WORDS)
            _straddle_finish(rows, loaded, h, P, HP, c, rx_b, out_b, C_t, Ce, Co, wbc_a, wc_a,
                             eL_a, D_a, wbc_b, wc_b, eL_b, D_b, RD_FMT, BLOCK_P, N, RING, HAS_Z)
    elif AHEAD == 0:
        for q in tl.static_range(NT):
            loaded = _pair_load(q, rd_c, rd_s1, rd_s2, mat, h, P, HP, offs_r, mr, rx_b, x_b,
                                z_b, PC, RD_FMT, BLOCK_P, N, RING, HAS_Z, WORDS)
            _pair_finish(q, loaded, h, P, HP, c, rx_b, out_b, C_t, Ce, Co, wbc_a, wc_a, eL_a,
                         D_a, wbc_b, wc_b, eL_b, D_b, PC, RD_FMT, BLOCK_P, N, RING, HAS_Z)
    else:  # a queue of the AHEAD + 1 oldest tiles' loads (1 or 2 ahead)
        tl.static_assert((AHEAD <= 2) and (AHEAD < NT), "AHEAD: 1 or 2, fewer than the tiles")
        q0 = _pair_load(0, rd_c, rd_s1, rd_s2, mat, h, P, HP, offs_r, mr, rx_b, x_b, z_b, PC,
                        RD_FMT, BLOCK_P, N, RING, HAS_Z, WORDS)
        q1 = _pair_load(1, rd_c, rd_s1, rd_s2, mat, h, P, HP, offs_r, mr, rx_b, x_b, z_b, PC,
                        RD_FMT, BLOCK_P, N, RING, HAS_Z, WORDS)
        if AHEAD == 2:
            q2 = _pair_load(2, rd_c, rd_s1, rd_s2, mat, h, P, HP, offs_r, mr, rx_b, x_b, z_b,
                            PC, RD_FMT, BLOCK_P, N, RING, HAS_Z, WORDS)
        for q in tl.static_range(NT):
            _pair_finish(q, q0, h, P, HP, c, rx_b, out_b, C_t, Ce, Co, wbc_a, wc_a, eL_a, D_a,
                         wbc_b, wc_b, eL_b, D_b, PC, RD_FMT, BLOCK_P, N, RING, HAS_Z)
            q0 = q1
            if AHEAD == 2:
                q1 = q2
            if q + AHEAD + 1 < NT:
                nxt = _pair_load(q + AHEAD + 1, rd_c, rd_s1, rd_s2, mat, h, P, HP, offs_r, mr,
                                 rx_b, x_b, z_b, PC, RD_FMT, BLOCK_P, N, RING, HAS_Z, WORDS)
                if AHEAD == 2:
                    q2 = nxt
                else:
                    q1 = nxt
    tl.store(rdt_b + c * H + h, dt_a)
    tl.store(rdt_b + c * H + h + 1, dt_b)


@triton.jit
def _head_tiles(rd_c, rd_s1, rd_s2, mat, h, P, HP, c, offs_r, mr, rx_b, x_b, z_b, out_b, C_t, Ce,
                Co, eL, wbc, wc, D_h, RD_FMT: tl.constexpr, BLOCK_P: tl.constexpr,
                NPB: tl.constexpr, TAIL: tl.constexpr, N: tl.constexpr, RING: tl.constexpr,
                HAS_Z: tl.constexpr, WORDS: tl.constexpr, LOADS_FIRST: tl.constexpr):
    """Head ``h``'s ``NPB`` tiles and its ``TAIL`` rows (:func:`m2_out_heads_kernel`), with
    LOADS_FIRST every tile's loads before the first store (at most 2 tiles and a tail:
    a tile's stores otherwise keep the compiler from hoisting the next tile's loads)."""
    if LOADS_FIRST:
        r0 = tl.arange(0, BLOCK_P)
        a0 = _heads_load(r0, rd_c, rd_s1, rd_s2, mat, h, P, HP, offs_r, mr, rx_b, x_b, z_b,
                         RD_FMT, BLOCK_P, N, RING, HAS_Z, WORDS)
        if NPB > 1:
            r1 = BLOCK_P + tl.arange(0, BLOCK_P)
            a1 = _heads_load(r1, rd_c, rd_s1, rd_s2, mat, h, P, HP, offs_r, mr, rx_b, x_b,
                             z_b, RD_FMT, BLOCK_P, N, RING, HAS_Z, WORDS)
        if TAIL > 0:
            rt = NPB * BLOCK_P + tl.arange(0, TAIL)
            at = _heads_load(rt, rd_c, rd_s1, rd_s2, mat, h, P, HP, offs_r, mr, rx_b, x_b,
                             z_b, RD_FMT, TAIL, N, RING, HAS_Z, WORDS)
        _heads_finish(r0, a0, h, P, HP, c, rx_b, out_b, C_t, Ce, Co, eL, wbc, wc, D_h, RD_FMT,
                      BLOCK_P, N, RING, HAS_Z)
        if NPB > 1:
            _heads_finish(r1, a1, h, P, HP, c, rx_b, out_b, C_t, Ce, Co, eL, wbc, wc, D_h,
                          RD_FMT, BLOCK_P, N, RING, HAS_Z)
        if TAIL > 0:
            _heads_finish(rt, at, h, P, HP, c, rx_b, out_b, C_t, Ce, Co, eL, wbc, wc, D_h,
                          RD_FMT, TAIL, N, RING, HAS_Z)
    else:
        for q in tl.static_range(NPB):
            _heads_tile(q * BLOCK_P + tl.arange(0, BLOCK_P), rd_c, rd_s1, rd_s2, mat, h, P, HP,
                        c, offs_r, mr, rx_b, x_b, z_b, out_b, C_t, Ce, Co, eL, wbc, wc, D_h,
                        RD_FMT, BLOCK_P, N, RING, HAS_Z, WORDS)
        if TAIL > 0:
            _heads_tile(NPB * BLOCK_P + tl.arange(0, TAIL), rd_c, rd_s1, rd_s2, mat, h, P, HP,
                        c, offs_r, mr, rx_b, x_b, z_b, out_b, C_t, Ce, Co, eL, wbc, wc, D_h,
                        RD_FMT, TAIL, N, RING, HAS_Z, WORDS)


@triton.jit
def m2_out_heads_kernel(
    rd_c, rd_s1, rd_s2, ring_x, ring_B, ring_dt, tickets, state_idx, pos,
    x_ptr, dt_ptr, B_ptr, C_ptr, z_ptr, out_ptr, A_ptr, D_ptr, dtb_ptr,
    s_xb, s_dtb, s_Bb, s_Cb, s_zb, s_ob,
    H, G, P, L, LR,
    N: tl.constexpr, BLOCK_P: tl.constexpr, NPB: tl.constexpr, HPP: tl.constexpr,
    NS: tl.constexpr, RB: tl.constexpr, RD_FMT: tl.constexpr, RING: tl.constexpr,
    HAS_Z: tl.constexpr, HAS_D: tl.constexpr, HAS_DT_BIAS: tl.constexpr,
    DT_SOFTPLUS: tl.constexpr, TAIL: tl.constexpr = 0, wts=None, WEIGHTS: tl.constexpr = False,
    PFO: tl.constexpr = 0, LOADS_FIRST: tl.constexpr = False, CONC: tl.constexpr = False,
    WORDS: tl.constexpr = False, PAIRS: tl.constexpr = 0, AHEAD: tl.constexpr = 0,
    LOOP: tl.constexpr = False,
):
    """Output launch, one program per ``HPP`` heads (of one B/C group) of a batch row:
    per head (a ``tl.range`` pipeline over heads) one coefficient per ring entry (the
    decay weight times ``B_i . C``: loaded from :func:`m2_weights_kernel` with
    ``WEIGHTS``, else computed here from the group's ring of B), then its ``NPB`` tiles
    (unrolled) with nothing but the row dot, the ring rows and the gate per tile.
    The step's own entry is a scalar coefficient on x, not a ring-tile select.
    ``TAIL``: rows of a last, smaller tile after ``NPB`` full ones (a headdim of 80 as
    two 32-row tiles and a 16-row one instead of three 32-row tiles, a sixth of them
    masked rows; ``SplitConfig.tail_tile``).  ``CONC`` (the flush launch on a second
    stream): the clocks are left to :func:`clocks.advance_clocks_kernel`.  ``WORDS``
    (4-bit copies): the codes load as int32 words and each nibble pair becomes fp16 bits
    by two shifts and two masks (:func:`tl_mamba2_fast.word_dot`).  ``PAIRS`` (the
    headdim, ``HPP`` 2, ``WEIGHTS``; ``SplitConfig.out_pairs``): the two heads' rows are
    one run of tiles (:func:`_pair_heads`; ``AHEAD``: its loads that many tiles ahead;
    ``LOOP``: a loop of ``NS`` stages)."""
    pid = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    slot = tl.load(state_idx + b)
    c = tl.load(pos + b)  # ring position (written by the flush launch); -1: padding
    if PFO > 0:  # the program PFO launches later: its row's slot and position now, its
        nh = tl.num_programs(0)  # L2 prefetch at the end
        tgt = pid + b * nh + PFO
        b_t = tl.minimum(tgt // nh, tl.num_programs(1) - 1)
        slot_t = tl.load(state_idx + b_t)
        c_t = tl.load(pos + b_t)
    h0 = pid * HPP
    out_b = out_ptr + b * s_ob
    if slot < 0:  # padding row: zero outputs
        for hh in range(HPP):
            for q in tl.static_range(NPB):
                rows = q * BLOCK_P + tl.arange(0, BLOCK_P)
                tl.store(out_b + (h0 + hh) * P + rows, 0.0, mask=rows < P)
            if TAIL > 0:
                tl.store(out_b + (h0 + hh) * P + NPB * BLOCK_P + tl.arange(0, TAIL), 0.0)
        return
    if (pid == 0) and not CONC:  # (CONC: clocks.advance_clocks_kernel advances it)
        tl.atomic_add(tickets + slot, 1, sem="relaxed")  # nobody in this launch reads it
    if c != L - 1:
        hpg = H // G
        g = h0 // hpg
        mat0 = slot.to(tl.int64) * H
        offs_n = tl.arange(0, N)
        offs_r = tl.arange(0, RB)
        HP = H * P
        win = slot.to(tl.int64) * LR
        rx_b = ring_x + win * HP
        rdt_b = ring_dt + win * H
        rB_g = ring_B + (win * G + g) * N
        x_b = x_ptr + b * s_xb
        z_b = z_ptr + b * s_zb
        dt_b = dt_ptr + b * s_dtb
        C_b = C_ptr + b * s_Cb + g * N
        B_t = ring_round(tl.load(B_ptr + b * s_Bb + g * N + offs_n).to(tl.float32), RING)
        C_t = tl.load(C_b + offs_n).to(tl.float32)
        Ce = tl.load(C_b + 2 * tl.arange(0, N // 2)).to(tl.float32) * TWO63
        Co = tl.load(C_b + 2 * tl.arange(0, N // 2) + 1).to(tl.float32) * TWO63
        mr = offs_r < c
        if not WEIGHTS:
            rB = ring_load(rB_g + offs_r[:, None] * (G * N) + offs_n[None, :], mr[:, None],
                           RING)
            BC = tl.sum(rB * C_t[None, :], axis=1)  # entries < c (0 elsewhere)
            BCc = tl.sum(B_t * C_t, axis=0)  # this step's entry
        if PAIRS > 0:
            tl.static_assert(WEIGHTS and (HPP == 2), "PAIRS: two heads, weights launch")
            _pair_heads(rd_c, rd_s1, rd_s2, wts, b, H, h0, mat0 + h0, P, HP, c, offs_r, mr,
                        rx_b, rdt_b, x_b, z_b, out_b, C_t, Ce, Co, D_ptr, PAIRS, BLOCK_P, N,
                        RB, RD_FMT, RING, HAS_Z, HAS_D, WORDS, AHEAD, LOOP, NS)
        else:
            for hh in tl.range(0, HPP, num_stages=NS):
                h = h0 + hh
                if WEIGHTS:  # from the flush launch (_out_weights)
                    wbc, wc, eL, dt, D_h = _head_weights(wts, b, H, h, offs_r, D_ptr, RB, HAS_D)
                else:
                    A_h, D_h, dtb = head_consts(h, A_ptr, D_ptr, dtb_ptr, HAS_D, HAS_DT_BIAS)
                    dt = dt_of(tl.load(dt_b + h), dtb, HAS_DT_BIAS, DT_SOFTPLUS)
                    rdt = tl.load(rdt_b + h + offs_r * H, mask=mr, other=0.0)
                    edt = tl.where(offs_r == c, dt, rdt)
                    cum = tl.cumsum(edt * A_h, axis=0)
                    last = tl.sum(tl.where(offs_r == c, cum, 0.0), axis=0)
                    wbc = tl.where(mr, rdt * tl.exp(last - cum), 0.0) * BC  # entries < c
                    wc = dt * BCc  # this step's entry: exp(last - cum_c) = 1
                    eL = tl.exp(last)
                _head_tiles(rd_c, rd_s1, rd_s2, mat0 + h, h, P, HP, c, offs_r, mr, rx_b, x_b, z_b,
                            out_b, C_t, Ce, Co, eL, wbc, wc, D_h, RD_FMT, BLOCK_P, NPB, TAIL, N,
                            RING, HAS_Z, WORDS, LOADS_FIRST)
                tl.store(rdt_b + c * H + h, dt)
        if h0 % hpg == 0:  # the group's first program appends B
            ring_store(rB_g + c * (G * N) + offs_n, B_t, offs_n < N, RING)
    if PFO > 0:
        if (tgt // nh < tl.num_programs(1)) & (slot_t >= 0) & (c_t != L - 1):
            h_t = (tgt % nh) * HPP
            _prefetch_out(rd_c, rd_s1, ring_x, slot_t.to(tl.int64) * H + h_t, h_t,
                          slot_t.to(tl.int64), c_t, P, H * P, LR, tl.arange(0, RB), RD_FMT, N,
                          HPP, RING)


settle_module_keys(__name__)  # every process looks its kernels up under one key

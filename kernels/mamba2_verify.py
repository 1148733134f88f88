"""Staged speculative verify for Mamba-2 (``mamba2_verify(..., verify_launch="staged-dot")``,
the default, or ``"staged"``): a flush launch (work only where drafts would overrun the
window), a prep launch, then an output launch that reads each state tile once for all
``T`` drafts.

Torch reference: ``precisionlab.speculative.SpeculativeDecoder.verify`` (as the
single-launch verify of ``mamba2_kernel``; same semantics, see ``mamba2_spec``).

* **Flush launch** (:func:`m2_verify_flush_kernel`, grid ``(heads, batch)``): per
  (row, head) the committed count ``c``; if ``c + T > L`` the head's committed
  entries are folded into a new checkpoint and read copy (the single kernel's verify
  flush, one head per program) and the drafts go to the other ring half; the other
  programs return at once.
* **Prep launch** (:func:`m2_verify_prep_kernel`, grid ``(groups, batch)``): the
  products ``B_i . C_k`` of the group's ring entries (committed, then the drafts)
  with each draft's C, once per group; for all the group's heads at once the decay of
  the copy ``e^Lambda_k`` and one coefficient per ring entry ``W[k, i] = w_k(i) (B_i .
  C_k)`` (entries before the draft and the draft itself) to a small scratch ``(batch,
  heads, TB, RB)``; the drafts' dt and (per group) B are appended to the ring; the
  row's draft base ``c0 | half << 16`` goes to ``pos``.
* **Output launch** (:func:`m2_verify_out_kernel`, grid ``(heads, batch)``): per
  tile ``[BLOCK_P, N]`` of the copy (a ``tl.range`` pipeline over the head's
  tiles) the tile is loaded and decoded once; each draft's output is
  ``e^Lambda_k (S C_k) + sum_i W[k, i] x_i + D x_k`` (gated) with the ring's
  committed x rows and the drafts' x rows loaded once per tile; the drafts' x
  rows are appended to the ring.
* **Output launch as matrix products** (:func:`m2_verify_out_mm_kernel`,
  ``verify_launch="staged-dot"``): the same outputs, but all drafts' reductions of a
  tile come from one tensor-core product ``X @ [C_0 .. C_{T-1}]`` (drafts padded to
  ``TP >= 16`` columns; ``X`` the tile's decoded values, exact in tf32 for every
  format but fp32) and the ring's part from one more, ``[x_i] @ W^T`` (ring and
  draft x rows times the prep coefficients); ~fp32 accuracy by explicit tf32 splits
  of the operands that are not exact in tf32 (``tl_dots.dot_fp32``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .compile_worker import settle_module_keys
from .mamba2_kernel import fold_committed
from .mamba2_step import device_buffer
from .tl_common import (
    K_RING_FP32,
    decay_weights,
    dt_of,
    gate,
    ring_load,
    ring_round,
    ring_store,
)
from .tl_dots import dot_fp32, tile_values
from .tl_formats import K_FP32, load_codes
from .tl_mamba2_fast import TWO63, row_dot


@triton.jit(do_not_specialize=["seed_ck", "seed_rd"])
def m2_verify_flush_kernel(
    ck_c, ck_s1, ck_s2, rd_c, rd_s1, rd_s2, fresh_ptr,
    ring_x, ring_B, ring_dt, ring_len, steps, state_idx, A_ptr,
    seed_ck, seed_rd, H, G, P, L, LR,
    N: tl.constexpr, FB: tl.constexpr, NQ: tl.constexpr, RB: tl.constexpr, T: tl.constexpr,
    CK_FMT: tl.constexpr, RD_FMT: tl.constexpr, SPLIT: tl.constexpr, RING: tl.constexpr,
    WRITE_FRESH: tl.constexpr, NEED_AMAX: tl.constexpr,
):
    """First launch of the staged verify, grid ``(heads, batch)``: where a row's
    committed entries and its T drafts would overrun the window (``c + T > L``), fold
    head h's committed entries into a new checkpoint and read copy (the single kernel's
    verify flush, one head per program); every other program returns after two loads."""
    h = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    slot = tl.load(state_idx + b)
    if slot >= 0:
        rl = tl.load(ring_len + slot)
        c = rl & 0xFFFF
        if c + T > L:
            half = rl >> 16
            g = h // (H // G)
            offs_n = tl.arange(0, N)
            offs_r = tl.arange(0, RB)
            HP = H * P
            A_h = tl.load(A_ptr + h).to(tl.float32)
            mat = slot.to(tl.int64) * H + h
            t = tl.load(steps + slot)
            win = slot.to(tl.int64) * LR + half * L
            rx_h = ring_x + win * HP + h * P
            rB = ring_load(ring_B + (win * G + g) * N + offs_r[:, None] * (G * N)
                           + offs_n[None, :], (offs_r < c)[:, None], RING)
            rdt = tl.load(ring_dt + win * H + h + offs_r * H, mask=offs_r < c, other=0.0)
            last, w = decay_weights(rdt, tl.cumsum(rdt * A_h, axis=0), offs_r, c - 1)
            fold_committed(ck_c, ck_s1, ck_s2, rd_c, rd_s1, rd_s2, fresh_ptr, mat, P, rx_h, HP,
                           offs_r, c, last, w, rB, seed_ck, seed_rd, t - 1, CK_FMT, RD_FMT, FB,
                           NQ, N, RING, SPLIT, NEED_AMAX, WRITE_FRESH)


@triton.jit
def m2_verify_prep_kernel(
    ring_B, ring_dt, ring_len, state_idx, pos, coef, eLs,
    dt_ptr, B_ptr, C_ptr, A_ptr, dtb_ptr,
    s_dtb, s_dtt, s_Bb, s_Bt, s_Cb, s_Ct,
    H, G, L, LR,
    N: tl.constexpr, RB: tl.constexpr, T: tl.constexpr, TB: tl.constexpr,
    HG: tl.constexpr, RING: tl.constexpr, HAS_DT_BIAS: tl.constexpr,
    DT_SOFTPLUS: tl.constexpr,
):
    """Second launch of the staged verify, grid ``(groups, batch)``: the ring half and
    draft base of the row (after any flush of the first launch: then the drafts go to
    the other half, from entry 0) to ``pos`` (group 0); the products ``B_i . C_k`` of
    the group's ring entries (committed, then the drafts) with each draft's C, once per
    group; then for all ``HG`` (padded) heads of the group at once the decays of the
    copy ``e^Lambda_k`` and the coefficients ``W[k, i] = w_k(i) (B_i . C_k)``; appends
    the drafts' B (the group's) and dt (its heads') to the ring."""
    g = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    slot = tl.load(state_idx + b)
    if slot < 0:
        if g == 0:
            tl.store(pos + b, -1)
        return
    offs_n = tl.arange(0, N)
    offs_r = tl.arange(0, RB)
    offs_t = tl.arange(0, TB)
    offs_j = tl.arange(0, HG)
    hpg = H // G
    rl = tl.load(ring_len + slot)
    c = rl & 0xFFFF
    half = rl >> 16
    if c + T > L:  # the first launch folded the committed entries
        c0 = c * 0
        half = 1 - half
    else:
        c0 = c
    if g == 0:
        tl.store(pos + b, c0 | (half << 16))
    win = slot.to(tl.int64) * LR + half * L
    oB = offs_r[:, None] * (G * N) + offs_n[None, :]
    rB_g = ring_B + (win * G + g) * N
    rdt_b = ring_dt + win * H
    old = offs_r < c0
    j = offs_r - c0
    vd = (j >= 0) & (j < T)
    jj = tl.where(vd, j, 0)
    B_b = B_ptr + b * s_Bb + g * N
    C_b = C_ptr + b * s_Cb + g * N
    rB = ring_load(rB_g + oB, old[:, None], RING)
    iB = tl.load(B_b + jj[:, None] * s_Bt + offs_n[None, :], mask=vd[:, None], other=0.0)
    iB = ring_round(iB.to(tl.float32), RING)
    eB = tl.where(old[:, None], rB, iB)
    BC = tl.zeros((TB, RB), dtype=tl.float32)  # row k: B_i . C_k
    for k in tl.static_range(T):
        C_k = tl.load(C_b + k * s_Ct + offs_n).to(tl.float32)
        BC = tl.where(offs_t[:, None] == k, tl.sum(eB * C_k[None, :], axis=1)[None, :], BC)
    # the group's heads: (HG, RB) tiles of dt, (HG, TB, RB) coefficients
    mj = offs_j < hpg
    hs = g * hpg + offs_j
    A_h = tl.load(A_ptr + hs, mask=mj, other=0.0).to(tl.float32)
    dtb = 0.0
    if HAS_DT_BIAS:
        dtb = tl.load(dtb_ptr + hs, mask=mj, other=0.0).to(tl.float32)[:, None]
    rdt = tl.load(rdt_b + hs[:, None] + offs_r[None, :] * H, mask=mj[:, None] & old[None, :],
                  other=0.0)
    dmask = mj[:, None] & vd[None, :]
    idt = dt_of(tl.load(dt_ptr + b * s_dtb + jj[None, :] * s_dtt + hs[:, None], mask=dmask,
                        other=0.0), dtb, HAS_DT_BIAS, DT_SOFTPLUS)
    edt = tl.where(old[None, :], rdt, tl.where(vd[None, :], idt, 0.0))
    cum = tl.cumsum(edt * A_h[:, None], axis=1)
    q = c0 + offs_t  # draft k's entry
    at_q = offs_r[None, None, :] == q[None, :, None]
    last = tl.sum(tl.where(at_q, cum[:, None, :], 0.0), axis=2)  # (HG, TB)
    w = edt[:, None, :] * tl.where(offs_r[None, None, :] <= q[None, :, None],
                                   tl.exp(last[:, :, None] - cum[:, None, :]), 0.0)
    base = (b * H + hs) * TB  # (HG,)
    mk = mj[:, None] & (offs_t < T)[None, :]
    tl.store(coef + (base[:, None, None] + offs_t[None, :, None]) * RB + offs_r[None, None, :],
             w * BC[None, :, :], mask=mk[:, :, None])
    tl.store(eLs + base[:, None] + offs_t[None, :], tl.exp(last), mask=mk)
    tl.store(rdt_b + offs_r[None, :] * H + hs[:, None], idt, mask=dmask)
    ring_store(rB_g + oB, iB, vd[:, None], RING)


@triton.jit
def _verify_rows(pos, ring_x, D_ptr, b, h, slot, H, P, L, LR, RB: tl.constexpr,
                 T: tl.constexpr, TB: tl.constexpr, HAS_D: tl.constexpr):
    """What both verify output kernels need of head ``h`` of batch row ``b``: its ring
    rows' base (the half of the double window the prep launch chose), D, the ring
    entries that are committed (``old``) or drafts (``vd``, draft index ``jj``) and the
    row of the prep launch's coefficients (``base``)."""
    pv = tl.load(pos + b)
    c0 = pv & 0xFFFF
    win = slot.to(tl.int64) * LR + (pv >> 16) * L
    rx_h = ring_x + win * (H * P) + h * P
    D_h = 0.0
    if HAS_D:
        D_h = tl.load(D_ptr + h).to(tl.float32)
    offs_r = tl.arange(0, RB)
    old = offs_r < c0
    j = offs_r - c0
    vd = (j >= 0) & (j < T)
    jj = tl.where(vd, j, 0)
    return rx_h, D_h, old, vd, jj, (b * H + h) * TB


@triton.jit
def m2_verify_out_kernel(
    rd_c, rd_s1, rd_s2, ring_x, state_idx, pos, coef, eLs,
    x_ptr, C_ptr, z_ptr, out_ptr, D_ptr,
    s_xb, s_xt, s_Cb, s_Ct, s_zb, s_zt, s_ob, s_ot,
    H, G, P, L, LR,
    N: tl.constexpr, BLOCK_P: tl.constexpr, NPB: tl.constexpr, RB: tl.constexpr,
    T: tl.constexpr, TB: tl.constexpr, RD_FMT: tl.constexpr, RING: tl.constexpr,
    HAS_Z: tl.constexpr, HAS_D: tl.constexpr, NS: tl.constexpr = 2,
):
    h = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    slot = tl.load(state_idx + b)
    out_b = out_ptr + b * s_ob + h * P
    if slot < 0:
        for q in tl.static_range(NPB):
            rows = q * BLOCK_P + tl.arange(0, BLOCK_P)
            for k in tl.static_range(T):
                tl.store(out_b + k * s_ot + rows, 0.0, mask=rows < P)
        return
    g = h // (H // G)
    offs_r = tl.arange(0, RB)
    HP = H * P
    mat = slot.to(tl.int64) * H + h
    x_h = x_ptr + b * s_xb + h * P
    z_h = z_ptr + b * s_zb + h * P
    C_b = C_ptr + b * s_Cb + g * N
    rx_h, D_h, old, vd, jj, base = _verify_rows(pos, ring_x, D_ptr, b, h, slot, H, P, L, LR,
                                                RB, T, TB, HAS_D)
    for q in tl.range(0, NPB, num_stages=NS):
        rows = q * BLOCK_P + tl.arange(0, BLOCK_P)
        m = rows < P
        # the state tile: loaded once for all drafts
        from_ring = ring_load(rx_h + offs_r[:, None] * HP + rows[None, :],
                              old[:, None] & m[None, :], RING)
        ix = tl.load(x_h + jj[:, None] * s_xt + rows[None, :], mask=vd[:, None] & m[None, :],
                     other=0.0).to(tl.float32)
        ix = ring_round(ix, RING)
        ex = tl.where(old[:, None], from_ring, ix)
        codes, s1, s2 = load_codes(rd_c, rd_s1, rd_s2, mat, rows, m, P, RD_FMT, BLOCK_P, N)
        for k in tl.static_range(T):
            C_k = tl.load(C_b + k * s_Ct + tl.arange(0, N)).to(tl.float32)
            Ce = tl.load(C_b + k * s_Ct + 2 * tl.arange(0, N // 2)).to(tl.float32) * TWO63
            Co = tl.load(C_b + k * s_Ct + 2 * tl.arange(0, N // 2) + 1).to(tl.float32) * TWO63
            W_k = tl.load(coef + (base + k) * RB + offs_r)
            y = tl.load(eLs + base + k) * row_dot(codes, s1, s2, C_k, Ce, Co, RD_FMT, BLOCK_P,
                                                  N)
            y = y + tl.sum(W_k[:, None] * ex, axis=0)
            x_k = tl.load(x_h + k * s_xt + rows, mask=m, other=0.0).to(tl.float32)
            z_k = 0.0
            if HAS_Z:
                z_k = tl.load(z_h + k * s_zt + rows, mask=m, other=0.0).to(tl.float32)
            tl.store(out_b + k * s_ot + rows, gate(y, x_k, z_k, D_h, HAS_Z), mask=m)
        ring_store(rx_h + offs_r[:, None] * HP + rows[None, :], ix, vd[:, None] & m[None, :],
                   RING)


@triton.jit
def m2_verify_out_mm_kernel(
    rd_c, rd_s1, rd_s2, ring_x, state_idx, pos, coef, eLs,
    x_ptr, C_ptr, z_ptr, out_ptr, D_ptr,
    s_xb, s_xt, s_Cb, s_Ct, s_zb, s_zt, s_ob, s_ot,
    H, G, P, L, LR,
    N: tl.constexpr, BLOCK_P: tl.constexpr, NPB: tl.constexpr, RB: tl.constexpr,
    T: tl.constexpr, TB: tl.constexpr, TP: tl.constexpr, RD_FMT: tl.constexpr,
    RING: tl.constexpr, C_EXACT: tl.constexpr, HAS_Z: tl.constexpr, HAS_D: tl.constexpr,
    NS: tl.constexpr = 2,
):
    """:func:`m2_verify_out_kernel` with every draft's reductions of a tile as two
    tensor-core products: ``Y = e^Lambda * rs * (X @ C^T) + Ex @ W^T`` (``(BLOCK_P, TP)``,
    column k = draft k).  ``C_EXACT``: C is bf16/fp16 (exact in tf32, not split); the
    tile's values are split only for an fp32 copy, the ring rows only for an fp32 ring."""
    h = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    slot = tl.load(state_idx + b)
    out_b = out_ptr + b * s_ob + h * P
    offs_t = tl.arange(0, TP)
    mt = offs_t < T
    tt = tl.where(mt, offs_t, 0)
    if slot < 0:
        for q in tl.static_range(NPB):
            rows = q * BLOCK_P + tl.arange(0, BLOCK_P)
            tl.store(out_b + tt[None, :] * s_ot + rows[:, None],
                     tl.zeros((BLOCK_P, TP), dtype=tl.float32),
                     mask=(rows < P)[:, None] & mt[None, :])
        return
    g = h // (H // G)
    offs_r = tl.arange(0, RB)
    offs_n = tl.arange(0, N)
    HP = H * P
    mat = slot.to(tl.int64) * H + h
    x_h = x_ptr + b * s_xb + h * P
    z_h = z_ptr + b * s_zb + h * P
    rx_h, D_h, old, vd, jj, base = _verify_rows(pos, ring_x, D_ptr, b, h, slot, H, P, L, LR,
                                                RB, T, TB, HAS_D)
    # per head, loaded once: C^T (N, TP), the ring coefficients W^T (RB, TP), the decays
    Ct = tl.load(C_ptr + b * s_Cb + g * N + tt[None, :] * s_Ct + offs_n[:, None],
                 mask=mt[None, :], other=0.0).to(tl.float32)
    Wt = tl.load(coef + (base + tt[None, :]) * RB + offs_r[:, None], mask=mt[None, :],
                 other=0.0)
    eL = tl.load(eLs + base + tt, mask=mt, other=0.0)
    for q in tl.range(0, NPB, num_stages=NS):
        rows = q * BLOCK_P + tl.arange(0, BLOCK_P)
        m = rows < P
        # ring entries (committed x, then the drafts' x) as columns: (BLOCK_P, RB)
        r_ptrs = rx_h + offs_r[None, :] * HP + rows[:, None]
        from_ring = ring_load(r_ptrs, m[:, None] & old[None, :], RING)
        ix = tl.load(x_h + jj[None, :] * s_xt + rows[:, None], mask=m[:, None] & vd[None, :],
                     other=0.0).to(tl.float32)
        ix = ring_round(ix, RING)
        ex = tl.where(old[None, :], from_ring, ix)
        codes, s1, s2 = load_codes(rd_c, rd_s1, rd_s2, mat, rows, m, P, RD_FMT, BLOCK_P, N)
        X, rs = tile_values(codes, s1, s2, RD_FMT, BLOCK_P, N)
        y = dot_fp32(X, Ct, RD_FMT != K_FP32, C_EXACT) * (rs[:, None] * eL[None, :])
        y = y + dot_fp32(ex, Wt, RING != K_RING_FP32, False)
        m2 = m[:, None] & mt[None, :]
        xk = tl.load(x_h + tt[None, :] * s_xt + rows[:, None], mask=m2, other=0.0).to(tl.float32)
        zk = 0.0
        if HAS_Z:
            zk = tl.load(z_h + tt[None, :] * s_zt + rows[:, None], mask=m2,
                         other=0.0).to(tl.float32)
        tl.store(out_b + tt[None, :] * s_ot + rows[:, None], gate(y, xk, zk, D_h, HAS_Z),
                 mask=m2)
        ring_store(r_ptrs, ix, m[:, None] & vd[None, :], RING)


_SCRATCH: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _scratch(batch: int, H: int, TB: int, RB: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Coefficient and decay scratch of the staged verify (cached per shape and device)."""
    key = (batch, H, TB, RB, str(device))
    if key not in _SCRATCH:
        _SCRATCH[key] = (torch.empty((batch, H, TB, RB), dtype=torch.float32, device=device),
                         torch.empty((batch, H, TB), dtype=torch.float32, device=device))
    return _SCRATCH[key]


def launch_staged_verify(cache, x, dt, B, C, params, *, z, out, state_indices, dt_softplus,
                         block_p: int | None = None, num_warps: int | None = None,
                         prep_warps: int = 4, flush_warps: int = 2, dot: bool = False) -> None:
    """The flush launch, the prep launch, then the output launch (inputs token-major
    ``(batch, T, ...)``).  ``block_p`` rows per output tile (default 32), ``num_warps``
    of the output launch (default 2), ``prep_warps`` and ``flush_warps`` of the prep and
    flush launches; ``dot``: the output launch as tensor-core products
    (:func:`m2_verify_out_mm_kernel`).  Warps picked on an H200 (batch 256, T = 4, L = 16,
    nano-4b / super-120b, us): the flush launch with 2 warps 20.4 / 25.3 where nothing
    flushes and 622 / 673 where all rows do (4 warps: 22.7 / 28.0 and 653 / 710; 1 warp:
    17.4 / 22.3 and 655 / 700), the prep launch with 4 warps 14.6 / 14.7 (2: 16.1 / 16.4)."""
    from .codec import as_int32
    from .mamba2_step import _RING_IDS, FLUSH_ROWS, _check_inputs
    from .tl_common import RING_FP32
    from .tl_formats import FMT_NVFP4

    ckpt, read = cache.ckpt, cache.read
    slots, H, P, N = ckpt.shape
    if N & (N - 1) or N < 16:
        raise ValueError(f"dstate must be a power of two >= 16, got {N}")
    _check_inputs(x, dt, B, C, z, out)
    batch, T = x.shape[0], x.shape[1]
    G = B.shape[-2]
    rd = read if read is not None else ckpt
    ring_id = _RING_IDS[cache.ring_x.dtype]
    rx, rB = cache.ring_x, cache.ring_B
    if ring_id != RING_FP32:
        rx, rB = rx.view(torch.int16), rB.view(torch.int16)
    L, LR = cache.window, cache.ring_x.shape[1]
    RB = max(16, triton.next_power_of_2(L))
    TB = max(2, triton.next_power_of_2(T))
    cache.pos = device_buffer(cache.pos, max(batch, 1), x.device, torch.int32, zero=True)
    coef, eLs = _scratch(batch, H, TB, RB, x.device)
    need_amax = FMT_NVFP4 in (ckpt.fmt_id, rd.fmt_id)
    dtb = params.dt_bias if params.dt_bias is not None else params.A
    m2_verify_flush_kernel[(H, batch)](
        *ckpt.kernel_args(), *rd.kernel_args(),
        cache.fresh if cache.fresh is not None else ckpt.codes,
        rx, rB, cache.ring_dt, cache.ring_len, cache.steps, state_indices, params.A,
        as_int32(cache.seed), as_int32(cache.seed + 1), H, G, P, L, LR,
        N=N, FB=FLUSH_ROWS, NQ=triton.cdiv(P, FLUSH_ROWS), RB=RB, T=T,
        CK_FMT=ckpt.fmt_id, RD_FMT=rd.fmt_id, SPLIT=read is not None, RING=ring_id,
        WRITE_FRESH=cache.fresh is not None, NEED_AMAX=need_amax, num_warps=flush_warps,
    )
    m2_verify_prep_kernel[(G, batch)](
        rB, cache.ring_dt, cache.ring_len, state_indices, cache.pos, coef, eLs,
        dt, B, C, params.A, dtb,
        dt.stride(0), dt.stride(1), B.stride(0), B.stride(1), C.stride(0), C.stride(1),
        H, G, L, LR,
        N=N, RB=RB, T=T, TB=TB, HG=triton.next_power_of_2(H // G), RING=ring_id,
        HAS_DT_BIAS=params.dt_bias is not None, DT_SOFTPLUS=dt_softplus, num_warps=prep_warps,
    )
    bp = max(16, min(block_p or 32, triton.next_power_of_2(P)))
    zz = z if z is not None else x
    args = (*rd.kernel_args(), rx, state_indices, cache.pos, coef, eLs,
            x, C, zz, out, params.D if params.D is not None else params.A,
            x.stride(0), x.stride(1), C.stride(0), C.stride(1),
            zz.stride(0) if z is not None else 0, zz.stride(1) if z is not None else 0,
            out.stride(0), out.stride(1), H, G, P, L, LR)
    kw = dict(N=N, BLOCK_P=bp, NPB=triton.cdiv(P, bp), RB=RB, T=T, TB=TB, RD_FMT=rd.fmt_id,
              RING=ring_id, HAS_Z=z is not None, HAS_D=params.D is not None,
              num_warps=num_warps or 2)
    if dot:
        m2_verify_out_mm_kernel[(H, batch)](
            *args, TP=max(16, triton.next_power_of_2(T)),
            C_EXACT=C.dtype in (torch.bfloat16, torch.float16), **kw)
    else:
        m2_verify_out_kernel[(H, batch)](*args, **kw)


settle_module_keys(__name__)  # every process looks its kernels up under one key

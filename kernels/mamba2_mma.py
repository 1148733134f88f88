"""The nvfp4 read copy's state product ``S c`` of a Mamba-2 output step on the tensor
cores (Gluon, ``mma.sync`` m16n8k16), with the operand built in registers.

Torch reference: :func:`state_dots_reference` (the decoded read copy times ``C``, as
``tl_mamba2_fast.row_dot`` computes it on the CUDA cores).

Each thread loads the 16 bytes of a state row that its A fragment holds (one 128-bit
load per row; four lanes cover a row of 128 codes), turns every int32 word of eight E2M1
codes into four fp16 pair registers (the value times 2**-14, exact; subnormal for code 1),
multiplies each pair by its E4M3 block scale (exact in fp16) and hands the pairs to the
tensor cores as they are: the product's K order is the fragments' order, so ``c``'s
elements are permuted to match (:func:`column_of`).  ``c`` enters as an fp16 head and
remainder (two of the eight operand columns) of ``c`` scaled by a power of two that puts
its largest magnitude just below 2**15, so the products carry about 22 of ``c``'s bits;
the fp32 accumulation runs inside the tensor cores.  The results agree with the CUDA-core
row dots to about 1e-6 of ``sum |S c|``, not bit for bit.

A program handles one (batch row, B/C group): the group's heads' rows, 64 at a time (4
warps of 16 rows), the next 64 rows' loads in flight while a tile is multiplied.  Rows
of padding slots and rows that flush at this step (ring position ``L - 1``) are skipped;
the output launch reads the products from ``dots`` (``m2_out_heads_kernel``'s ``DOTS``).

Gluon has no interpreter: this module is imported only for compiled launches
(``mamba2_step.state_mma_block``); the CPU tests compile it offline for sm_90.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

N_COLS = 128
"""The dstate the product supports (four lanes of four int32 words per row)."""
ROWS = 64
"""Rows per tile: 4 warps of the 16 rows of one ``mma.sync``."""
WARPS = 4
RING_AHEAD = True
"""The output launch loads a tile's ring rows and weights with the previous tile."""
RING_LANES = True
"""The output launch's ring sum: each lane holds all entries of its row (no cross-warp
sum; each row is held by two warps)."""


def column_of(k: int) -> int:
    """The state column whose code sits at operand row ``k`` (0..127) of the product.

    ``k``'s bits: 0 the fp16 half of a pair register (code ``m`` or ``m + 4`` of a word),
    1-2 the lane's quarter of the row, 3-4 the pair ``m``, 5-6 the word among the lane's
    four (``_state_dots_kernel``'s joins, reshape and permute give this order)."""
    half, quarter = k & 1, (k >> 1) & 3
    m = ((k >> 3) & 1) + 2 * ((k >> 4) & 1)
    word = quarter * 4 + ((k >> 5) & 3)
    return word * 8 + m + 4 * half


@gluon.jit
def _scaled_half(p, s16, HIGH: gl.constexpr):
    """One fp16 half of the int32 pairs ``p``, times its block scale ``s16`` (exact)."""
    if HIGH:
        h = (p >> 16).to(gl.int16)
    else:
        h = (p & 0xFFFF).to(gl.int16)
    return h.to(gl.float16, bitcast=True) * s16


@gluon.jit
def _halves(e04, e15, e26, e37, s16, HIGH: gl.constexpr):
    """(rows, words, j, i): the low (or high) halves of a word's four pairs, pair i + 2j."""
    return gl.join(gl.join(_scaled_half(e04, s16, HIGH), _scaled_half(e26, s16, HIGH)),
                   gl.join(_scaled_half(e15, s16, HIGH), _scaled_half(e37, s16, HIGH)))


@gluon.jit
def _c_operand(c_row, b_op: gl.constexpr):
    """The (128, 8) fp16 B operand: ``c`` (float32, fragment order) times ``2**k`` as a
    head (column 0) and remainder (column 1), and ``2**-k`` to undo it."""
    cmax = gl.max(gl.abs(c_row), axis=0)
    # 2**k with cmax * 2**k in [2**14, 2**15): from cmax's exponent (0: k = 0)
    e = (cmax.to(gl.int32, bitcast=True) >> 23) & 0xFF
    k = gl.where(cmax > 0.0, 141 - e, 0)
    k = gl.minimum(gl.maximum(k, -100), 100)
    up = ((k + 127) << 23).to(gl.float32, bitcast=True)
    down = ((127 - k) << 23).to(gl.float32, bitcast=True)
    cv = c_row * up
    hi = cv.to(gl.float16)
    lo = (cv - hi.to(gl.float32)).to(gl.float16)
    n = gl.expand_dims(gl.arange(0, 8, layout=gl.SliceLayout(0, b_op)), 0)
    B = gl.where(n == 0, gl.expand_dims(hi, 1),
                 gl.where(n == 1, gl.expand_dims(lo, 1), gl.zeros_like(gl.expand_dims(hi, 1))))
    return B, down


@gluon.jit
def _tile_product(w, sc, B, a_op: gl.constexpr, mma: gl.constexpr, R: gl.constexpr):
    """``(R,)`` row sums of the tile's decoded values (times 2**-14) with ``B``'s two
    columns: the words ``w`` and block-scale bytes ``sc`` as the fragments hold them."""
    MAG: gl.constexpr = 0x0E000E00
    SGN: gl.constexpr = -2147450880  # 0x80008000
    e04 = ((w << 9) & MAG) | ((w << 12) & SGN)
    e15 = ((w << 5) & MAG) | ((w << 8) & SGN)
    e26 = ((w << 1) & MAG) | ((w << 4) & SGN)
    e37 = ((w >> 3) & MAG) | (w & SGN)
    s16 = sc.to(gl.float8e4nv, bitcast=True).to(gl.float16)
    xs = gl.join(_halves(e04, e15, e26, e37, s16, False),
                 _halves(e04, e15, e26, e37, s16, True))
    # (R, word, j, i, half) -> K = word * 8 + j * 4 + i * 2 + half; the fragments' K bits:
    # half, the lane's quarter (word bits 2-3), i, j, the lane's word (word bits 0-1)
    x8 = gl.permute(gl.reshape(xs, [R, 2, 2, 2, 2, 2, 2, 2]), [0, 3, 4, 5, 6, 1, 2, 7])
    A = gl.convert_layout(gl.reshape(x8, [R, 128]), a_op, assert_trivial=True)
    acc = mma_v2(A, B, gl.zeros([R, 8], gl.float32, layout=mma))
    cols = gl.expand_dims(gl.arange(0, 8, layout=gl.SliceLayout(0, mma)), 0)
    return gl.sum(gl.where(cols < 2, acc, 0.0), axis=1)


@gluon.jit
def _state_dots_kernel(rd_w, rd_s1, rd_s2, state_idx, pos, C_ptr, dots, s_Cb, H, G, L,
                       P: gl.constexpr, HPG: gl.constexpr, NUM_WARPS: gl.constexpr):
    """``dots[b, h, p] = (S c)[p]`` of head ``h``'s read copy (nvfp4, matrix scale
    included) for the heads of group ``program_id(0)`` of batch row ``program_id(1)``."""
    gl.static_assert(NUM_WARPS == 4, "4 warps of 16 rows")
    R: gl.constexpr = 64
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, 8])
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_op: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    # (rows, words): a lane holds words 4q..4q+3 (q = lane % 4) of rows r and r + 8
    # (r = lane // 4) of its warp's 16 rows, the rows its A fragments hold
    WL: gl.constexpr = gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2], [8, 0]],
        lane_bases=[[0, 4], [0, 8], [1, 0], [2, 0], [4, 0]],
        warp_bases=[[16, 0], [32, 0]], block_bases=[], shape=[64, 16])
    g = gl.program_id(0)
    b = gl.program_id(1).to(gl.int64)
    slot = gl.load(state_idx + b)
    c = gl.load(pos + b)
    if (slot >= 0) & (c != L - 1):
        kd = gl.arange(0, 128, layout=gl.SliceLayout(1, b_op))
        col = ((kd >> 1) & 3) * 32 + ((kd >> 5) & 3) * 8 + ((kd >> 3) & 1) \
            + 2 * ((kd >> 4) & 1) + 4 * (kd & 1)  # column_of
        c_row = gl.load(C_ptr + b * s_Cb + g * 128 + col).to(gl.float32)
        B, down = _c_operand(c_row, b_op)
        total: gl.constexpr = HPG * P
        EVEN: gl.constexpr = total % R == 0  # no masks
        row0 = (slot.to(gl.int64) * H + g * HPG) * P  # the group's first row in the store
        rows = gl.arange(0, R, layout=gl.SliceLayout(1, WL))
        wcol = gl.expand_dims(gl.arange(0, 16, layout=gl.SliceLayout(0, WL)), 0)
        orows = gl.arange(0, R, layout=gl.SliceLayout(1, mma))
        out_b = dots + b * H * P + g * HPG * P
        n_tiles: gl.constexpr = (total + R - 1) // R
        m = gl.expand_dims((rows < total) | EVEN, 1)
        w_nx = gl.load(rd_w + (row0 + gl.expand_dims(rows, 1)) * 16 + wcol, mask=m, other=0)
        s_nx = gl.load(rd_s1 + (row0 + gl.expand_dims(rows, 1)) * 8 + wcol // 2, mask=m,
                       other=0)
        for t in range(n_tiles):
            w = w_nx
            sc = s_nx
            nr = gl.minimum(t + 1, n_tiles - 1) * R + rows  # the next tile (the last: itself)
            m = gl.expand_dims((nr < total) | EVEN, 1)
            w_nx = gl.load(rd_w + (row0 + gl.expand_dims(nr, 1)) * 16 + wcol, mask=m, other=0)
            s_nx = gl.load(rd_s1 + (row0 + gl.expand_dims(nr, 1)) * 8 + wcol // 2, mask=m,
                           other=0)
            y = _tile_product(w, sc, B, a_op, mma, R)
            r = t * R + orows
            mo = (r < total) | EVEN
            s2 = gl.load(rd_s2 + slot.to(gl.int64) * H + g * HPG + r // P, mask=mo, other=0.0)
            gl.store(out_b + r, y * (down * 16384.0) * s2, mask=mo)


@gluon.jit
def _to_ring(v, RING: gl.constexpr):
    """``v`` (float32) as the ring stores it: float32, or bf16 / fp16 bits (int16)."""
    if RING == 1:
        r = v.to(gl.bfloat16).to(gl.int16, bitcast=True)
    elif RING == 2:
        r = v.to(gl.float16).to(gl.int16, bitcast=True)
    else:
        r = v
    return r


@gluon.jit
def _from_ring(raw, RING: gl.constexpr):
    """float32 values of ring entries loaded raw (:func:`_to_ring`'s inverse)."""
    if RING == 1:
        v = raw.to(gl.bfloat16, bitcast=True).to(gl.float32)
    elif RING == 2:
        v = raw.to(gl.float16, bitcast=True).to(gl.float32)
    else:
        v = raw
    return v


@gluon.jit
def m2_out_mma_kernel(
    rd_w, rd_s1, rd_s2, ring_x, ring_B, ring_dt, tickets, state_idx, pos, wts,
    x_ptr, B_ptr, C_ptr, z_ptr, out_ptr, D_ptr,
    s_xb, s_Bb, s_Cb, s_zb, s_ob, H, G, L, LR,
    P: gl.constexpr, HPG: gl.constexpr, RB: gl.constexpr, RING: gl.constexpr,
    HAS_Z: gl.constexpr, HAS_D: gl.constexpr, CONC: gl.constexpr, NUM_WARPS: gl.constexpr,
    RING_AHEAD: gl.constexpr = True, RING_LANES: gl.constexpr = True,
):
    """The split step's output launch for an nvfp4 read copy of 128 columns, a program per
    (B/C group, batch row), the group's heads' rows 64 at a time: each row's ``S c`` on
    the tensor cores (:func:`_tile_product`), then, as ``mamba2_fast.m2_out_heads_kernel``
    with ``WEIGHTS``, ``e^Lambda (S c) + sum_i w_i x_i + w_c x`` from the weights launch's
    per-head weights and the ring's x rows, the gate, the output; it appends x (and the
    group's B, and each head's dt) at ring entry ``c``.  Padding rows output zeros; rows at
    ring position ``L - 1`` are the flush launch's."""
    gl.static_assert(NUM_WARPS == 4, "4 warps of 16 rows")
    R: gl.constexpr = 64
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, 8])
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_op: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    WL: gl.constexpr = gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2], [8, 0]],
        lane_bases=[[0, 4], [0, 8], [1, 0], [2, 0], [4, 0]],
        warp_bases=[[16, 0], [32, 0]], block_bases=[], shape=[64, 16])
    # (ring entry, row) tiles of the ring sum: RING_LANES, a lane holds every entry of
    # one row (two warps hold each row); else 8 entries (a cross-warp sum)
    if RING_LANES:
        RL: gl.constexpr = gl.BlockedLayout([RB, 1], [1, 32], [1, 4], [0, 1])
    else:
        RL: gl.constexpr = gl.BlockedLayout([RB // 2, 1], [1, 32], [2, 2], [0, 1])
    ROW: gl.constexpr = gl.SliceLayout(0, RL)
    total: gl.constexpr = HPG * P
    EVEN: gl.constexpr = total % R == 0
    n_tiles: gl.constexpr = (total + R - 1) // R
    g = gl.program_id(0)
    b = gl.program_id(1).to(gl.int64)
    slot = gl.load(state_idx + b)
    c = gl.load(pos + b)
    rows = gl.arange(0, R, layout=ROW)
    first = g * HPG * P  # the group's first row in a batch row's (heads, P) block
    out_b = out_ptr + b * s_ob + first
    if slot < 0:  # padding row: zero outputs
        for t in range(n_tiles):
            r = t * R + rows
            gl.store(out_b + r, gl.zeros([R], gl.float32, layout=ROW), mask=(r < total) | EVEN)
    else:
        if (g == 0) and not CONC:  # (CONC: the clock advance launch advances it)
            gl.atomic_add(tickets + slot, 1, sem="relaxed")
        if c != L - 1:
            HP = H * P
            win = slot.to(gl.int64) * LR
            rx_b = ring_x + win * HP + first
            # the group's B and each head's dt at entry c
            offs_n = gl.arange(0, 128, layout=gl.BlockedLayout([4], [32], [4], [0]))
            B_t = gl.load(B_ptr + b * s_Bb + g * 128 + offs_n).to(gl.float32)
            gl.store(ring_B + (win * G + g) * 128 + c * (G * 128) + offs_n, _to_ring(B_t, RING))
            offs_h = gl.arange(0, 32, layout=gl.BlockedLayout([1], [32], [4], [0]))
            mh = offs_h < HPG
            heads = g * HPG + offs_h
            dt_h = gl.load(wts + (b * H + heads) * (RB + 4) + RB + 2, mask=mh, other=0.0)
            gl.store(ring_dt + win * H + c * H + heads, dt_h, mask=mh)
            # the B operand: C (fragment order) as an fp16 head and remainder
            kd = gl.arange(0, 128, layout=gl.SliceLayout(1, b_op))
            col = ((kd >> 1) & 3) * 32 + ((kd >> 5) & 3) * 8 + ((kd >> 3) & 1) \
                + 2 * ((kd >> 4) & 1) + 4 * (kd & 1)  # column_of
            Bop, down = _c_operand(gl.load(C_ptr + b * s_Cb + g * 128 + col).to(gl.float32),
                                   b_op)
            row0 = (slot.to(gl.int64) * H + g * HPG) * P  # the group's first stored row
            wrows = gl.arange(0, R, layout=gl.SliceLayout(1, WL))
            wcol = gl.expand_dims(gl.arange(0, 16, layout=gl.SliceLayout(0, WL)), 0)
            ent = gl.expand_dims(gl.arange(0, RB, layout=gl.SliceLayout(1, RL)), 1)
            live = ent < c
            m = gl.expand_dims((wrows < total) | EVEN, 1)
            w_nx = gl.load(rd_w + (row0 + gl.expand_dims(wrows, 1)) * 16 + wcol, mask=m,
                           other=0)
            s_nx = gl.load(rd_s1 + (row0 + gl.expand_dims(wrows, 1)) * 8 + wcol // 2, mask=m,
                           other=0)
            mr_nx = (rows < total) | EVEN
            lv = live & gl.expand_dims(mr_nx, 0)
            h_nx = g * HPG + rows // P
            rx_nx = gl.load(rx_b + ent * HP + gl.expand_dims(rows, 0), mask=lv, other=0)
            wb_nx = gl.load(gl.expand_dims(wts + (b * H + h_nx) * (RB + 4), 0) + ent, mask=lv,
                            other=0.0)
            for t in range(n_tiles):
                w = w_nx
                sc = s_nx
                nr = gl.minimum(t + 1, n_tiles - 1) * R + wrows  # the next tile's rows
                m = gl.expand_dims((nr < total) | EVEN, 1)
                w_nx = gl.load(rd_w + (row0 + gl.expand_dims(nr, 1)) * 16 + wcol, mask=m,
                               other=0)
                s_nx = gl.load(rd_s1 + (row0 + gl.expand_dims(nr, 1)) * 8 + wcol // 2,
                               mask=m, other=0)
                r = t * R + rows
                mr = (r < total) | EVEN
                h = g * HPG + r // P  # each row's head
                w_h = wts + (b * H + h) * (RB + 4)
                if RING_AHEAD:  # this tile's ring rows and weights came with the last tile
                    rx_raw = rx_nx
                    wbc = wb_nx
                    rn = gl.minimum(t + 1, n_tiles - 1) * R + rows
                    lv = live & gl.expand_dims((rn < total) | EVEN, 0)
                    rx_nx = gl.load(rx_b + ent * HP + gl.expand_dims(rn, 0), mask=lv, other=0)
                    wb_nx = gl.load(gl.expand_dims(wts + (b * H + g * HPG + rn // P) * (RB + 4),
                                                   0) + ent, mask=lv, other=0.0)
                else:
                    lv = live & gl.expand_dims(mr, 0)
                    rx_raw = gl.load(rx_b + ent * HP + gl.expand_dims(r, 0), mask=lv, other=0)
                    wbc = gl.load(gl.expand_dims(w_h, 0) + ent, mask=lv, other=0.0)
                rx = _from_ring(rx_raw, RING)
                ring = gl.sum(wbc * rx, axis=0)
                wc = gl.load(w_h + RB, mask=mr, other=0.0)
                eL = gl.load(w_h + RB + 1, mask=mr, other=0.0)
                s2 = gl.load(rd_s2 + slot.to(gl.int64) * H + h, mask=mr, other=0.0)
                xf = gl.load(x_ptr + b * s_xb + first + r, mask=mr, other=0.0).to(gl.float32)
                xr = _from_ring(_to_ring(xf, RING), RING)
                prod = _tile_product(w, sc, Bop, a_op, mma, R)
                dot = gl.convert_layout(prod, ROW) * (down * 16384.0) * s2
                y = gl.fma(wc, xr, gl.fma(eL, dot, ring))
                if HAS_D:
                    y = y + gl.load(D_ptr + h, mask=mr, other=0.0).to(gl.float32) * xf
                if HAS_Z:
                    zz = gl.load(z_ptr + b * s_zb + first + r, mask=mr, other=0.0).to(
                        gl.float32)
                    y = y * (zz * (1.0 / (1.0 + gl.exp(-zz))))
                gl.store(out_b + r, y, mask=mr)
                gl.store(rx_b + c * HP + r, _to_ring(xr, RING), mask=mr)


def launch_state_dots(codes: torch.Tensor, s1: torch.Tensor, s2: torch.Tensor,
                      state_idx: torch.Tensor, pos: torch.Tensor, C: torch.Tensor,
                      dots: torch.Tensor, window: int) -> None:
    """``dots`` (batch * heads * P float32) of the rows that output at this step: an
    nvfp4 store's ``codes`` (slots, heads, P, 64) uint8, ``s1`` block scales, ``s2``
    matrix scales; ``C`` (batch, groups, 128)."""
    slots, H, P, half = codes.shape
    batch, G, N = C.shape
    _state_dots_kernel[(G, batch)](
        codes.view(torch.int32), s1, s2, state_idx, pos, C, dots, C.stride(0), H, G, window,
        P=P, HPG=H // G, NUM_WARPS=WARPS, num_warps=WARPS)


def launch_output(rd, rx, rB, ring_dt, tickets, state_idx, pos, wts, x, B, C, z, out, D,
                  strides, window: int, ring_len: int, ring_id: int, conc: bool) -> None:
    """The split step's output launch with the tensor-core state product
    (:func:`m2_out_mma_kernel`): ``rd`` the nvfp4 read copy (``StateStore``), ``rx`` /
    ``rB`` the rings as the step passes them (int16 views of 16-bit rings), ``wts`` the
    weights launch's output, ``z`` / ``D`` None where absent, ``strides`` the step's
    batch strides of x, dt, B, C, z, out."""
    slots, H, P, _ = rd.codes.shape
    batch, G, _ = C.shape
    s_x, _, s_B, s_C, s_z, s_o = strides
    m2_out_mma_kernel[(G, batch)](
        rd.codes.view(torch.int32), rd.s1, rd.s2, rx, rB, ring_dt, tickets, state_idx, pos,
        wts, x, B, C, z if z is not None else x, out, D if D is not None else wts,
        s_x, s_B, s_C, s_z, s_o, H, G, window, ring_len,
        P=P, HPG=H // G, RB=max(16, 1 << (window - 1).bit_length()), RING=ring_id,
        HAS_Z=z is not None, HAS_D=D is not None, CONC=conc, NUM_WARPS=WARPS,
        RING_AHEAD=RING_AHEAD, RING_LANES=RING_LANES, num_warps=WARPS)


def state_dots_reference(read_values: torch.Tensor, state_idx: torch.Tensor,
                         C: torch.Tensor) -> torch.Tensor:
    """float64 ``S c`` per (batch row, head, row) of decoded read copies
    ``read_values`` (slots, heads, P, N); padding rows 0."""
    slots, H, P, N = read_values.shape
    batch, G, _ = C.shape
    idx = state_idx.long().clamp_min(0)
    S = read_values.double()[idx]  # (batch, H, P, N)
    cg = C.double().repeat_interleave(H // G, dim=1)  # (batch, H, N)
    y = torch.einsum("bhpn,bhn->bhp", S, cg)
    return torch.where((state_idx >= 0)[:, None, None], y, torch.zeros_like(y))

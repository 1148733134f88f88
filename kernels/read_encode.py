"""The read copies of a replay step's flushed rows, encoded by a launch of their own
from the checkpoints the flush launch just wrote (shared by the GDN staged step and the
Mamba-2 split step).

A split design's read copy encodes the checkpoint's stored values (``designs.store_state``),
so the copy is encoded from the same values the flush would have encoded, and the bits
are those of the flush's own encoder and of the torch reference,
``formats.get(read).encode(decoded checkpoint)``.  The flush's programs are sized for the
fold (one warp and up to 255 registers each on an H200) and encode 4-bit copies slowly;
this launch runs whole-matrix programs of 2 to 8 warps, 32 warps per SM
(:func:`encode_programs`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .compile_worker import settle_module_keys
from .state import DENSE_FORMATS, StateStore
from .tl_common import at_flushing_row, batch_slots, flushing_rows
from .tl_formats import (
    FMT_BF16,
    FMT_BF16_SR,
    FMT_FP32,
    INTERPRETED,
    K_BF16,
    K_BF16_SR,
    K_FP32,
    K_NVFP4,
    bf16_bits_to_f32,
    fp16_bits_to_f32,
    load_16bit_words,
    load_state,
    matrix_amax,
    store_state_with,
    tile_offsets,
)

ENCODE_CTAS_PER_SM = 0
"""Programs per SM of the persistent encode launch (0: :func:`encode_programs`)."""
ENCODE_ROWS = 0
"""Rows per tile of the encode launch (0: :func:`encode_rows`)."""
ENCODE_WHOLE_BYTES = 16384
"""A stored matrix of at most this many bytes (its rows rounded up to a power of two)
is encoded from one tile: one read, no amax pass.  Timed at batch 256 on an H200 (fp16-sr
checkpoint, nvfp4 copy): nemotron-3-super-120b's 64 x 128 fp16 matrices, 189.8 -> 185.9
us per step; larger tiles took as long or longer (qwen3.5-4b's 128 x 128 fp16 109.3 /
113.5 us against 109.3 in 32-row chunks, nemotron-3-nano-4b's 80 x 128 in a 128-row tile
192.6 / 201.6 against 191.7), as did fp32 matrices of 128 rows."""
ENCODE_WARPS = 0
"""Warps per program of the encode launch (0: :func:`encode_programs`)."""
ENCODE_MAXNREG = 0
"""Register cap per thread of the encode launch (0: the compiler's choice)."""
ENCODE_AMAX_BITS = True
"""nvfp4 copies of matrices encoded in chunks: the amax pass takes the largest magnitude
from the checkpoint's stored bits (:func:`amax_bits_pass`) instead of from decoded
values (the same amax)."""


def encode_rows(rows: int, cols: int, code_bytes: int) -> int:
    """Rows per tile of the encode launch for ``(rows, cols)`` matrices stored with
    ``code_bytes`` bytes per element: :data:`ENCODE_ROWS` where set; else the whole
    matrix where it fits :data:`ENCODE_WHOLE_BYTES`; else 32 where they divide the
    matrix, else 16 (an amax pass precedes the encode pass)."""
    if ENCODE_ROWS:
        return ENCODE_ROWS
    whole = triton.next_power_of_2(rows)
    if whole * cols * code_bytes <= ENCODE_WHOLE_BYTES:
        return whole
    return 32 if rows % 32 == 0 else 16


def encode_programs(tile_rows: int, cols: int) -> tuple[int, int]:
    """``(warps per program, programs per SM)`` of the encode launch for tiles of
    ``tile_rows x cols``: :data:`ENCODE_WARPS` / :data:`ENCODE_CTAS_PER_SM` where set;
    else one warp per 1024 elements, so that a thread holds 32 elements of a tile (2 to 8
    warps: 16-row chunks of 128 columns, as nemotron-3-nano-4b's 80-row matrices take, 2;
    32-row chunks 4; nemotron-3-super-120b's one 64-row tile 8), and 32 warps per SM.
    Timed at batch 256 on an H200 (fp16-sr checkpoint, nvfp4 copy): nano-4b 183.8 /
    183.8 -> 180.3-181.1 us per step with 2 warps instead of 4; super-120b flush step
    1241-1249 -> 1217 us with 8 instead of 4."""
    warps = ENCODE_WARPS or max(2, min(8, tile_rows * cols // 1024))
    return warps, (ENCODE_CTAS_PER_SM or 32 // warps)


def encodes_apart(checkpoint: str, read: str | None) -> bool:
    """Whether a launch of its own encodes the read copy: a dense checkpoint (fp32, or
    16 bits with or without stochastic rounding) and an nvfp4 or mxfp4 read copy."""
    return checkpoint in DENSE_FORMATS and read in ("nvfp4", "mxfp4")


@triton.jit
def amax_bits_pass(c_words, mat, P: tl.constexpr, N: tl.constexpr, FB: tl.constexpr,
                   NCH: tl.constexpr, C_FMT: tl.constexpr):
    """Largest magnitude's bits (int32 scalar: 16-bit formats in the low half) over a
    dense matrix of the checkpoint, read as int32 words (two 16-bit codes or one fp32
    each) in chunks of FB rows.  Magnitude bits order like the magnitudes, so the
    maximum is integer: one mask per word and one packed maximum of its 16-bit halves
    (:func:`_max_u16x2`).  A non-finite code gives bits at or above
    :func:`inf_bits`; the caller then takes the decoded values instead."""
    W: tl.constexpr = N if C_FMT == K_FP32 else N // 2
    hi = tl.zeros((FB, W), tl.int32)
    for c in tl.range(0, NCH):
        offs_p = c * FB + tl.arange(0, FB)
        w = tl.load(c_words + mat * P * W + tile_offsets(offs_p, W), mask=(offs_p < P)[:, None],
                    other=0)
        if C_FMT == K_FP32:
            hi = tl.maximum(hi, w & 0x7FFFFFFF)
        else:  # both halves by one packed maximum
            hi = _max_u16x2(hi, w & 0x7FFF7FFF)
    m = tl.max(tl.max(hi, axis=1), axis=0)
    if C_FMT != K_FP32:
        m = tl.maximum(m >> 16, tl.max(tl.max(hi & 0x7FFF, axis=1), axis=0))
    return m


@triton.jit
def _max_u16x2(a, b):
    """The unsigned maximum of each 16-bit half of int32 ``a`` and ``b`` whose halves'
    top bits are clear (compiled: one ``max.u16x2``; interpreted: each half apart)."""
    if INTERPRETED:
        r = (tl.maximum(a >> 16, b >> 16) << 16) | tl.maximum(a & 0xFFFF, b & 0xFFFF)
    else:
        r = tl.inline_asm_elementwise("max.u16x2 $0, $1, $2;", "=r,r,r", [a, b],
                                      dtype=tl.int32, is_pure=True, pack=1)
    return r


@triton.constexpr_function
def inf_bits(fmt) -> int:
    """Magnitude bits of +inf in dense format code ``fmt`` (NaNs lie above)."""
    if fmt == FMT_FP32:
        return 0x7F800000
    return 0x7F80 if fmt in (FMT_BF16, FMT_BF16_SR) else 0x7C00


@triton.jit
def value_of_bits(m, C_FMT: tl.constexpr):
    """float32 value of the non-negative magnitude bits ``m`` (int32 scalar)."""
    if C_FMT == K_FP32:
        v = m.to(tl.float32, bitcast=True)
    elif (C_FMT == K_BF16) or (C_FMT == K_BF16_SR):
        v = bf16_bits_to_f32(m.to(tl.int16))
    else:
        v = fp16_bits_to_f32(m.to(tl.int16))
    return v


@triton.jit
def encode_read_copies_kernel(tickets, state_idx, c_data, c_s1, c_s2, c_words, f_data, f_s1,
                              f_s2, B, PCLK, L, H: tl.constexpr, P: tl.constexpr,
                              N: tl.constexpr, FB: tl.constexpr, BP: tl.constexpr,
                              C_FMT: tl.constexpr, F_FMT: tl.constexpr,
                              AMAX_BITS: tl.constexpr, WORDS16: tl.constexpr = False):
    """Persistent: every program reads the clocks of all B rows (a row flushed this step
    where ``tickets // PCLK`` is at ring position L - 1; the clocks advance only after
    the flush) and takes every G-th (flushed row, head) matrix of P x N, so a step that
    flushes nothing costs one vector load per program.  nvfp4: a pass for the matrix
    amax (from the stored bits where ``AMAX_BITS``, :func:`amax_bits_pass`), then one
    that encodes.  ``WORDS16``: a 16-bit checkpoint's rows are read as int32 words
    (``c_words``; ``tl_formats.load_16bit_words``)."""
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    _, _, live, sl0 = batch_slots(state_idx, B, BP)
    t = tl.load(tickets + sl0, mask=live, other=0) // PCLK
    key, units = flushing_rows(live & (t % L == L - 1), H)
    NCH: tl.constexpr = (P + FB - 1) // FB
    u = pid
    while u < units:
        slot = at_flushing_row(key, u // H, sl0)
        mat = slot.to(tl.int64) * H + u % H
        amax = 0.0
        if NCH == 1:  # the whole matrix in one tile: one read
            offs_p = tl.arange(0, FB)
            S = _load_rows(c_data, c_s1, c_s2, c_words, mat, offs_p, P, N, FB, C_FMT, WORDS16)
            if F_FMT == K_NVFP4:
                amax = matrix_amax(S)
            store_state_with(f_data, f_s1, f_s2, S, mat, offs_p, offs_p < P, P, 0, 0, amax,
                             F_FMT, FB, N, True)
        elif F_FMT == K_NVFP4:
            m = inf_bits(C_FMT)
            if AMAX_BITS:
                m = amax_bits_pass(c_words, mat, P, N, FB, NCH, C_FMT)
                amax = value_of_bits(m, C_FMT)
            if m >= inf_bits(C_FMT):  # decoded values: a non-finite code is skipped
                amax = 0.0
                for c in tl.range(0, NCH):
                    offs_p = c * FB + tl.arange(0, FB)
                    S = load_state(c_data, c_s1, c_s2, mat, offs_p, offs_p < P, P, C_FMT, FB,
                                   N)
                    amax = tl.maximum(amax, matrix_amax(S))
        if NCH > 1:
            for c in tl.range(0, NCH):
                offs_p = c * FB + tl.arange(0, FB)
                S = _load_rows(c_data, c_s1, c_s2, c_words, mat, offs_p, P, N, FB, C_FMT,
                               WORDS16)
                store_state_with(f_data, f_s1, f_s2, S, mat, offs_p, offs_p < P, P, 0, 0,
                                 amax, F_FMT, FB, N, True)
        u += G


@triton.jit
def _load_rows(c_data, c_s1, c_s2, c_words, mat, offs_p, P: tl.constexpr, N: tl.constexpr,
               FB: tl.constexpr, C_FMT: tl.constexpr, WORDS16: tl.constexpr):
    """The float32 rows ``offs_p`` of checkpoint matrix ``mat`` (past ``P`` zero)."""
    if WORDS16:
        S = load_16bit_words(c_words, mat, offs_p, offs_p < P, P, C_FMT, FB, N)
    else:
        S = load_state(c_data, c_s1, c_s2, mat, offs_p, offs_p < P, P, C_FMT, FB, N)
    return S


def encode_read_copies(ckpt: StateStore, read: StateStore, tickets, state_indices,
                       window: int, programs_per_slot: int, n_sm: int):
    """Launch :func:`encode_read_copies_kernel` for a batch (``state_indices``) whose
    flush launch has just run; returns the compiled kernel."""
    slots, H, P, N = ckpt.shape
    B = state_indices.shape[0]
    fb = encode_rows(P, N, ckpt.codes.element_size())
    warps, ctas = encode_programs(fb, N)
    grid = (max(1, min(B * H, n_sm * ctas)),)
    codes = ckpt.codes
    whole_words = codes.shape[-1] % 2 == 0  # rows of whole int32 words
    words = codes.view(torch.int32) if whole_words else codes
    return encode_read_copies_kernel[grid](
        tickets, state_indices, *ckpt.kernel_args(), words, *read.kernel_args(), B,
        programs_per_slot, window, H, P, N, fb, max(16, triton.next_power_of_2(B)),
        ckpt.fmt_id, read.fmt_id, bool(ENCODE_AMAX_BITS) and whole_words,
        whole_words and codes.element_size() == 2, num_warps=warps,
        maxnreg=ENCODE_MAXNREG or None)


settle_module_keys(__name__)  # every process looks its kernels up under one key

"""Triton device helpers of the split-launch Mamba-2 kernels (``mamba2_fast``) that
``tl_formats`` does not have.

* :func:`row_dot`: ``S c`` for the rows of a stored tile, computed from the stored
  bits with the fewest operations per element and no layout conversion of the tile:
  fp8 codes go through the hardware E4M3 conversion and the row scale is applied
  after the reduction; E2M1 nibbles (nvfp4 / mxfp4) are dotted in the packed domain
  (low nibbles against the even elements of ``c``, high nibbles against the odd
  ones, each nibble turned into float bits by two shifts and a merge) and each
  block's partial sum is scaled once.  The values are those of
  ``tl_formats.decode_tile`` followed by a row sum; only the order of the fp32
  operations differs.
* :func:`fold_dot`: the flush's rank-L update to ~fp32 accuracy on the tensor cores
  (two tf32 passes where ``b`` is exact in tf32, ring B in bf16 / fp16; else three),
  with explicit splits: the same inputs always give the same bits.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .tl_dots import NVFP4_WORD_SCALE, e2m1_word_pairs, tf32_hi
from .tl_formats import (
    K_BF16,
    K_BF16_SR,
    K_FP8,
    K_FP16,
    K_FP16_SR,
    K_FP32,
    K_NVFP4,
    bf16_bits_to_f32,
    e4m3_value_hw,
    e8m0_value,
    element_index,
    encode_tile,
    f16_pair_to_f32,
    fp8_encode_hw,
    fp16_bits_to_f32,
    fp16_rne_bits,
    is_16bit,
    nearest_16bit,
    nvfp4_encode_fast,
    sr_bf16_code,
    sr_bits,
    sr_key,
    sr_round_fast,
    store_codes,
    stored_values,
)

TWO63 = tl.constexpr(9.223372036854775808e18)
"""2**63: E2M1 nibbles become ``value * 2**-126`` floats; ``c`` carries 2**63 and the
row sum the other 2**63 (products stay normal for any realistic ``c``)."""


@triton.jit
def word_dot(words, c, BLOCK_P: tl.constexpr, N: tl.constexpr, BS: tl.constexpr):
    """``(BLOCK_P, N // BS)`` block sums of ``S c`` (float32; E2M1 values, block scales
    apart) of ``(BLOCK_P, N // 8)`` int32 words of nibbles, element ``8 m + j`` in nibble
    ``j`` of word ``m``.  Each nibble pair's fp16 bits come as one int32 from
    :func:`tl_dots.e2m1_word_pairs` (two shifts and two masks), are widened to float32
    in place (``tl_formats.f16_pair_to_f32``; values times 2**-14, exact) and put back
    in element order (joins only rename registers), then multiplied by ``c * 2**14``."""
    e04, e15, e26, e37 = e2m1_word_pairs(words)
    f0, f4 = f16_pair_to_f32(e04)
    f1, f5 = f16_pair_to_f32(e15)
    f2, f6 = f16_pair_to_f32(e26)
    f3, f7 = f16_pair_to_f32(e37)
    even = tl.join(tl.join(f0, f4), tl.join(f2, f6))  # elements 0, 2, 4, 6
    odd = tl.join(tl.join(f1, f5), tl.join(f3, f7))
    x = tl.reshape(tl.join(even, odd), (BLOCK_P, N))
    acc = x * (c * NVFP4_WORD_SCALE)[None, :]
    return tl.sum(tl.reshape(acc, [BLOCK_P, N // BS, BS]), axis=2)


@triton.jit
def row_dot(codes, s1, s2, c, c_even, c_odd, FMT: tl.constexpr, BLOCK_P: tl.constexpr,
            N: tl.constexpr):
    """``(BLOCK_P,)`` row sums ``S c`` of a tile as ``tl_formats.load_codes`` loads it.

    ``c``: the (N,) float32 vector; ``c_even`` / ``c_odd``: its even / odd elements
    times 2**63 (4-bit formats as bytes only; any float for the others).  4-bit codes
    loaded as int32 words go through :func:`word_dot`."""
    if FMT == K_FP32:
        y = tl.sum(codes * c[None, :], axis=1)
    elif (FMT == K_BF16) or (FMT == K_BF16_SR):
        y = tl.sum(bf16_bits_to_f32(codes) * c[None, :], axis=1)
    elif (FMT == K_FP16) or (FMT == K_FP16_SR):
        y = tl.sum(fp16_bits_to_f32(codes) * c[None, :], axis=1)
    elif FMT == K_FP8:
        y = s1 * tl.sum(e4m3_value_hw(codes) * c[None, :], axis=1)
    else:
        if FMT == K_NVFP4:
            BS: tl.constexpr = 16
            scale = e4m3_value_hw(s1) * s2
        else:
            BS: tl.constexpr = 32
            scale = e8m0_value(s1.to(tl.int32))
        if codes.dtype == tl.int32:  # words (load_codes(..., WORDS=True))
            y = tl.sum(word_dot(codes, c, BLOCK_P, N, BS) * scale, axis=1)
        else:
            b = codes.to(tl.int32)
            x_lo = (((b << 28) & -2147483648) | ((b & 7) << 22)).to(tl.float32, bitcast=True)
            x_hi = (((b << 24) & -2147483648) | ((b << 18) & 0x01C00000)).to(tl.float32,
                                                                              bitcast=True)
            acc = x_lo * c_even[None, :] + x_hi * c_odd[None, :]
            part = tl.sum(tl.reshape(acc, [BLOCK_P, N // BS, BS // 2]), axis=2)
            y = tl.sum(part * scale, axis=1) * TWO63
    return y


@triton.jit
def fold_dot(x, w, b, acc, EXACT_B: tl.constexpr):
    """``acc + (x w) @ b`` (``x``: (M, K), ``w``: (K,) scaling x's columns, ``b``: (K, N))
    to ~fp32 accuracy on the tensor cores, with every split explicit so the result's
    bits do not depend on how the compiler contracts (an nvfp4 flush computes its rows
    twice and both passes must agree): ``x w = a_hi + a_lo`` with ``a_lo = fma(x, w,
    -a_hi)``; ``b`` exact in tf32 (``EXACT_B``: a bf16/fp16 ring) takes two tf32 passes,
    else ``b = b_hi + b_lo`` and three (the tf32x3 scheme)."""
    a_hi = tf32_hi(x * w[None, :])
    a_lo = tl.fma(x, w[None, :], -a_hi)
    if EXACT_B:
        r = tl.dot(a_lo, b, acc=acc, input_precision="tf32")
        r = tl.dot(a_hi, b, acc=r, input_precision="tf32")
    else:
        b_hi = tf32_hi(b)
        b_lo = b - b_hi
        r = tl.dot(a_lo, b_hi, acc=acc, input_precision="tf32")
        r = tl.dot(a_hi, b_lo, acc=r, input_precision="tf32")
        r = tl.dot(a_hi, b_hi, acc=r, input_precision="tf32")
    return r


@triton.jit
def store_fast(codes_ptr, s1_ptr, s2_ptr, S, mat, offs_p, mask_p, P, seed, step, amax_mat,
               FMT: tl.constexpr, BLOCK_P: tl.constexpr, N: tl.constexpr,
               HW_CVT: tl.constexpr = False, FAST_ENC: tl.constexpr = False,
               SELF_AMAX: tl.constexpr = False, EVICT: tl.constexpr = False):
    """``tl_formats.store_state`` (same bits) without decoding the stored values back,
    stochastic rounding by :func:`sr_round_fast` / :func:`sr_bf16_code`, (``HW_CVT``,
    compiled code only) fp8 by :func:`fp8_encode_hw`, and (``FAST_ENC``) nvfp4 by
    ``tl_formats.nvfp4_encode_fast`` (``SELF_AMAX``: the tile holds the whole matrix,
    ``amax_mat`` is ignored); ``EVICT``: the stores evict first from L2."""
    if (FMT == K_NVFP4) and FAST_ENC:
        codes, s1, s2 = nvfp4_encode_fast(S, amax_mat, SELF_AMAX, BLOCK_P, N)
    elif (FMT == K_FP8) and HW_CVT:
        codes, s1 = fp8_encode_hw(S)
        s2 = 0.0
    elif FMT == K_BF16_SR:
        key = sr_key(seed, step)
        codes = sr_bf16_code(S, sr_bits(element_index(mat, offs_p, P, N), key))
        s1 = 0.0
        s2 = 0.0
    elif FMT == K_FP16_SR:
        key = sr_key(seed, step)
        q = sr_round_fast(S, sr_bits(element_index(mat, offs_p, P, N), key), 10, -14, 65504.0)
        codes = fp16_rne_bits(q)
        s1 = 0.0
        s2 = 0.0
    else:
        codes, s1, s2 = encode_tile(S, FMT, 0, 0, amax_mat, BLOCK_P, N)
    store_codes(codes_ptr, s1_ptr, s2_ptr, codes, s1, s2, mat, offs_p, mask_p, P, FMT, BLOCK_P,
                N, EVICT)


@triton.jit
def store_read_fast(rd_c, rd_s1, rd_s2, S, mat, offs_p, mask_p, P, seed_ck, seed_rd, step,
                    amax_mat, CK_FMT: tl.constexpr, RD_FMT: tl.constexpr,
                    BLOCK_P: tl.constexpr, N: tl.constexpr, HW_CVT: tl.constexpr = False,
                    FAST_ENC: tl.constexpr = False, SELF_AMAX: tl.constexpr = False,
                    EVICT: tl.constexpr = False):
    """:func:`store_fast` of a split's read copy of fresh rows ``S``: it encodes the
    values the checkpoint (CK_FMT, SR seed ``seed_ck``) stores
    (``tl_formats.stored_values``)."""
    Sr = stored_values(S, mat, offs_p, P, seed_ck, step, CK_FMT, BLOCK_P, N)
    store_fast(rd_c, rd_s1, rd_s2, Sr, mat, offs_p, mask_p, P, seed_rd, step, amax_mat, RD_FMT,
               BLOCK_P, N, HW_CVT, FAST_ENC, SELF_AMAX, EVICT)


@triton.jit
def store_rounded_fast(codes_ptr, s1_ptr, s2_ptr, Sr, mat, offs_p, mask_p, P,
                       FMT: tl.constexpr, BLOCK_P: tl.constexpr, N: tl.constexpr,
                       EVICT: tl.constexpr = False):
    """:func:`store_fast` of ``Sr``, the values ``tl_formats.stored_values`` gives for a
    16-bit format ``FMT``, through the round-to-nearest encoder of its grid, which keeps a
    value the grid holds: the codes :func:`store_fast` writes for the fresh rows, without
    drawing the stochastic rounding again."""
    store_fast(codes_ptr, s1_ptr, s2_ptr, Sr, mat, offs_p, mask_p, P, 0, 0, 0.0,
               nearest_16bit(FMT), BLOCK_P, N, EVICT=EVICT)


@triton.jit
def store_split_fast(ck_c, ck_s1, ck_s2, rd_c, rd_s1, rd_s2, S, mat, offs_p, mask_p, P,
                     seed_ck, seed_rd, step, amax_mat, CK_FMT: tl.constexpr,
                     RD_FMT: tl.constexpr, BLOCK_P: tl.constexpr, N: tl.constexpr,
                     HW_CVT: tl.constexpr = False, FAST_ENC: tl.constexpr = False,
                     SELF_AMAX: tl.constexpr = False, EVICT: tl.constexpr = False):
    """:func:`store_fast` of both copies of a split design's fresh rows ``S``: the
    checkpoint (CK_FMT) and the read copy of its stored values.  A 16-bit checkpoint's
    values are rounded once (its stochastic-rounding draws) and stored by the
    round-to-nearest encoder, which keeps a value its grid holds (the same bits as
    :func:`store_fast` of ``S``; :func:`store_read_fast` would draw them again)."""
    if CK_FMT == K_FP32:
        Sr = S
        store_fast(ck_c, ck_s1, ck_s2, S, mat, offs_p, mask_p, P, seed_ck, step, amax_mat,
                   CK_FMT, BLOCK_P, N, HW_CVT, FAST_ENC, SELF_AMAX, EVICT)
    elif is_16bit(CK_FMT):
        Sr = stored_values(S, mat, offs_p, P, seed_ck, step, CK_FMT, BLOCK_P, N)
        store_rounded_fast(ck_c, ck_s1, ck_s2, Sr, mat, offs_p, mask_p, P, CK_FMT, BLOCK_P, N,
                           EVICT)
    else:
        store_fast(ck_c, ck_s1, ck_s2, S, mat, offs_p, mask_p, P, seed_ck, step, amax_mat,
                   CK_FMT, BLOCK_P, N, HW_CVT, FAST_ENC, SELF_AMAX, EVICT)
        Sr = stored_values(S, mat, offs_p, P, seed_ck, step, CK_FMT, BLOCK_P, N)
    store_fast(rd_c, rd_s1, rd_s2, Sr, mat, offs_p, mask_p, P, seed_rd, step, amax_mat, RD_FMT,
               BLOCK_P, N, HW_CVT, FAST_ENC, SELF_AMAX, EVICT)

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
* :func:`sr_round_fast`: ``tl_formats.sr_round`` with the division by the power
  of two ``ulp`` done as an exact multiplication (same bits).
* :func:`fold_dot`: the flush's rank-L update ``a @ b`` to ~fp32 accuracy on the
  tensor cores, in two tf32 passes where ``b`` is exact in tf32 (ring B in bf16 /
  fp16).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .tl_formats import (
    K_BF16,
    K_BF16_SR,
    K_FP8,
    K_FP16,
    K_FP16_SR,
    K_FP32,
    K_NVFP4,
    bf16_bits_to_f32,
    bf16_rne_bits,
    copysign,
    e8m0_value,
    element_index,
    encode_tile,
    exponent_of,
    fp16_bits_to_f32,
    fp16_rne_bits,
    pow2,
    sr_bits,
    sr_key,
    store_codes,
)

TWO63 = tl.constexpr(9.223372036854775808e18)
"""2**63: E2M1 nibbles become ``value * 2**-126`` floats; ``c`` carries 2**63 and the
row sum the other 2**63 (products stay normal for any realistic ``c``)."""


@triton.jit
def e4m3_hw(code):
    """float32 of E4M3 codes (uint8) by the hardware conversion (NaN for 0x7F/0xFF)."""
    return code.to(tl.float8e4nv, bitcast=True).to(tl.float32)


@triton.jit
def row_dot(codes, s1, s2, c, c_even, c_odd, FMT: tl.constexpr, BLOCK_P: tl.constexpr,
            N: tl.constexpr):
    """``(BLOCK_P,)`` row sums ``S c`` of a tile as ``tl_formats.load_codes`` loads it.

    ``c``: the (N,) float32 vector; ``c_even`` / ``c_odd``: its even / odd elements
    times 2**63 (4-bit formats only; any float for the others)."""
    if FMT == K_FP32:
        y = tl.sum(codes * c[None, :], axis=1)
    elif (FMT == K_BF16) or (FMT == K_BF16_SR):
        y = tl.sum(bf16_bits_to_f32(codes) * c[None, :], axis=1)
    elif (FMT == K_FP16) or (FMT == K_FP16_SR):
        y = tl.sum(fp16_bits_to_f32(codes) * c[None, :], axis=1)
    elif FMT == K_FP8:
        y = s1 * tl.sum(e4m3_hw(codes) * c[None, :], axis=1)
    else:
        if FMT == K_NVFP4:
            BS: tl.constexpr = 16
        else:
            BS: tl.constexpr = 32
        b = codes.to(tl.int32)
        x_lo = (((b << 28) & -2147483648) | ((b & 7) << 22)).to(tl.float32, bitcast=True)
        x_hi = (((b << 24) & -2147483648) | ((b << 18) & 0x01C00000)).to(tl.float32,
                                                                          bitcast=True)
        acc = x_lo * c_even[None, :] + x_hi * c_odd[None, :]
        part = tl.sum(tl.reshape(acc, [BLOCK_P, N // BS, BS // 2]), axis=2)
        if FMT == K_NVFP4:
            scale = e4m3_hw(s1) * s2
        else:
            scale = e8m0_value(s1.to(tl.int32))
        y = tl.sum(part * scale, axis=1) * TWO63
    return y


@triton.jit
def sr_round_fast(x, bits, MBITS: tl.constexpr, EMIN: tl.constexpr, MAXV: tl.constexpr):
    """``tl_formats.sr_round`` (same bits): ``|x| / ulp`` as ``|x| * 2**(m - e)``, exact."""
    a = tl.abs(x)
    e = tl.minimum(tl.maximum(exponent_of(a), EMIN), 127 + MBITS)
    v = a * pow2(MBITS - e)
    lo = tl.floor(v)
    u = (bits >> 8).to(tl.float32) * 5.9604644775390625e-08
    q = (lo + tl.where(u < v - lo, 1.0, 0.0)) * pow2(e - MBITS)
    q = copysign(tl.minimum(q, MAXV), x)
    return tl.where(a < float("inf"), q, x)


@triton.jit
def fold_dot(a, b, acc, DOT: tl.constexpr):
    """``acc + a @ b`` to ~fp32 accuracy.  "tf32x2": ``b`` exact in tf32; ``a`` split
    into its tf32 head (truncated) and the exact remainder, two tensor-core passes.
    Else ``tl.dot`` with that input precision ("tf32x3", "ieee")."""
    if DOT == "tf32x2":
        a_hi = (a.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)
        r = tl.dot(a - a_hi, b, acc=acc, input_precision="tf32")
        r = tl.dot(a_hi, b, acc=r, input_precision="tf32")
    else:
        r = tl.dot(a, b, acc=acc, input_precision=DOT)
    return r


@triton.jit
def store_fast(codes_ptr, s1_ptr, s2_ptr, S, mat, offs_p, mask_p, P, seed, step, amax_mat,
               FMT: tl.constexpr, BLOCK_P: tl.constexpr, N: tl.constexpr):
    """``tl_formats.store_state`` (same bits) without decoding the stored values back,
    and stochastic rounding by :func:`sr_round_fast`."""
    if FMT == K_BF16_SR:
        key = sr_key(seed, step)
        q = sr_round_fast(S, sr_bits(element_index(mat, offs_p, P, N), key), 7, -126,
                          3.3895313892515355e38)
        codes = bf16_rne_bits(q)
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
                N)

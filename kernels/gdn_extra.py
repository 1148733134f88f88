"""GDN-specific Triton device helpers that ``kernels/tl_formats.py`` does not have.

* :func:`round_to`: round fp32 to the ring dtype (bf16 / fp16 / fp32) and back.
* :func:`read_dots`: the output step's hot path, ``(S k, S q)`` for a block of rows of
  a stored copy, decoding on the fly with the fewest operations per element (the
  fp8 row scale is applied after the reduction, E4M3 codes are converted by the
  hardware, E2M1 codes through a 32-bit lookup constant).  The values are those of
  ``tl_formats.decode_tile``; only the order of the fp32 operations differs.

Candidates to move into ``tl_formats.py``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .tl_formats import (
    FMT_BF16,
    FMT_BF16_SR,
    FMT_FP8,
    FMT_FP16,
    FMT_FP16_SR,
    FMT_FP32,
    FMT_NVFP4,
    bf16_bits_to_f32,
    bf16_rne_bits,
    e8m0_value,
    fp16_bits_to_f32,
)
from .tl_formats import e4m3_value as e4m3_value_exact

# E2M1 magnitudes times two (0, 1, 2, 3, 4, 6, 8, 12), four bits each, code 0 lowest:
# 0xC8643210 as an int32 (the arithmetic shift's sign fill is masked off).
E2M1_LUT2: tl.constexpr = tl.constexpr(0xC8643210 - (1 << 32))


@triton.jit
def round_to(x, DT: tl.constexpr):
    """Round float32 ``x`` to dtype ``DT`` (bf16, fp16 or fp32, RNE); return float32."""
    if DT == tl.bfloat16:
        y = bf16_bits_to_f32(bf16_rne_bits(x))
    elif DT == tl.float16:
        y = x.to(tl.float16).to(tl.float32)
    else:
        y = x
    return y


@triton.jit
def e2m1_value2(c):
    """Twice the float32 value of E2M1 codes (int32 0..15, sign in bit 3)."""
    lut = tl.full(c.shape, E2M1_LUT2, tl.int32)
    v = ((lut >> ((c & 7) << 2)) & 15).to(tl.float32)
    return (v.to(tl.int32, bitcast=True) | ((c & 8) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def e4m3_value_fast(c):
    """float32 value of E4M3 codes (uint8 tensor) by the hardware conversion (no NaN codes)."""
    return c.to(tl.float8e4nv, bitcast=True).to(tl.float32)


@triton.jit
def read_dots(data, s1, s2, mat, offs_v, k, q, V: tl.constexpr, K: tl.constexpr,
              FMT: tl.constexpr):
    """``(S k, S q)`` (float32 (BV,) each) for rows ``offs_v`` of stored matrix ``mat``
    (int64, slot * heads + head) in format ``FMT`` (``tl_formats`` ids and layouts)."""
    offs_k = tl.arange(0, K)
    row = mat * V + offs_v
    if FMT == FMT_FP32:
        S = tl.load(data + row[:, None] * K + offs_k[None, :])
        Sk = tl.sum(S * k[None, :], axis=1)
        Sq = tl.sum(S * q[None, :], axis=1)
    elif (FMT == FMT_BF16) or (FMT == FMT_BF16_SR):
        S = bf16_bits_to_f32(tl.load(data + row[:, None] * K + offs_k[None, :]))
        Sk = tl.sum(S * k[None, :], axis=1)
        Sq = tl.sum(S * q[None, :], axis=1)
    elif (FMT == FMT_FP16) or (FMT == FMT_FP16_SR):
        S = fp16_bits_to_f32(tl.load(data + row[:, None] * K + offs_k[None, :]))
        Sk = tl.sum(S * k[None, :], axis=1)
        Sq = tl.sum(S * q[None, :], axis=1)
    elif FMT == FMT_FP8:
        c = tl.load(data + row[:, None] * K + offs_k[None, :])
        S = e4m3_value_fast(c)
        scale = tl.load(s1 + row)
        Sk = scale * tl.sum(S * k[None, :], axis=1)
        Sq = scale * tl.sum(S * q[None, :], axis=1)
    else:
        offs_h = tl.arange(0, K // 2)
        b = tl.load(data + row[:, None] * (K // 2) + offs_h[None, :]).to(tl.int32)
        x2 = tl.interleave(e2m1_value2(b & 15), e2m1_value2(b >> 4))
        if FMT == FMT_NVFP4:
            sc = tl.load(s1 + row[:, None] * (K // 16) + offs_k[None, :] // 16).to(tl.int32)
            scale = e4m3_value_exact(sc) * (tl.load(s2 + mat) * 0.5)
        else:
            sc = tl.load(s1 + row[:, None] * (K // 32) + offs_k[None, :] // 32).to(tl.int32)
            scale = e8m0_value(sc) * 0.5
        S = x2 * scale
        Sk = tl.sum(S * k[None, :], axis=1)
        Sq = tl.sum(S * q[None, :], axis=1)
    return Sk, Sq

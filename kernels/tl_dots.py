"""Tensor-core products to ~fp32 accuracy and stored tiles as tf32-exact values,
shared by the GDN and Mamba-2 kernels.

* :func:`tf32_hi`: the tf32 head of a float32 (the remainder ``x - tf32_hi(x)`` is exact).
* :func:`dot_fp32`: ``a @ b`` with explicit tf32 splits of only the operands that are
  not exact in tf32 (1, 2 or 3 passes): the same inputs give the same bits however the
  compiler contracts.
* :func:`tile_values`: a stored tile (``tl_formats.load_codes`` / ``gdn_extra.load_tile``
  layout) as ``(X, row_scale)`` with ``X`` exact in tf32 for every format but fp32 (the
  verify kernels' matrix products).
* :func:`split_f16` / :func:`fp8_tile_dot` / :func:`nvfp4_word_dot`: fp16 tensor-core
  products of fp8 and nvfp4 tiles (their values, an nvfp4 block scale included, are
  exact in fp16) with float32 vectors split into two scaled fp16 parts (~22
  significant bits), accumulated in fp32: the GDN output step's row sums.
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
    e2m1_value,
    e4m3_value_hw,
    e8m0_value,
    fp16_bits_to_f32,
    int16_halves,
    per_block,
    unpack_nibbles,
)
from .tl_formats import e4m3_value as e4m3_value_exact


@triton.jit
def tf32_hi(x):
    """``x`` truncated to tf32 (10 fraction bits; ``x - tf32_hi(x)`` is exact)."""
    return (x.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)


@triton.jit
def dot_fp32(a, b, A_EXACT: tl.constexpr, B_EXACT: tl.constexpr, acc=None):
    """``acc + a @ b`` (float32; no ``acc``: ``a @ b``) to ~fp32 accuracy on tensor
    cores: an operand exact in tf32 (A_EXACT / B_EXACT) is used as it is, any other is
    split into its tf32 head and remainder: 1, 2 or 3 tf32 passes."""
    if A_EXACT and B_EXACT:
        r = tl.dot(a, b, acc=acc, input_precision="tf32")
    elif A_EXACT:
        b_hi = tf32_hi(b)
        r = tl.dot(a, b - b_hi, acc=acc, input_precision="tf32")
        r = tl.dot(a, b_hi, acc=r, input_precision="tf32")
    elif B_EXACT:
        a_hi = tf32_hi(a)
        r = tl.dot(a - a_hi, b, acc=acc, input_precision="tf32")
        r = tl.dot(a_hi, b, acc=r, input_precision="tf32")
    else:
        a_hi = tf32_hi(a)
        b_hi = tf32_hi(b)
        r = tl.dot(a - a_hi, b_hi, acc=acc, input_precision="tf32")
        r = tl.dot(a_hi, b - b_hi, acc=r, input_precision="tf32")
        r = tl.dot(a_hi, b_hi, acc=r, input_precision="tf32")
    return r


F16_SPLIT_SCALE = tl.constexpr(4096.0)
"""Scale of :func:`split_f16`'s parts: vectors of magnitude <= 1 (normalised q and k)
keep both parts clear of fp16's subnormals (below 2**-14) down to ~1e-8 and below
its largest value (65504)."""


@triton.jit
def split_f16(x):
    """``(hi, lo)`` float16 with ``hi + lo = x * F16_SPLIT_SCALE`` to ~22 significant
    bits (``x * F16_SPLIT_SCALE - hi`` is exact in float32; only ``lo`` rounds)."""
    xs = x * F16_SPLIT_SCALE
    hi = xs.to(tl.float16)
    lo = (xs - hi.to(tl.float32)).to(tl.float16)
    return hi, lo


@triton.jit
def fp8_tile_dot(codes, KQ):
    """``X @ KQ`` (float32) of a (BV, K) tile of E4M3 codes (uint8) without their row
    scales, as one fp16 tensor-core product (E4M3 values are exact in fp16) with
    ``KQ`` (K, N) float16, e.g. :func:`split_f16` parts as columns."""
    X = codes.to(tl.float8e4nv, bitcast=True).to(tl.float16)
    return tl.dot(X, KQ, out_dtype=tl.float32)


NVFP4_WORD_SCALE = tl.constexpr(16384.0)
""":func:`nvfp4_word_dot` returns its product divided by this (2**14)."""


@triton.jit
def nvfp4_word_order(cols):
    """Element (column of the state row) that :func:`nvfp4_word_dot` puts at each of its
    operand columns ``cols``: within each 8 columns (one word) the elements 0, 4, 1, 5,
    2, 6, 3, 7, so each fp16 pair the decode builds is one operand register."""
    return (cols & -8) | ((cols >> 1) & 3) | ((cols & 1) << 2)


@triton.jit
def e2m1_word_pairs(words):
    """:func:`e2m1_word_halves` as the four int32 words that hold them: nibbles 0 and 4,
    1 and 5, 2 and 6, 3 and 7 in the low and high halves."""
    MAG: tl.constexpr = 0x0E000E00
    SGN: tl.constexpr = -2147450880  # 0x80008000
    e04 = ((words << 9) & MAG) | ((words << 12) & SGN)
    e15 = ((words << 5) & MAG) | ((words << 8) & SGN)
    e26 = ((words << 1) & MAG) | ((words << 4) & SGN)
    e37 = ((words >> 3) & MAG) | (words & SGN)
    return e04, e15, e26, e37


@triton.jit
def e2m1_word_halves(words):
    """The eight E2M1 nibbles of int32 ``words`` (nibble j: bits 4j..4j+3) as the int16
    bits of fp16 values ``2**-14`` times theirs: ``sign << 15 | magnitude << 9`` (an
    E2M1 magnitude's exponent and mantissa bits are fp16's lowest exponent and highest
    mantissa bits; code 1, 0.5, is fp16's subnormal 2**-15).  Nibbles j and j + 4 are 16
    bits apart, so two shifts and two masks of the word give both halves of one pair
    (:func:`e2m1_word_pairs`)."""
    e04, e15, e26, e37 = e2m1_word_pairs(words)
    e0, e4 = int16_halves(e04)
    e1, e5 = int16_halves(e15)
    e2, e6 = int16_halves(e26)
    e3, e7 = int16_halves(e37)
    return e0, e1, e2, e3, e4, e5, e6, e7


@triton.jit
def nvfp4_word_dot(words, sc, KQ, BV: tl.constexpr, K: tl.constexpr):
    """``X @ KQ / 2**14`` (float32) of a (BV, K) nvfp4 tile loaded as int32 words
    (``gdn_extra.load_tile(..., WORDS=True)``; E4M3 block scales ``sc`` per 16 elements,
    the matrix scale apart) as one fp16 tensor-core product, with ``KQ``'s rows in
    :func:`nvfp4_word_order` (``KQ[c]`` multiplies element ``nvfp4_word_order(c)``).

    Each E2M1 nibble becomes the fp16 of its value times 2**-14
    (:func:`e2m1_word_halves`, subnormal codes included).  Times its block scale the
    value stays exact in fp16 (a multiple of 2**-24 with at most 8 significant bits,
    below 0.17), so the product is the exact product scaled by 2**-14."""
    e0, e1, e2, e3, e4, e5, e6, e7 = e2m1_word_halves(words)
    firsts = tl.join(tl.join(e0, e2), tl.join(e1, e3))
    seconds = tl.join(tl.join(e4, e6), tl.join(e5, e7))
    x = tl.reshape(tl.join(firsts, seconds), (BV, K)).to(tl.float16, bitcast=True)
    bs = sc.to(tl.float8e4nv, bitcast=True).to(tl.float16)
    X = tl.reshape(tl.reshape(x, (BV, K // 16, 16)) * bs[:, :, None], (BV, K))
    return tl.dot(X, KQ, out_dtype=tl.float32)


@triton.jit
def tile_values(codes, sc, s2v, FMT: tl.constexpr, BV: tl.constexpr, K: tl.constexpr):
    """A tile :func:`load_tile` loaded as ``(X, row_scale)`` with ``S = X * row_scale``:
    fp32 codes as they are (scale 1); 16-bit values; fp8 E4M3 values (the row scale
    apart); nvfp4 E2M1 values times their E4M3 block scales (the matrix scale apart);
    mxfp4 E2M1 values times E8M0 block scales.  ``X`` is exact in tf32 for every format
    but fp32 (at most 11 significant bits)."""
    if FMT == K_FP32:
        X = codes
        rs = tl.full((BV,), 1.0, tl.float32)
    elif (FMT == K_BF16) or (FMT == K_BF16_SR):
        X = bf16_bits_to_f32(codes)
        rs = tl.full((BV,), 1.0, tl.float32)
    elif (FMT == K_FP16) or (FMT == K_FP16_SR):
        X = fp16_bits_to_f32(codes)
        rs = tl.full((BV,), 1.0, tl.float32)
    elif FMT == K_FP8:
        X = e4m3_value_hw(codes)
        rs = sc
    elif FMT == K_NVFP4:
        X = e2m1_value(unpack_nibbles(codes, BV, K)) * per_block(
            e4m3_value_exact(sc.to(tl.int32)), BV, K, 16)
        rs = tl.full((BV,), 1.0, tl.float32) * s2v
    else:
        X = e2m1_value(unpack_nibbles(codes, BV, K)) * per_block(
            e8m0_value(sc.to(tl.int32)), BV, K, 32)
        rs = tl.full((BV,), 1.0, tl.float32)
    return X, rs

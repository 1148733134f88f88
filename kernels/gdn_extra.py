"""GDN-specific Triton device helpers that ``kernels/tl_formats.py`` does not have.

* :func:`load_tile` / :func:`tile_dots`: the output step's hot path, ``(S k, S q)`` for
  a block of rows of a stored copy.  The load is separate from the arithmetic so a
  kernel can issue the state load first and everything else while it is in flight.
  Decoding uses the fewest operations per element (the fp8 row scale is applied
  after the reduction and E4M3 codes are converted by the hardware; E2M1 nibbles
  are turned into float bits with two shifts and a merge, block scales applied once
  per block).  The values are those of ``tl_formats.decode_tile``; only the order of
  the fp32 operations differs.
* :func:`inv_unit_lower`: ``(I + N)^-1`` of a strictly lower-triangular ``N`` by
  repeated squaring (``log2`` of its size small matrix products) or by forward
  substitution (a sixth of the multiplications, in sequence).
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
    K_MXFP4,
    K_NVFP4,
    bf16_bits_to_f32,
    e4m3_value_hw,
    e8m0_value,
    fp16_bits_to_f32,
)
from .tl_formats import e4m3_value as e4m3_value_exact


@triton.jit
def _load_ev(ptrs, mask, other, EVICT: tl.constexpr):
    """``tl.load``, evicting first from L2 where ``EVICT``."""
    if EVICT:
        x = tl.load(ptrs, mask=mask, other=other, eviction_policy="evict_first")
    else:
        x = tl.load(ptrs, mask=mask, other=other)
    return x


@triton.jit
def load_tile(data, s1, s2, mat, offs_v, mask, V: tl.constexpr, K: tl.constexpr,
              FMT: tl.constexpr, WORDS: tl.constexpr = False, EVICT: tl.constexpr = False):
    """The stored pieces of rows ``offs_v`` of matrix ``mat`` (int64, slot * heads +
    head): ``(codes, scales, matrix scale)`` shaped as ``tl_formats.load_codes`` returns
    them (rows where ``mask`` is false are not read and are zero).  One scalar int64
    base per matrix plus int32 tile offsets (vectorised loads).  ``WORDS`` (4-bit formats):
    the packed nibbles as (BV, K / 8) int32 words, 8 elements each (little-endian: byte
    j of a word holds elements 2j, 2j + 1), as :func:`tl_dots.nvfp4_word_dot` takes them.
    ``EVICT``: the codes and scales stream with the ``evict_first`` L2 policy (rows read
    once)."""
    m2 = mask[:, None]
    sc = 0.0
    s2v = 0.0
    if (FMT == K_NVFP4) or (FMT == K_MXFP4):
        if WORDS:
            offs_w = tl.arange(0, K // 8)
            codes = _load_ev(data.to(tl.pointer_type(tl.int32)) + mat * (V * K // 8)
                             + offs_v[:, None] * (K // 8) + offs_w[None, :], m2, 0, EVICT)
        else:
            offs_h = tl.arange(0, K // 2)
            codes = _load_ev(data + mat * (V * K // 2) + offs_v[:, None] * (K // 2)
                             + offs_h[None, :], m2, 0, EVICT)
        if FMT == K_NVFP4:
            ob = tl.arange(0, K // 16)
            sc = _load_ev(s1 + mat * (V * (K // 16)) + offs_v[:, None] * (K // 16) + ob[None, :],
                          m2, 0, EVICT)
            s2v = tl.load(s2 + mat)
        else:
            ob = tl.arange(0, K // 32)
            sc = _load_ev(s1 + mat * (V * (K // 32)) + offs_v[:, None] * (K // 32) + ob[None, :],
                          m2, 0, EVICT)
    else:
        offs_k = tl.arange(0, K)
        codes = _load_ev(data + mat * (V * K) + offs_v[:, None] * K + offs_k[None, :], m2, 0,
                         EVICT)
        if FMT == K_FP8:
            sc = _load_ev(s1 + mat * V + offs_v, mask, 0.0, EVICT)
    return codes, sc, s2v


@triton.jit
def _fp4_dots(b, sc, s2v, k, q, K: tl.constexpr, BV: tl.constexpr, BS: tl.constexpr,
              FMT: tl.constexpr):
    """``(S k, S q)`` of E2M1 rows (packed bytes ``b``) with a scale per BS elements
    (nvfp4: BS 16, E4M3 scales ``sc`` times the matrix scale ``s2v``; mxfp4: BS 32, E8M0).
    Each nibble becomes the float32 whose bits are ``sign << 31 | mag << 22`` (its
    value times 2**-126; code 1 is an fp32 subnormal), two shifts and a bit merge; the
    2**126 goes into k and q, and block sums are scaled once per block."""
    NB: tl.constexpr = K // BS
    b = b.to(tl.int32)
    x_lo = (((b << 28) & -2147483648) | ((b & 7) << 22)).to(tl.float32, bitcast=True)
    x_hi = (((b << 24) & -2147483648) | ((b << 18) & 0x01C00000)).to(tl.float32, bitcast=True)
    ke, ko = tl.split(tl.reshape(k * 8.507059173023462e37, (K // 2, 2)))  # 2**126
    qe, qo = tl.split(tl.reshape(q * 8.507059173023462e37, (K // 2, 2)))
    acc_k = tl.reshape(x_lo * ke[None, :] + x_hi * ko[None, :], (BV, NB, BS // 2))
    acc_q = tl.reshape(x_lo * qe[None, :] + x_hi * qo[None, :], (BV, NB, BS // 2))
    sc = sc.to(tl.int32)
    if FMT == K_NVFP4:
        scale = e4m3_value_exact(sc) * s2v
    else:
        scale = e8m0_value(sc)
    Sk = tl.sum(tl.sum(acc_k, axis=2) * scale, axis=1)
    Sq = tl.sum(tl.sum(acc_q, axis=2) * scale, axis=1)
    return Sk, Sq


@triton.jit
def tile_dots(codes, sc, s2v, k, q, K: tl.constexpr, BV: tl.constexpr, FMT: tl.constexpr):
    """``(S k, S q)`` (float32 (BV,) each) of a tile :func:`load_tile` loaded, in format
    ``FMT`` (``tl_formats`` ids and layouts).  ``k``, ``q``: the prepared (K,) vectors."""
    if FMT == K_FP32:
        Sk = tl.sum(codes * k[None, :], axis=1)
        Sq = tl.sum(codes * q[None, :], axis=1)
    elif (FMT == K_BF16) or (FMT == K_BF16_SR):
        S = bf16_bits_to_f32(codes)
        Sk = tl.sum(S * k[None, :], axis=1)
        Sq = tl.sum(S * q[None, :], axis=1)
    elif (FMT == K_FP16) or (FMT == K_FP16_SR):
        S = fp16_bits_to_f32(codes)
        Sk = tl.sum(S * k[None, :], axis=1)
        Sq = tl.sum(S * q[None, :], axis=1)
    elif FMT == K_FP8:
        S = e4m3_value_hw(codes)
        Sk = sc * tl.sum(S * k[None, :], axis=1)
        Sq = sc * tl.sum(S * q[None, :], axis=1)
    elif FMT == K_NVFP4:
        Sk, Sq = _fp4_dots(codes, sc, s2v, k, q, K, BV, 16, FMT)
    else:
        Sk, Sq = _fp4_dots(codes, sc, s2v, k, q, K, BV, 32, FMT)
    return Sk, Sq


UNROLLED_RP = tl.constexpr(32)
"""Largest padded window whose inverse's products are unrolled.  An ieee fp32 product of
two (RP, RP) tiles is RP**3 FMAs spread over the program's threads; unrolled 2 (log2 RP
- 1) times at RP = 64, they made the one-launch kernel's compile take minutes."""


@triton.jit
def inv_unit_lower(Nm, RP: tl.constexpr, LOG2RP: tl.constexpr, SUBST: tl.constexpr = False):
    """``(I + N)^-1`` for a strictly lower-triangular ``(RP, RP)`` float32 ``N`` (so
    ``N**RP = 0``): ``(I - N)(I + N^2)(I + N^4)...(I + N^(RP/2))``, 2 (log2 RP - 1)
    small products (ieee fp32; in a loop past :data:`UNROLLED_RP`, the same products in
    the same order); SUBST: by forward substitution instead, row i = e_i - sum_j N_ij
    row j (fp32 FMAs, a sixth of the products' multiplications)."""
    offs = tl.arange(0, RP)
    eye = tl.where(offs[:, None] == offs[None, :], 1.0, 0.0)
    if SUBST:
        Nt = tl.trans(Nm)
        Tm = eye
        for i in tl.static_range(1, RP):
            ni = tl.sum(tl.where(offs[None, :] == i, Nt, 0.0), axis=1)  # N[i, :]
            r = tl.sum(ni[:, None] * Tm, axis=0)
            Tm = tl.where(offs[:, None] == i, Tm - r[None, :], Tm)
    elif RP > UNROLLED_RP:  # a loop: its two (RP, RP) products compiled once
        Tm = eye - Nm
        Np = Nm
        for _ in tl.range(LOG2RP - 1, loop_unroll_factor=1):
            Np = tl.dot(Np, Np, input_precision="ieee")
            Tm = Tm + tl.dot(Tm, Np, input_precision="ieee")
    else:
        Tm = eye - Nm
        Np = Nm
        for _ in tl.static_range(LOG2RP - 1):
            Np = tl.dot(Np, Np, input_precision="ieee")
            Tm = Tm + tl.dot(Tm, Np, input_precision="ieee")
    return Tm

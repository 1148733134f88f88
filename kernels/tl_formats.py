"""Triton device functions for the state formats of :mod:`precisionlab.formats`.

Every encoder here writes the same bits as ``precisionlab.formats.get(name).encode``
(the torch reference of this module), element for element, on the GPU and in the
Triton interpreter alike.  Rounding is done in float32 with exact integer and
power-of-two arithmetic, never by a float cast of an inexact value (the
interpreter truncates fp32 -> bf16/fp8 casts), and no fp8 dtype is used at all.

Tiles are ``[BLOCK_P, N]`` float32: rows of one (slot, head) state matrix, the
whole ``N`` (dstate) axis per row.  A format is a compile-time id (``FMT_*``);
its storage is up to three tensors ``codes, s1, s2``:

========== =================== ========================== ======================
format     codes               s1                         s2
========== =================== ========================== ======================
fp32       float32 (P, N)      -                          -
bf16(-sr)  int16 bits (P, N)   -                          -
fp16(-sr)  int16 bits (P, N)   -                          -
fp8-e4m3   uint8 (P, N)        float32 row scale (P, 1)   -
nvfp4      uint8 (P, N/2)      uint8 E4M3 per 16 (P, N/16) float32 matrix (1, 1)
mxfp4      uint8 (P, N/2)      uint8 E8M0 per 32 (P, N/32) -
========== =================== ========================== ======================

(per state matrix; tensors are ``(slots, heads, ...)``).  nvfp4 needs the amax of
a whole matrix, so a tile that encodes nvfp4 must hold the whole matrix
(``BLOCK_P >= P``; rows past ``P`` masked and zero).

Stochastic rounding (``*-sr``) draws its bits from ``(seed, step, index)`` with
the ``lowbias32`` hash of :mod:`precisionlab.formats.random_bits`; ``index`` is the
row-major element index over the whole ``(slots, heads, P, N)`` tensor.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

if os.environ.get("TRITON_INTERPRET") == "1":
    from .interp_fma import install

    install()


INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")
"""Whether kernels run in the Triton interpreter (no inline PTX there)."""


def compiled_on(device) -> bool:
    """Whether launches on ``device`` (a ``torch.device``) run compiled on a GPU, not in
    the Triton interpreter: the hardware-only paths (fp8 conversion by ``cvt``, which
    the interpreter does not round to nearest even; inline-PTX L2 prefetch)."""
    return device.type == "cuda" and os.environ.get("TRITON_INTERPRET", "0") != "1"

FMT_NONE = -1
FMT_FP32 = 0
FMT_BF16 = 1
FMT_FP16 = 2
FMT_BF16_SR = 3
FMT_FP16_SR = 4
FMT_FP8 = 5
FMT_NVFP4 = 6
FMT_MXFP4 = 7

FORMAT_IDS: dict[str, int] = {
    "fp32": FMT_FP32,
    "bf16": FMT_BF16,
    "fp16": FMT_FP16,
    "bf16-sr": FMT_BF16_SR,
    "fp16-sr": FMT_FP16_SR,
    "fp8-e4m3": FMT_FP8,
    "nvfp4": FMT_NVFP4,
    "mxfp4": FMT_MXFP4,
}
"""Formats the kernels read and write, by registry name."""

# the same ids as compile-time constants for device code
K_NONE = tl.constexpr(FMT_NONE)
K_FP32 = tl.constexpr(FMT_FP32)
K_BF16 = tl.constexpr(FMT_BF16)
K_FP16 = tl.constexpr(FMT_FP16)
K_BF16_SR = tl.constexpr(FMT_BF16_SR)
K_FP16_SR = tl.constexpr(FMT_FP16_SR)
K_FP8 = tl.constexpr(FMT_FP8)
K_NVFP4 = tl.constexpr(FMT_NVFP4)
K_MXFP4 = tl.constexpr(FMT_MXFP4)

GOLDEN32 = 0x9E3779B9
_M1 = 0x7FEB352D
_M2 = 0x846CA68B


def format_id(name: str) -> int:
    """The kernel id of a format name (KeyError for formats the kernels lack)."""
    try:
        return FORMAT_IDS[name]
    except KeyError:
        raise KeyError(
            f"no Triton kernel path for format {name!r}; kernels support {', '.join(FORMAT_IDS)}"
        ) from None


# --------------------------------------------------------------------------- bits


@triton.jit
def f32_bits(x):
    """int32 bit pattern of a float32 tensor."""
    return x.to(tl.int32, bitcast=True)


@triton.jit
def exponent_of(a):
    """Unbiased fp32 exponent field (int32): floor(log2|a|) for normals, -127 for
    zero/subnormals, 128 for inf/NaN."""
    return ((a.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127


@triton.jit
def pow2(k):
    """Exactly ``2.0**k`` (float32) for int32 ``k`` in [-149, 127], built from bits."""
    normal = tl.minimum(tl.maximum(k + 127, 1), 254) << 23
    sub = tl.full(k.shape, 1, tl.int32) << tl.minimum(tl.maximum(k + 149, 0), 22)
    return tl.where(k >= -126, normal, sub).to(tl.float32, bitcast=True)


@triton.jit
def round_half_even(v):
    """Round ``0 <= v < 2**22`` (float32) to the nearest integer, ties to even."""
    return (v + 8388608.0) - 8388608.0


@triton.jit
def signbit(x):
    """True where the float32 sign bit is set (also for -0.0 and -NaN)."""
    return x.to(tl.int32, bitcast=True) < 0


@triton.jit
def copysign(mag, x):
    """``|mag|`` with the sign bit of ``x`` (bit ops: ``-q`` loses -0.0)."""
    m = mag.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    s = x.to(tl.int32, bitcast=True) & (-2147483648)
    return (m | s).to(tl.float32, bitcast=True)


@triton.jit
def is_finite(x):
    return tl.abs(x) < float("inf")


# ------------------------------------------------------------------ 16-bit floats


@triton.jit
def bf16_rne_bits(x):
    """int16 bits of ``x.to(bfloat16)`` (RNE; NaN -> 0x7FC0 as torch on CPU)."""
    b = x.to(tl.int32, bitcast=True)
    r = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    r = tl.where(x != x, 0x7FC0, r)
    return r.to(tl.int16)


@triton.jit
def bf16_bits_to_f32(bits):
    """float32 value of int16 bf16 bits."""
    return (bits.to(tl.int32) << 16).to(tl.float32, bitcast=True)


@triton.jit
def fp16_rne_bits(x):
    """int16 bits of ``x.to(float16)`` (IEEE RNE; the cast is exact in the interpreter)."""
    return x.to(tl.float16).to(tl.int16, bitcast=True)


@triton.jit
def fp16_bits_to_f32(bits):
    return bits.to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def int16_halves(x):
    """The low and high 16 bits of int32 ``x`` as int16."""
    return x.to(tl.int16), (x >> 16).to(tl.int16)


@triton.jit
def f16_pair_to_f32(x):
    """The fp16 values in the low and high halves of int32 ``x`` as float32 (exact).
    Compiled: one inline-PTX conversion per half straight from the packed register (no
    half moved first); interpreted: the same values through int16 halves."""
    if INTERPRETED:
        lo, hi = int16_halves(x)
        return fp16_bits_to_f32(lo), fp16_bits_to_f32(hi)
    else:
        return tl.inline_asm_elementwise(
            "{ .reg .b16 l, h; mov.b32 {l, h}, $2; cvt.f32.f16 $0, l; cvt.f32.f16 $1, h; }",
            "=f,=f,r", [x], dtype=(tl.float32, tl.float32), is_pure=True, pack=1)


# -------------------------------------------------------------- random bits, SR


@triton.jit
def lowbias32(x):
    """Wellons' lowbias32 hash on uint32 tensors."""
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    x = x ^ (x >> 16)
    return x


@triton.jit
def sr_key(seed, step):
    """32-bit stream key of one rounding pass: lowbias32(seed ^ lowbias32(step + golden)).

    ``seed`` and ``step`` are int32 scalars holding the uint32 values (wrapped)."""
    s = step.to(tl.uint32, bitcast=True) + 0x9E3779B9
    return lowbias32(seed.to(tl.uint32, bitcast=True) ^ lowbias32(s))


@triton.jit
def sr_bits(index, key):
    """32 random bits (uint32) per element from its uint32 linear index."""
    return lowbias32(lowbias32(index) ^ key)


@triton.jit
def sr_round(x, bits, MBITS: tl.constexpr, EMIN: tl.constexpr, MAXV: tl.constexpr):
    """Stochastic rounding of float32 ``x`` onto a binary float grid (values exact).

    Same algorithm as ``formats.floats.stochastic_round``: ``e = max(floor(log2|x|),
    emin)``, ``ulp = 2**(e - m)``, ``q = (floor(|x|/ulp) + (u < frac)) * ulp``,
    saturated, sign restored; NaN/inf pass through."""
    a = tl.abs(x)
    e = tl.minimum(tl.maximum(exponent_of(a), EMIN), 127 + MBITS)
    ulp = pow2(e - MBITS)
    v = tl.math.div_rn(a, ulp)
    lo = tl.floor(v)
    u = (bits >> 8).to(tl.float32) * 5.9604644775390625e-08
    q = (lo + tl.where(u < v - lo, 1.0, 0.0)) * ulp
    q = copysign(tl.minimum(q, MAXV), x)
    return tl.where(a < float("inf"), q, x)


@triton.jit
def sr_bf16_code(x, bits):
    """int16 bits of :func:`sr_round` onto bf16 (``bits``: its random bits) by integer
    arithmetic, the same bits.  For every finite x, subnormal ones too, bf16's grid is
    fp32's shifted by 16 bits, so the rounding is one addition: ``|x|``'s bits plus
    ``0xFFFF - (bits >> 16)`` carry into bit 16 exactly when ``u < frac`` (``u`` the
    top 24 random bits over 2**24, ``frac`` the low 16 bits over 2**16); the sum's high
    half, saturated at 0x7F7F, is the code.  Non-finite x: :func:`bf16_rne_bits`."""
    b = x.to(tl.int32, bitcast=True)
    ab = b & 0x7FFFFFFF
    mag = tl.minimum((ab + (0xFFFF - (bits >> 16).to(tl.int32))) >> 16, 0x7F7F)
    code = mag | ((b >> 16) & -32768)
    return tl.where(ab < 0x7F800000, code, bf16_rne_bits(x).to(tl.int32)).to(tl.int16)


# ------------------------------------------------------------------- minifloats


@triton.jit
def minifloat_code(y, EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr,
                   MAXV: tl.constexpr, NEG_ZERO: tl.constexpr):
    """RNE code (int32) of float32 ``y`` in a narrow float without inf, saturating
    at ``MAXV``; sign bit from signbit(y) (``NEG_ZERO``) or ``y < 0``.  NaN: unspecified."""
    a = tl.abs(y)
    e = tl.minimum(tl.maximum(exponent_of(a), 1 - BIAS), 127 + MBITS)
    r = round_half_even(a * pow2(MBITS - e))
    q = tl.minimum(r * pow2(e - MBITS), MAXV)
    sub = (q * (2.0 ** (BIAS - 1 + MBITS))).to(tl.int32)
    mant = (q.to(tl.int32, bitcast=True) >> (23 - MBITS)) & ((1 << MBITS) - 1)
    normal = ((exponent_of(q) + BIAS) << MBITS) | mant
    mag = tl.where(q < 2.0 ** (1 - BIAS), sub, normal)
    if NEG_ZERO:
        neg = signbit(y)
    else:
        neg = y < 0
    return mag | (neg.to(tl.int32) << (EBITS + MBITS))


@triton.jit
def minifloat_value(code, EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr):
    """float32 value of a narrow-float code (int32; no NaN handling)."""
    mant = code & ((1 << MBITS) - 1)
    ex = (code >> MBITS) & ((1 << EBITS) - 1)
    normal = pow2(ex - BIAS) * (1.0 + mant.to(tl.float32) * (2.0 ** -MBITS))
    val = tl.where(ex == 0, mant.to(tl.float32) * (2.0 ** (1 - BIAS - MBITS)), normal)
    return tl.where(((code >> (EBITS + MBITS)) & 1) == 1, -val, val)


@triton.jit
def e4m3_code(y, NEG_ZERO: tl.constexpr):
    """E4M3 (e4m3fn) RNE code, saturating at 448."""
    return minifloat_code(y, 4, 3, 7, 448.0, NEG_ZERO)


@triton.jit
def e4m3_value(code):
    """float32 value of an E4M3 code (int32); 0x7F/0xFF are NaN."""
    v = minifloat_value(code, 4, 3, 7)
    return tl.where((code & 0x7F) == 0x7F, float("nan"), v)


@triton.jit
def e2m1_code(y, NEG_ZERO: tl.constexpr):
    """E2M1 RNE code (0..15), saturating at 6."""
    return minifloat_code(y, 2, 1, 1, 6.0, NEG_ZERO)


@triton.jit
def e2m1_value(code):
    """float32 value of an E2M1 code (int32), built from bits (-0.0 kept)."""
    mag = tl.where((code & 6) == 0, (code & 1) * 0x3F000000, ((code & 7) << 22) + (126 << 23))
    return (mag | ((code & 8) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def e4m3_value_hw(code):
    """float32 value of E4M3 codes (uint8) by the hardware fp8 conversion, for codes
    known to be finite (those the encoders write)."""
    return code.to(tl.float8e4nv, bitcast=True).to(tl.float32)


@triton.jit
def e4m3_value_fast(code):
    """float32 value of E4M3 codes (uint8) by the hardware fp8 conversion (exact for
    finite codes, also in the interpreter); 0x7F/0xFF give NaN."""
    v = code.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    return tl.where((code & 0x7F) == 0x7F, float("nan"), v)


@triton.jit
def e8m0_value(code):
    """float32 ``2**(code - 127)`` of an E8M0 code (int32); 0xFF is NaN."""
    return tl.where(code == 0xFF, float("nan"), pow2(code - 127))


@triton.jit
def pack_nibbles(codes, BLOCK_P: tl.constexpr, N: tl.constexpr):
    """[BLOCK_P, N] int32 4-bit codes -> [BLOCK_P, N/2] uint8 (2i low, 2i+1 high)."""
    lo, hi = tl.split(tl.reshape(codes, [BLOCK_P, N // 2, 2]))
    return (lo | (hi << 4)).to(tl.uint8)


@triton.jit
def unpack_nibbles(packed, BLOCK_P: tl.constexpr, N: tl.constexpr):
    """Inverse of :func:`pack_nibbles` (int32 codes)."""
    b = packed.to(tl.int32)
    return tl.reshape(tl.join(b & 0xF, b >> 4), [BLOCK_P, N])


@triton.jit
def per_block(v, BLOCK_P: tl.constexpr, N: tl.constexpr, BS: tl.constexpr):
    """Broadcast a [BLOCK_P, N/BS] per-block value to [BLOCK_P, N]."""
    return tl.reshape(tl.broadcast_to(v[:, :, None], [BLOCK_P, N // BS, BS]), [BLOCK_P, N])


@triton.jit
def block_max(a, BLOCK_P: tl.constexpr, N: tl.constexpr, BS: tl.constexpr):
    """[BLOCK_P, N] -> [BLOCK_P, N/BS] max over blocks of BS along the last axis."""
    return tl.max(tl.reshape(a, [BLOCK_P, N // BS, BS]), axis=2)


# ------------------------------------------------------------- tile codecs


@triton.jit
def matrix_amax(S):
    """Largest finite ``|S|`` of a tile (scalar), for the nvfp4 matrix scale."""
    return tl.max(tl.max(tl.where(is_finite(S), tl.abs(S), 0.0), axis=1), axis=0)


@triton.jit
def minifloat_code_bits(y, EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr,
                        MAXC: tl.constexpr, NEG_ZERO: tl.constexpr):
    """:func:`minifloat_code` by integer rounding (the same codes; ``MAXC`` is the
    code of the saturation value).  Normal range: RNE of the fp32 significand to MBITS
    bits is ``(bits + half - 1 + lsb) >> (23 - MBITS)`` (a carry moves into the
    exponent), rebiased by one subtraction; below the smallest normal the code is the
    integer ``RNE(|y| 2**(BIAS - 1 + MBITS))`` (adding 2**23 rounds it).  NaN:
    unspecified (callers mask non-finite values)."""
    b = y.to(tl.int32, bitcast=True)
    ab = b & 0x7FFFFFFF
    SH: tl.constexpr = 23 - MBITS
    HALF: tl.constexpr = (1 << (SH - 1)) - 1
    ab = tl.minimum(ab, 0x7F000000)  # finite and no int32 overflow below (inf saturates)
    normal = ((ab + HALF + ((ab >> SH) & 1)) >> SH) - ((127 - BIAS) << MBITS)
    a = ab.to(tl.float32, bitcast=True)
    SUBS: tl.constexpr = 2.0 ** (BIAS - 1 + MBITS)
    sub = (a * SUBS + 8388608.0).to(tl.int32, bitcast=True) - 0x4B000000
    mag = tl.minimum(tl.where(a < 2.0 ** (1 - BIAS), sub, normal), MAXC)
    if NEG_ZERO:
        neg = (b >> 31) & 1
    else:
        neg = (y < 0).to(tl.int32)
    return mag | (neg << (EBITS + MBITS))


@triton.jit
def e4m3_code_bits(y, NEG_ZERO: tl.constexpr):
    """:func:`e4m3_code` (RNE, saturating at 448 = code 126)."""
    return minifloat_code_bits(y, 4, 3, 7, 126, NEG_ZERO)


@triton.jit
def e2m1_code_bits(y, NEG_ZERO: tl.constexpr):
    """:func:`e2m1_code` (RNE, saturating at 6 = code 7)."""
    return minifloat_code_bits(y, 2, 1, 1, 7, NEG_ZERO)


@triton.jit
def e4m3_pos_value(code):
    """float32 value of a positive finite E4M3 code (int32, 0..126) from its bits."""
    normal = ((code + ((127 - 7) << 3)) << 20).to(tl.float32, bitcast=True)
    return tl.where(code < 8, code.to(tl.float32) * 0.001953125, normal)


@triton.jit
def div_shared(x, d):
    """``div_rn(x, d)`` for a divisor ``d > 0`` shared by many ``x`` (``d`` broadcast to
    ``x``'s shape), from one correctly rounded reciprocal ``r = 1 / d`` per divisor and,
    per element, ``q = x r`` with one Markstein correction ``q + (x - q d) r``: three
    float operations instead of a division and its slow-path call.  Correctly rounded
    wherever ``x - q d`` is exact, i.e. for ``|x| > 2**-100`` once divisors below
    2**-64 (and their dividends) are scaled by 2**64, exactly; smaller ``|x|`` give
    ``|x / d| < 2**-36``, within one ulp (no E4M3 / E2M1 code tells them apart).
    Zeros keep their sign (the correction is added as ``q - (q d - x) r``, whose zero
    terms take the sign of ``q``); non-finite ``x`` give NaN."""
    f = tl.where(d < 5.421010862427522e-20, 1.8446744073709552e19, 1.0)  # 2**-64, 2**64
    ds = d * f
    xs = x * f
    r = tl.math.div_rn(tl.full(ds.shape, 1.0, tl.float32), ds)
    q = xs * r
    # sign flips as products by -1 (exact; Triton's unary minus is 0 - x, which loses -0)
    return tl.fma(tl.fma(q, ds, xs * -1.0) * -1.0, r, q)


@triton.jit
def sr_round_fast(x, bits, MBITS: tl.constexpr, EMIN: tl.constexpr, MAXV: tl.constexpr):
    """:func:`sr_round` with ``|x| / ulp`` as a product by the exact power of two
    ``1 / ulp`` (exact: the quotient is below ``2**(MBITS + 1)``), for grids whose
    ``1 / ulp`` stays below 2**127 (fp16; bf16 has :func:`sr_bf16_code`)."""
    tl.static_assert(MBITS - EMIN <= 126, "1 / ulp would pass 2**127: use sr_bf16_code")
    a = tl.abs(x)
    e = tl.minimum(tl.maximum(exponent_of(a), EMIN), 127 + MBITS)
    ulp = pow2(e - MBITS)
    v = a * pow2(MBITS - e)
    lo = tl.floor(v)
    u = (bits >> 8).to(tl.float32) * 5.9604644775390625e-08
    q = (lo + tl.where(u < v - lo, 1.0, 0.0)) * ulp
    q = copysign(tl.minimum(q, MAXV), x)
    return tl.where(a < float("inf"), q, x)


@triton.jit
def encode_tile_with(S, FMT: tl.constexpr, index, key, amax_mat, BLOCK_P: tl.constexpr,
                     N: tl.constexpr, FAST: tl.constexpr):
    """Encode a float32 tile into ``(codes, s1, s2)`` of format ``FMT``.

    ``index``: uint32 [BLOCK_P, N] element indices and ``key``: uint32 stream key
    (stochastic formats only); ``amax_mat``: the whole matrix's finite amax (nvfp4
    only; a tile may hold part of the matrix).  Rows outside the matrix must be zero.
    ``FAST``: the integer-rounding encoders (:func:`e4m3_code_bits`, :func:`e2m1_code_bits`,
    :func:`sr_bf16_code`, :func:`sr_round_fast`, :func:`nvfp4_encode_fast`), fewer
    instructions for the same bits."""
    s1 = 0.0
    s2 = 0.0
    if FMT == K_FP32:
        codes = S
    elif FMT == K_BF16:
        codes = bf16_rne_bits(S)
    elif FMT == K_FP16:
        codes = fp16_rne_bits(S)
    elif FMT == K_BF16_SR:
        if FAST:
            codes = sr_bf16_code(S, sr_bits(index, key))
        else:
            codes = bf16_rne_bits(sr_round(S, sr_bits(index, key), 7, -126,
                                           3.3895313892515355e38))
    elif FMT == K_FP16_SR:
        if FAST:
            q = sr_round_fast(S, sr_bits(index, key), 10, -14, 65504.0)
        else:
            q = sr_round(S, sr_bits(index, key), 10, -14, 65504.0)
        codes = fp16_rne_bits(q)
    elif FMT == K_FP8:
        fin = is_finite(S)
        amax = tl.max(tl.where(fin, tl.abs(S), 0.0), axis=1)
        s1 = tl.math.div_rn(amax, 448.0)
        if FAST:
            y = div_shared(S, tl.where(s1 > 0, s1, 1.0)[:, None])
        else:
            y = tl.math.div_rn(S, tl.where(s1 > 0, s1, 1.0)[:, None])
        y = tl.minimum(tl.maximum(y, -448.0), 448.0)
        if FAST:
            c = e4m3_code_bits(y, True)
        else:
            c = e4m3_code(y, True)
        codes = tl.where(fin, c, 0x7F).to(tl.uint8)
    elif (FMT == K_NVFP4) and FAST:
        codes, s1, s2 = nvfp4_encode_fast(S, amax_mat, False, BLOCK_P, N)
    elif FMT == K_NVFP4:
        fin = is_finite(S)
        a = tl.where(fin, tl.abs(S), 0.0)
        s2 = tl.math.div_rn(amax_mat, 2688.0)
        nonzero = s2 > 0
        s = tl.math.div_rn(block_max(a, BLOCK_P, N, 16), 6.0 * s2)
        s = tl.where(s == 0, 1.0, s)
        s = tl.where(nonzero, s, 1.0)
        s = tl.minimum(tl.maximum(s, 2.0**-9), 448.0)
        sc = e4m3_code(s, True)
        y = tl.math.div_rn(S, per_block(e4m3_value(sc) * s2, BLOCK_P, N, 16))
        bfin = block_max(tl.where(fin, 0, 1), BLOCK_P, N, 16) == 0
        okb = tl.where(nonzero, bfin.to(tl.int32), 0)
        ok = per_block(okb, BLOCK_P, N, 16) != 0
        codes = pack_nibbles(tl.where(ok, e2m1_code(y, False), 0), BLOCK_P, N)
        s1 = tl.where(bfin, sc, 0x7F).to(tl.uint8)
    else:  # K_MXFP4
        fin = is_finite(S)
        a = tl.where(fin, tl.abs(S), 0.0)
        k = tl.minimum(tl.maximum(exponent_of(block_max(a, BLOCK_P, N, 32)) - 2, -127), 127)
        if FAST:
            y = S * per_block(pow2(-k), BLOCK_P, N, 32)  # exact power of two: = S / 2**k
        else:
            y = tl.math.div_rn(S, per_block(pow2(k), BLOCK_P, N, 32))
        bfin = block_max(tl.where(fin, 0, 1), BLOCK_P, N, 32) == 0
        ok = per_block(bfin.to(tl.int32), BLOCK_P, N, 32) != 0
        if FAST:
            c = e2m1_code_bits(y, True)
        else:
            c = e2m1_code(y, True)
        codes = pack_nibbles(tl.where(ok, c, 0), BLOCK_P, N)
        s1 = tl.where(bfin, k + 127, 0xFF).to(tl.uint8)
    return codes, s1, s2


@triton.jit
def encode_tile(S, FMT: tl.constexpr, index, key, amax_mat, BLOCK_P: tl.constexpr,
                N: tl.constexpr):
    """Encode a float32 tile into ``(codes, s1, s2)`` of format ``FMT`` (see
    :func:`encode_tile_with`)."""
    return encode_tile_with(S, FMT, index, key, amax_mat, BLOCK_P, N, False)



@triton.jit
def decode_tile(codes, s1, s2, FMT: tl.constexpr, BLOCK_P: tl.constexpr, N: tl.constexpr):
    """float32 [BLOCK_P, N] values of ``(codes, s1, s2)`` (as :func:`encode_tile` returns
    them or :func:`load_codes` loads them)."""
    if FMT == K_FP32:
        S = codes
    elif (FMT == K_BF16) or (FMT == K_BF16_SR):
        S = bf16_bits_to_f32(codes)
    elif (FMT == K_FP16) or (FMT == K_FP16_SR):
        S = fp16_bits_to_f32(codes)
    elif FMT == K_FP8:
        S = e4m3_value_fast(codes) * s1[:, None]
    elif FMT == K_NVFP4:
        bs = e4m3_value(s1.to(tl.int32)) * s2
        S = e2m1_value(unpack_nibbles(codes, BLOCK_P, N)) * per_block(bs, BLOCK_P, N, 16)
    else:  # K_MXFP4
        bs = e8m0_value(s1.to(tl.int32))
        S = e2m1_value(unpack_nibbles(codes, BLOCK_P, N)) * per_block(bs, BLOCK_P, N, 32)
    return S


@triton.jit
def tile_offsets(offs_p, W: tl.constexpr):
    """int32 offsets of a [BLOCK_P, W] tile of rows ``offs_p`` (row pitch W)."""
    return offs_p[:, None] * W + tl.arange(0, W)[None, :]


@triton.jit
def _store_ev(ptrs, value, mask, EVICT: tl.constexpr):
    """``tl.store``, evicting first from L2 where ``EVICT``."""
    if EVICT:
        tl.store(ptrs, value, mask=mask, eviction_policy="evict_first")
    else:
        tl.store(ptrs, value, mask=mask)


@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def fp8_encode_hw(S):
    """:func:`encode_tile` for fp8-e4m3 (same bits: row scale ``amax / 448`` and
    ``S / scale`` by IEEE division, clamped to +-448, RNE; non-finite -> 0x7F) with the
    hardware conversion (``cvt.rn.satfinite.e4m3x2.f32``, which also does the clamp:
    finite values past 448 saturate) instead of the integer rounding.  Compiled code
    only: the Triton interpreter's fp8 cast does not round to nearest even.

    A tile whose rows are all finite with scales of at least 2**-64 or zero (every
    state in practice; one NaN-propagating max per element tells) takes
    :func:`div_shared`'s arithmetic without its per-element scaling and needs no
    non-finite selects: 4.5 instead of 8.5 operations per element, the same bits."""
    amax_nan = tl.reduce(tl.abs(S), 1, _max_nan)  # NaN / inf where a row has one
    s1 = tl.math.div_rn(amax_nan, 448.0)
    d = tl.where(s1 > 0, s1, 1.0)
    plain = (amax_nan < float("inf")) & (d >= 5.421010862427522e-20)  # 2**-64
    if tl.min(plain.to(tl.int32), axis=0) == 1:
        r = tl.math.div_rn(tl.full(d.shape, 1.0, tl.float32), d)
        q = S * r[:, None]
        y = tl.fma(tl.fma(q, d[:, None], S * -1.0) * -1.0, r[:, None], q)
    else:
        fin = tl.abs(S) < float("inf")
        amax = tl.max(tl.where(fin, tl.abs(S), 0.0), axis=1)
        s1 = tl.math.div_rn(amax, 448.0)
        y = div_shared(S, tl.where(s1 > 0, s1, 1.0)[:, None])
        # non-finite elements as a positive NaN before the conversion (which gives
        # 0x7F): one float select per element instead of one on the packed bytes
        y = tl.where(fin, y, float("nan"))
    c = y.to(tl.float8e4nv, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True)
    return c, s1


@triton.jit
def low3_over(a, b):
    """``(a & 7) | (b & ~7)`` of int32 tensors: compiled, one ``lop3`` (the compiler
    would otherwise keep its two masks apart: two logic instructions)."""
    if INTERPRETED:
        return (a & 7) | (b & -8)
    else:
        return tl.inline_asm_elementwise("lop3.b32 $0, $1, $2, 7, 0xE4;", "=r,r,r", [a, b],
                                         dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def e2m1_code_fast(y):
    """:func:`e2m1_code` ``(y, False)`` (same codes for every non-NaN ``y``) mostly on the
    FMA pipe.  The E2M1 magnitude code of ``a = |y|`` is the least of ``RNE(2a)`` (the
    0.5 grid below 2), ``RNE(a) + 2`` (the 1 grid of [2, 4)), ``RNE(a / 2) + 4`` (the 2
    grid from 4) and 7 (saturation at 6.0): each line is the right one on its own range
    and above the others elsewhere, and rounding keeps that order.  Each line is one
    rounded float operation onto [2**23, 2**24), whose integers are spaced by one, so
    its bits are ``2**23``'s plus the line (ties to even alike) and the least of the
    bits is the least line.  The sign is that of ``y + 0`` (set where ``y < 0``), moved
    from bit 31 to bit 3 by the high word of a product, also on the FMA pipe; that word
    (below 16) keeps exponent bits under the sign, so one bitwise select
    (:func:`low3_over`) takes the magnitude's low three bits and the sign above them."""
    a = tl.abs(y)
    b1 = tl.fma(a, 2.0, 8388608.0).to(tl.int32, bitcast=True)  # 2**23 + RNE(2a)
    b2 = (a + 8388610.0).to(tl.int32, bitcast=True)  # 2**23 + 2 + RNE(a)
    b3 = tl.fma(a, 0.5, 8388612.0).to(tl.int32, bitcast=True)  # 2**23 + 4 + RNE(a/2)
    mag = tl.minimum(tl.minimum(b1, b2), tl.minimum(b3, 0x4B000007))
    top = tl.umulhi((y + 0.0).to(tl.uint32, bitcast=True), 16).to(tl.int32, bitcast=True)
    return low3_over(mag, top)


@triton.jit
def nvfp4_encode_fast(S, amax_mat, SELF_AMAX: tl.constexpr, BLOCK_P: tl.constexpr,
                      N: tl.constexpr):
    """:func:`encode_tile` for nvfp4 (the same codes, block scales and matrix scale)
    with fewer operations per element.  ``SELF_AMAX``: the tile is the whole matrix
    (rows past it zero) and its amax comes from the block maxima (``amax_mat`` ignored).

    The tile is kept as ``[rows, blocks, 16]`` (block maxima and scales need no
    broadcast back) and E2M1 rounding is :func:`e2m1_code_fast`.  A tile whose values
    are all finite under a matrix scale of at least 2**-55 (every state in practice; one
    NaN-propagating max per element tells) divides by its block scales through one
    correctly rounded reciprocal per block and a corrected product per element, without
    :func:`div_shared`'s scaling (the divisors are at least 2**-64, and every quotient is
    at most ~6.4), and needs no non-finite selects; other tiles take the general path."""
    S3 = tl.reshape(S, [BLOCK_P, N // 16, 16])
    bmax_nan = tl.reduce(tl.abs(S3), 2, _max_nan)  # NaN / inf in a block that has one
    fin_all = tl.min(tl.min((bmax_nan < float("inf")).to(tl.int32), axis=1), axis=0) == 1
    if SELF_AMAX:
        amax_plain = tl.max(tl.max(tl.where(bmax_nan < float("inf"), bmax_nan, 0.0), axis=1),
                            axis=0)
        s2 = tl.math.div_rn(amax_plain, 2688.0)
    else:
        s2 = tl.math.div_rn(amax_mat, 2688.0)
    if fin_all & (s2 >= 2.7755575615628914e-17):  # 2**-55
        s = tl.math.div_rn(bmax_nan, 6.0 * s2)
        s = tl.minimum(tl.maximum(tl.where(s == 0, 1.0, s), 2.0**-9), 448.0)
        sc = e4m3_code_bits(s, True)
        den = e4m3_pos_value(sc) * s2
        r = tl.math.div_rn(tl.full(den.shape, 1.0, tl.float32), den)
        q = S3 * r[:, :, None]
        y = tl.fma(tl.fma(q, den[:, :, None], S3 * -1.0) * -1.0, r[:, :, None], q)
        c3 = e2m1_code_fast(y)
        s1 = sc.to(tl.uint8)
    else:
        a = tl.abs(S3)
        fin = a < float("inf")
        bmax = tl.max(tl.where(fin, a, 0.0), axis=2)
        bfin = tl.min(fin.to(tl.int32), axis=2) != 0
        if SELF_AMAX:
            s2 = tl.math.div_rn(tl.max(tl.max(bmax, axis=1), axis=0), 2688.0)
        nonzero = s2 > 0
        s = tl.math.div_rn(bmax, 6.0 * s2)
        s = tl.where(s == 0, 1.0, s)
        s = tl.where(nonzero, s, 1.0)
        sc = e4m3_code(tl.minimum(tl.maximum(s, 2.0**-9), 448.0), True)
        den = e4m3_value_hw(sc.to(tl.uint8)) * s2
        y = div_shared(S3, den[:, :, None])
        ok = tl.where(nonzero, bfin.to(tl.int32), 0) != 0
        c3 = tl.where(ok[:, :, None], e2m1_code_fast(y), 0)
        s1 = tl.where(bfin, sc, 0x7F).to(tl.uint8)
    lo, hi = tl.split(tl.reshape(c3, [BLOCK_P, N // 2, 2]))
    codes = (lo + hi * 16).to(tl.uint8)  # (one multiply-add: the nibbles do not overlap)
    return codes, s1, s2


@triton.jit
def load_codes(codes_ptr, s1_ptr, s2_ptr, mat, offs_p, mask_p, P,
               FMT: tl.constexpr, BLOCK_P: tl.constexpr, N: tl.constexpr,
               WORDS: tl.constexpr = False):
    """Load the stored pieces of rows ``offs_p`` of state matrix ``mat`` (int64 scalar).

    Addresses are a scalar int64 base per matrix plus int32 tile offsets.  WORDS: 4-bit
    codes as ``(BLOCK_P, N // 8)`` int32 words (eight nibbles each, element ``8 m + j``
    in bits ``4 j .. 4 j + 3`` of word m) instead of ``(BLOCK_P, N // 2)`` bytes."""
    s1 = 0.0
    s2 = 0.0
    rows = mat * P  # first global row of the matrix, int64 scalar
    m2 = mask_p[:, None]
    if (FMT == K_NVFP4) or (FMT == K_MXFP4):
        if WORDS:
            codes = tl.load(codes_ptr.to(tl.pointer_type(tl.int32)) + rows * (N // 8)
                            + tile_offsets(offs_p, N // 8), mask=m2, other=0)
        else:
            codes = tl.load(codes_ptr + rows * (N // 2) + tile_offsets(offs_p, N // 2),
                            mask=m2, other=0)
        if FMT == K_NVFP4:
            s1 = tl.load(s1_ptr + rows * (N // 16) + tile_offsets(offs_p, N // 16), mask=m2,
                         other=0)
            s2 = tl.load(s2_ptr + mat)
        else:
            s1 = tl.load(s1_ptr + rows * (N // 32) + tile_offsets(offs_p, N // 32), mask=m2,
                         other=0)
    else:
        codes = tl.load(codes_ptr + rows * N + tile_offsets(offs_p, N), mask=m2, other=0)
        if FMT == K_FP8:
            s1 = tl.load(s1_ptr + rows + offs_p, mask=mask_p, other=0.0)
    return codes, s1, s2


@triton.jit
def store_codes(codes_ptr, s1_ptr, s2_ptr, codes, s1, s2, mat, offs_p, mask_p, P,
                FMT: tl.constexpr, BLOCK_P: tl.constexpr, N: tl.constexpr,
                EVICT: tl.constexpr = False):
    """Store the pieces :func:`encode_tile` returned (rows ``offs_p`` of matrix ``mat``;
    ``EVICT``: the stores evict first from L2)."""
    rows = mat * P
    m2 = mask_p[:, None]
    if (FMT == K_NVFP4) or (FMT == K_MXFP4):
        _store_ev(codes_ptr + rows * (N // 2) + tile_offsets(offs_p, N // 2), codes, m2, EVICT)
        if FMT == K_NVFP4:
            _store_ev(s1_ptr + rows * (N // 16) + tile_offsets(offs_p, N // 16), s1, m2, EVICT)
            tl.store(s2_ptr + mat, s2)
        else:
            _store_ev(s1_ptr + rows * (N // 32) + tile_offsets(offs_p, N // 32), s1, m2, EVICT)
    else:
        _store_ev(codes_ptr + rows * N + tile_offsets(offs_p, N), codes, m2, EVICT)
        if FMT == K_FP8:
            _store_ev(s1_ptr + rows + offs_p, s1, mask_p, EVICT)


@triton.jit
def load_state(codes_ptr, s1_ptr, s2_ptr, mat, offs_p, mask_p, P,
               FMT: tl.constexpr, BLOCK_P: tl.constexpr, N: tl.constexpr):
    """Load and decode rows ``offs_p`` of state matrix ``mat`` to float32 [BLOCK_P, N]
    (masked rows are zero)."""
    codes, s1, s2 = load_codes(codes_ptr, s1_ptr, s2_ptr, mat, offs_p, mask_p, P,
                               FMT, BLOCK_P, N)
    S = decode_tile(codes, s1, s2, FMT, BLOCK_P, N)
    return tl.where(mask_p[:, None], S, 0.0)


@triton.jit
def load_16bit_words(words_ptr, mat, offs_p, mask_p, P, FMT: tl.constexpr,
                     BLOCK_P: tl.constexpr, N: tl.constexpr):
    """:func:`load_state` of a 16-bit format (fp16 or bf16, with or without stochastic
    rounding) from its codes read as int32 words (``words_ptr``, two codes each): the
    same float32 values, each word's halves widened where they lie."""
    W: tl.constexpr = N // 2
    w = tl.load(words_ptr + mat * P * W + tile_offsets(offs_p, W), mask=mask_p[:, None],
                other=0)
    if (FMT == K_FP16) or (FMT == K_FP16_SR):
        lo, hi = f16_pair_to_f32(w)
    else:
        lo = (w << 16).to(tl.float32, bitcast=True)
        hi = (w & -65536).to(tl.float32, bitcast=True)
    return tl.reshape(tl.join(lo, hi), (BLOCK_P, N))


@triton.jit
def element_index(mat, offs_p, P, N: tl.constexpr):
    """uint32 row-major index (mod 2**32) of each element of the tile."""
    base = (mat * P * N).to(tl.uint32)
    return base + tile_offsets(offs_p, N).to(tl.uint32)


@triton.jit
def store_state(codes_ptr, s1_ptr, s2_ptr, S, mat, offs_p, mask_p, P, seed, step, amax_mat,
                FMT: tl.constexpr, BLOCK_P: tl.constexpr, N: tl.constexpr):
    """Encode float32 tile ``S`` (masked rows zero) and store it; returns the
    float32 values the stored bits decode to (for a read that follows in registers).
    ``amax_mat`` is the matrix amax for nvfp4 (see :func:`encode_tile`)."""
    return store_state_with(codes_ptr, s1_ptr, s2_ptr, S, mat, offs_p, mask_p, P, seed, step,
                            amax_mat, FMT, BLOCK_P, N, False)


@triton.jit
def encode_tile_at(S, mat, offs_p, P, seed, step, amax_mat, FMT: tl.constexpr,
                   BLOCK_P: tl.constexpr, N: tl.constexpr, FAST: tl.constexpr):
    """:func:`encode_tile_with` of rows ``offs_p`` of matrix ``mat``: a stochastic
    format's stream keyed by (seed, step) and the elements' indices."""
    if (FMT == K_BF16_SR) or (FMT == K_FP16_SR):
        index = element_index(mat, offs_p, P, N)
        key = sr_key(seed, step)
    else:
        index = 0
        key = 0
    return encode_tile_with(S, FMT, index, key, amax_mat, BLOCK_P, N, FAST)


@triton.jit
def stored_values(S, mat, offs_p, P, seed, step, FMT: tl.constexpr, BLOCK_P: tl.constexpr,
                  N: tl.constexpr, FAST: tl.constexpr = True):
    """The float32 values :func:`store_state` would store for tile ``S`` in ``FMT`` (the
    same stochastic-rounding stream), without storing them: what a split design's read
    copy encodes.  ``S`` itself for fp32; not for nvfp4 (its scale needs the matrix)."""
    if FMT == K_FP32:
        return S
    else:
        codes, s1, s2 = encode_tile_at(S, mat, offs_p, P, seed, step, 0.0, FMT, BLOCK_P, N,
                                       FAST)
        return decode_tile(codes, s1, s2, FMT, BLOCK_P, N)


@triton.jit
def flush_amax(S, mat, offs_p, P, seed_ck, step, C_FMT: tl.constexpr, F_FMT: tl.constexpr,
               BLOCK_P: tl.constexpr, N: tl.constexpr):
    """The amax of fresh rows ``S`` that a flush's nvfp4 store takes: for a split's nvfp4
    read copy (F_FMT), that of the values the checkpoint (C_FMT, SR seed ``seed_ck``)
    stores, which the copy encodes; else (an nvfp4 checkpoint) that of ``S``."""
    if (F_FMT == K_NVFP4) and (C_FMT != K_FP32) and (C_FMT != K_NVFP4):
        return matrix_amax(stored_values(S, mat, offs_p, P, seed_ck, step, C_FMT, BLOCK_P, N))
    else:
        return matrix_amax(S)


@triton.jit
def store_state_with(codes_ptr, s1_ptr, s2_ptr, S, mat, offs_p, mask_p, P, seed, step,
                     amax_mat, FMT: tl.constexpr, BLOCK_P: tl.constexpr, N: tl.constexpr,
                     FAST: tl.constexpr, EVICT: tl.constexpr = False):
    """:func:`store_state` with the encoders of :func:`encode_tile_with` (``FAST``;
    ``EVICT``: the stores evict first from L2)."""
    codes, s1, s2 = encode_tile_at(S, mat, offs_p, P, seed, step, amax_mat, FMT, BLOCK_P, N,
                                   FAST)
    store_codes(codes_ptr, s1_ptr, s2_ptr, codes, s1, s2, mat, offs_p, mask_p, P,
                FMT, BLOCK_P, N, EVICT)
    return tl.where(mask_p[:, None], decode_tile(codes, s1, s2, FMT, BLOCK_P, N), 0.0)


@triton.jit
def store_rounded_with(codes_ptr, s1_ptr, s2_ptr, Sr, mat, offs_p, mask_p, P,
                       FMT: tl.constexpr, BLOCK_P: tl.constexpr, N: tl.constexpr,
                       FAST: tl.constexpr, EVICT: tl.constexpr = False):
    """Store ``Sr``, the values :func:`stored_values` gives for a 16-bit format ``FMT``
    (fp16, bf16, with or without stochastic rounding), through the round-to-nearest
    encoder of its grid, which keeps a value the grid holds: the codes
    :func:`store_state_with` writes for the fresh rows, without drawing the rounding
    again."""
    store_state_with(codes_ptr, s1_ptr, s2_ptr, Sr, mat, offs_p, mask_p, P, 0, 0, 0.0,
                     nearest_16bit(FMT), BLOCK_P, N, FAST, EVICT)


FMTS_16BIT = (FMT_FP16, FMT_FP16_SR, FMT_BF16, FMT_BF16_SR)
"""The 16-bit format codes: fp16 and bf16, with or without stochastic rounding."""


@triton.constexpr_function
def is_16bit(fmt) -> bool:
    """Whether format code ``fmt`` is one of :data:`FMTS_16BIT`."""
    return fmt in FMTS_16BIT


@triton.constexpr_function
def nearest_16bit(fmt) -> int:
    """The round-to-nearest format code of 16-bit format ``fmt``'s grid."""
    if fmt not in FMTS_16BIT:
        raise ValueError(f"format code {fmt} is not a 16-bit format")
    return FMT_FP16 if fmt in (FMT_FP16, FMT_FP16_SR) else FMT_BF16

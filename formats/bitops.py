"""Shared bit-level helpers: input checks, float32 bit views, exact powers of
two, round-to-nearest-even into narrow float formats that torch has no dtype for
(E2M1; a generic minifloat rounder used as a cross-check), nibble packing.

Everything is elementwise torch arithmetic on CPU or CUDA with no host sync, and
exact: the generic rounder rounds once, in ``torch.round`` (ties to even) on a
value scaled by an exact power of two; the E2M1 fast path counts midpoints.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import FormatError

F32_MANT_BITS = 23
F32_BIAS = 127
INF = float("inf")


def as_float32(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """``x`` as a contiguous float32 tensor (fp64/fp16/bf16 are cast, RNE)."""
    if not isinstance(x, torch.Tensor):
        raise FormatError(f"{fmt} encodes a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise FormatError(f"{fmt} encodes floating-point tensors, got {x.dtype}")
    return x.to(torch.float32).contiguous()


def require_last_axis(x: torch.Tensor, fmt: str, multiple: int = 1) -> None:
    """FormatError unless ``x`` has a last axis that is a non-zero multiple of ``multiple``."""
    if x.dim() == 0:
        raise FormatError(f"{fmt} needs a tensor with at least one axis, got a scalar")
    n = x.shape[-1]
    if n == 0:
        raise FormatError(f"{fmt} needs a non-empty last axis, got shape {tuple(x.shape)}")
    if n % multiple:
        raise FormatError(f"{fmt} needs the last axis to be a multiple of {multiple}, got {n}")


def div_scalar(a: torch.Tensor, b: float) -> torch.Tensor:
    """``a / b`` correctly rounded on every device.  (On CUDA, torch turns division
    by a Python scalar into multiplication by its reciprocal, which can be one ulp
    off; dividing by a tensor is IEEE division.)"""
    return a / torch.full_like(a, b)


def f32_bits(x: torch.Tensor) -> torch.Tensor:
    """The int32 bit pattern of a float32 tensor."""
    return x.view(torch.int32)


def exponent_of(a: torch.Tensor) -> torch.Tensor:
    """Unbiased float32 exponent field of ``a`` (int32): ``floor(log2(|a|))`` for
    normal values, -127 for zeros and fp32 subnormals, 128 for inf and NaN."""
    return ((f32_bits(a) >> F32_MANT_BITS) & 0xFF) - F32_BIAS


def pow2(k: torch.Tensor) -> torch.Tensor:
    """Exactly ``2.0**k`` as float32 for an integer tensor ``k`` in [-149, 127]
    (built from bits, so fp32 subnormals such as 2**-127 are exact too)."""
    k = k.to(torch.int32)
    normal = (k + F32_BIAS).clamp(1, 254) << F32_MANT_BITS
    subnormal = torch.ones_like(k) << (k + 149).clamp(0, 22)
    return torch.where(k >= -126, normal, subnormal).view(torch.float32)


def grid_exponent(a: torch.Tensor, emin: int) -> torch.Tensor:
    """``max(floor(log2 a), emin)`` for ``a >= 0`` (valid for any ``emin >= -126``;
    inf and NaN give 128)."""
    return exponent_of(a).clamp_min(emin)


@dataclass(frozen=True)
class MiniFloat:
    """A narrow IEEE-like binary float without inf (E2M1, E4M3, E5M2 finite part)."""

    name: str
    exponent_bits: int
    mantissa_bits: int
    bias: int
    max_normal: float

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal number."""
        return 1 - self.bias

    @property
    def min_subnormal(self) -> float:
        return 2.0 ** (self.emin - self.mantissa_bits)


E2M1 = MiniFloat("e2m1", 2, 1, 1, 6.0)
E4M3 = MiniFloat("e4m3", 4, 3, 7, 448.0)
E5M2 = MiniFloat("e5m2", 5, 2, 15, 57344.0)


def round_magnitude(a: torch.Tensor, fmt: MiniFloat) -> torch.Tensor:
    """RNE of ``a >= 0`` (float32) onto ``fmt``'s grid, saturating at max_normal.

    ``e = max(floor(log2 a), emin)``, ``ulp = 2**(e - mantissa_bits)``,
    ``q = round_half_even(a / ulp) * ulp`` (every step exact), ``min(q, max_normal)``.
    inf saturates; NaN stays NaN.
    """
    e = grid_exponent(a, fmt.emin).clamp_max(127 + fmt.mantissa_bits)
    ulp = pow2(e - fmt.mantissa_bits)
    return torch.clamp_max(torch.round(a / ulp) * ulp, fmt.max_normal)


def magnitude_code(q: torch.Tensor, fmt: MiniFloat) -> torch.Tensor:
    """The code (without sign) of a float32 ``q >= 0`` already on ``fmt``'s grid (int32)."""
    m = fmt.mantissa_bits
    sub = (q * (1.0 / fmt.min_subnormal)).to(torch.int32)  # exact: q is a multiple of it
    mant = (f32_bits(q) >> (F32_MANT_BITS - m)) & ((1 << m) - 1)
    normal = ((exponent_of(q) + fmt.bias) << m) | mant
    return torch.where(q < 2.0**fmt.emin, sub, normal)


def encode_minifloat(
    y: torch.Tensor, fmt: MiniFloat, *, negative_zero: bool = True
) -> torch.Tensor:
    """RNE codes (uint8, one per element) of float32 ``y`` in ``fmt``, saturating
    finite overflow and ±inf to ±max_normal.

    Code layout: sign in bit ``E+M``, then the biased exponent, then the mantissa.
    The sign bit is ``signbit(y)`` (so -0.0 and negatives that round to zero give
    the negative-zero code); with ``negative_zero=False`` it is ``y < 0`` instead
    (-0.0 gives +0).  NaN gives an unspecified code: callers handle NaN.
    """
    mag = magnitude_code(round_magnitude(y.abs(), fmt), fmt)
    neg = torch.signbit(y) if negative_zero else y < 0
    sign = neg.to(torch.int32) << (fmt.exponent_bits + fmt.mantissa_bits)
    return (mag | sign).to(torch.uint8)


def decode_minifloat(codes: torch.Tensor, fmt: MiniFloat) -> torch.Tensor:
    """float32 values of ``fmt`` codes (uint8, one per element; no NaN/inf codes)."""
    c = codes.to(torch.int32)
    m = fmt.mantissa_bits
    mant = c & ((1 << m) - 1)
    exp = (c >> m) & ((1 << fmt.exponent_bits) - 1)
    frac = mant.to(torch.float32) * (2.0**-m)
    normal = pow2(exp - fmt.bias) * (1.0 + frac)
    value = torch.where(exp == 0, mant.to(torch.float32) * fmt.min_subnormal, normal)
    sign = (c >> (fmt.exponent_bits + m)) & 1
    return torch.where(sign == 1, -value, value)


# E2M1 magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 (codes 0..7).  Round to nearest even
# by counting the midpoints below |y|: a tie at a midpoint rounds up exactly when
# the upper code is even, hence ">=" at 0.75, 1.75, 3.5 and ">" at 0.25, 1.25, 2.5, 5.
_E2M1_UP_AT_TIE = (0.75, 1.75, 3.5)
_E2M1_DOWN_AT_TIE = (0.25, 1.25, 2.5, 5.0)


def encode_e2m1(y: torch.Tensor, *, negative_zero: bool = True) -> torch.Tensor:
    """RNE E2M1 codes (uint8, one per element) of float32 ``y``; same result as
    ``encode_minifloat(y, E2M1, negative_zero=...)`` (beyond ±6 and ±inf saturate
    to code 7 | sign), in fewer passes.  NaN gives an unspecified code."""
    a = y.abs()
    code = torch.zeros_like(a, dtype=torch.uint8)
    for b in _E2M1_DOWN_AT_TIE:
        code += a > b
    for b in _E2M1_UP_AT_TIE:
        code += a >= b
    neg = torch.signbit(y) if negative_zero else y < 0
    return code | (neg.to(torch.uint8) << 3)


_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E2M1_TABLES: dict[torch.device, torch.Tensor] = {}


def decode_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """float32 values of E2M1 codes (uint8, one per element; bit 3 the sign, so code
    8 is -0.0): a lookup in the 16-entry table of E2M1 values."""
    table = _E2M1_TABLES.get(codes.device)
    if table is None:
        magnitudes = torch.tensor(_E2M1_VALUES, dtype=torch.float32)
        table = torch.cat([magnitudes, -magnitudes]).to(codes.device)
        _E2M1_TABLES[codes.device] = table
    return table[(codes & 15).long()]


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Two 4-bit codes per byte along the last axis: element 2i in the low nibble,
    element 2i+1 in the high nibble."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_nibbles` (uint8, last axis doubled)."""
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)


def finite_abs(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(|x| with NaN and ±inf replaced by 0, mask of finite elements)``."""
    a = x.abs()
    finite = a < INF  # False for NaN and inf
    return torch.where(finite, a, 0.0), finite

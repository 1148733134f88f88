"""Unscaled IEEE formats: fp32, fp16, bf16 (round to nearest even) and the
stochastic-rounding variants fp16-sr, bf16-sr.

Bit layout: ``codes`` is the int32 (fp32) or int16 (the 16-bit formats) bit view
of the stored value, same shape as the input; there are no scales.  NaN: fp32 keeps
the input's bits; the 16-bit formats store 0x7E00 (fp16) / 0x7FC0 (bf16).
"""

from __future__ import annotations

import warnings

import torch

from .base import Format, FormatError, FormatSpec, Packed
from .bitops import as_float32, grid_exponent, pow2
from .random_bits import bits_i32, hashed_index, resolve_seed, stream_key_i32, uniform24_i32

FP32_SPEC = FormatSpec(8, 23, 127, 3.4028234663852886e38, 2.0**-149)
FP16_SPEC = FormatSpec(5, 10, 15, 65504.0, 2.0**-24)
BF16_SPEC = FormatSpec(8, 7, 127, 3.3895313892515355e38, 2.0**-133)

_INT_VIEW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


class _IEEEFormat(Format):
    """Stores each element as one IEEE value of ``dtype`` (torch's RNE cast:
    fp16/bf16 overflow to ±inf as IEEE requires; ±inf is kept).  Every NaN is
    stored as the canonical quiet NaN (fp16 0x7E00, bf16 0x7FC0), since torch's
    casts give different NaN bits on CPU and CUDA; fp32 keeps NaN bits as they are."""

    dtype: torch.dtype
    nan_code: int = 0

    def encode(self, x, *, generator=None, seed=None, step=0) -> Packed:
        x = as_float32(x, self.name)
        return self._pack(self._round(x, generator=generator, seed=seed, step=step), x.shape)

    def _round(self, x: torch.Tensor, **_) -> torch.Tensor:
        return x.to(self.dtype)

    def _pack(self, values: torch.Tensor, shape: torch.Size) -> Packed:
        codes = values.view(_INT_VIEW[self.dtype])
        if self.dtype != torch.float32:
            codes = torch.where(torch.isnan(values), self.nan_code, codes)
        return Packed(self.name, codes, tuple(shape))

    def decode(self, packed: Packed) -> torch.Tensor:
        if packed.format != self.name:
            raise FormatError(f"{self.name} cannot decode a {packed.format} value")
        return packed.codes.view(self.dtype).to(torch.float32)

    def bits_per_element(self, shape=None) -> float:
        return float(torch.finfo(self.dtype).bits)


class FP32(_IEEEFormat):
    """fp32: codes = ``x.view(int32)`` (fp64 input is rounded to fp32, RNE)."""

    name = "fp32"
    dtype = torch.float32
    spec = FP32_SPEC

    def _round(self, x: torch.Tensor, **_) -> torch.Tensor:
        return x.clone()  # the codes must not alias the caller's tensor


class FP16(_IEEEFormat):
    """fp16 (IEEE binary16), RNE: codes = int16 bit view of ``x.to(float16)``."""

    name = "fp16"
    dtype = torch.float16
    nan_code = 0x7E00
    spec = FP16_SPEC


class BF16(_IEEEFormat):
    """bf16, RNE: codes = int16 bit view of ``x.to(bfloat16)``."""

    name = "bf16"
    dtype = torch.bfloat16
    nan_code = 0x7FC0
    spec = BF16_SPEC


def stochastic_round(
    x: torch.Tensor, *, mantissa_bits: int, emin: int, max_normal: float, seed: int, step: int
) -> torch.Tensor:
    """Stochastically round float32 ``x`` onto the grid of a binary float with
    ``mantissa_bits`` stored mantissa bits and minimum normal exponent ``emin``.

    The algorithm the kernels reproduce bit for bit; for each element, with
    ``i`` its row-major linear index in ``x``:

        u    = uniform24(random_bits(x.shape, seed, step))[i]   # k * 2**-24, k < 2**24
        e    = max(floor(log2|x|), emin)          # from the fp32 exponent field
        ulp  = 2**(e - mantissa_bits)             # exact, built from bits
        v    = |x| / ulp                          # exact
        lo   = floor(v);  frac = v - lo           # exact
        q    = (lo + (u < frac)) * ulp            # exact
        q    = min(q, max_normal)                 # finite values never become inf
        out  = copysign(q, x)                     # -0 stays -0
        out  = x where x is NaN or ±inf

    Returns float32 values exactly representable in the target format.
    """
    index_hash = hashed_index(tuple(x.shape), x.device)
    key = torch.tensor(stream_key_i32(seed, step), dtype=torch.int32, device=x.device)
    args = (x, index_hash, key, mantissa_bits, emin, max_normal)
    if not x.is_cuda:
        return _sr_in_chunks(*args)
    if _FUSED["off"]:
        return _sr_core(*args)
    try:
        return _fused_sr_core()(*args)
    except Exception as exc:  # pragma: no cover - depends on the GPU toolchain
        _FUSED["off"] = True
        warnings.warn(f"fused stochastic rounding unavailable ({type(exc).__name__}: {exc}); "
                      "running it eagerly", stacklevel=2)
        return _sr_core(*args)


def _sr_core(
    x: torch.Tensor, index_hash: torch.Tensor, key: torch.Tensor, mantissa_bits: int,
    emin: int, max_normal: float,
) -> torch.Tensor:
    """Elementwise body of :func:`stochastic_round` (fusable: every step is exact,
    and scaling by powers of two is done by two exact multiplications, never by a
    division, so a fused GPU kernel gives the same bits)."""
    a = x.abs()
    e = grid_exponent(a, emin).clamp_max(127 + mantissa_bits)
    shift = mantissa_bits - e  # v = a * 2**shift, shift in [-120, 133]
    half = torch.div(shift, 2, rounding_mode="floor")
    v = a * pow2(half) * pow2(shift - half)
    lo = torch.floor(v)
    u = uniform24_i32(bits_i32(index_hash, key))
    q = (lo + (u < (v - lo)).to(torch.float32)) * pow2(e - mantissa_bits)
    q = torch.copysign(torch.clamp_max(q, max_normal), x)
    return torch.where(torch.isfinite(x), q, x)


_SIGN = -(2**31)  # the float32 sign bit as an int32
_EXPONENT = 0x7F800000  # the float32 exponent field; bits at or above it are inf or NaN


CPU_CHUNK = 1 << 20
"""Elements rounded per pass on the CPU, so that each pass's temporaries stay in cache
(a 16M-element state rounds 2.5x faster in 1M-element pieces than whole)."""


def _sr_in_chunks(
    x: torch.Tensor, index_hash: torch.Tensor, key: torch.Tensor, mantissa_bits: int,
    emin: int, max_normal: float,
) -> torch.Tensor:
    """:func:`_sr_bits` over ``CPU_CHUNK`` elements at a time (elementwise: the same bits)."""
    if x.numel() <= CPU_CHUNK:
        return _sr_bits(x, index_hash, key, mantissa_bits, emin, max_normal)
    flat, hashes = x.reshape(-1), index_hash.reshape(-1)
    out = torch.empty_like(flat)
    for i in range(0, flat.numel(), CPU_CHUNK):
        part = slice(i, i + CPU_CHUNK)
        out[part] = _sr_bits(flat[part], hashes[part], key, mantissa_bits, emin, max_normal)
    return out.view(x.shape)


def _sr_bits(
    x: torch.Tensor, index_hash: torch.Tensor, key: torch.Tensor, mantissa_bits: int,
    emin: int, max_normal: float,
) -> torch.Tensor:
    """:func:`_sr_core`'s bits in a few integer passes (for eager CPU tensors).

    Where ``|x|`` is normal in the target format, its ulp is the float32 value of the
    ``drop = 23 - mantissa_bits`` low mantissa bits, ``frac = low / 2**drop`` and
    ``u = k / 2**24`` with ``k = bits >>> 8``; so ``u < frac`` exactly when the top
    ``drop`` random bits, ``t``, are below ``low``, which is when adding ``~t`` to the
    magnitude's bits carries out of the low bits.  Adding it and clearing the low bits
    rounds up or down (a carry into the exponent is the next binade), and the result
    is clamped to max_normal's bits.  Target subnormals and zeros take
    :func:`_sr_core` on their elements; NaN and ±inf are returned as they are.
    """
    drop = 23 - mantissa_bits
    low_bits = (1 << drop) - 1
    b = x.view(torch.int32)
    mag = b & 0x7FFFFFFF
    up = (~bits_i32(index_hash, key) >> (32 - drop)) & low_bits
    q = ((mag + up) & ~low_bits).clamp_max_(_f32_bits_of(max_normal))
    out = (q | (b & _SIGN)).view(torch.float32)
    small = mag < (emin + 127) << 23
    if bool(small.any()):
        out[small] = _sr_core(x[small], index_hash[small], key, mantissa_bits, emin, max_normal)
    return torch.where(mag >= _EXPONENT, x, out)


def _f32_bits_of(value: float) -> int:
    """The int32 bit pattern of ``value`` rounded to float32."""
    return int(torch.tensor(value, dtype=torch.float32).view(torch.int32))


_FUSED: dict = {"off": False, "fn": None}


def _fused_sr_core():
    """:func:`_sr_core` fused by ``torch.compile`` for CUDA tensors (one pass over
    memory instead of ~20)."""
    if _FUSED["fn"] is None:
        _FUSED["fn"] = torch.compile(_sr_core, dynamic=False)
    return _FUSED["fn"]


class _StochasticFormat(_IEEEFormat):
    """16-bit float with stochastic rounding (see :func:`stochastic_round`).

    Same bit layout as the round-to-nearest format.  ``seed`` (or one drawn from
    ``generator``, else 0) and ``step`` select the random stream; the same
    ``(seed, step)`` and input give the same bits on CPU and CUDA.  Finite inputs
    saturate at ±max_normal instead of overflowing to inf.
    """

    def _round(self, x, *, generator=None, seed=None, step=0) -> torch.Tensor:
        q = stochastic_round(
            x,
            mantissa_bits=self.spec.mantissa_bits,
            emin=1 - self.spec.bias,
            max_normal=self.spec.max_normal,
            seed=resolve_seed(seed, generator),
            step=int(step),
        )
        return q.to(self.dtype)  # exact: q is on the target grid


class FP16SR(_StochasticFormat):
    """fp16 with stochastic rounding (emin = -14, 10 mantissa bits)."""

    name = "fp16-sr"
    dtype = torch.float16
    nan_code = 0x7E00
    spec = FormatSpec(5, 10, 15, 65504.0, 2.0**-24, rounding="stochastic")


class BF16SR(_StochasticFormat):
    """bf16 with stochastic rounding (emin = -126, 7 mantissa bits)."""

    name = "bf16-sr"
    dtype = torch.bfloat16
    nan_code = 0x7FC0
    spec = FormatSpec(8, 7, 127, 3.3895313892515355e38, 2.0**-133, rounding="stochastic")

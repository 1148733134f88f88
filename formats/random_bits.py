"""Counter-based random bits for stochastic rounding, identical in torch and Triton.

Every stochastic-rounding decision draws 32 random bits from a pure function of
``(seed, step, element index)``, so the torch emulation and the fused kernels in
``precisionlab.kernels`` write the same bits.  The mixer is Wellons' ``lowbias32``
integer hash, evaluated in uint32 arithmetic (emulated here with int64 and masks):

    key  = lowbias32(seed ^ lowbias32(step + 0x9E3779B9))
    bits = lowbias32(lowbias32(index) ^ key)

``index`` is the element's row-major linear index in the tensor being rounded,
taken modulo 2**32.
"""

from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
GOLDEN32 = 0x9E3779B9
_M1 = 0x7FEB352D
_M2 = 0x846CA68B


def lowbias32_int(x: int) -> int:
    """The hash on a Python int (uint32 semantics)."""
    x &= MASK32
    x ^= x >> 16
    x = (x * _M1) & MASK32
    x ^= x >> 15
    x = (x * _M2) & MASK32
    x ^= x >> 16
    return x


def lowbias32(x: torch.Tensor) -> torch.Tensor:
    """The hash on an int64 tensor holding uint32 values; returns a new tensor."""
    return _lowbias32_i32(_to_i32(x)).to(torch.int64) & MASK32


def _to_i32(x: torch.Tensor) -> torch.Tensor:
    """uint32 values (in int64) -> the same bits as int32 (two's complement)."""
    x = x & MASK32
    return torch.where(x >= 2**31, x - 2**32, x).to(torch.int32)


_M2_I32 = _M2 - 2**32  # the same 32 bits as a signed int32 constant


def _lowbias32_i32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 on int32 bit patterns: multiplications wrap mod 2**32 and the
    masks turn arithmetic shifts into logical ones.  Works in place on ``x``."""
    x ^= (x >> 16) & 0xFFFF
    x.mul_(_M1)
    x ^= (x >> 15) & 0x1FFFF
    x.mul_(_M2_I32)
    x ^= (x >> 16) & 0xFFFF
    return x


def stream_key(seed: int, step: int) -> int:
    """The 32-bit key of one rounding pass (one seed, one step)."""
    return lowbias32_int((seed & MASK32) ^ lowbias32_int((step + GOLDEN32) & MASK32))


_INDEX_HASH: dict[tuple[int, str], torch.Tensor] = {}


def _hashed_index(n: int, device: torch.device | str) -> torch.Tensor:
    """``lowbias32(arange(n))`` as int32 bits, cached per size and device (it does not
    depend on seed or step)."""
    key = (n, str(device))
    cached = _INDEX_HASH.get(key)
    if cached is None:
        if len(_INDEX_HASH) > 8:
            _INDEX_HASH.clear()
        cached = _lowbias32_i32(_to_i32(torch.arange(n, dtype=torch.int64, device=device)))
        _INDEX_HASH[key] = cached
    return cached


def stream_key_i32(seed: int, step: int) -> int:
    """:func:`stream_key` as a signed int32 value (same bits)."""
    key = stream_key(seed, step)
    return key - 2**32 if key >= 2**31 else key


def hashed_index(shape: tuple[int, ...], device: torch.device | str) -> torch.Tensor:
    """``lowbias32`` of every element's row-major index, as int32 bits in ``shape``
    (cached; it depends on neither seed nor step)."""
    n = 1
    for s in shape:
        n *= s
    return _hashed_index(n, device).view(shape)


def bits_i32(index_hash: torch.Tensor, key: int | torch.Tensor) -> torch.Tensor:
    """The 32 random bits (as int32) of each element from its hashed index and the
    stream key: ``lowbias32(index_hash ^ key)``."""
    return _lowbias32_i32(index_hash ^ key)


def uniform24_i32(bits: torch.Tensor) -> torch.Tensor:
    """:func:`uniform24` for int32 bit patterns."""
    return ((bits >> 8) & 0xFFFFFF).to(torch.float32) * (2.0**-24)


def _bits_i32(shape: tuple[int, ...], seed: int, step: int, device) -> torch.Tensor:
    return bits_i32(hashed_index(shape, device), stream_key_i32(seed, step))


def random_bits(
    shape: tuple[int, ...], seed: int, step: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """32 random bits per element of ``shape`` (int64 tensor, values in [0, 2**32))."""
    return _bits_i32(shape, seed, step, device).to(torch.int64) & MASK32


def random_uniform(
    shape: tuple[int, ...], seed: int, step: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """``uniform24(random_bits(shape, seed, step))`` without the int64 detour."""
    return uniform24_i32(_bits_i32(shape, seed, step, device))


def uniform24(bits: torch.Tensor) -> torch.Tensor:
    """Map 32 random bits to a float32 uniform on [0, 1) with 24-bit resolution (exact)."""
    return (bits >> 8).to(torch.float32) * (2.0**-24)


def resolve_seed(seed: int | None, generator: torch.Generator | None) -> int:
    """A concrete 32-bit seed: ``seed`` if given, else one drawn from ``generator``,
    else 0 (reproducible by default)."""
    if seed is not None:
        return int(seed) & MASK32
    if generator is not None:
        return int(torch.randint(0, 2**31 - 1, (1,), generator=generator).item())
    return 0

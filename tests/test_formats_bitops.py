"""The shared bit helpers: exact powers of two, exponent extraction, the generic
minifloat RNE against torch / ml_dtypes casts, the fast E2M1 path against the
generic one, nibble packing."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch

from precisionlab.formats.bitops import (
    E2M1,
    E4M3,
    E5M2,
    decode_e2m1,
    decode_minifloat,
    encode_e2m1,
    encode_minifloat,
    exponent_of,
    pack_nibbles,
    pow2,
    unpack_nibbles,
)


def probe_values() -> torch.Tensor:
    """Every fp16 value (fp32-exact; includes ties of every narrower format) at a few
    scales, plus random fp32 bit patterns, NaN excluded."""
    v = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    v = v[~np.isnan(v)]
    scaled = np.concatenate([v * np.float32(2.0**k) for k in (-20, -9, 0, 3)])
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2**32, 1 << 18, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = np.concatenate([scaled, bits])
    return torch.from_numpy(x[~np.isnan(x)])


def test_pow2_is_exact_everywhere():
    k = torch.arange(-149, 128)
    got = pow2(k).double()
    assert torch.equal(got, torch.tensor([math.ldexp(1.0, int(i)) for i in k], dtype=torch.float64))


def test_exponent_of():
    x = torch.tensor([1.0, 1.999, 2.0, 0.75, 2.0**-126, 2.0**-127, 0.0, float("inf"), 3e38])
    assert exponent_of(x).tolist() == [0, 0, 1, -1, -126, -127, -127, 128, 127]


@pytest.mark.parametrize(("fmt", "tdt"), [(E4M3, torch.float8_e4m3fn), (E5M2, torch.float8_e5m2)])
def test_generic_minifloat_matches_torch_cast(fmt, tdt):
    x = probe_values()
    x = x[torch.isfinite(x) & (x.abs() <= fmt.max_normal)]
    ours = encode_minifloat(x, fmt)
    assert torch.equal(ours, x.to(tdt).view(torch.uint8))
    assert torch.equal(decode_minifloat(ours, fmt), x.to(tdt).to(torch.float32))


def test_generic_minifloat_saturates():
    x = torch.tensor([500.0, -1e30, float("inf"), -float("inf"), 464.0, 463.9])
    assert encode_minifloat(x, E4M3).tolist() == [0x7E, 0xFE, 0x7E, 0xFE, 0x7E, 0x7E]


@pytest.mark.parametrize("negative_zero", [True, False])
def test_e2m1_fast_path_matches_generic_and_ml_dtypes(negative_zero):
    x = probe_values()
    fast = encode_e2m1(x, negative_zero=negative_zero)
    assert torch.equal(fast, encode_minifloat(x, E2M1, negative_zero=negative_zero))
    ref = x.numpy().astype(ml_dtypes.float4_e2m1fn).view(np.uint8)  # RNE, saturating
    if not negative_zero:
        ref = np.where((x.numpy() < 0), ref, ref & 7)
    np.testing.assert_array_equal(fast.numpy(), ref)


def test_e2m1_decoders():
    codes = torch.arange(16, dtype=torch.uint8)
    ref = torch.from_numpy(codes.numpy().view(ml_dtypes.float4_e2m1fn).astype(np.float32))
    for dec in (decode_e2m1(codes), decode_minifloat(codes, E2M1)):
        assert torch.equal(dec.view(torch.int32), ref.view(torch.int32))  # -0 included


def test_nibble_packing():
    codes = torch.randint(0, 16, (3, 5, 64), dtype=torch.uint8)
    packed = pack_nibbles(codes)
    assert packed.shape == (3, 5, 32)
    assert torch.equal(packed & 0xF, codes[..., 0::2]) and torch.equal(
        packed >> 4, codes[..., 1::2]
    )
    assert torch.equal(unpack_nibbles(packed), codes)

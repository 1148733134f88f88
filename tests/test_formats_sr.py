"""Stochastic rounding (fp16-sr, bf16-sr): pinned bits, unbiasedness, variance,
reproducibility, subnormals and saturation."""

from __future__ import annotations

import math
import struct

import ml_dtypes
import numpy as np
import pytest
import torch

from precisionlab.formats import get

NO_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, NO_CUDA])]

# (mantissa bits, min normal exponent, max normal, numpy dtype, rounding twin)
PARAMS = {
    "fp16-sr": (10, -14, 65504.0, np.float16, "fp16"),
    "bf16-sr": (7, -126, 3.3895313892515355e38, ml_dtypes.bfloat16, "bf16"),
}


# ---- an independent pure-Python statement of the algorithm (pins it for the kernels)


def _hash(x: int) -> int:
    x &= 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def _uniform(seed: int, step: int, index: int) -> float:
    key = _hash(seed ^ _hash(step + 0x9E3779B9))
    return (_hash(_hash(index) ^ key) >> 8) / 2**24


def sr_reference(x: float, index: int, seed: int, step: int, name: str) -> int:
    """16-bit code of SR(x), computed in Python floats (float64, exact here)."""
    mbits, emin, maxn, np16, _ = PARAMS[name]
    if math.isfinite(x):
        a = abs(x)
        e = max(math.frexp(a)[1] - 1, emin) if a else emin
        ulp = 2.0 ** (e - mbits)
        v = a / ulp
        lo = math.floor(v)
        q = (lo + (1 if _uniform(seed, step, index) < v - lo else 0)) * ulp
        x = math.copysign(min(q, maxn), x)
    if math.isnan(x):
        return 0x7E00 if name == "fp16-sr" else 0x7FC0  # canonical NaN
    return int(np.array([x], dtype=np.float32).astype(np16).view(np.uint16)[0])


def f32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


PINNED_VALUES = [
    0.0, -0.0, 1.0, -1.0, 1.0 + 2**-12, -(1.0 + 3 * 2**-13), math.pi, -math.e * 1e3,
    65504.0, 65519.0, 65520.0, 70000.0, -1e10, 3.0e38, f32(0x7F7FFFFF),
    2**-24 * 2.3, -(2**-24) * 0.7, 2**-14 * 1.37, 1e-30, f32(0x00000001), f32(0x007FFFFF),
    f32(0x00012345), -f32(0x00400001), 1.17e-38, float("inf"), -float("inf"), float("nan"),
]  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["fp16-sr", "bf16-sr"])
@pytest.mark.parametrize(("seed", "step"), [(0, 0), (12345, 7), (2**32 - 1, 2**31)])
def test_bits_match_pure_python_reference(name, seed, step, device):
    rng = np.random.default_rng(seed & 0xFFFF)
    extra = (rng.standard_normal(37) * np.exp(rng.normal(0, 20, 37))).astype(np.float32)
    values = np.array(PINNED_VALUES + list(extra), dtype=np.float32).reshape(4, 16)
    x = torch.from_numpy(values).to(device)
    codes = get(name).encode(x, seed=seed, step=step).codes.cpu().numpy().view(np.uint16)
    flat = values.reshape(-1)
    for i, v in enumerate(flat):
        ref = sr_reference(float(v), i, seed, step, name)
        assert codes.reshape(-1)[i] == ref, (i, v)


def _draws(name: str, x0: float, n: int, seed: int = 1, step: int = 0) -> torch.Tensor:
    """n stochastic roundings of the same value (one per element index)."""
    x = torch.full((n // 256, 256), x0, dtype=torch.float32)
    return get(name).quantize(x, seed=seed, step=step).double().reshape(-1)


CASES = [
    # (format, x0, ulp of x0's binade in the target)
    ("fp16-sr", 1.0 + 0.3 * 2**-10, 2**-10),
    ("fp16-sr", -(1000.0 + 0.77 * 0.5), 0.5),
    ("fp16-sr", 2**-24 * 5.1, 2**-24),  # fp16 subnormal
    ("fp16-sr", 2**-24 * 0.02, 2**-24),  # below the smallest fp16 subnormal
    ("bf16-sr", 3.0 + 0.5 * 2**-6, 2**-6),
    ("bf16-sr", -(1e20), 2.0 ** (66 - 7)),
    ("bf16-sr", 2**-133 * 9.25, 2**-133),  # bf16 subnormal: an fp32 subnormal input
]


@pytest.mark.parametrize(("name", "x0", "ulp"), CASES)
def test_unbiased_and_variance(name, x0, ulp):
    n = 1 << 18
    x0 = float(np.float32(x0))
    q = _draws(name, x0, n)
    frac = (abs(x0) / ulp) % 1.0
    lo = math.floor(abs(x0) / ulp) * ulp
    assert set(np.unique(q.abs().numpy())) <= {lo, lo + ulp}  # only the two neighbours
    sigma = ulp * math.sqrt(frac * (1 - frac) / n)
    bias = abs(q.mean().item() - x0)
    assert bias < 5 * sigma + 1e-3 * ulp * frac
    # the same bound rejects round-to-nearest, so the test can fail
    rne = get(PARAMS[name][4]).quantize(torch.tensor([x0])).double().item()
    assert abs(rne - x0) > 5 * sigma + 1e-3 * ulp * frac
    var = q.var().item()
    assert var == pytest.approx(frac * (1 - frac) * ulp**2, rel=0.03)


@pytest.mark.parametrize("name", ["fp16-sr", "bf16-sr"])
def test_unbiased_across_steps(name):
    """One element position, many steps: the per-step streams are unbiased too."""
    x0 = float(np.float32(1.0 + 0.1 * 2 ** -PARAMS[name][0]))
    x = torch.full((64,), x0)
    f = get(name)
    q = torch.stack([f.quantize(x, seed=5, step=s) for s in range(1024)]).double()
    ulp = 2.0 ** -PARAMS[name][0]
    sigma = ulp * math.sqrt(0.09 / q.numel())
    assert abs(q.mean().item() - x0) < 5 * sigma
    col = q[:, 0]  # a single element across steps is not constant
    assert 0 < (col > 1.0).sum().item() < 1024


@pytest.mark.parametrize("name", ["fp16-sr", "bf16-sr"])
def test_reproducible_and_stream_dependent(name):
    x = torch.randn(64, 128) * 10
    f = get(name)
    a = f.encode(x, seed=3, step=9).codes
    assert torch.equal(a, f.encode(x, seed=3, step=9).codes)
    assert torch.equal(a, f.encode(x.clone(), seed=3 + 2**32, step=9).codes)  # 32-bit seeds
    for other in (f.encode(x, seed=4, step=9).codes, f.encode(x, seed=3, step=10).codes):
        assert (other != a).float().mean().item() > 0.2
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    assert torch.equal(f.encode(x, generator=g1).codes, f.encode(x, generator=g2).codes)
    assert torch.equal(f.encode(x).codes, f.encode(x, seed=0).codes)  # default seed 0


@pytest.mark.parametrize("name", ["fp16-sr", "bf16-sr"])
def test_specials_and_saturation(name):
    maxn = PARAMS[name][2]
    f32max = float(np.finfo(np.float32).max)
    x = torch.tensor(
        [0.0, -0.0, float("inf"), -float("inf"), float("nan"), f32max, -f32max, maxn, 65519.0]
    ).repeat(512)
    q = get(name).quantize(x, seed=11)
    assert q[0] == 0 and not torch.signbit(q[0]) and q[1] == 0 and torch.signbit(q[1])
    assert q[2] == float("inf") and q[3] == -float("inf") and torch.isnan(q[4::9]).all()
    assert (q[5::9] == maxn).all() and (q[6::9] == -maxn).all() and (q[7::9] == maxn).all()
    assert torch.isfinite(q[8::9]).all()  # never rounds up to inf
    if name == "fp16-sr":
        big = get(name).quantize(torch.full((4096,), 65519.0), seed=2)
        assert set(big.unique().tolist()) == {65504.0}  # saturates instead of 65536


@pytest.mark.parametrize("name", ["fp16-sr", "bf16-sr"])
def test_representable_values_are_unchanged(name):
    np16 = PARAMS[name][3]
    pats = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    v = pats.view(np16).astype(np.float32)
    keep = np.isfinite(v)
    x = torch.from_numpy(v[keep])
    codes = get(name).encode(x, seed=99, step=3).codes.numpy().view(np.uint16)
    np.testing.assert_array_equal(codes, pats[keep])


@pytest.mark.parametrize("device", DEVICES)
def test_leading_shape_and_index_order(device):
    """Element index is the row-major linear index of the tensor passed in."""
    f = get("bf16-sr")
    x = (torch.randn(3, 5, 64) * 3).to(device)
    full = f.encode(x, seed=1, step=2).codes
    flat = f.encode(x.reshape(-1), seed=1, step=2).codes.reshape(3, 5, 64)
    assert torch.equal(full, flat)
    t = x.transpose(1, 2)  # non-contiguous input: index follows its logical order
    tc = t.contiguous()
    assert torch.equal(f.encode(t, seed=1, step=2).codes, f.encode(tc, seed=1, step=2).codes)


@pytest.mark.parametrize("name", ["fp16-sr", "bf16-sr"])
def test_integer_form_writes_the_reference_bits(name):
    """The CPU's integer form of the rounding gives the documented algorithm's bits for
    every kind of float32: random bit patterns (subnormals, NaN payloads, ±inf, huge
    values), target subnormals and values near the saturation point."""
    from precisionlab.formats.floats import _sr_bits, _sr_core
    from precisionlab.formats.random_bits import hashed_index, stream_key_i32

    m, emin, max_normal, _, _ = PARAMS[name]
    gen = torch.Generator().manual_seed(3)
    patterns = torch.randint(-(2**31), 2**31, (1 << 17,), generator=gen).to(torch.int32)
    x = torch.cat([patterns.view(torch.float32), torch.tensor(PINNED_VALUES),
                   torch.randn(1 << 16, generator=gen) * 2.0**emin,
                   torch.randn(1 << 16, generator=gen) * max_normal / 3])
    index_hash = hashed_index(tuple(x.shape), x.device)
    for seed, step in ((0, 0), (7, 123456)):
        key = torch.tensor(stream_key_i32(seed, step), dtype=torch.int32)
        want = _sr_core(x, index_hash, key, m, emin, max_normal).view(torch.int32)
        got = _sr_bits(x, index_hash, key, m, emin, max_normal).view(torch.int32)
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_rounding_in_pieces_writes_the_same_bits(monkeypatch):
    """On the CPU a large tensor is rounded a piece at a time: the same bits as whole."""
    from precisionlab.formats import floats

    x = torch.randn(3, 5, 2 * 17 * 64, generator=torch.Generator().manual_seed(5))
    x[0, 0, :4] = torch.tensor([2.0**-20, -(2.0**-25), float("nan"), 7e4])
    whole = get("fp16-sr").encode(x, seed=9, step=4).codes
    monkeypatch.setattr(floats, "CPU_CHUNK", 1000)  # 32640 elements: 33 pieces, the last short
    pieces = get("fp16-sr").encode(x, seed=9, step=4).codes
    assert torch.equal(pieces, whole)

"""fp32 / fp16 / bf16 (round to nearest even): codes against torch's casts and
ml_dtypes, over exhaustive 16-bit patterns, their midpoints and random fp32 bits."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from precisionlab.formats import get

NO_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, NO_CUDA])]

NP16 = {"fp16": np.float16, "bf16": ml_dtypes.bfloat16}
TORCH16 = {"fp16": torch.float16, "bf16": torch.bfloat16}


def random_f32(n: int, seed: int = 0) -> np.ndarray:
    """n float32 values with uniformly random bit patterns (NaN, inf, subnormals)."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)


def all_16bit_values(name: str) -> np.ndarray:
    """Every 16-bit pattern of the format, as float32 (exact)."""
    return np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(NP16[name]).astype(np.float32)


def midpoints(name: str) -> np.ndarray:
    """Midpoints between consecutive finite values (exact ties) and their fp32
    neighbours on either side, both signs."""
    v = all_16bit_values(name)[: 0x7C00 if name == "fp16" else 0x7F80].astype(np.float64)
    mid = ((v[:-1] + v[1:]) / 2).astype(np.float32)  # exact: one more bit than the format
    up = np.nextafter(mid, np.float32(np.inf))
    down = np.nextafter(mid, np.float32(-np.inf))
    pos = np.concatenate([mid, up, down])
    return np.concatenate([pos, -pos])


def codes_u16(fmt_name: str, x: np.ndarray, device: str) -> np.ndarray:
    packed = get(fmt_name).encode(torch.from_numpy(x).to(device))
    assert packed.codes.dtype == torch.int16
    return packed.codes.cpu().numpy().view(np.uint16)


def assert_codes_equal(ours: np.ndarray, ref: np.ndarray, x: np.ndarray, np16) -> None:
    nan = np.isnan(x)
    np.testing.assert_array_equal(ours[~nan], ref[~nan])
    assert np.isnan(ours[nan].view(np16).astype(np.float32)).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_16bit_codes_match_ml_dtypes_and_torch(name, device):
    x = np.concatenate([all_16bit_values(name), midpoints(name), random_f32(1 << 20)])
    ours = codes_u16(name, x, device)
    with np.errstate(over="ignore", invalid="ignore"):
        ref = x.astype(NP16[name]).view(np.uint16)
    assert_codes_equal(ours, ref, x, NP16[name])
    ref_torch = torch.from_numpy(x).to(TORCH16[name]).view(torch.int16).numpy().view(np.uint16)
    assert_codes_equal(ours, ref_torch, x, NP16[name])


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_16bit_exhaustive_roundtrip(name):
    """Every representable value (NaN aside) encodes to its own pattern."""
    patterns = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    x = patterns.view(NP16[name]).astype(np.float32)
    ours = codes_u16(name, x, "cpu")
    keep = ~np.isnan(x)
    np.testing.assert_array_equal(ours[keep], patterns[keep])


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_16bit_edges(name):
    f = get(name)
    info = torch.finfo(TORCH16[name])
    x = torch.tensor(
        [0.0, -0.0, info.max, -info.max, info.tiny, info.smallest_normal / 4, float("inf")]
        + [-float("inf"), float("nan"), 3.0e38, -3.5e38, 1e-45],
        dtype=torch.float32,
    )
    q = f.quantize(x)
    ref = x.to(TORCH16[name]).to(torch.float32)
    assert torch.equal(torch.isnan(q), torch.isnan(x))
    keep = ~torch.isnan(x)
    assert torch.equal(q[keep], ref[keep])
    assert torch.signbit(q[1])  # -0 keeps its sign
    if name == "fp16":
        assert torch.isinf(q[9]) and torch.isinf(q[10])  # RNE overflows (IEEE), unlike -sr


@pytest.mark.parametrize("device", DEVICES)
def test_fp32_codes_are_the_bits(device):
    x = torch.from_numpy(random_f32(1 << 16, seed=3)).to(device)
    p = get("fp32").encode(x)
    assert p.codes.dtype == torch.int32
    assert torch.equal(p.codes, x.view(torch.int32))  # NaN payloads too
    assert p.codes.data_ptr() != x.data_ptr()  # no aliasing of the caller's tensor
    assert torch.equal(get("fp32").decode(p).view(torch.int32), x.view(torch.int32))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["fp32", "fp16", "bf16"])
def test_wider_and_narrower_inputs_cast_to_fp32_first(name, dtype):
    x = torch.randn(1000, dtype=torch.float64) * 100
    x = x.to(dtype)
    f = get(name)
    assert torch.equal(f.encode(x).codes, f.encode(x.to(torch.float32)).codes)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("name", "code"), [("fp16", 0x7E00), ("bf16", 0x7FC0), ("fp16-sr", 0x7E00), ("bf16-sr", 0x7FC0)]
)
def test_nan_is_stored_canonically(name, code, device):
    nans = torch.tensor(
        [0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFFFFFFF, 0x7FBFFFFF], dtype=torch.int64
    )
    x = nans.to(torch.int32).view(torch.float32).to(device)  # quiet, signalling, signed
    codes = get(name).encode(x, seed=1).codes.cpu()
    assert (codes == code).all()

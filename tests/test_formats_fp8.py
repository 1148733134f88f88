"""fp8-e4m3 / fp8-e5m2 with an fp32 scale per row: codes and scales against an
ml_dtypes reference, exhaustive casts of every fp16 value, ties and specials."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from precisionlab.formats import FormatError, get

NO_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, NO_CUDA])]

FMT = {
    "fp8-e4m3": (ml_dtypes.float8_e4m3fn, 448.0, torch.float8_e4m3fn),
    "fp8-e5m2": (ml_dtypes.float8_e5m2, 57344.0, torch.float8_e5m2),
}
NAMES = list(FMT)


def reference(name: str, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes, row scales) computed with numpy float32 and ml_dtypes casts."""
    dt, maxn, _ = FMT[name]
    finite = np.isfinite(x)
    amax = np.where(finite, np.abs(x), np.float32(0)).max(axis=-1, keepdims=True)
    scale = (amax / np.float32(maxn)).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        y = np.clip(x / np.where(scale > 0, scale, np.float32(1)), -maxn, maxn)
        codes = y.astype(np.float32).astype(dt).view(np.uint8).copy()
    codes[np.isnan(x)] = 0x7F
    inf = np.isinf(x)
    if name == "fp8-e5m2":
        codes[inf] = np.where(x[inf] > 0, 0x7C, 0xFC)
    else:
        codes[inf] = 0x7F
    return codes, scale


def encode_np(name: str, x: np.ndarray, device: str = "cpu"):
    p = get(name).encode(torch.from_numpy(x).to(device))
    assert p.codes.dtype == torch.uint8 and p.codes.shape == x.shape
    assert p.scales["row"].dtype == torch.float32 and p.scales["row"].shape == (*x.shape[:-1], 1)
    return p, p.codes.cpu().numpy(), p.scales["row"].cpu().numpy()


def random_rows(n_rows: int, seed: int) -> np.ndarray:
    """Rows of random fp32 bit patterns, plus rows of normals over wide magnitudes."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2**32, (n_rows, 128), dtype=np.uint64).astype(np.uint32)
    raw = bits.view(np.float32)
    mag = np.exp(rng.uniform(-100, 84, (n_rows, 1))).astype(np.float32)
    normal = (rng.standard_normal((n_rows, 128)) * mag).astype(np.float32)
    return np.concatenate([raw, normal])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", NAMES)
def test_random_rows_match_reference(name, device):
    x = random_rows(2048, seed=NAMES.index(name))
    _, codes, scale = encode_np(name, x, device)
    ref_codes, ref_scale = reference(name, x)
    np.testing.assert_array_equal(scale.view(np.uint32), ref_scale.view(np.uint32))
    np.testing.assert_array_equal(codes, ref_codes)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", NAMES)
def test_every_fp16_value_with_unit_scale(name, device):
    """Rows whose amax is exactly max_normal have scale 1, so every fp16 value in
    range (ties between fp8 values included) is cast directly: RNE vs ml_dtypes
    and torch's own cast."""
    dt, maxn, tdt = FMT[name]
    v = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    v = v[np.isfinite(v) & (np.abs(v) <= maxn)]
    v = np.concatenate([v, np.zeros(-len(v) % 127, np.float32)]).reshape(-1, 127)
    x = np.concatenate([np.full((len(v), 1), maxn, np.float32), v], axis=1)
    _, codes, scale = encode_np(name, x, device)
    assert (scale == 1.0).all()
    np.testing.assert_array_equal(codes, x.astype(dt).view(np.uint8))
    np.testing.assert_array_equal(codes, torch.from_numpy(x).to(tdt).view(torch.uint8).numpy())


@pytest.mark.parametrize("name", NAMES)
def test_every_code_roundtrips(name):
    """Every finite code times an arbitrary scale decodes and re-encodes to itself."""
    dt, maxn, _ = FMT[name]
    codes = np.arange(256, dtype=np.uint8)
    vals = codes.view(dt).astype(np.float32)
    keep = np.isfinite(vals)
    s = np.float32(0.37)
    row = (np.concatenate([vals[keep], [maxn]]) * s).astype(np.float32)[None]
    p, got, scale = encode_np(name, row)
    assert scale[0, 0] == np.float32(maxn * s) / np.float32(maxn)
    np.testing.assert_array_equal(got[0, :-1], codes[keep])
    dec = get(name).decode(p).numpy()
    np.testing.assert_array_equal(dec[0, :-1], vals[keep] * scale[0, 0])


@pytest.mark.parametrize("name", NAMES)
def test_specials(name):
    inf, nan = float("inf"), float("nan")
    x = torch.tensor(
        [
            [0.0] * 8,  # zero row
            [-0.0, 0.0, -0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
            [1.0, -2.0, nan, 4.0, inf, -inf, 0.5, -0.0],
            [inf, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, nan],  # no nonzero finite value
            [1e-44, -3e-45, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],  # amax / max underflows
            [3.0e38, -3.4e38, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0],  # huge amax
        ]
    )
    f = get(name)
    p = f.encode(x)
    q = f.decode(p)
    scale = p.scales["row"][:, 0]
    assert scale[0] == 0 and scale[1] == 0 and scale[3] == 0 and scale[4] == 0
    assert torch.equal(q[0], torch.zeros(8)) and torch.equal(
        torch.signbit(q[1]), torch.signbit(x[1])
    )
    assert p.codes[2, 2] == 0x7F and torch.isnan(q[2, 2])
    assert scale[2] == 4.0 / FMT[name][1]
    assert torch.equal(q[2, [0, 1, 3, 6]], x[2, [0, 1, 3, 6]])
    assert torch.signbit(q[2, 7])
    if name == "fp8-e5m2":
        assert p.codes[2, 4] == 0x7C and p.codes[2, 5] == 0xFC
        assert q[2, 4] == inf and q[2, 5] == -inf
        assert torch.isnan(q[3, 0])  # inf in a row with scale 0 decodes to NaN (inf * 0)
    else:
        assert p.codes[2, 4] == 0x7F and p.codes[2, 5] == 0x7F
        assert torch.isnan(q[2, 4:6]).all()
    assert not torch.isfinite(q[3, [0, 7]]).any()  # non-finite never becomes finite
    assert torch.equal(q[3, 1:7], torch.zeros(6))
    assert torch.equal(q[4], torch.zeros(8) * torch.sign(x[4]))  # flushed, sign kept
    assert torch.isfinite(q[5]).all() and q[5, 1] == -f.decode(p)[5].abs().max()


def test_decode_is_code_times_scale():
    x = torch.randn(4, 3, 256) * 50
    for name, (_, _, tdt) in FMT.items():
        p = get(name).encode(x)
        ref = p.codes.view(tdt).to(torch.float32) * p.scales["row"]
        assert torch.equal(get(name).decode(p), ref)
        assert (get(name).quantize(x) - x).abs().max() <= x.abs().max() * 2.0**-3


@pytest.mark.parametrize("name", NAMES)
def test_shape_errors(name):
    with pytest.raises(FormatError, match="at least one axis"):
        get(name).encode(torch.tensor(1.0))
    with pytest.raises(FormatError, match="non-empty last axis"):
        get(name).encode(torch.zeros(3, 0))
    with pytest.raises(FormatError, match="floating-point"):
        get(name).encode(torch.zeros(3, 4, dtype=torch.int32))


def test_bits_per_element():
    assert get("fp8-e4m3").bits_per_element() == 8.25
    assert get("fp8-e5m2").bits_per_element((96, 80, 128)) == 8.25
    assert get("fp8-e4m3").bits_per_element((7, 64)) == 8.5

"""mxfp8 / mxfp4: element codes and E8M0 block scales against gfloat's OCP MX
implementation and ml_dtypes, every element value at every scale, ties, packing
order and non-finite blocks."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from precisionlab.formats import FormatError, get
from precisionlab.formats.bitops import unpack_nibbles

gfloat = pytest.importorskip("gfloat")
from gfloat.formats import (  # noqa: E402
    format_info_mxfp4_e2m1,
    format_info_mxfp8_e4m3,
    format_info_ocp_e8m0,
)

NO_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, NO_CUDA])]

GF = {"mxfp8": format_info_mxfp8_e4m3, "mxfp4": format_info_mxfp4_e2m1}
ML = {"mxfp8": ml_dtypes.float8_e4m3fn, "mxfp4": ml_dtypes.float4_e2m1fn}
MAXN = {"mxfp8": 448.0, "mxfp4": 6.0}
NAMES = list(GF)


def element_codes(name: str, packed) -> np.ndarray:
    c = packed.codes.cpu()
    return (unpack_nibbles(c) if name == "mxfp4" else c).numpy()


def gfloat_reference(name: str, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(element codes, E8M0 scale codes) from gfloat, in float64, block by block."""
    fi = GF[name]
    blocks = x.astype(np.float64).reshape(-1, 32)
    scales = np.array([gfloat.compute_scale_amax(fi.etype.emax, b) for b in blocks])
    scaled = blocks / scales[:, None]
    rounded = gfloat.round_ndarray(fi.etype, scaled, sat=True)
    codes = gfloat.encode_ndarray(fi.etype, rounded).astype(np.uint8)
    scodes = np.array([gfloat.encode_float(format_info_ocp_e8m0, s) for s in scales], np.uint8)
    return codes.reshape(x.shape), scodes.reshape(*x.shape[:-1], -1)


def random_blocks(n_blocks: int, seed: int) -> np.ndarray:
    """Finite fp32 blocks: normals over a wide exponent range, random bit patterns,
    values on and between element grid points (ties), mixed-magnitude blocks."""
    rng = np.random.default_rng(seed)
    k = n_blocks // 4
    mag = np.exp2(rng.integers(-150, 120, (k, 1))).astype(np.float32)
    normal = (rng.standard_normal((k, 32)) * mag).astype(np.float32)
    bits = rng.integers(0, 2**32, (k, 32), dtype=np.uint64).astype(np.uint32).view(np.float32)
    bits = np.where(np.isfinite(bits), bits, np.float32(1.0))
    grid = rng.integers(-64, 65, (k, 32)).astype(np.float32) / 8  # multiples of 1/8: ties
    grid *= np.exp2(rng.integers(-20, 20, (k, 1))).astype(np.float32)
    mixed = normal[::-1] * np.exp2(rng.integers(-40, 1, (k, 32))).astype(np.float32)
    return np.concatenate([normal, bits, grid, mixed]).astype(np.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", NAMES)
def test_codes_and_scales_match_gfloat(name, device):
    x = random_blocks(4096, seed=NAMES.index(name)).reshape(-1, 4, 64)
    p = get(name).encode(torch.from_numpy(x).to(device))
    codes, scodes = gfloat_reference(name, x)
    assert p.scales["block"].dtype == torch.uint8 and p.scales["block"].shape == scodes.shape
    np.testing.assert_array_equal(p.scales["block"].cpu().numpy(), scodes)
    np.testing.assert_array_equal(element_codes(name, p), codes)
    dec = get(name).decode(p).cpu().numpy().astype(np.float64)
    np.testing.assert_array_equal(dec, gfloat_dequant(name, codes, scodes))


def gfloat_dequant(name: str, codes: np.ndarray, scodes: np.ndarray) -> np.ndarray:
    fi = GF[name]
    vals = np.array(
        [gfloat.decode_float(fi.etype, int(c)).fval for c in range(256 if name == "mxfp8" else 16)]
    )
    svals = np.array([gfloat.decode_float(format_info_ocp_e8m0, int(c)).fval for c in range(256)])
    out = vals[codes].reshape(*codes.shape[:-1], -1, 32) * svals[scodes][..., None]
    return out.reshape(codes.shape)


@pytest.mark.parametrize("name", NAMES)
def test_elements_and_scales_match_ml_dtypes(name):
    x = random_blocks(2048, seed=10 + NAMES.index(name))
    p = get(name).encode(torch.from_numpy(x))
    k = p.scales["block"].numpy().astype(np.int32) - 127
    scale = np.exp2(k.astype(np.float64))
    # the scale code is the E8M0 encoding of 2**k
    np.testing.assert_array_equal(
        scale.astype(np.float32).astype(ml_dtypes.float8_e8m0fnu).view(np.uint8),
        p.scales["block"].numpy(),
    )
    y = np.clip(x.astype(np.float64) / scale, -MAXN[name], MAXN[name]).astype(np.float32)
    np.testing.assert_array_equal(element_codes(name, p), y.astype(ML[name]).view(np.uint8))


@pytest.mark.parametrize("name", NAMES)
def test_every_element_value_at_every_scale(name):
    """A block holding every element value times 2**k (so amax = max_elem * 2**k and
    floor(log2 amax) - emax = k) gets scale code k + 127 and encodes each value
    back to its own code, for every k the fp32 range allows."""
    if name == "mxfp8":
        codes = np.arange(256, dtype=np.uint8)
        vals = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
        codes, vals = codes[np.isfinite(vals)], vals[np.isfinite(vals)]
    else:
        codes = np.arange(16, dtype=np.uint8)
        vals = codes.view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    pad = -len(vals) % 31  # blocks of 31 values plus max_elem, so every block's amax is it
    vals = np.concatenate([vals, np.zeros(pad, np.float32)]).reshape(-1, 31)
    codes = np.concatenate([codes, np.zeros(pad, np.uint8)]).reshape(-1, 31)
    top = 0x7E if name == "mxfp8" else 0x7  # the code of max_elem
    vals = np.concatenate([vals, np.full((len(vals), 1), MAXN[name], np.float32)], 1).ravel()
    codes = np.concatenate([codes, np.full((len(codes), 1), top, np.uint8)], 1).ravel()
    ks = np.arange(-127, 128 - int(np.log2(MAXN[name])))  # max_elem * 2**k stays finite
    x = (vals[None, :].astype(np.float64) * np.exp2(ks)[:, None]).astype(np.float32)
    p = get(name).encode(torch.from_numpy(x))
    expect = np.broadcast_to((ks + 127)[:, None], p.scales["block"].shape)
    np.testing.assert_array_equal(p.scales["block"].numpy(), expect)
    got = element_codes(name, p)
    np.testing.assert_array_equal(got, np.broadcast_to(codes, got.shape))
    assert torch.equal(get(name).decode(p), torch.from_numpy(x))


def test_packing_order():
    x = torch.zeros(32)
    x[0], x[1], x[2], x[3] = 1.0, -6.0, 0.5, -0.0
    p = get("mxfp4").encode(x)
    assert p.scales["block"][0] == 127  # amax 6 -> floor(log2 6) - 2 = 0
    assert p.codes.shape == (16,) and p.codes.dtype == torch.uint8
    assert p.codes[0] == (0x2 | (0xF << 4))  # element 0 in the low nibble
    assert p.codes[1] == (0x1 | (0x8 << 4))  # -0.0 keeps its sign
    assert (p.codes[2:] == 0).all()


@pytest.mark.parametrize("name", NAMES)
def test_zero_and_nonfinite_blocks(name):
    f = get(name)
    x = torch.randn(6, 32)
    x[0] = 0.0
    x[1, 5] = float("nan")
    x[2, 7] = float("inf")
    x[3, 0] = -float("inf")
    x[4] = 1e-42  # fp32 subnormal amax: smallest scale
    p = f.encode(x)
    q = f.decode(p)
    s = p.scales["block"][:, 0]
    assert s[0] == 0 and torch.equal(q[0], torch.zeros(32))
    assert (s[1:4] == 0xFF).all() and torch.isnan(q[1:4]).all()
    assert (element_codes(name, p)[1:4] == 0).all()
    assert s[4] == 0 and torch.isfinite(q[4]).all()
    ok = f.encode(x[5:])
    assert torch.equal(ok.scales["block"], p.scales["block"][5:])  # blocks are independent
    assert torch.equal(f.decode(ok), q[5:])


@pytest.mark.parametrize("name", NAMES)
def test_saturation_and_decode_formula(name):
    f = get(name)
    x = torch.linspace(-1, 1, 64) * 7.99  # amax/2**k close to 2**(emax+1): saturates
    p = f.encode(x)
    q = f.decode(p)
    assert q.abs().max() <= MAXN[name] * 2.0 ** (p.scales["block"].int().max().item() - 127)
    assert torch.isfinite(q).all()
    vals = torch.from_numpy(element_codes(name, p).view(ML[name]).astype(np.float32))
    scale = torch.exp2(p.scales["block"].double() - 127).float()
    assert torch.equal(q, (vals.reshape(-1, 32) * scale[:, None]).reshape(-1))


@pytest.mark.parametrize("name", NAMES)
def test_shape_errors_and_bits(name):
    f = get(name)
    with pytest.raises(
        FormatError, match=f"{name} needs the last axis to be a multiple of 32, got 100"
    ):
        f.encode(torch.zeros(4, 100))
    assert f.bits_per_element() == (8.25 if name == "mxfp8" else 4.25)
    x = torch.randn(2, 3, 5, 64)
    p = f.encode(x)
    assert p.nbytes() * 8 == f.bits_per_element(x.shape) * x.numel()

"""nvfp4: element codes, E4M3 block scales and matrix scales identical to
nvidia-modelopt's NVFP4QTensor and to an ml_dtypes reference; zero and
non-finite handling; layout."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from precisionlab.formats import FormatError, get
from precisionlab.formats.bitops import unpack_nibbles

NO_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, NO_CUDA])]
NV = get("nvfp4")


def matrices(seed: int) -> list[np.ndarray]:
    """Finite fp32 test matrices: wide dynamic range, grid ties, zero blocks,
    negative zeros, tiny blocks (scale clamped to 2**-9), fp32 extremes."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(24):
        m, n = int(rng.integers(1, 9)), 16 * int(rng.integers(1, 9))
        x = rng.standard_normal((m, n)) * np.exp(rng.normal(0, 3, (m, n)))
        x *= np.exp2(rng.integers(-60, 60))
        out.append(x.astype(np.float32))
    ties = (rng.integers(-48, 49, (8, 64)) / 8.0).astype(np.float32)  # many exact ties
    ties[:, ::16] = 6.0  # every block amax 6 -> block scales near 1
    out.append(ties)
    mixed = rng.standard_normal((8, 64)).astype(np.float32)
    mixed[0, :16] = 0.0  # zero block
    mixed[1, 3] = -0.0
    mixed[2, 16:32] *= np.float32(1e-9)  # block scale below 2**-9: clamped
    mixed[3, 32:48] *= np.float32(3e-3)
    mixed[4, :] *= np.float32(1e30)
    out.append(mixed)
    huge = (rng.standard_normal((4, 32)) * 1e38).astype(np.float32)
    huge[0, 0] = np.finfo(np.float32).max
    out.append(huge)
    tiny = (rng.standard_normal((4, 32)) * 1e-36).astype(np.float32)  # subnormal g
    out.append(tiny)
    return out


def reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.float32]:
    """(element codes, block scale codes, matrix scale) via numpy float32 and the
    ml_dtypes e4m3fn / e2m1fn casts (RNE, e2m1 saturating), modelopt's formula."""
    f32 = np.float32
    g = f32(np.abs(x).max()) / f32(2688.0)
    blocks = x.reshape(*x.shape[:-1], -1, 16)
    s = np.abs(blocks).max(axis=-1) / (f32(6.0) * g)
    s = np.where(s == 0, f32(1.0), s)
    s8 = np.clip(s, f32(2**-9), f32(448)).astype(ml_dtypes.float8_e4m3fn)
    y = blocks / (s8.astype(f32) * g)[..., None]
    y = np.where(y == 0, f32(0), y)  # modelopt: sign bit only for y < 0
    codes = y.astype(ml_dtypes.float4_e2m1fn).view(np.uint8).reshape(x.shape)
    return codes, s8.view(np.uint8), g


def ours(x: np.ndarray, device: str = "cpu"):
    p = NV.encode(torch.from_numpy(x).to(device))
    codes = unpack_nibbles(p.codes.cpu()).numpy()
    return p, codes, p.scales["block"].cpu().numpy(), p.scales["matrix"].cpu().numpy()


@pytest.mark.parametrize("device", DEVICES)
def test_matches_ml_dtypes_reference(device):
    for x in matrices(0):
        p, codes, scodes, g = ours(x, device)
        rc, rs, rg = reference(x)
        assert (
            g.shape == (1, 1)
            and g.dtype == np.float32
            and g[0, 0].view(np.uint32) == rg.view(np.uint32)
        )
        np.testing.assert_array_equal(scodes, rs)
        np.testing.assert_array_equal(codes, rc)


@pytest.mark.parametrize("device", DEVICES)
def test_matches_modelopt(device):
    mod = pytest.importorskip(
        "modelopt.torch.quantization.qtensor.nvfp4_tensor",
        reason="nvidia-modelopt is not installed",
    )
    Q = mod.NVFP4QTensor
    for x in matrices(1):
        t = torch.from_numpy(x)
        qt, s, g = Q.quantize(t.clone(), 16)
        p = NV.encode(t.to(device))
        assert torch.equal(p.codes.cpu(), qt._quantized_data)
        assert s.dtype == torch.float8_e4m3fn
        assert torch.equal(p.scales["block"].cpu(), s.view(torch.uint8))
        assert torch.equal(p.scales["matrix"].cpu().reshape(()), g.reshape(()))
        deq = qt.dequantize(dtype=torch.float32, scale=s, double_scale=g, block_sizes={-1: 16})
        assert torch.equal(NV.decode(p).cpu(), deq)


def test_batched_matrices_match_one_at_a_time():
    x = torch.randn(2, 3, 8, 64) * torch.logspace(-3, 3, 6).reshape(2, 3, 1, 1)
    p = NV.encode(x)
    assert p.codes.shape == (2, 3, 8, 32)
    assert p.scales["block"].shape == (2, 3, 8, 4) and p.scales["matrix"].shape == (2, 3, 1, 1)
    for i in range(2):
        for j in range(3):
            one = NV.encode(x[i, j])
            assert torch.equal(one.codes, p.codes[i, j])
            assert torch.equal(one.scales["block"], p.scales["block"][i, j])
            assert torch.equal(one.scales["matrix"], p.scales["matrix"][i, j])
    assert torch.equal(NV.decode(p)[1, 2], NV.decode(NV.encode(x[1, 2])))


def test_zero_matrix_and_zero_block():
    p = NV.encode(torch.zeros(2, 4, 32))
    assert (p.codes == 0).all() and (p.scales["block"] == 0x38).all()
    assert (p.scales["matrix"] == 0).all()
    q = NV.decode(p)
    assert torch.equal(q, torch.zeros(2, 4, 32)) and not torch.isnan(q).any()
    x = torch.randn(4, 32)
    x[1, :16] = 0.0
    p = NV.encode(x)
    assert p.scales["block"][1, 0] == 0x38 and (unpack_nibbles(p.codes)[1, :16] == 0).all()
    assert torch.equal(NV.decode(p)[1, :16], torch.zeros(16))
    # a matrix whose amax / 2688 underflows is flushed to exact zeros
    p = NV.encode(torch.full((2, 16), 1e-45))
    assert (p.scales["matrix"] == 0).all() and torch.equal(NV.decode(p), torch.zeros(2, 16))


def test_nonfinite_blocks_poison_only_their_block():
    x = torch.randn(4, 64)
    x[0, 3] = float("nan")
    x[2, 40] = float("inf")
    x[3, 63] = -float("inf")
    p = NV.encode(x)
    q = NV.decode(p)
    bad = torch.zeros(4, 4, dtype=torch.bool)
    bad[0, 0] = bad[2, 2] = bad[3, 3] = True
    assert (p.scales["block"][bad] == 0x7F).all()
    assert torch.isnan(q.reshape(4, 4, 16)[bad]).all()
    clean = torch.where(torch.isfinite(x), x, 0.0)  # same finite amax, same g
    ref = NV.encode(clean)
    assert torch.equal(p.scales["matrix"], ref.scales["matrix"])
    assert torch.equal(p.scales["block"][~bad], ref.scales["block"][~bad])
    good = ~bad.repeat_interleave(16, dim=1)
    assert torch.equal(q[good], NV.decode(ref)[good])
    # a matrix with no nonzero finite value but a NaN: zeros and NaN, nothing else
    y = torch.zeros(2, 32)
    y[1, 20] = float("nan")
    q = NV.decode(NV.encode(y))
    assert torch.isnan(q[1, 16:]).all() and torch.equal(q[0], torch.zeros(32))


def test_one_dimensional_and_layout():
    x = torch.tensor([6.0, -3.0, 0.5, 1.0] + [0.0] * 12)
    p = NV.encode(x)
    assert p.codes.shape == (8,) and p.scales["block"].shape == (1,)
    assert p.scales["matrix"].shape == (1,)
    assert p.codes[0] == (0x7 | (0xD << 4)) and p.codes[1] == (0x1 | (0x2 << 4))
    assert p.scales["matrix"][0] == torch.tensor(6.0) / 2688.0
    assert torch.equal(NV.decode(p), NV.decode(NV.encode(x[None]))[0])
    assert torch.equal(NV.decode(p), x)  # representable values survive exactly


def test_errors_and_bits():
    with pytest.raises(
        FormatError, match="nvfp4 needs the last axis to be a multiple of 16, got 100"
    ):
        NV.encode(torch.zeros(4, 100))
    with pytest.raises(FormatError):
        NV.encode(torch.zeros(0, 32))
    assert NV.bits_per_element() == 4.5 + 32 / (128 * 128)
    assert NV.bits_per_element((96, 80, 128)) == 4.5 + 32 / (80 * 128)
    x = torch.randn(3, 80, 128)
    assert NV.encode(x).nbytes() * 8 == NV.bits_per_element(x.shape) * x.numel()

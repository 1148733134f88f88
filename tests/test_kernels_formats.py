"""Triton format codecs (kernels/tl_formats.py) against precisionlab.formats, bit for bit.

Runs compiled on a GPU, else in the Triton interpreter on the CPU.
"""

from __future__ import annotations

from precisionlab.kernels.testing import kernel_device

DEVICE = kernel_device()  # before the kernel modules are imported

import pytest  # noqa: E402
import torch  # noqa: E402

from precisionlab import formats  # noqa: E402
from precisionlab.formats.random_bits import random_bits  # noqa: E402
from precisionlab.kernels import codec  # noqa: E402
from precisionlab.kernels.state import StateStore  # noqa: E402
from precisionlab.kernels.tl_formats import FORMAT_IDS  # noqa: E402

FORMATS = list(FORMAT_IDS)
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy, interpreter only


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32) if t.dtype == torch.float32 else t


def assert_same_bits(a: StateStore, b: StateStore) -> None:
    for x, y in zip(a.tensors(), b.tensors(), strict=True):
        x, y = _bits(x), _bits(y)
        bad = (x != y).nonzero()
        assert bad.numel() == 0, f"{a.fmt}: {len(bad)} differ, first at {bad[0].tolist()}: " \
                                 f"{x[tuple(bad[0])]} vs {y[tuple(bad[0])]}"


def hard_values(gen: torch.Generator) -> torch.Tensor:
    """(2, 3, 20, 64) fp32: wide magnitudes, zero rows/blocks/matrices, -0.0, ties."""
    x = torch.randn(2, 3, 20, 64, generator=gen) * torch.logspace(-9, 4, 64)
    x[0, 0, 1, :16] = 0.0  # a zero block
    x[0, 1] = 0.0  # a zero matrix
    x[1, 2, 3, 5] = -0.0
    # exact ties of E2M1 / E4M3 grids after scaling, and fp16/bf16 halfway points
    x[1, 0, 0, :8] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0])
    x[1, 0, 1, :4] = torch.tensor([1.0 + 2**-11, 1.0 + 3 * 2**-11, 1.0 + 2**-8, 65520.0])
    x[1, 1, 2, :4] = torch.tensor([3e-39, -1e-45, 7e-8, 1e38])  # fp32 subnormals, huge
    return x


@pytest.mark.parametrize("fast", [False, True], ids=["reference", "fast"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_encode_decode_bit_exact(fmt: str, fast: bool) -> None:
    """Both encoder sets (tl_formats.encode_tile_with FAST 0 / 1) write formats/' bits."""
    gen = torch.Generator().manual_seed(1)
    x = hard_values(gen).to(DEVICE)
    for seed, step in ((0, 0), (123, 7)):
        ours = codec.encode(x, fmt, seed=seed, step=step, fast=fast)
        ref = StateStore.encode(x, fmt, seed=seed, step=step)
        assert_same_bits(ours, ref)
        torch.testing.assert_close(codec.decode(ours), ref.decode(), rtol=0, atol=0,
                                   equal_nan=True)


@pytest.mark.parametrize("fmt", ["fp8-e4m3", "nvfp4", "mxfp4", "bf16", "fp16", "fp16-sr"])
def test_non_finite(fmt: str) -> None:
    x = torch.randn(1, 2, 4, 32, generator=torch.Generator().manual_seed(2))
    x[0, 0, 1, 3] = float("nan")
    x[0, 1, 2, 20] = float("inf")
    x[0, 1, 3, 0] = -float("inf")
    x = x.to(DEVICE)
    ours = codec.encode(x, fmt, seed=3, step=1)
    ref = StateStore.encode(x, fmt, seed=3, step=1)
    finite = torch.isfinite(ref.decode())
    if fmt not in ("bf16", "fp16", "fp16-sr"):  # NaN payloads of 16-bit casts may differ
        assert_same_bits(ours, ref)
    dec = codec.decode(ours)
    assert torch.equal(torch.isfinite(dec), finite)
    torch.testing.assert_close(dec[finite], ref.decode()[finite], rtol=0, atol=0)


def test_sr_matches_random_bits_and_is_unbiased() -> None:
    """bf16-sr over a constant tensor: each element rounds up exactly when its
    formats.random_bits draw says so."""
    v = 1.0 + 2**-9  # a quarter of a bf16 ulp above 1
    x = torch.full((1, 2, 8, 128), v, device=DEVICE)
    ours = codec.encode(x, "bf16-sr", seed=9, step=4)
    up = (ours.codes.view(torch.int16) != torch.tensor(1.0).to(torch.bfloat16)
          .view(torch.int16).item()).cpu()
    u = (random_bits(tuple(x.shape), 9, 4) >> 8).float() * 2**-24
    assert torch.equal(up, u < 0.25)
    assert 0.15 < up.float().mean().item() < 0.35


@pytest.mark.parametrize("fmt", ["fp8-e4m3", "nvfp4"])
def test_rows_beyond_a_block_and_padded_matrix(fmt: str) -> None:
    """Headdim not a power of two (80 rows -> one padded 128-row tile for nvfp4)."""
    x = torch.randn(1, 2, 80, 32, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    assert_same_bits(codec.encode(x, fmt), StateStore.encode(x, fmt))


def test_packed_round_trip_through_formats() -> None:
    x = torch.randn(2, 2, 16, 64, generator=torch.Generator().manual_seed(6)).to(DEVICE)
    for fmt in ("nvfp4", "mxfp4", "fp8-e4m3"):
        st = codec.encode(x, fmt)
        torch.testing.assert_close(formats.get(fmt).decode(st.packed()), codec.decode(st),
                                   rtol=0, atol=0)

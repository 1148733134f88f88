"""Triton format codecs (kernels/tl_formats.py) against precisionlab.formats, bit for bit.

Runs compiled on a GPU, else in the Triton interpreter on the CPU.
"""

from __future__ import annotations

from precisionlab.kernels.testing import kernel_device

DEVICE = kernel_device()  # before the kernel modules are imported

import pytest  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from precisionlab import formats  # noqa: E402
from precisionlab.formats.random_bits import random_bits  # noqa: E402
from precisionlab.kernels import codec  # noqa: E402
from precisionlab.kernels.gdn_extra import load_tile  # noqa: E402
from precisionlab.kernels.state import StateStore  # noqa: E402
from precisionlab.kernels.tl_dots import (  # noqa: E402
    F16_SPLIT_SCALE,
    NVFP4_WORD_SCALE,
    fp8_tile_dot,
    nvfp4_word_dot,
    nvfp4_word_order,
    split_f16,
)
from precisionlab.kernels.tl_formats import FORMAT_IDS, K_FP8, K_NVFP4, div_shared  # noqa: E402

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


HW = pytest.mark.skipif(DEVICE != "cuda", reason="the hardware fp8 conversion is compiled only")
ENCODERS = [pytest.param("reference", id="reference"), pytest.param("fast", id="fast"),
            pytest.param("hw", id="hw", marks=HW)]


@pytest.mark.parametrize("encoder", ENCODERS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_encode_decode_bit_exact(fmt: str, encoder: str) -> None:
    """Every encoder set (tl_formats.encode_tile_with FAST 0 / 1, and on a GPU the flush
    kernels' store_fast with the hardware fp8 conversion) writes formats/' bits."""
    gen = torch.Generator().manual_seed(1)
    x = hard_values(gen).to(DEVICE)
    for seed, step in ((0, 0), (123, 7)):
        ours = codec.encode(x, fmt, seed=seed, step=step, fast=encoder == "fast",
                            hw=encoder == "hw")
        ref = StateStore.encode(x, fmt, seed=seed, step=step)
        assert_same_bits(ours, ref)
        torch.testing.assert_close(codec.decode(ours), ref.decode(), rtol=0, atol=0,
                                   equal_nan=True)


@pytest.mark.parametrize("encoder", ENCODERS)
@pytest.mark.parametrize("fmt", ["fp8-e4m3", "nvfp4", "mxfp4", "bf16", "fp16", "fp16-sr"])
def test_non_finite(fmt: str, encoder: str) -> None:
    x = torch.randn(1, 2, 4, 32, generator=torch.Generator().manual_seed(2))
    x[0, 0, 1, 3] = float("nan")
    x[0, 1, 2, 20] = float("inf")
    x[0, 1, 3, 0] = -float("inf")
    x[0, 0, 2, 7] = -float("nan")
    x = x.to(DEVICE)
    ours = codec.encode(x, fmt, seed=3, step=1, fast=encoder == "fast", hw=encoder == "hw")
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


def sr_edge_values(fmt: str, gen: torch.Generator) -> torch.Tensor:
    """(1, 1, 64, 64) fp32 around where the 16-bit SR encoders change path: the bottom
    of fp16's normal range (2**-14) and its 2**-24 grid below, fp32's smallest normals
    (bf16), the saturation points (65504 ... 65536, bf16's largest finite), zeros, and
    both signs; each value with the low bits the rounding looks at spread out."""
    if fmt == "fp16-sr":
        edges = [0x38800000, 0x33800000, 0x477FE000, 0x47800000, 0x00800000]
    else:
        edges = [0x00800000, 0x00000001, 0x7F7F0000, 0x7F7FFFFF - 0xFFFF, 0x3F800000]
    base = torch.tensor(edges, dtype=torch.int64).repeat_interleave(512)
    off = torch.randint(-2**14, 2**14, base.shape, generator=gen)
    bits = (base + off).clamp(0, 0x7F7FFFFF)
    n = 64 * 64
    rest = torch.randint(0, 0x7F800000, (n - bits.numel(),), generator=gen)
    x = torch.cat([bits, rest]).to(torch.int32).view(torch.float32)
    x = torch.where(torch.rand(n, generator=gen) < 0.5, -x, x)
    x[:7] = torch.tensor([0.0, -0.0, 65504.0, 65519.99, 65520.0, -65535.0, 2.0**-24])
    return x.reshape(1, 1, 64, 64)


def sr_decision_values(fmt: str, seed: int, step: int, gen: torch.Generator) -> torch.Tensor:
    """(1, 1, 64, 64) fp32 whose rounding is decided by one unit of the random draw:
    each element's dropped bits equal its own draw's ``r`` (``bits >> 19`` for fp16,
    ``>> 16`` for bf16) plus -1, 0 or +1, so it rounds up exactly when they exceed
    ``r``; for fp16 a quarter of them sit below 2**-14 as ``(u + d) 2**-48`` with ``u``
    the draw's 24 bits, on either side of the comparison ``u < frac``."""
    shape = (1, 1, 64, 64)
    bits = random_bits(shape, seed, step).flatten().to(torch.int64)
    n = bits.numel()
    d = torch.randint(-1, 2, (n,), generator=gen)
    sh = 13 if fmt == "fp16-sr" else 16
    exp = torch.randint(113 if sh == 13 else 1, 142, (n,), generator=gen) << 23
    top = torch.randint(0, 2 ** (23 - sh), (n,), generator=gen) << sh
    low = ((bits >> (32 - sh)) + d).clamp(0, 2**sh - 1)
    x = (exp | top | low).to(torch.int32).view(torch.float32)
    if sh == 13:
        sub = ((bits >> 8) + d).clamp(0, 2**24 - 1).double() * 2.0**-48
        x = torch.where(torch.arange(n) % 4 == 0, sub.float(), x)
    x = torch.where(torch.rand(n, generator=gen) < 0.5, -x, x)
    return x.reshape(shape)


@pytest.mark.parametrize("encoder", ENCODERS[1:])
@pytest.mark.parametrize("fmt", ["fp16-sr", "bf16-sr"])
def test_sr_encoders_at_their_edges(fmt: str, encoder: str) -> None:
    """The fast SR encoders (tl_formats.sr_round_fast, sr_bf16_code) write
    formats/' bits at the edges of their paths and at every rounding decision's
    boundary, over several random streams."""
    gen = torch.Generator().manual_seed(11)
    edges = sr_edge_values(fmt, gen).to(DEVICE)
    for seed, step in ((0, 0), (5, 1), (77, 1234), (2**31 - 1, 9)):
        for x in (edges, sr_decision_values(fmt, seed, step, gen).to(DEVICE)):
            ours = codec.encode(x, fmt, seed=seed, step=step, fast=encoder == "fast",
                                hw=encoder == "hw")
            assert_same_bits(ours, StateStore.encode(x, fmt, seed=seed, step=step))


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


@triton.jit
def _div_shared_kernel(x_ptr, d_ptr, o_ptr, R: tl.constexpr, N: tl.constexpr):
    rows = tl.arange(0, R)
    offs = rows[:, None] * N + tl.arange(0, N)[None, :]
    q = div_shared(tl.load(x_ptr + offs), tl.load(d_ptr + rows)[:, None])
    tl.store(o_ptr + offs, q)


@triton.jit
def _fma_kernel(a_ptr, b_ptr, c_ptr, o_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(o_ptr + offs, tl.fma(tl.load(a_ptr + offs), tl.load(b_ptr + offs),
                                  tl.load(c_ptr + offs)))


def test_fma_rounds_once() -> None:
    """tl.fma is fused compiled and (kernels.interp_fma) in the interpreter alike."""
    a = torch.tensor([1 + 2**-23, 3.0, 1e30, -0.0], dtype=torch.float32)
    b = torch.tensor([1 + 2**-23, 1 / 3, 1e10, 5.0], dtype=torch.float32)
    c = -(a * b)  # the rounded products
    out = torch.empty_like(a, device=DEVICE)
    _fma_kernel[(1,)](a.to(DEVICE), b.to(DEVICE), c.to(DEVICE), out, 4)
    exact = (a.double() * b.double() + c.double()).float()
    assert exact[0].item() == 2.0**-46
    assert torch.equal(out.cpu().view(torch.int32), exact.view(torch.int32))


def test_div_shared_is_division() -> None:
    """div_shared (one reciprocal per divisor, one correction per element) gives the
    bits of x / d wherever |x| > 2**-100, and within one ulp below; zeros keep their
    sign; divisors from subnormal to 2**118, dividends up to 448 d as in the encoders."""
    gen = torch.Generator().manual_seed(11)
    R, N = 64, 128
    e = torch.randint(-149, 119, (R,), generator=gen).double()
    d = ((1 + torch.rand(R, generator=gen, dtype=torch.float64)) * 2.0**e).float()
    d = torch.where(d > 0, d, torch.tensor(2.0**-149))
    scale = 2.0 ** torch.randint(-40, 1, (R, N), generator=gen).double()
    x = ((torch.rand(R, N, generator=gen, dtype=torch.float64) * 896 - 448) * scale
         * d[:, None].double()).float()
    x[:, 0], x[:, 1] = 0.0, -0.0
    out = torch.empty(R, N, device=DEVICE)
    _div_shared_kernel[(1,)](x.to(DEVICE), d.to(DEVICE), out, R, N)
    out = out.cpu()
    ref = x / d[:, None]
    same = out.view(torch.int32) == ref.view(torch.int32)
    big = x.abs() > 2.0**-100
    assert big.sum() > 0.6 * R * N
    assert same[big].all(), f"{int((~same & big).sum())} quotients differ"
    ulp = torch.nextafter(ref.abs(), torch.tensor(float("inf"))) - ref.abs()
    assert ((out - ref).abs() <= ulp)[~big].all()
    assert torch.equal(torch.signbit(out[:, :2]), torch.signbit(x[:, :2]))


@triton.jit
def _rows_dot_kernel(data, s1, s2, c_ptr, o_ptr, FMT: tl.constexpr, BT: tl.constexpr,
                     N: tl.constexpr):
    """Row sums ``S c`` of a (BT, N) stored matrix (fp8 or nvfp4) as the GDN output step
    takes them: one fp16 tensor-core product with c split in two fp16 parts."""
    rows = tl.arange(0, BT)
    codes, sc, s2v = load_tile(data, s1, s2, 0, rows, rows < BT, BT, N, FMT, FMT == K_NVFP4)
    cols = tl.arange(0, N)
    if FMT == K_NVFP4:  # the operand's rows in the order of the decoded words
        cols = nvfp4_word_order(cols)
    c_hi, c_lo = split_f16(tl.load(c_ptr + cols))
    cc = tl.arange(0, 16)[None, :]
    CC = tl.where(cc == 0, c_hi[:, None], tl.where(cc == 1, c_lo[:, None], 0.0)).to(tl.float16)
    if FMT == K_FP8:
        P = fp8_tile_dot(codes, CC) * (sc / F16_SPLIT_SCALE)[:, None]
    else:
        P = nvfp4_word_dot(codes, sc, CC, BT, N) * (s2v * (NVFP4_WORD_SCALE / F16_SPLIT_SCALE))
    tl.store(o_ptr + rows, tl.sum(tl.where(cc < 2, P, 0.0), axis=1))


@pytest.mark.parametrize("fmt", ["fp8-e4m3", "nvfp4"])
def test_tensor_core_row_sums_are_fp32_accurate(fmt: str) -> None:
    """The GDN output step's row sums as fp16 tensor-core products (``tl_dots``): an fp8
    or nvfp4 tile's values and block scales exactly in fp16, an fp32 vector (wide
    magnitudes, not bf16-exact) in two fp16 parts: within 1e-6 of float64 sums."""
    gen = torch.Generator().manual_seed(3)
    BT, N = 32, 64
    S = torch.randn(1, 1, BT, N, generator=gen) * torch.logspace(-3, 2, BT)[:, None]
    store = StateStore.encode(S.to(DEVICE), fmt)
    c = (torch.randn(N, generator=gen) * torch.logspace(-6, 0, N)).to(DEVICE)
    o = torch.empty(BT, device=DEVICE)
    _rows_dot_kernel[(1,)](*store.kernel_args(), c, o, FORMAT_IDS[fmt], BT, N)
    X = store.decode().reshape(BT, N).double()
    err = (o.double() - X @ c.double()).abs() / (X.abs() @ c.double().abs())
    assert float(err.max()) < 1e-6, float(err.max())


@pytest.mark.parametrize("fmt", ["fp16-sr", "bf16-sr", "fp8-e4m3"])
def test_encode_state_takes_the_triton_encoder_for_rounding_where_kernels_compile(
        fmt: str, monkeypatch) -> None:
    """Where kernels run compiled, a stochastically rounded state is encoded by the
    Triton codec (no torch.compile of the emulator's rounding); the bits stay the torch
    formats'."""
    used: list[str] = []
    encode = codec.encode
    monkeypatch.setattr(codec, "encode", lambda x, f, **kw: used.append(f) or encode(x, f, **kw))
    monkeypatch.setattr(codec, "compiled_on", lambda device: True)
    x = torch.randn(2, 3, 24, 16, device=DEVICE) * 3.0
    got = codec.encode_state(x, fmt, seed=11, step=5)
    assert_same_bits(got, StateStore.encode(x, fmt, seed=11, step=5))
    assert used == ([fmt] if fmt.endswith("-sr") else [])
    monkeypatch.setattr(codec, "compiled_on", lambda device: False)
    used.clear()
    assert_same_bits(codec.encode_state(x, fmt, seed=11, step=5),
                     StateStore.encode(x, fmt, seed=11, step=5))
    assert used == []

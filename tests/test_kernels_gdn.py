"""Fused Gated DeltaNet kernels against their torch references (layers/gdn.py, the
torch design runner) and the bits they write against precisionlab.formats.

Runs compiled on a GPU, else in the Triton interpreter on the CPU (small shapes).
"""

from __future__ import annotations

import importlib
import sys

from precisionlab.kernels.testing import assert_runs_same_bits, kernel_device

DEVICE = kernel_device()  # before the kernel modules are imported
for _m in ("gdn_extra", "gdn_device", "gdn_flush", "gdn_step", "gdn_verify", "read_encode",
           "gdn_decode", "gdn_backend"):  # compiled-mode leftovers
    if f"precisionlab.kernels.{_m}" in sys.modules:
        importlib.reload(sys.modules[f"precisionlab.kernels.{_m}"])

import pytest  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from precisionlab.designs import TorchDesignRunner, shared, split  # noqa: E402
from precisionlab.kernels import read_encode  # noqa: E402
from precisionlab.kernels.gdn_backend import TritonGDNDesign, supports  # noqa: E402
from precisionlab.kernels.gdn_decode import (  # noqa: E402
    GDNReplayCache,
    SlotCounters,
    conventional_step,
    empty_store,
    store_into,
)
from precisionlab.kernels.gdn_extra import inv_unit_lower  # noqa: E402
from precisionlab.kernels.state import StateStore  # noqa: E402
from precisionlab.kernels.tl_formats import (  # noqa: E402
    FORMAT_IDS,
    matrix_amax,
    store_state_with,  # noqa: E402
)
from precisionlab.kinds import kind_for  # noqa: E402
from precisionlab.layers import gdn  # noqa: E402
from precisionlab.presets import Preset  # noqa: E402
from precisionlab.timing import stagger_clocks  # noqa: E402
from precisionlab.traces import SyntheticTrace  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy, interpreter only

# 4 value heads over 2 key heads, V = K = 32: two 16-row blocks, or one 32-row nvfp4 tile
PRESET = Preset("gdn-kernel-test", "gdn", 4, 32, 32, 2, 1, "test shape")
HV, V, K, HK = 4, 32, 32, 2
DEV = torch.device(DEVICE)
TOL = 1e-5


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def setup(steps: int, batch: int, seed: int = 0):
    trace = SyntheticTrace(PRESET, steps=steps, batch=batch, seed=seed, dynamics="init")
    kind = kind_for(PRESET)
    params = kind.params({k: v.float().to(DEV) for k, v in trace.params.items()})
    raws = [{k: v.to(DEV) for k, v in raw.items()} for raw in trace]
    return kind, params, raws


def state0(batch: int, seed: int = 7) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (0.5 * torch.randn(batch, HV, V, K, generator=g)).to(DEV)


def args(raw: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    return tuple(raw[n] for n in ("q", "k", "v", "a", "b"))


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32) if t.dtype == torch.float32 else t


def assert_bits(store: StateStore, S: torch.Tensor, seed: int, step: int,
                slots: torch.Tensor, near: bool = False) -> None:
    """Stored slots equal formats' encoding of the kernel's own fp32 state (the whole
    pool is encoded so that stochastic rounding sees the kernel's element indices)."""
    ref = StateStore.encode(S, store.fmt, seed=seed, step=step)
    if near:  # S from another compiled kernel: equal to the last fp32 bit or so
        a, b = bits(store.codes)[slots].long(), bits(ref.codes)[slots].long()
        assert (a - b).abs().max() <= 1 and (a != b).float().mean() < 1e-2
        return
    for a, b in zip(store.tensors(), ref.tensors(), strict=True):
        assert torch.equal(bits(a)[slots], bits(b)[slots]), f"{store.fmt} bits differ"


def assert_read_bits(read: StateStore, checkpoint: str, S: torch.Tensor, seed: int, step: int,
                     slots: torch.Tensor) -> None:
    """A split's stored read copy equals formats' encoding (seed + 1) of the checkpoint
    formats' encoding (seed) of the kernel's fp32 state gives: the read copy encodes
    the checkpoint's stored values."""
    stored = StateStore.encode(S, checkpoint, seed=seed, step=step).decode()
    assert_bits(read, stored, seed + 1, step, slots)


# --------------------------------------------------------------- conventional
def test_conventional_default_config_by_state_format() -> None:
    """fp32 states: 8-row one-warp programs (the benchmarked configuration); nvfp4:
    whole matrices; other formats: 16 or 32 rows by grid size."""
    from precisionlab.kernels.gdn_decode import default_config

    assert default_config(1, 32, 128, 128, fmt="fp32") == (8, 1)
    assert default_config(256, 32, 128, 128, fmt="fp32") == (8, 1)
    assert default_config(1, 4, 4, 16, fmt="fp32") == (4, 1)
    assert default_config(1, 32, 128, 128, fmt="nvfp4") == (128, 16)
    assert default_config(1, 32, 128, 128, fmt="bf16") == (16, 2)
    assert default_config(256, 32, 128, 128, fmt="fp16-sr") == (32, 4)


def test_a_long_window_keeps_the_fp8_copy_of_an_fp32_checkpoint_off_one_warp() -> None:
    """Small batches past 32 ring rows: 4-warp fused programs (one warp compiles the
    flush's (64, 64) system into 2.7x the code); up to 32, the one-warp ones timed."""
    from precisionlab.kernels.gdn_decode import GDNReplayCache, replay_defaults

    def warps(rows: int) -> int:
        return replay_defaults(2, 16, 32, 128, 128, "fp32", "fp8-e4m3", ring_rows=rows)[
            "num_warps"]

    assert (warps(16), warps(32), warps(64)) == (1, 1, 4)
    for window, want in ((16, 1), (64, 4)):  # 100 x 4 one-tile programs: past 384
        cache = GDNReplayCache(2, 2, 4, 16, 16, checkpoint="fp32", read="fp8-e4m3",
                               window=window, batch_hint=100, device=DEVICE)
        assert (cache.launch, cache.num_warps) == ("fused", want)


@pytest.mark.parametrize("ring,block_v", [(torch.float32, 16), (torch.bfloat16, 16),
                                          (torch.float32, None)])
def test_conventional_fp32_matches_layer(ring: torch.dtype, block_v: int | None) -> None:
    kind, params, raws = setup(steps=2, batch=3)
    idx = torch.tensor([2, -1, 0], dtype=torch.int32, device=DEV)
    live = torch.tensor([0, 2], device=DEV)
    S_all = state0(4)
    store = StateStore.encode(S_all, "fp32")
    S_ref = S_all[idx[live].long()]
    for raw in raws:
        o = conventional_step(*args(raw), params.A_log, params.dt_bias, store, idx,
                              kv_dtype=ring, block_v=block_v)
        inp = kind.prepare(raw, params, ring)
        inp = gdn.GDNInputs(*(getattr(inp, n)[live] for n in ("q", "k", "v", "g", "beta")))
        S_ref, o_ref = gdn.conventional_step(S_ref, inp, params)
        assert rel(o[live], o_ref) < TOL
    assert rel(store.decode()[idx[live].long()], S_ref) < TOL
    assert torch.equal(store.decode()[[1, 3]], S_all[[1, 3]])  # other slots untouched


@pytest.mark.parametrize("fmt", ["bf16-sr", "fp16-sr"])
def test_conventional_sr_write_back_bits(fmt: str) -> None:
    """The stochastic write-back equals formats' encoding of the same fp32 update.

    The fp32 update comes from the same kernel compiled for an fp32 state; compiled
    for a GPU the two specialisations may round a few products differently (FMA
    contraction), so there a rare neighbour code is allowed."""
    kind, params, raws = setup(steps=2, batch=2, seed=3)
    idx = torch.tensor([1, 0], dtype=torch.int32, device=DEV)
    S0 = state0(2, seed=5).to(torch.bfloat16).float()
    S0 = torch.where(S0.abs() < 2.0**-10, 0.0, S0)  # exactly representable in both
    exact, sr = StateStore.encode(S0, "fp32"), StateStore.encode(S0, fmt, seed=9)
    counters = SlotCounters(2, DEV)
    for t, raw in enumerate(raws):
        S_prev = sr.decode()
        exact.codes.copy_(S_prev)  # same input state: the kernels compute the same fp32 S
        conventional_step(*args(raw), params.A_log, params.dt_bias, exact, idx, block_v=16)
        conventional_step(*args(raw), params.A_log, params.dt_bias, sr, idx, block_v=16,
                          counters=counters, seed=9)
        assert_bits(sr, exact.codes, 9, t, torch.arange(2, device=DEV), near=DEVICE == "cuda")
    assert counters.steps.tolist() == [2, 2] and counters.tickets.tolist() == [0, 0]


# ------------------------------------------------------------- fast encoders
@triton.jit(do_not_specialize=["seed", "step"])
def _encode_pair(S, a_c, a_s1, a_s2, b_c, b_s1, b_s2, seed, step, P: tl.constexpr, N: tl.constexpr,
                 FMT: tl.constexpr):
    """Each program encodes one (P, N) matrix with tl_formats' encoders (a) and the
    fast ones (b)."""
    mat = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, P)
    x = tl.load(S + mat * (P * N) + offs[:, None] * N + tl.arange(0, N)[None, :])
    amax = matrix_amax(x)
    store_state_with(a_c, a_s1, a_s2, x, mat, offs, offs < P, P, seed, step, amax, FMT, P, N,
                     False)
    store_state_with(b_c, b_s1, b_s2, x, mat, offs, offs < P, P, seed, step, amax, FMT, P, N,
                     True)


def _hard_values(fmt: str, mats: int, P: int, N: int) -> torch.Tensor:
    """Random magnitudes over many binades (subnormals included), rounding midpoints of
    the format's element grid (and their fp32 neighbours) placed where the scales come
    out as 1, and non-finite values in the last matrix."""
    g = torch.Generator().manual_seed(11)
    x = torch.empty(mats, P, N).uniform_(1, 2, generator=g)
    x *= torch.exp2(torch.randint(-140, 12, (mats, P, N), generator=g).float())
    x *= torch.where(torch.rand(mats, P, N, generator=g) < 0.5, -1.0, 1.0)
    if fmt in ("fp8-e4m3", "nvfp4", "mxfp4"):
        if fmt == "fp8-e4m3":  # row amax 448: row scale 1, y = S
            grid = torch.tensor([0.0] + [2.0 ** (e - 3) * (8 + m) / 8 for e in range(-6, 9)
                                         for m in range(8)][:-1])
            grid = torch.cat([grid[grid < 2.0**-6 * 1.01], grid[grid >= 2.0**-6]])
            top = 448.0
        else:  # nvfp4: matrix amax 2688 -> s2 = 1, blocks holding 6 -> scale 1; mxfp4 too
            grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
            top = 6.0
        mid = (grid[1:] + grid[:-1]) / 2
        pts = torch.cat([mid, torch.nextafter(mid, torch.zeros(1)),
                         torch.nextafter(mid, torch.full((1,), 1e9)), grid, -mid])
        pts = pts[torch.randperm(len(pts), generator=g)]
        flat = x[0].reshape(-1)
        flat[: len(pts)] = pts[: flat.numel()]
        x[0] = flat.reshape(P, N)
        x[0, :, 0] = top  # every row (fp8) / first block of every row (nvfp4, mxfp4)
        if fmt != "fp8-e4m3":
            x[0, :, 16] = top
            x[0, 0, 1] = 2688.0 if fmt == "nvfp4" else x[0, 0, 1]
            if fmt == "nvfp4":  # the 2688 block: its own scale; others keep scale 1
                x[0, 0, :16] = torch.tensor([2688.0] + [1.0] * 15)
    x[-1, 0, 3] = float("inf")
    x[-1, 1, 5] = float("nan")
    x[-1, 2, 7] = -float("inf")
    x[-1, 3, :] = 0.0
    x[-1, 4, 2] = -0.0
    return x


@pytest.mark.parametrize("fmt", ["fp8-e4m3", "nvfp4", "mxfp4", "fp16-sr", "bf16-sr"])
def test_fast_encoders_write_the_same_bits(fmt: str) -> None:
    """tl_formats.encode_tile_with(..., FAST=True) (integer-rounded minifloat codes, SR
    by a power-of-two product) writes tl_formats' bits, and formats/' bits for finite
    matrices."""
    mats, P, N = 4, 16, 32
    S = _hard_values(fmt, mats, P, N).to(DEV)
    a = empty_store(fmt, (1, mats, P, N), DEV)
    b = empty_store(fmt, (1, mats, P, N), DEV)
    _encode_pair[(mats,)](S, *a.kernel_args(), *b.kernel_args(), 5, 3, P, N,
                          FORMAT_IDS[fmt])
    for x, y in zip(a.tensors(), b.tensors(), strict=True):
        assert torch.equal(bits(x), bits(y)), fmt
    ref = StateStore.encode(S[:-1].reshape(1, mats - 1, P, N), fmt, seed=5, step=3)
    for x, y in zip(b.tensors(), ref.tensors(), strict=True):
        n = y.numel()
        assert torch.equal(bits(x).reshape(-1)[:n], bits(y).reshape(-1)), fmt


# ---------------------------------------------------------------- replay designs
DESIGNS = [
    shared("fp32", 3),
    split("fp32", "fp8-e4m3", 3),
    split("fp16-sr", "nvfp4", 2),
    split("bf16-sr", "mxfp4", 2),
    shared("bf16", 2),
]


def check_replay(design, steps: int, ring: torch.dtype = torch.bfloat16, **cfg) -> None:
    """Per-step outputs match the torch runner; every flush writes exactly the bits
    formats/ gives the kernel's fp32 state (checkpoint: seed; read copy: seed + 1, of the
    checkpoint's stored values)."""
    kind, params, raws = setup(steps=steps, batch=2, seed=1)
    idx = torch.tensor([2, 0], dtype=torch.int32, device=DEV)
    live = idx.long()
    S0 = state0(2)
    read = None if design.kind == "shared" else design.read_format
    cache = GDNReplayCache(3, HK, HV, K, V, window=design.window,
                           checkpoint=design.checkpoint_format, read=read, seed=4, device=DEV,
                           keep_fresh=True, ring_dtype=ring, **cfg)
    cache.reset()
    cache.reset(S0, slots=live)
    # the torch runner sees slot order: its batch row b is slot idx[b]
    runner = TorchDesignRunner(design, kind, params, 2, DEV, ring, seed=4, state0=S0)
    exact_sr = design.checkpoint_format.endswith("-sr")
    for t, raw in enumerate(raws):
        o = cache.step(*args(raw), params.A_log, params.dt_bias, idx)
        o_ref, S_new = runner.step(kind.prepare(raw, params, ring), t, raw)
        # an SR checkpoint rounds the kernel's and torch's (equal to 1e-7) states with
        # different random outcomes at a few elements; fp32 checkpoints agree exactly
        tol = TOL if (not exact_sr or t < design.window) else 5e-2
        assert rel(o, o_ref) < tol, (t, rel(o, o_ref))
        if S_new is not None:
            fresh = cache.fresh
            if not exact_sr or t < design.window:
                assert rel(fresh[live], S_new) < TOL
            assert_bits(cache.ckpt, fresh, 4, t, live)
            if cache.read is not None:
                assert_read_bits(cache.read, cache.ckpt.fmt, fresh, 4, t, live)
    assert cache.ring_len[live].tolist() == [steps % design.window] * 2
    assert cache.steps[live].tolist() == [steps] * 2
    clock = cache.counters.tickets.tolist()  # one tick per program and step; slot 1 unused
    assert clock[1] == 0 and clock[0] == clock[2] == steps * cache.programs_per_slot


@pytest.mark.parametrize("design", DESIGNS, ids=lambda d: d.label)
def test_replay_matches_torch_runner_and_formats(design) -> None:
    """Two flushes of each design (small-batch defaults: one fused launch per step,
    tf32x2 flush products), two 16-row blocks per head (nvfp4: each flushes its rows,
    the last to post its amax encodes the 32-row matrix's copy)."""
    whole = "nvfp4" in (design.checkpoint_format, design.read_format)
    check_replay(design, 2 * design.window + 1, block_v=None if whole else 16)


CONFIGS = [
    # the production window: 16 entries fill the (16, 16) triangular system; ieee
    # products; fused launch, each program streams a k-head group's 2 tiles (2-stage
    # pipeline) and flushes them in 16-row chunks (2-stage pipeline)
    (shared("fp32", 16), dict(block_v=32, flush_chunk=16, dot_precision="ieee",
                              tiles_per_program=2, stages=2, flush_stages=2)),
    # 17 entries (a 32-entry system); nvfp4 copy: two passes over two chunks (amax first)
    (split("fp16-sr", "nvfp4", 17), dict(flush_chunk=16, flush_stages=2, fast_encode=False)),
    # an nvfp4 checkpoint folded in two chunks: the second decodes with the old matrix
    # scale although the first has already written the new one
    (shared("nvfp4", 3), dict(flush_chunk=16, flush_stages=2)),
    # split launch: persistent flush over 16-row units; output programs stream the 4
    # 16-row tiles of a k-head group (3-stage pipeline)
    (split("fp32", "fp8-e4m3", 5), dict(launch="split", block_v=16, out_block_v=16,
                                        out_tiles_per_program=4, out_stages=3)),
    # staged launch: flush, prep (ring products and coefficients per k-head), output
    # programs of 16-row tiles (two per program, 2-stage pipeline)
    (split("fp32", "fp8-e4m3", 5), dict(launch="staged", block_v=16, out_block_v=16,
                                        out_tiles_per_program=2, out_stages=2)),
    # staged, the production window, masked (not eager) ring loads in the prep launch,
    # one-warp flush programs (the triangular system by forward substitution)
    (shared("fp32", 16), dict(launch="staged", block_v=32, out_block_v=32, eager=False,
                              num_warps=1)),
    # staged with an nvfp4 read copy (whole-matrix flush units; its defaults: the
    # integer-rounding encoders, the second nvfp4 pass from the fp32 scratch) ...
    (split("fp16-sr", "nvfp4", 3), dict(launch="staged", out_block_v=16)),
    # ... and the reference encoders of tl_formats with the nvfp4 chunks folded twice
    (split("fp16-sr", "nvfp4", 3), dict(launch="staged", out_block_v=16, flush_chunk=16,
                                        flush_pass="recompute", fast_encode=False)),
    # opt-in flush variants: the nvfp4 second pass from the fp32 scratch (persistent
    # launch, two 16-row chunks) with the integer-rounded encoders ...
    (split("fp16-sr", "nvfp4", 3), dict(launch="staged", out_block_v=16, flush_chunk=16,
                                        flush_pass="scratch", fast_encode=True)),
    # ... an nvfp4 checkpoint (decoded with the old matrix scale, encoded from the
    # scratch), one flush program per unit
    (shared("nvfp4", 3), dict(launch="staged", flush_chunk=16, flush_grid="units",
                              flush_pass="scratch")),
    # ... one program per 16-row unit, fast fp8 encoder
    (split("fp32", "fp8-e4m3", 5), dict(launch="staged", block_v=16, out_block_v=16,
                                        flush_grid="units", fast_encode=True)),
    # ... fast mxfp4 encoder and bf16 stochastic rounding
    (split("bf16-sr", "mxfp4", 2), dict(launch="staged", block_v=16, fast_encode=True)),
    # staged, fp8 read copy read by tensor-core products (fp16 tile, split k and q;
    # the ring's part in tf32), tiles two per program, 2-stage pipeline ...
    (split("fp32", "fp8-e4m3", 5), dict(launch="staged", block_v=16, out_block_v=16,
                                        out_tiles_per_program=2, out_stages=2,
                                        out_mma=True)),
    # ... and over the production window, the fp8 checkpoint shared
    (shared("fp8-e4m3", 16), dict(launch="staged", block_v=32, out_block_v=16,
                                  out_mma=True)),
    # ... an nvfp4 copy's (its nibbles and block scales as exact fp16 values) ...
    (split("fp16-sr", "nvfp4", 3), dict(launch="staged", out_block_v=32, out_mma=True)),
    # ... four tiles per program (a k-head group's 16-row tiles, as qwen3.5-122b's
    # 128-row ones), 2-stage pipeline
    (split("fp16-sr", "nvfp4", 3), dict(launch="staged", out_block_v=16, out_mma=True,
                                        out_tiles_per_program=4, out_stages=2)),
    # ... an fp32 copy's tiles (two tf32 passes: head and remainder)
    (shared("fp32", 16), dict(launch="staged", block_v=32, out_block_v=16, out_mma=True)),
    # small-batch fused launch: fast encoders in the programs' own flushes (fp16-sr
    # checkpoint, fp8 read copy)
    (split("fp16-sr", "fp8-e4m3", 3), dict(block_v=16, fast_encode=True)),
    # ... one-warp programs (an fp8 copy of an fp32 checkpoint on a large grid) and
    # eight-warp ones (fp32 tiles on a small grid)
    (split("fp32", "fp8-e4m3", 4), dict(launch="fused", block_v=16, num_warps=1,
                                        fast_encode=True)),
    (shared("fp32", 4), dict(launch="fused", block_v=16, num_warps=8)),
    # ... nvfp4 copies in 16-row programs: each folds its rows into the checkpoint and
    # the matrix's scratch and posts its amax; the head's last to post encodes the copy
    (split("fp16-sr", "nvfp4", 3), dict(launch="fused", block_v=16, fast_encode=True)),
    (split("bf16-sr", "nvfp4", 3), dict(launch="fused", block_v=16)),
    (shared("nvfp4", 3), dict(launch="fused", block_v=16)),
    # ... and in programs of the whole matrix (the earlier default)
    (split("fp16-sr", "nvfp4", 3), dict(launch="fused", block_v=32)),
]


@pytest.mark.parametrize("design,cfg", CONFIGS, ids=lambda x: getattr(x, "label", ""))
def test_replay_windows_and_launches(design, cfg) -> None:
    """fp32 ring: over a long window a bf16 ring's d entries (rounded from fp32 values
    that agree with torch to ~1e-7) can round to neighbouring bf16 values."""
    check_replay(design, design.window + 1 if design.window > 8 else 2 * design.window + 1,
                 ring=torch.float32, **cfg)


@pytest.mark.parametrize("design", [shared("fp32", 4), split("fp16-sr", "nvfp4", 2),
                                    split("fp32", "fp8-e4m3", 4)], ids=lambda d: d.label)
def test_large_batch_launch(design) -> None:
    """The large-batch defaults (staged launch: whole-head flush units in pipelined
    16-row chunks with tf32x2 products; prep launch; output programs of one tile, or
    of two whole-head tiles read by tensor-core products for an fp8 copy)."""
    cache = GDNReplayCache(3, HK, HV, K, V, window=design.window, batch_hint=256,
                           device=DEV, checkpoint=design.checkpoint_format,
                           read=None if design.kind == "shared" else design.read_format)
    assert cache.launch == "staged" and cache.dot == "tf32x2"
    assert cache.out_TPP == (2 if cache.out_mma else 1)
    assert cache.out_mma == (design.read_format in ("fp8-e4m3", "nvfp4"))
    assert cache.out_evict == (not cache.out_mma)  # plain tile loads stream evict-first
    assert cache.prep_keep  # the prep launch's rows stored evict-last
    assert cache.prep_release  # and a flushing row's put back to the normal priority
    check_replay(design, 2 * design.window + 1, batch_hint=256)


@pytest.mark.parametrize("read,bv", [("nvfp4", 32)])
def test_split_launch_equals_fused(read: str, bv: int) -> None:
    """Flush launch + output launch (its own, smaller block) = the one fused launch."""
    kind, params, raws = setup(steps=4, batch=2, seed=2)
    idx = torch.tensor([0, 1], dtype=torch.int32, device=DEV)
    outs = {}
    for launch in ("fused", "split"):
        cache = GDNReplayCache(2, HK, HV, K, V, window=3, checkpoint="fp32", read=read,
                               device=DEV, block_v=bv, launch=launch, out_block_v=16)
        cache.reset(state0(2))
        outs[launch] = [cache.step(*args(r), params.A_log, params.dt_bias, idx) for r in raws]
        outs[launch + "_counters"] = (cache.ring_len.tolist(), cache.steps.tolist())
    for a, b in zip(outs["fused"], outs["split"], strict=True):
        assert rel(a, b) < 1e-6
    assert outs["fused_counters"] == outs["split_counters"] == ([1, 1], [4, 4])


def test_backend_matches_torch_runner() -> None:
    design = split("fp32", "mxfp4", 2)
    kind, params, raws = setup(steps=3, batch=2, seed=6)
    assert supports(design, kind) is None
    S0 = state0(2)
    runner = TorchDesignRunner(design, kind, params, 2, DEV, torch.bfloat16, seed=1, state0=S0)
    tri = TritonGDNDesign(design, kind, params, 2, DEV, torch.bfloat16, seed=1, state0=S0,
                          block_v=16)
    for t, raw in enumerate(raws):
        inp = kind.prepare(raw, params, torch.bfloat16)
        (y, S), (y_ref, S_ref) = tri.step(inp, t, raw), runner.step(inp, t, raw)
        assert rel(y, y_ref) < TOL
        assert (S is None) == (S_ref is None)
        if S is not None:
            assert rel(S, S_ref) < TOL
            assert torch.equal(tri.read, runner.read)


# ------------------------------------------------------------------ speculative
@pytest.mark.parametrize("vl", ["single", "staged", "staged-dot"])
def test_spec_accepted_outputs_equal_plain_decoding(vl: str) -> None:
    """Verify T drafts (rejected ones are junk), commit a random accepted count: the
    accepted outputs equal plain decoding (shared fp32, fp32 ring: equal to fp32
    rounding, whenever either path flushes)."""
    T, L, steps, B = 3, 4, 8, 2
    kind, params, raws = setup(steps=steps, batch=B, seed=8)
    idx = torch.tensor([1, 0], dtype=torch.int32, device=DEV)
    S0 = state0(B)

    def cache(drafts: int) -> GDNReplayCache:
        c = GDNReplayCache(2, HK, HV, K, V, window=L, drafts=drafts, device=DEV, block_v=32,
                           verify_block_v=16, ring_dtype=torch.float32, verify_launch=vl)
        c.reset(S0[[1, 0]])
        return c

    plain = cache(0)
    ref = [plain.step(*args(r), params.A_log, params.dt_bias, idx) for r in raws]
    spec = cache(T)
    gen = torch.Generator().manual_seed(0)
    pos = [0] * B
    while min(pos) <= steps - T:
        acc = torch.randint(1, T + 1, (B,), generator=gen, dtype=torch.int32)
        drafts = {}
        for n in ("q", "k", "v", "a", "b"):
            rows = []
            for b in range(B):
                seq = [raws[min(pos[b] + j, steps - 1)][n][b] for j in range(T)]
                seq = [s if j < acc[b] else torch.randn_like(s) for j, s in enumerate(seq)]
                rows.append(torch.stack(seq))
            drafts[n] = torch.stack(rows)
        before = spec.ring_len.clone()
        o = spec.verify(*(drafts[n] for n in ("q", "k", "v", "a", "b")), params.A_log,
                        params.dt_bias, idx)
        assert torch.equal(spec.ring_len, before)  # verify writes no counter
        for b in range(B):
            for j in range(int(acc[b])):
                if pos[b] + j < steps:
                    assert rel(o[b, j], ref[pos[b] + j][b]) < TOL
        spec.commit(acc.to(DEV), idx)
        pos = [p + int(a) for p, a in zip(pos, acc, strict=True)]
        for b in range(B):
            assert int(spec.ring_len[idx[b]]) == (0 if int(before[idx[b]]) + int(acc[b]) >= L
                                                  else int(before[idx[b]]) + int(acc[b]))
    assert spec.steps[idx.long()].tolist() == pos


@pytest.mark.parametrize("vl,fcfg,read,ring", [
    ("single", {}, "fp8-e4m3", torch.float32), ("staged", {}, "fp8-e4m3", torch.float32),
    ("staged", {"flush_grid": "units", "fast_encode": True}, "fp8-e4m3", torch.float32),
    ("staged-dot", {}, "fp8-e4m3", torch.float32), ("staged-dot", {}, "nvfp4", torch.bfloat16),
    ("staged-dot", {"flush_grid": "dynamic", "flush_ctas_per_sm": 1}, "fp8-e4m3",
     torch.float32)],
    ids=["single", "staged", "staged-units-fast", "staged-dot", "staged-dot-nvfp4-bf16ring",
         "staged-dot-dynamic"])
def test_verify_and_commit_flush_on_a_read_copy(vl: str, fcfg: dict, read: str,
                                                ring: torch.dtype) -> None:
    """Split design (fp8 read copy): each draft's output and ring d equal
    ``layers.gdn.replay_step`` on the decoded read copy and the ring; a commit that
    reaches the window folds all committed entries (6 > L) like ``layers.gdn.fold``
    and writes both copies' exact bits."""
    T, L, B = 3, 4, 2
    kind, params, raws = setup(steps=2 * T, batch=B, seed=9)
    idx = torch.tensor([1, 0], dtype=torch.int32, device=DEV)
    live = idx.long()
    cache = GDNReplayCache(2, HK, HV, K, V, window=L, drafts=T, read=read, seed=3,
                           device=DEV, block_v=32, verify_block_v=16,
                           ring_dtype=ring, keep_fresh=True, verify_launch=vl, **fcfg)
    cache.reset(state0(B)[[1, 0]])
    inps = [kind.prepare(r, params, ring) for r in raws]
    dtol = TOL if ring == torch.float32 else 1e-2  # the ring's d is rounded to bf16
    for r0 in (0, T):
        S_read = cache.read.decode()[live]
        drafts = {n: torch.stack([raws[r0 + j][n] for j in range(T)], dim=1)
                  for n in ("q", "k", "v", "a", "b")}
        o = cache.verify(*(drafts[n] for n in ("q", "k", "v", "a", "b")), params.A_log,
                         params.dt_bias, idx)
        rk, rg, rd = (cache.ring(f)[live].float() for f in ("k", "g", "d"))
        for j in range(T):
            n = r0 + j
            o_ref, d_ref = gdn.replay_step(S_read, rk[:, :n], rg[:, :n], rd[:, :n], inps[n])
            assert rel(o[:, j], o_ref) < TOL and rel(rd[:, n].float(), d_ref) < dtol
        cache.commit(torch.full((B,), T, dtype=torch.int32, device=DEV), idx)
    # the second commit reached 2T = 6 >= L committed entries: flushed
    assert cache.ring_len[live].tolist() == [0, 0] and cache.steps[live].tolist() == [6, 6]
    rk, rv, rg, rb = (cache.ring(f)[live].float() for f in ("k", "v", "g", "beta"))
    S_ref = gdn.fold(state0(B), rk[:, :2 * T], rv[:, :2 * T], rg[:, :2 * T], rb[:, :2 * T])
    assert rel(cache.fresh[live], S_ref) < TOL
    assert_bits(cache.ckpt, cache.fresh, 3, 2 * T - 1, live)
    assert_read_bits(cache.read, cache.ckpt.fmt, cache.fresh, 3, 2 * T - 1, live)


def _staggered_cache(B: int, L: int, **kw) -> GDNReplayCache:
    kw = dict(checkpoint="fp32", read="fp8-e4m3", block_v=16, out_block_v=16) | kw
    cache = GDNReplayCache(B, HK, HV, K, V, window=L, device=DEV, **kw)
    cache.reset(state0(B))
    stagger_clocks(cache.counters.tickets, L, cache.programs_per_slot)
    return cache


def test_staggered_phases_staged_equals_fused() -> None:
    """Sequences at different ring positions (admitted on different steps): at every
    step some rows flush while the others output.  The staged launches (a flushing
    row's programs of the prep and output launches do nothing) give the fused launch's
    outputs, clocks and checkpoints."""
    B, L = 3, 3
    kind, params, raws = setup(steps=2 * L + 1, batch=B, seed=5)
    idx = torch.arange(B, dtype=torch.int32, device=DEV)
    res = {}
    for launch in ("fused", "staged"):
        cache = _staggered_cache(B, L, launch=launch)
        outs = [cache.step(*args(r), params.A_log, params.dt_bias, idx) for r in raws]
        res[launch] = outs, cache.ring_len.tolist(), cache.ckpt.codes.clone()
    for a, b in zip(res["fused"][0], res["staged"][0], strict=True):
        assert rel(a, b) < 1e-6
    assert res["fused"][1] == res["staged"][1] == [(2 * L + 1 + b) % L for b in range(B)]
    assert rel(res["staged"][2], res["fused"][2]) < 1e-6


def test_gdn_bench_times_staggered_phases() -> None:
    """The GDN benchmark's replay timer with staggered phases and the concurrent flush
    (off a GPU: the sequential launches, in the Triton interpreter) on a small shape:
    one time per step of the window; a bad phase is one error."""
    from precisionlab.studies import bench_gdn as bg

    s = bg.Shape("tiny", 3, HK, HV, K, V)
    clock = bg.Clock(DEV, reps=1)
    cfg = {"phases": "staggered", "launch": "staged", "block_v": 16, "out_block_v": 16,
           "concurrent_flush": True}
    pos = bg.time_replay(s, clock, "fp32", "fp8-e4m3", 3, 1, cfg)
    assert len(pos) == 3 and all(p > 0 for p in pos)
    assert cfg["phases"] == "staggered"  # the caller's dict is not consumed
    with pytest.raises(bg.BenchError, match="phases"):
        bg.time_replay(s, clock, "fp32", None, 3, 1, {"phases": "random"})
    # the study: every replay cell with the phase mix, recorded in the attrs
    ds = bg.bench_gdn(("tiny-gdn",), (3,), (3,), extra_windows=(), variants=("replay-fp32",),
                      rounds=1, reps=1, device=DEVICE, phases="staggered")
    assert ds.attrs["phases"] == "staggered" and float(ds.us_per_step.max()) > 0
    with pytest.raises(bg.BenchError, match="phases"):
        bg.bench_gdn(("tiny-gdn",), (3,), (3,), variants=("replay-fp32",), device=DEVICE,
                     phases="random")


def test_gdn_bench_times_layers(monkeypatch) -> None:
    """``layers``: the timed step runs that many caches in turn (the same order in every
    step) and the times are per layer; a bad count is one error."""
    from precisionlab.kernels import gdn_decode
    from precisionlab.studies import bench_gdn as bg

    calls = []
    step = gdn_decode.GDNReplayCache.step

    def counted(self, *a, **kw):
        calls.append(id(self))
        return step(self, *a, **kw)

    monkeypatch.setattr(gdn_decode.GDNReplayCache, "step", counted)
    s = bg.Shape("tiny", 3, HK, HV, K, V)
    clock = bg.Clock(DEV, reps=1)
    cfg = {"layers": 2, "launch": "staged", "block_v": 16, "out_block_v": 16}
    pos = bg.time_replay(s, clock, "fp32", None, 3, 1, cfg)
    assert len(pos) == 3 and all(p > 0 for p in pos) and cfg["layers"] == 2
    assert len(set(calls)) == 2 and len(calls) % 2 == 0
    assert calls[0::2] == [calls[0]] * (len(calls) // 2) != calls[1::2]
    monkeypatch.setattr(clock, "cycle", lambda g, period, rounds: [6.0] * period)
    assert bg.time_replay(s, clock, "fp32", None, 3, 1, {"layers": 3}) == [2.0] * 3
    for bad in (0, True, "2"):
        with pytest.raises(bg.BenchError, match="layers must be an integer"):
            bg.time_replay(s, clock, "fp32", None, 3, 1, {"layers": bad})
    # the conventional step's graph: each layer its own state
    stores = []
    conv = gdn_decode.conventional_step

    def recorded(*a, **kw):
        stores.append(id(a[7]))
        return conv(*a, **kw)

    monkeypatch.setattr(gdn_decode, "conventional_step", recorded)
    bg.conventional_graph(s, clock, {"block_v": 16, "num_warps": 1}, layers=2)
    # (a compiled graph is warmed before its capture: each layer in turn, twice)
    assert len(set(stores)) == 2 and stores == stores[:2] * (len(stores) // 2)


def test_gdn_diag_times_each_launch() -> None:
    """The per-launch diagnosis of a staged step times the empty flush launch, the prep
    and output launches apart and back to back, and the step; the fused launch has no
    prep or output launch to time apart."""
    from precisionlab.studies import bench_gdn as bg

    s = bg.Shape("tiny", 3, HK, HV, K, V)
    clock = bg.Clock(DEV, reps=1)
    cfg = {"launch": "staged", "block_v": 16, "out_block_v": 16}
    row = bg.diag_replay(s, clock, "fp32", None, 4, cfg, 2)
    for key in ("us_flush_noop", "us_prep", "us_out", "us_prep_out", "us_step_output",
                "us_step_flush"):
        assert row[key] > 0, key
    fused = bg.diag_replay(s, clock, "fp32", None, 4, {"launch": "fused", "block_v": 16}, 2)
    assert "us_prep_out" not in fused and fused["us_step_output"] > 0


@pytest.mark.parametrize("grid", ["persistent", "dynamic", "units"])
def test_staged_flush_after_prep_equals_before(grid) -> None:
    """On a GPU the staged step's flush launch runs on its own stream, so it may run
    after the prep and output launches.  With the concurrent protocol (the prep launch
    leaves the clocks alone; a launch behind the flush and the prep launch advances
    them) a flush launched last reads the same clocks and writes the same bits as the
    sequential step (flush first, prep programs advancing the clocks), over two windows
    with rows at different ring positions and a padding row; the clocks advance once
    per step."""
    B, L = 4, 3
    kind, params, raws = setup(steps=2 * L + 1, batch=B, seed=6)
    idx = torch.tensor([0, 3, -1, 1], dtype=torch.int32, device=DEV)
    res = []
    for flush_last in (False, True):
        cache = _staggered_cache(B, L, launch="staged", concurrent_flush=False,
                                 flush_grid=grid)
        outs = []
        for r in raws:
            q, k, v, a, b = (t.contiguous() for t in args(r))
            out = torch.zeros(B, HV, V, device=DEV)
            if not flush_last:
                cache._flush(q, k, v, a, b, params.A_log, params.dt_bias, idx, idx, out,
                             commit=False)
            cache._staged(q, k, v, a, b, params.A_log, params.dt_bias, idx, out,
                          concurrent=flush_last)
            if flush_last:
                cache._flush(q, k, v, a, b, params.A_log, params.dt_bias, idx, idx, out,
                             commit=False)
                cache._advance_clocks(idx)
            outs.append(out)
        res.append(outs + cache.ckpt.tensors() + cache.read.tensors()
                   + [cache.counters.tickets.clone()])
    assert_runs_same_bits(res)
    advanced = res[1][-1] - _staggered_cache(B, L, launch="staged").counters.tickets
    assert advanced.tolist() == [len(raws) * HK, len(raws) * HK, 0, len(raws) * HK]


_FLUSH_VARIANTS = {
    # (checkpoint, read copy, baseline: the library defaults, or the read copy encoded
    # by the flush itself): the variants compared with that baseline
    ("fp32", "fp8-e4m3", "defaults"): {
        "dynamic": {"flush_grid": "dynamic"},
        "ring-ahead": {"flush_ring_ahead": True},
        "evict": {"flush_evict": True}},
    ("fp16-sr", "nvfp4", "defaults"): {
        "dynamic": {"flush_grid": "dynamic"},
        "evict": {"flush_evict": True}},
    ("fp32", None, "defaults"): {
        "dynamic-ring-ahead": {"flush_grid": "dynamic", "flush_ring_ahead": True}},
    ("fp32", "nvfp4", "flush-encoder"): {
        "encode-launch": {"read_encode": "launch"},
        "encode-launch-chunks": {"read_encode": "launch", "encode_rows": 16}},
    ("fp32", "mxfp4", "flush-encoder"): {
        "encode-launch": {"read_encode": "launch"}},
    ("fp16-sr", "nvfp4", "flush-encoder"): {
        "encode-launch": {"read_encode": "launch"},
        "encode-launch-chunks": {"read_encode": "launch", "encode_rows": 16}},
}


@pytest.mark.parametrize("ckpt,read,baseline", list(_FLUSH_VARIANTS),
                         ids=["fp8", "fp16sr-nvfp4", "fp32", "nvfp4-encode-launch",
                              "mxfp4-encode-launch", "fp16sr-nvfp4-encode-launch"])
def test_flush_variants_equal_persistent(ckpt: str, read: str | None, baseline: str,
                                         monkeypatch) -> None:
    """Flush programs that claim their units from a counter (``flush_grid="dynamic"``,
    fewer programs than units) and chunk loops that load the ring v rows a chunk ahead
    (``flush_ring_ahead``) or store the copies evicting first from L2
    (``flush_evict``) write the persistent grid's bits and outputs over two
    windows, aligned and staggered rows with a padding row (compiled, the fp32 values
    to 1e-6: the variants' code may contract products differently), as does a read
    copy encoded by a launch of its own (``read_encode="launch"``) against the flush's
    own encoder; the dynamic grid leaves its counter and its count of programs done at
    zero after every flush launch.  Each baseline runs once for all its variants."""
    # the encode launch's programs each take several matrices on the CPU (2 "SMs"), as
    # one tile (32 rows) or in 16-row chunks (an amax pass, then an encode pass)
    monkeypatch.setattr(read_encode, "ENCODE_CTAS_PER_SM", 1)
    B, L = 4, 3
    kind, params, raws = setup(steps=2 * L + 1, batch=B, seed=8)
    idx = torch.tensor([2, 0, -1, 1], dtype=torch.int32, device=DEV)
    base = {"read_encode": "flush"} if baseline == "flush-encoder" else {}

    def run(cfg: dict, stagger: bool) -> list[torch.Tensor]:
        cfg = dict(cfg)
        monkeypatch.setattr(read_encode, "ENCODE_ROWS", cfg.pop("encode_rows", 0))
        cache = GDNReplayCache(B, HK, HV, K, V, window=L, checkpoint=ckpt, read=read,
                               device=DEV, launch="staged", block_v=V, flush_chunk=16,
                               flush_ctas_per_sm=1, concurrent_flush=False, **cfg)
        cache.reset(state0(B))
        if stagger:
            stagger_clocks(cache.counters.tickets, L, cache.programs_per_slot)
        outs = []
        for r in raws:
            out = torch.zeros(B, HV, V, device=DEV)  # the padding row stays zero
            cache.step(*args(r), params.A_log, params.dt_bias, idx, out=out)
            outs.append(out)
            assert cache._flush_work.tolist() == [0, 0]
        return outs + cache.ckpt.tensors() + (cache.read.tensors() if read else [])

    for stagger in (False, True):
        expected = run(base, stagger)
        for name, variant in _FLUSH_VARIANTS[ckpt, read, baseline].items():
            got = run(variant, stagger)
            if DEVICE == "cpu":
                try:
                    assert_runs_same_bits([expected, got])
                except AssertionError as err:
                    raise AssertionError(f"{name}, staggered: {stagger}") from err
                continue
            for a, b in zip(got, expected, strict=True):
                if a.dtype == torch.float32:
                    assert rel(a, b) < 1e-6, (name, stagger)
                else:
                    assert torch.equal(a, b), (name, stagger)


def test_encode_rows_take_whole_matrices_up_to_16_kb() -> None:
    """The encode launch reads a stored matrix of at most 16 KB (rows rounded up to a
    power of two) as one tile, larger ones in 32- or 16-row chunks: the model shapes
    at batch 256 as timed on an H200."""
    assert read_encode.encode_rows(64, 128, 2) == 64  # nemotron-3-super-120b, fp16-sr
    assert read_encode.encode_rows(64, 128, 4) == 32  # its fp32 checkpoint
    assert read_encode.encode_rows(128, 128, 2) == 32  # qwen3.5: 32 KB
    assert read_encode.encode_rows(80, 128, 2) == 16  # nemotron-3-nano-4b: a 128-row tile
    assert read_encode.encode_rows(32, 128, 4) == 32
    assert read_encode.encode_rows(24, 32, 4) == 32  # a small shape: one masked tile


# ---------------------------------------------------------------- GPU only
@pytest.mark.skipif(DEVICE != "cuda", reason="streams and CUDA graphs need a GPU")
@pytest.mark.parametrize("copy", [{}, dict(read="nvfp4", block_v=V, read_encode="launch")],
                         ids=["fp8", "nvfp4-encode-launch"])
@pytest.mark.parametrize("stagger", [True, False], ids=["staggered", "aligned"])
def test_concurrent_flush_equals_sequential_in_a_graph(copy: dict, stagger: bool) -> None:
    """The flush launch on its own stream (``concurrent_flush``), captured in a CUDA
    graph, writes the same bits as the sequential staged step, with rows at different
    ring positions so that flushes and outputs share steps, or all at one (most steps'
    flush launches then find nothing to flush); an nvfp4 copy encoded by a launch of its
    own too: on the flush's stream, behind the flush."""
    B, L = 4, 3
    kind, params, raws = setup(steps=1, batch=B, seed=6)
    idx = torch.arange(B, dtype=torch.int32, device=DEV)
    a = args(raws[0])
    res = {}
    for conc in (False, True):
        cache = _staggered_cache(B, L, launch="staged", concurrent_flush=conc, **copy)
        out = torch.empty(B, HV, V, device=DEV)
        cache.step(*a, params.A_log, params.dt_bias, idx, out=out)  # compile
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            cache.step(*a, params.A_log, params.dt_bias, idx, out=out)
        cache.reset(state0(B))
        if stagger:
            stagger_clocks(cache.counters.tickets, L, cache.programs_per_slot)
        outs = []
        for _ in range(2 * L + 1):
            g.replay()
            outs.append(out.clone())
        res[conc] = (outs, cache.ckpt.codes.clone(), cache.read.codes.clone(),
                     cache.counters.tickets.clone())
    for x, y in zip(res[False][0], res[True][0], strict=True):
        assert torch.equal(x, y)
    for i in (1, 2, 3):
        assert torch.equal(res[False][i], res[True][i])


@pytest.mark.skipif(DEVICE != "cuda", reason="L2 prefetch is compiled code only")
@pytest.mark.parametrize("ck,rd", [("fp32", None), ("fp32", "fp8-e4m3"), ("fp16-sr", "nvfp4")])
def test_flush_prefetch_changes_no_bit(ck, rd) -> None:
    """The staged flush's L2 prefetch (``flush_prefetch``: chunks ahead, including past
    the unit's last chunk) writes the same outputs and copies as none."""
    B, L = 4, 3
    kind, params, raws = setup(steps=2 * L + 1, batch=B, seed=8)
    idx = torch.arange(B, dtype=torch.int32, device=DEV)
    res = []
    for pf in (0, 1, 3):
        cache = GDNReplayCache(B, HK, HV, K, V, window=L, checkpoint=ck, read=rd, device=DEV,
                               seed=2, launch="staged", flush_chunk=16, flush_prefetch=pf)
        cache.reset(state0(B))
        outs = [cache.step(*args(r), params.A_log, params.dt_bias, idx).clone() for r in raws]
        res.append(outs + cache.ckpt.tensors() + (cache.read or cache.ckpt).tensors())
    assert_runs_same_bits(res)


@triton.jit
def _inverse(N_ptr, T_ptr, RP: tl.constexpr, LOG2RP: tl.constexpr, SUBST: tl.constexpr):
    offs = tl.arange(0, RP)
    tile = offs[:, None] * RP + offs[None, :]
    tl.store(T_ptr + tile, inv_unit_lower(tl.load(N_ptr + tile), RP, LOG2RP, SUBST))


@pytest.mark.parametrize("RP", [16, 32, 64])
def test_inverse_of_the_window_system(RP) -> None:
    """Both inverses of the flush's ``I + N`` (repeated squaring, unrolled up to
    ``UNROLLED_RP`` and a loop past it; forward substitution, the one-warp flush's) are
    ``(I + N)^-1`` to fp32 accuracy, for a system like the window's (``|N_ij| <= 1``:
    betas, decays and products of unit vectors)."""
    g = torch.Generator().manual_seed(5)
    N = torch.tril(torch.empty(RP, RP).uniform_(-1, 1, generator=g), diagonal=-1) * 0.5
    ref = torch.linalg.inv(torch.eye(RP, dtype=torch.float64) + N.double())
    for subst in (False, True):
        T = torch.empty(RP, RP, device=DEV)
        _inverse[(1,)](N.to(DEV), T, RP, RP.bit_length() - 1, subst, num_warps=1)
        assert rel(T.cpu(), ref) < 1e-6, subst
        assert torch.equal(torch.triu(T.cpu(), diagonal=1), torch.zeros(RP, RP)), subst


@pytest.mark.parametrize("ck,rd", [("fp32", None), ("fp32", "fp8-e4m3"), ("fp16-sr", "nvfp4")])
def test_flush_tma_changes_no_bit(ck, rd) -> None:
    """The staged flush's checkpoint chunks through a tensor descriptor (``flush_tma``,
    one and two pipeline stages) write the same outputs and copies as plain loads."""
    B, L = 3, 3
    kind, params, raws = setup(steps=2 * L + 1, batch=B, seed=8)
    idx = torch.arange(B, dtype=torch.int32, device=DEV)
    res = []
    for tma, stages in ((False, 1), (True, 1), (True, 2)):
        cache = GDNReplayCache(B, HK, HV, K, V, window=L, checkpoint=ck, read=rd, device=DEV,
                               seed=2, launch="staged", flush_chunk=16, flush_stages=stages,
                               flush_tma=tma, flush_ctas_per_sm=1)
        cache.reset(state0(B))
        outs = [cache.step(*args(r), params.A_log, params.dt_bias, idx).clone() for r in raws]
        res.append(outs + cache.ckpt.tensors() + (cache.read or cache.ckpt).tensors())
    assert_runs_same_bits(res)


@pytest.mark.skipif(DEVICE != "cuda", reason="the hardware fp8 conversion is compiled code")
def test_hw_fp8_encoder_changes_no_bit() -> None:
    """The staged flush's fp8 read copy by the hardware conversion (``hw_fp8``) has the
    bits of the integer-rounding encoder, and the outputs are unchanged."""
    B, L = 3, 3
    kind, params, raws = setup(steps=2 * L + 1, batch=B, seed=9)
    idx = torch.arange(B, dtype=torch.int32, device=DEV)
    res = []
    for hw in (False, True):
        cache = GDNReplayCache(B, HK, HV, K, V, window=L, read="fp8-e4m3", device=DEV, seed=2,
                               launch="staged", hw_fp8=hw)
        cache.reset(state0(B))
        outs = [cache.step(*args(r), params.A_log, params.dt_bias, idx).clone() for r in raws]
        res.append(outs + cache.ckpt.tensors() + cache.read.tensors())
    assert_runs_same_bits(res)


@pytest.mark.parametrize("option", ["out_evict", "prep_keep", "prep_release"])
@pytest.mark.parametrize("read", ["fp8-e4m3", "nvfp4", None])
def test_l2_policies_change_no_bit(option: str, read: str | None) -> None:
    """The staged output launch's tiles streamed with the evict-first L2 policy
    (``out_evict``), the prep launch's rows stored evict-last (``prep_keep``), or put
    back to the normal priority where a row flushes (``prep_release``), give the same
    outputs and stored copies.  The interpreter ignores the policies, so there each
    option runs with one copy (its wiring; compiled, every copy)."""
    one = {"out_evict": None, "prep_keep": "fp8-e4m3", "prep_release": "fp8-e4m3"}
    if DEVICE == "cpu" and read != one[option]:
        pytest.skip("one copy per option under the interpreter")
    B, L = 3, 3
    kind, params, raws = setup(steps=2 * L + 1, batch=B, seed=4)
    idx = torch.arange(B, dtype=torch.int32, device=DEV)
    res = []
    for on in (False, True):
        cache = GDNReplayCache(B, HK, HV, K, V, window=L, read=read, device=DEV, seed=3,
                               checkpoint="fp16-sr" if read == "nvfp4" else "fp32",
                               launch="staged", batch_hint=256, **{option: on})
        assert getattr(cache, option) is on
        cache.reset(state0(B))
        outs = [cache.step(*args(r), params.A_log, params.dt_bias, idx).clone() for r in raws]
        copies = cache.read.tensors() if read is not None else []
        res.append(outs + cache.ckpt.tensors() + copies)
    assert_runs_same_bits(res)


@pytest.mark.parametrize("option", ["out_evict", "prep_keep", "prep_release"])
def test_l2_policies_reject_other_launches(option: str) -> None:
    with pytest.raises(ValueError, match=f"{option} needs the staged launch"):
        GDNReplayCache(1, HK, HV, K, V, window=2, device=DEV, launch="fused", **{option: True})


@pytest.mark.parametrize("kw", [dict(checkpoint="nvfp4"), dict(launch="fused")])
def test_flush_tma_rejects_what_it_cannot_load(kw) -> None:
    with pytest.raises(ValueError, match="flush_tma needs the staged launch"):
        GDNReplayCache(1, HK, HV, K, V, window=2, device=DEV, flush_tma=True, **kw)


@pytest.mark.parametrize("kw", [dict(read="nvfp4", checkpoint="fp8-e4m3", launch="staged"),
                                dict(read="fp8-e4m3", launch="staged"),
                                dict(read="nvfp4", launch="fused"),
                                dict(read="nvfp4", launch="staged", drafts=2)])
def test_read_encode_launch_rejects_what_it_cannot_encode(kw) -> None:
    """A read copy encoded by a launch of its own: a dense checkpoint, a 4-bit copy, the
    staged launch's step flushes only."""
    with pytest.raises(ValueError, match="read_encode='launch' needs the staged launch"):
        GDNReplayCache(1, HK, HV, K, V, window=2, device=DEV, read_encode="launch", **kw)
    with pytest.raises(ValueError, match="read_encode must be one of"):
        GDNReplayCache(1, HK, HV, K, V, window=2, device=DEV, read_encode="later")


@pytest.mark.parametrize("kw", [dict(read="mxfp4", checkpoint="fp16-sr"),
                                dict(read="fp8-e4m3", launch="split")])
def test_out_mma_rejects_what_it_cannot_read(kw) -> None:
    with pytest.raises(ValueError, match="out_mma needs the staged launch"):
        GDNReplayCache(1, HK, HV, K, V, window=2, device=DEV, out_mma=True, **kw)


def test_read_encode_launch_is_the_staged_dense_4bit_default() -> None:
    """Large batches with a dense checkpoint encode an nvfp4 or mxfp4 read copy in a
    launch of their own, and the flush launch then takes the settings of a flush without
    a read copy; fp8 copies, small batches, speculative caches and a launch the user
    picks keep the flush's own encoder."""
    big = dict(window=4, device=DEV, batch_hint=256)
    for ck in ("fp32", "fp16-sr", "bf16-sr"):
        plain = GDNReplayCache(1, 16, 32, 128, 128, checkpoint=ck, **big).config
        for read in ("nvfp4", "mxfp4"):
            c = GDNReplayCache(1, 16, 32, 128, 128, checkpoint=ck, read=read, **big)
            assert c.read_encode == "launch"
            for key in ("num_warps", "maxnreg", "flush_ctas_per_sm", "flush_stages",
                        "flush_licm", "flush_grid", "flush_prefetch", "flush_ring_ahead"):
                assert c.config[key] == plain[key], (ck, read, key)
    for kw in (dict(checkpoint="fp8-e4m3", read="nvfp4", **big),
               dict(read="fp8-e4m3", **big), dict(read="nvfp4", window=4, device=DEV),
               dict(read="nvfp4", drafts=2, **big), dict(read="nvfp4", launch="split", **big)):
        assert GDNReplayCache(1, 16, 32, 128, 128, **kw).read_encode == "flush", kw


def test_out_mma_is_the_staged_fp8_default() -> None:
    """Large batches read an fp8 (or nvfp4) copy by tensor-core products in programs
    of two 128-row tiles; a launch the user picks keeps the CUDA-core row sums."""
    c = GDNReplayCache(1, 16, 32, 128, 128, window=4, read="fp8-e4m3", device=DEV,
                       batch_hint=256)
    assert c.out_mma and (c.out_BV, c.out_num_warps, c.out_TPP, c.out_stages) == (128, 2, 2, 2)
    assert not GDNReplayCache(1, 16, 32, 128, 128, window=4, read="fp8-e4m3", device=DEV,
                              batch_hint=256, launch="split").out_mma
    assert not GDNReplayCache(1, 16, 32, 128, 128, window=4, device=DEV, batch_hint=256).out_mma
    # one v-head per k-head: a group has one 128-row tile, so one tile per program
    assert GDNReplayCache(1, 16, 16, 128, 128, window=4, read="fp8-e4m3", device=DEV,
                          batch_hint=256).out_TPP == 1
    # nvfp4 copies: up to four tiles per program, at most a k-head group's
    for v_heads, tpp in ((32, 2), (64, 4)):
        c = GDNReplayCache(1, 16, v_heads, 128, 128, window=4, checkpoint="fp16-sr",
                           read="nvfp4", device=DEV, batch_hint=256)
        assert c.out_mma and (c.out_BV, c.out_TPP, c.out_stages) == (128, tpp, 2)


@pytest.mark.parametrize("read", ["nvfp4", None], ids=["split", "shared"])
def test_part_matrix_nvfp4_flush_at_full_matrix_size(read) -> None:
    """128 x 128 matrices flushed by eight 16-row programs each (the small-batch default
    at the models' shape): after every flush -- the second one too, so the posting words
    were cleared -- the stored copies are formats' encoding of the kernel's fp32 state,
    and the outputs agree with whole-matrix programs."""
    D, hv, ckpt = 128, 2, ("fp16-sr" if read else "nvfp4")
    live = torch.tensor([1, 0], device=DEV)
    idx = live.to(torch.int32)

    def make(bv: int) -> GDNReplayCache:
        c = GDNReplayCache(2, 1, hv, D, D, window=2, checkpoint=ckpt, read=read, seed=4,
                           device=DEV, keep_fresh=True, launch="fused", block_v=bv)
        c.reset(0.5 * torch.randn(2, hv, D, D, generator=torch.Generator().manual_seed(2)
                                  ).to(DEV), slots=live)
        return c

    parts, whole = make(16), make(D)
    g = torch.Generator().manual_seed(5)
    A_log, dt_bias = torch.zeros(hv, device=DEV), torch.zeros(hv, device=DEV)
    for t in range(5):  # flushes at steps 1 and 3
        q, k = (torch.randn(2, 1, D, generator=g).to(DEV) for _ in range(2))
        v = torch.randn(2, hv, D, generator=g).to(DEV)
        a, b = (torch.randn(2, hv, generator=g).to(DEV) for _ in range(2))
        o = parts.step(q, k, v, a, b, A_log, dt_bias, idx)
        assert rel(o, whole.step(q, k, v, a, b, A_log, dt_bias, idx)) < TOL, t
        if t % 2 == 1:
            assert_bits(parts.ckpt, parts.fresh, 4, t, live)
            if read is not None:
                assert_read_bits(parts.read, parts.ckpt.fmt, parts.fresh, 4, t, live)


def test_fused_launch_nvfp4_rows_by_grid() -> None:
    """Small batches with an nvfp4 copy: 16-row programs (the last of a head's to post
    its amax encodes the copy) on grids of at most 512 of them, whole-matrix programs
    above; a speculative cache's commit flushes whole-matrix units, so it keeps them."""
    def bv(batch, v_heads, **kw):
        return GDNReplayCache(batch, 16, v_heads, 128, 128, window=4, checkpoint="fp16-sr",
                              read="nvfp4", device=DEV, **kw).BV
    assert (bv(1, 32), bv(1, 64), bv(2, 32)) == (16, 16, 16)
    assert (bv(3, 32), bv(2, 64), bv(1, 32, block_v=128)) == (128, 128, 128)
    assert (bv(1, 32, drafts=4), bv(1, 32, launch="staged")) == (128, 128)
    for kw in (dict(drafts=4), dict(launch="split")):
        with pytest.raises(ValueError, match="needs block_v == V"):
            bv(1, 32, block_v=16, **kw)


@pytest.mark.parametrize("batch,v_heads,ckpt,read,warps", [
    (1, 32, "fp32", None, 8), (1, 64, "fp32", None, 2), (4, 32, "fp32", None, 2),
    (12, 64, "fp32", None, 2), (1, 32, "fp32", "fp8-e4m3", 4), (1, 64, "fp32", "fp8-e4m3", 1),
    (12, 64, "fp32", "fp8-e4m3", 1), (1, 64, "fp16-sr", "fp8-e4m3", 4),
    (1, 64, "fp16-sr", "nvfp4", 4)])
def test_fused_launch_warps_by_grid(batch, v_heads, ckpt, read, warps) -> None:
    """Small batches (one fused launch), warps per program by grid size: fp32 tiles 2
    warps once the grid passes 384 programs (more of them resident per SM), 8 below;
    an fp8 copy of an fp32 checkpoint 1 warp past 384 programs, 4 below; others 4.  A
    user's ``num_warps`` wins."""
    c = GDNReplayCache(batch, 16, v_heads, 128, 128, window=4, checkpoint=ckpt, read=read,
                       device=DEV)
    assert (c.launch, c.num_warps) == ("fused", warps)
    assert GDNReplayCache(batch, 16, v_heads, 128, 128, window=4, checkpoint=ckpt, read=read,
                          device=DEV, num_warps=2).num_warps == 2


@pytest.mark.parametrize("ckpt,read,v_heads,warps,tma,grid,encode", [
    ("fp32", None, 64, 1, True, "persistent", None),
    ("fp32", "fp8-e4m3", 64, 1, True, "dynamic", None),
    ("fp16-sr", "nvfp4", 32, 1, True, "dynamic", None),
    ("fp16-sr", "nvfp4", 64, 1, True, "dynamic", None),
    ("fp16", "nvfp4", 32, 1, True, "persistent", None),
    ("nvfp4", None, 32, 4, False, "persistent", None),
    ("bf16-sr", "mxfp4", 32, 1, True, "dynamic", None),
    ("bf16-sr", "mxfp4", 32, 4, True, "dynamic", "flush")])
def test_staged_flush_programs_by_copy(ckpt, read, v_heads, warps, tma, grid, encode) -> None:
    """Large batches (256): one-warp flush programs with TMA chunk loads for a dense
    checkpoint with no copy in the flush, or an fp8 one (qwen3.5-4b's 32 v-heads and
    qwen3.5-122b's 64; a dense checkpoint's 4-bit copy is encoded by a launch of its
    own); an nvfp4 checkpoint keeps 4-warp programs with plain loads, an mxfp4 copy
    written by the flush 4-warp ones.  Programs claim their units from a counter where
    the flush writes a read copy or a stochastically rounded 16-bit checkpoint; their
    stores evict first from L2 where the flush writes an fp8 copy."""
    c = GDNReplayCache(1, 16, v_heads, 128, 128, window=4, checkpoint=ckpt, read=read,
                       device=DEV, batch_hint=256, read_encode=encode)
    assert (c.launch, c.num_warps, c.flush_tma, c.flush_grid) == ("staged", warps, tma, grid)
    assert c.flush_evict == (read == "fp8-e4m3")  # evict-first stores beside an fp8 copy


def test_flush_prefetch_rejects_negative() -> None:
    with pytest.raises(ValueError, match="flush_prefetch must be"):
        GDNReplayCache(1, HK, HV, K, V, window=2, device=DEV, flush_prefetch=-1)


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graphs need a GPU")
def test_cuda_graph_replay_walks_the_window() -> None:
    kind, params, raws = setup(steps=1, batch=2, seed=4)
    idx = torch.tensor([0, 1], dtype=torch.int32, device=DEV)
    S0 = state0(2)
    eager = GDNReplayCache(2, HK, HV, K, V, window=3, checkpoint="fp16-sr", read="nvfp4",
                           device=DEV, seed=2)
    graphed = GDNReplayCache(2, HK, HV, K, V, window=3, checkpoint="fp16-sr", read="nvfp4",
                             device=DEV, seed=2)
    a = args(raws[0])
    out = torch.empty(2, HV, V, device=DEV)
    graphed.reset(S0)
    graphed.step(*a, params.A_log, params.dt_bias, idx, out=out)  # compile
    graphed.reset(S0)
    eager.reset(S0)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        graphed.step(*a, params.A_log, params.dt_bias, idx, out=out)
    graphed.reset(S0)
    for _ in range(7):
        g.replay()
        ref = eager.step(*a, params.A_log, params.dt_bias, idx)
        assert torch.equal(out, ref)
    assert graphed.ring_len.tolist() == eager.ring_len.tolist() == [1, 1]
    assert torch.equal(graphed.ckpt.codes, eager.ckpt.codes)


def test_store_helpers_roundtrip() -> None:
    st = empty_store("fp8-e4m3", (3, HV, V, K), DEV)
    S = state0(2)
    store_into(st, S, seed=0, step=0, slots=torch.tensor([2, 0], device=DEV))
    ref = StateStore.encode(S, "fp8-e4m3").decode()
    assert torch.equal(st.decode()[[2, 0]], ref)
    assert torch.equal(st.decode()[1], torch.zeros_like(ref[0]))

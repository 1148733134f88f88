"""The tensor-core state product of nvfp4 read copies (kernels/mamba2_mma.py, the split
step's ``SplitConfig.state_mma``): against a float64 product and against the CUDA-core
row dots on the GPU; its offline sm_90 compile and its settings on the CPU."""

from __future__ import annotations

from precisionlab.kernels.testing import compiling_env, kernel_device, ptxas_available

DEVICE = kernel_device()  # before the kernel modules are imported

import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from precisionlab.kernels.mamba2_step import (  # noqa: E402
    HeadParams,
    Mamba2Cache,
    SplitConfig,
    _split_defaults,
    mamba2_step,
    state_mma_block,
)
from precisionlab.kernels.state import StateStore  # noqa: E402
from precisionlab.kernels.tl_formats import format_id  # noqa: E402
from precisionlab.kinds import kind_for  # noqa: E402
from precisionlab.presets import Preset  # noqa: E402
from precisionlab.traces import SyntheticTrace  # noqa: E402

GPU = pytest.mark.skipif(DEVICE != "cuda", reason="the tensor-core product runs compiled only")
NV = format_id("nvfp4")


@GPU
@pytest.mark.parametrize("H,G,P", [(16, 2, 80), (6, 2, 48)], ids=["whole-tiles", "masked"])
@pytest.mark.parametrize("cscale", [1.0, 1e3, 1e-4])
def test_state_dots_match_a_float64_product(H: int, G: int, P: int, cscale: float) -> None:
    """Every outputting row's product is within 1e-5 of ``sum |S c|`` of the float64
    product of the decoded copy (matrix scale included), for ``c`` of any magnitude;
    padding rows and rows at ring position L - 1 are left alone."""
    from precisionlab.kernels.mamba2_mma import launch_state_dots, state_dots_reference

    slots, L = 6, 5
    gen = torch.Generator().manual_seed(11)
    S = torch.randn(slots, H, P, 128, generator=gen) * torch.rand(slots, H, P, 1,
                                                                  generator=gen) * 3
    store = StateStore.encode(S.cuda(), "nvfp4")
    idx = torch.tensor([3, -1, 0, 5, 2], dtype=torch.int32, device="cuda")
    pos = torch.tensor([0, 4, L - 1, 2, 1], dtype=torch.int32, device="cuda")
    C = (torch.randn(5, G, 128, generator=gen) * cscale).cuda()
    dots = torch.full((5 * H * P,), float("nan"), device="cuda")
    launch_state_dots(store.codes, store.s1, store.s2, idx, pos, C, dots, L)
    got = dots.view(5, H, P).double()
    vals = store.decode()
    ref = state_dots_reference(vals, idx, C)
    bound = state_dots_reference(vals.abs(), idx, C.abs())
    live = torch.tensor([True, False, False, True, True], device="cuda")
    assert torch.isnan(got[~live]).all()
    err = ((got - ref).abs() / bound.clamp_min(1e-30))[live]
    assert err.max().item() <= 1e-5


MMA_PRESETS = [Preset("mma-even", "mamba2", 8, 48, 128, 2, 1, "4 heads of 48 rows per group"),
               Preset("mma-masked", "mamba2", 4, 40, 128, 2, 1, "2 heads of 40 rows per group")]


@GPU
@pytest.mark.parametrize("preset", MMA_PRESETS, ids=lambda p: p.name)
@pytest.mark.parametrize("ck", ["fp16-sr", "fp32"])
def test_split_step_with_state_mma_matches_cuda_core_dots(preset: Preset, ck: str) -> None:
    """Two windows and a flush of a split design with an nvfp4 read copy, padding row
    included: the outputs with the tensor-core product are within 1e-5 (norm-wise, per
    step) of the CUDA-core row dots', and the stored copies are the same bits (the
    product writes no state)."""
    batch, L = 5, 4
    trace = SyntheticTrace(preset, steps=2 * L + 1, batch=batch, seed=4)
    params = kind_for(preset).params({k: v.float().cuda() for k, v in trace.params.items()})
    head = HeadParams(params.A, params.D, params.dt_bias)
    raws = [{k: v.cuda() for k, v in raw.items()} for raw in trace]
    gen = torch.Generator().manual_seed(5)
    S0 = torch.randn(batch, preset.heads, preset.head_dim, 128, generator=gen).cuda()
    idx = torch.tensor([0, 1, -1, 3, 4], dtype=torch.int32, device="cuda")
    runs = []
    for mma in (False, True):
        cache = Mamba2Cache.allocate(batch, preset.heads, preset.head_dim, 128, preset.groups,
                                     checkpoint_format=ck, read_format="nvfp4", window=L,
                                     device="cuda", seed=3, launch="split",
                                     split_config=SplitConfig(state_mma=mma))
        cache.load_state(S0)
        ys = [mamba2_step(cache, r["x"], r["dt_raw"], r["B"], r["C"], head, z=r["z"],
                          state_indices=idx, dt_softplus=True).clone() for r in raws]
        runs.append((ys, cache.ckpt.tensors() + cache.read.tensors()))
    (y0, st0), (y1, st1) = runs
    for a, b in zip(y1, y0, strict=True):
        assert ((a - b).norm() / b.norm()).item() <= 1e-5
        assert torch.equal(a[2], torch.zeros_like(a[2]))  # the padding row
    for a, b in zip(st1, st0, strict=True):
        assert torch.equal(a.view(torch.int32) if a.dtype == torch.float32 else a,
                           b.view(torch.int32) if b.dtype == torch.float32 else b)


COMPILE = """
import re, subprocess, sys
from pathlib import Path
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from precisionlab.kernels import mamba2_mma as M
assert sorted(M.column_of(k) for k in range(128)) == list(range(128))
sig = {"rd_w": "*i32", "rd_s1": "*u8", "rd_s2": "*fp32", "state_idx": "*i32", "pos": "*i32",
       "C_ptr": "*bf16", "dots": "*fp32", "s_Cb": "i32", "H": "i32", "G": "i32", "L": "i32",
       "P": "constexpr", "HPG": "constexpr", "NUM_WARPS": "constexpr"}
attrs = {(i,): [["tt.divisibility", 16]] for i in range(7)}
src = GluonASTSource(M._state_dots_kernel, sig, {"P": 80, "HPG": 12, "NUM_WARPS": 4}, attrs)
k = triton.compile(src, target=GPUTarget("cuda", 90, 64), options={"num_warps": 4})
tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
Path("k.cubin").write_bytes(k.asm["cubin"])
sass = subprocess.run([str(tool), "-sass", "k.cubin"], capture_output=True, text=True).stdout
res = subprocess.run([str(tool), "-res-usage", "k.cubin"], capture_output=True, text=True).stdout
print("HMMA", len(re.findall(r"HMMA", sass)), re.search(r"SHARED:\\d+", res).group(0))
"""


@pytest.mark.skipif(not ptxas_available(), reason="needs Triton's ptxas")
def test_state_dots_kernel_compiles_with_its_operand_in_registers(tmp_path) -> None:
    """Offline sm_90 compile (no GPU): the decoded tile reaches the tensor cores without
    a layout conversion (``assert_trivial``; no shared memory), and the operand's rows
    name every state column once."""
    env = compiling_env()
    r = subprocess.run([sys.executable, "-c", COMPILE], capture_output=True, text=True,
                       cwd=tmp_path, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    hmma, shared = r.stdout.split()[1:]
    assert int(hmma) >= 8 and shared == "SHARED:0"


def test_state_mma_settings() -> None:
    """On where it can run (one head's tiles at a time, no words, pairs or prefetch), off
    where it cannot, refused in one line where asked for and impossible."""
    on = _split_defaults(SplitConfig(), 80, 128, 96, 8, NV, False, True, None, None)
    assert on.state_mma and on.out_kernel == "heads"
    assert not (on.out_pairs or on.out_pair_loop or on.out_words or on.out_prefetch)
    off = _split_defaults(SplitConfig(), 80, 128, 96, 8, NV, False, True, None, "why not")
    assert not off.state_mma and off.out_pairs
    with pytest.raises(ValueError, match="state_mma: why not"):
        _split_defaults(SplitConfig(state_mma=True), 80, 128, 96, 8, NV, False, True, None,
                        "why not")
    with pytest.raises(ValueError, match="no out_pairs"):
        _split_defaults(SplitConfig(state_mma=True, out_pairs=True), 80, 128, 96, 8, NV,
                        False, True, None, None)
    with pytest.raises(ValueError, match="'heads' output launch and its weights"):
        _split_defaults(SplitConfig(state_mma=True, out_kernel="tiles"), 80, 128, 96, 8, NV,
                        False, True, None, None)
    with pytest.raises(ValueError, match="state_mma must be"):
        _split_defaults(SplitConfig(state_mma="yes"), 80, 128, 96, 8, NV, False)


def test_state_mma_block_names_what_is_missing() -> None:
    cpu = torch.device("cpu")
    assert "not fp8-e4m3" in state_mma_block("fp8-e4m3", 128, cpu)
    assert "dstate 128, got 64" in state_mma_block("nvfp4", 64, cpu)
    assert "compiled on an NVIDIA GPU" in state_mma_block("nvfp4", 128, cpu)
    if DEVICE == "cuda":
        assert state_mma_block("nvfp4", 128, torch.device("cuda")) is None

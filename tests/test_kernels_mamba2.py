"""Fused Mamba-2 kernels against their torch references (layers/mamba2.py, the
torch design runner, the torch speculative decoder), and the bits they write
against precisionlab.formats.

Runs compiled on a GPU, else in the Triton interpreter on the CPU (small shapes).
"""

from __future__ import annotations

from precisionlab.kernels.testing import assert_runs_same_bits, kernel_device

DEVICE = kernel_device()  # before the kernel modules are imported

import pytest  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from precisionlab import formats  # noqa: E402
from precisionlab.designs import TorchDesignRunner, shared, split  # noqa: E402
from precisionlab.kernels import read_encode  # noqa: E402
from precisionlab.kernels.mamba2_backend import TritonMamba2Design  # noqa: E402
from precisionlab.kernels.mamba2_spec import mamba2_commit, mamba2_verify  # noqa: E402
from precisionlab.kernels.mamba2_step import (  # noqa: E402
    HeadParams,
    Mamba2Cache,
    SplitConfig,
    _read_encode_apart,
    _split_defaults,
    fused_warps,
    mamba2_conventional_step,
    mamba2_step,
)
from precisionlab.kernels.state import StateStore  # noqa: E402
from precisionlab.kernels.tl_formats import (  # noqa: E402  # noqa: E402
    K_NVFP4,
    e2m1_code,
    e2m1_code_fast,
    format_id,
    nvfp4_encode_fast,
    store_codes,
    tile_offsets,
)
from precisionlab.kinds import kind_for  # noqa: E402
from precisionlab.layers import mamba2  # noqa: E402
from precisionlab.presets import Preset  # noqa: E402
from precisionlab.speculative import SpeculativeDecoder  # noqa: E402
from precisionlab.timing import stagger_clocks  # noqa: E402
from precisionlab.traces import SyntheticTrace  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy, interpreter only

# headdim 24: two 16-row blocks with masking, or one padded 32-row tile for nvfp4
PRESET = Preset("kernel-test", "mamba2", 4, 24, 32, 2, 1, "test shape")
H, P, N, G = 4, 24, 32, 2
DEV = torch.device(DEVICE)
TOL = 1e-5


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def setup(steps: int, batch: int, seed: int = 0, dynamics: str = "init"):
    trace = SyntheticTrace(PRESET, steps=steps, batch=batch, seed=seed, dynamics=dynamics)
    kind = kind_for(PRESET)
    params = kind.params({k: v.float().to(DEV) for k, v in trace.params.items()})
    raws = [{k: v.to(DEV) for k, v in raw.items()} for raw in trace]
    return kind, params, raws


def state0(batch: int, seed: int = 7) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, H, P, N, generator=g).to(DEV)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32) if t.dtype == torch.float32 else t


def assert_store_bits(store: StateStore, S: torch.Tensor, seed: int, step: int) -> None:
    """The kernel-written store equals formats' encoding of the kernel's own fp32 state."""
    ref = StateStore.encode(S, store.fmt, seed=seed, step=step)
    for a, b in zip(store.tensors(), ref.tensors(), strict=True):
        assert torch.equal(bits(a), bits(b)), f"{store.fmt} bits differ from formats.encode"


def assert_read_bits(read: StateStore, checkpoint: str, S: torch.Tensor, seed: int,
                     step: int) -> None:
    """A split's stored read copy equals formats' encoding (seed + 1) of the values the
    checkpoint (seed) stores for the kernel's fp32 state."""
    stored = StateStore.encode(S, checkpoint, seed=seed, step=step).decode()
    assert_store_bits(read, stored, seed + 1, step)


# --------------------------------------------------------------- conventional


def test_conventional_fp32_matches_layer_with_slots_and_padding() -> None:
    kind, params, raws = setup(steps=3, batch=4)
    slots = 6
    idx = torch.tensor([3, -1, 0, 5], dtype=torch.int32, device=DEV)
    S_all = state0(slots)
    store = StateStore.encode(S_all, "fp32")
    head = HeadParams(params.A, params.D, params.dt_bias)
    S_ref = S_all.clone()
    rows = idx[idx >= 0].long()
    for raw in raws:
        y = mamba2_conventional_step(store, raw["x"], raw["dt_raw"], raw["B"], raw["C"], head,
                                     z=raw["z"], state_indices=idx, dt_softplus=True)
        keep = idx >= 0
        inp = mamba2.Mamba2Inputs(raw["x"][keep], mamba2.softplus_dt(raw["dt_raw"][keep],
                                  params.dt_bias), raw["B"][keep], raw["C"][keep], raw["z"][keep])
        S_new, y_ref = mamba2.conventional_step(S_ref[rows], inp, params)
        S_ref[rows] = S_new
        assert rel(y[keep], y_ref) < TOL
        assert torch.all(y[~keep] == 0)
    assert rel(store.decode(), S_ref) < TOL
    untouched = torch.tensor([1, 2, 4], device=DEV)
    assert torch.equal(store.decode()[untouched], S_all[untouched])


@pytest.mark.parametrize("fmt", ["bf16-sr", "fp16-sr", "bf16", "fp16"])
def test_conventional_16bit_write_back_bits(fmt: str) -> None:
    """With dt = 0 the update is exactly S, so the written bits must equal
    formats.encode(S, seed, step) bit for bit; the step counter advances."""
    kind, params, raws = setup(steps=2, batch=3)
    S = state0(3)
    store = StateStore.encode(S, "fp32")  # start from exact fp32 values
    store16 = StateStore.empty(fmt, tuple(S.shape), DEV)
    store16.codes.copy_(store.codes.to(torch.bfloat16 if "bf16" in fmt else torch.float16)
                        .view(torch.int16))
    S16 = store16.decode()
    steps = torch.tensor([0, 5, 2], dtype=torch.int32, device=DEV)
    head = HeadParams(params.A, params.D)
    raw = raws[0]
    zero_dt = torch.zeros_like(raw["dt_raw"])
    mamba2_conventional_step(store16, raw["x"], zero_dt, raw["B"], raw["C"], head,
                             steps=steps, seed=11)
    for b, t in enumerate([0, 5, 2]):
        ref = formats.get(fmt).encode(S16[b:b + 1], seed=11, step=t).codes
        if fmt.endswith("-sr"):  # the index is over the whole tensor: encode it all
            ref = formats.get(fmt).encode(S16, seed=11, step=t).codes[b:b + 1]
        assert torch.equal(store16.codes[b:b + 1], ref)
    if fmt.endswith("-sr"):
        assert steps.tolist() == [1, 6, 3]
    # a real update stays within one ulp of the fp32 result
    before = store16.decode()
    inp = kind.prepare(raw, params, torch.float32)
    mamba2_conventional_step(store16, inp.x, inp.dt, inp.B, inp.C, head, steps=steps, seed=11)
    S_ref, _ = mamba2.conventional_step(before, inp, params)
    ulp = 2.0 ** -7 if "bf16" in fmt else 2.0 ** -10
    assert torch.all((store16.decode() - S_ref).abs() <= ulp * S_ref.abs() * 1.01 + 1e-30)


# --------------------------------------------------------------- replay designs

DESIGNS = [
    (shared("fp32", 4), torch.bfloat16),
    (split("fp32", "fp8-e4m3", 4), torch.bfloat16),
    (split("fp16-sr", "nvfp4", 4), torch.bfloat16),
    (split("bf16-sr", "mxfp4", 3), torch.float16),
    (shared("bf16-sr", 1), torch.float32),
    (shared("fp8-e4m3", 3), torch.bfloat16),
    (shared("nvfp4", 2), torch.float32),  # the matrix scale of a checkpoint folded in chunks
]


DESIGNS_SPLIT = [
    (shared("fp32", 4), torch.bfloat16),
    (split("fp32", "fp8-e4m3", 4), torch.bfloat16),
    (split("fp16-sr", "nvfp4", 4), torch.bfloat16),
    (split("bf16-sr", "mxfp4", 3), torch.float16),
    (shared("nvfp4", 2), torch.float32),
    (shared("bf16-sr", 1), torch.float32),
]
# flush encoders: the default "fast" nvfp4 in one pass (a 32-row chunk holds the
# 24-row head; the split cases above run it in two passes of 16-row chunks) and the
# reference encoders of tl_formats ("ref")
FAST_ENC = {"split-refenc": SplitConfig(flush_encoder="ref"),
            "split-fastenc-1pass": SplitConfig(flush_encoder="fast", flush_rows=32),
            # the nvfp4 copy encoded after a second fold instead of from the scratch of the
            # first fold's fp32 rows (the default)
            "split-recompute": SplitConfig(flush_pass="recompute"),
            "split-recompute-refenc": SplitConfig(flush_pass="recompute",
                                                  flush_encoder="ref")}
# "heads" output programs that load a 4-bit copy's codes as int32 words (the default)
# or as bytes
WORD_CFG = {"split-words": SplitConfig(out_words=True),
            "split-bytes": SplitConfig(out_words=False),
            "split-words-loads-first": SplitConfig(out_words=True, out_loads_first=True,
                                                   block_p=16, tail_tile=True),
            # two heads' 24 rows as three 16-row tiles: one of each head, one shared
            "split-pairs": SplitConfig(out_pairs=True, block_p=16),
            # two heads per program, each head's two tiles loaded first
            "split-words-2heads-loads-first": SplitConfig(
                out_words=True, heads_per_program=2, out_loads_first=True, block_p=16,
                tail_tile=False),
            "split-pairs-bytes": SplitConfig(out_pairs=True, block_p=16, out_words=False),
            # the pairs' tiles loaded one tile ahead of the tile being finished
            "split-pairs-ahead": SplitConfig(out_pairs=True, out_ahead=1, block_p=16),
            "split-pairs-ahead2": SplitConfig(out_pairs=True, out_ahead=2, block_p=16),
            "split-pairs-ahead0": SplitConfig(out_pairs=True, out_ahead=0, block_p=16),
            "split-pairs-ahead-bytes": SplitConfig(out_pairs=True, out_ahead=1,
                                                   block_p=16, out_words=False)}
SPLIT_CFG = {**FAST_ENC, **WORD_CFG}
CASES = ([(d, r, "fused") for d, r in DESIGNS] + [(d, r, "split") for d, r in DESIGNS_SPLIT]
         + [(d, r, v) for v in FAST_ENC for d, r in DESIGNS_SPLIT
            if "nvfp4" in (d.checkpoint_format, d.read_format)]
         + [(d, r, v) for v in WORD_CFG for d, r in DESIGNS_SPLIT
            if (d.read_format or d.checkpoint_format) in ("nvfp4", "mxfp4")]
         # the one-launch kernel with a program per (head, 16-row tile): small batches
         # (nvfp4: the last of a head's programs to post its amax encodes the copy);
         # a flush chunk larger than the program's rows is cut to them
         + [(d, r, "fused-rows") for d, r in DESIGNS]
         + [(d, r, "fused-rows-fb32") for d, r in DESIGNS
            if "nvfp4" in (d.checkpoint_format, d.read_format)]
         # a 16-bit checkpoint and an fp8 copy written by one flush: the checkpoint's
         # rounding drawn once for both copies
         + [(split("bf16-sr", "fp8-e4m3", 3), torch.bfloat16, lc) for lc in ("split", "fused")]
         # a bf16 checkpoint beside an nvfp4 copy in row programs: its rounding drawn once
         # for its store, the amax and the scratch the copy encodes
         + [(split("bf16-sr", "nvfp4", 3), torch.bfloat16, "fused-rows")])


@pytest.mark.parametrize("design,ring_dtype,launch", CASES,
                         ids=[f"{d.label}-{lc}" for d, _, lc in CASES])
def test_design_runner_matches_torch(design, ring_dtype, launch) -> None:
    """Each step within 1e-5 of the torch runner fed the kernel's own stored copies
    (the step's arithmetic); the stored bits equal formats.encode of the kernel's
    fresh fp32 state; and end to end within 1e-5 of an independent torch runner
    for fp32 copies (lossy copies: a code can flip on a last-bit difference)."""
    batch, seed = 3, 5
    kind, params, raws = setup(steps=2 * design.window + 1, batch=batch)
    S0 = state0(batch)
    ref = TorchDesignRunner(design, kind, params, batch, DEV, ring_dtype, seed, S0)
    mirror = TorchDesignRunner(design, kind, params, batch, DEV, ring_dtype, seed, S0)
    ours = TritonMamba2Design(design, kind, params, batch, DEV, ring_dtype, seed, S0,
                              launch="split" if launch in SPLIT_CFG else launch.split("-")[0],
                              rows_per_program=16 if "rows" in launch else 0)
    cache = ours.cache
    if launch in SPLIT_CFG:
        cache.split_config = SPLIT_CFG[launch]
    if launch == "fused-rows-fb32":
        cache.split_config = SplitConfig(flush_rows=32)
    lossless = design.read_format == design.checkpoint_format == "fp32"
    for t, raw in enumerate(raws):
        inp = kind.prepare(raw, params, ring_dtype)
        mirror.ckpt, mirror.read = cache.ckpt.decode(), cache.reader.decode()
        y_mir, S_mir = mirror.step(inp, t)
        y_ref, S_ref = ref.step(inp, t)
        y, S = ours.step(inp, t)
        assert rel(y, y_mir) < TOL, f"step {t}"
        assert rel(y, y_ref) < (TOL if lossless else 1e-3), f"step {t}"
        assert (S is None) == (S_ref is None)
        if S is None:
            continue
        assert rel(S, S_mir) < TOL
        if design.checkpoint_format == "fp32":
            assert torch.equal(cache.ckpt.codes, S)
        else:
            assert_store_bits(cache.ckpt, S, seed, t)
        if cache.read is not None:
            assert_read_bits(cache.read, cache.ckpt.fmt, S, seed, t)
    assert cache.committed().tolist() == [len(raws) % design.window] * batch
    assert cache.steps_taken().tolist() == [len(raws)] * batch


SPLIT_CONFIGS = {
    "fused": ("fused", None),
    # one-launch kernel, a program per (head, 16-row tile)
    "fused-rows": ("fused", None),
    "split": ("split", None),
    # output: one tile per program; flush: 16-row units (a head in two), one-stage loops
    "split-1tile": ("split", SplitConfig(out_kernel="tiles", tiles_per_program=1, stages=1,
                                         flush_chunks=1, num_warps=4)),
    # output: a whole B/C group per program (tiles loop); pipelined flush chunks
    "split-group": ("split", SplitConfig(out_kernel="tiles", tiles_per_program=4, stages=3,
                                         block_p=16, flush_stages=2, flush_ctas_per_sm=1)),
    # output: the one-launch kernel's output path, two heads per program
    "split-outgroup": ("split", SplitConfig(out_kernel="group", heads_per_program=2,
                                            block_p=16, num_warps=4)),
    # output: one head per program, 2 warps, 16-row tiles
    "split-heads": ("split", SplitConfig(heads_per_program=1, block_p=16, num_warps=2,
                                         stages=2, tail_tile=True)),
    # output: "heads" programs that compute their ring weights themselves / load them
    # from the weights launch
    "split-heads-own-weights": ("split", SplitConfig(heads_per_program=2,
                                                     out_weights="program")),
    "split-heads-weights-launch": ("split", SplitConfig(heads_per_program=1,
                                                        out_weights="launch")),
    # output: every tile's loads before its first store (two masked 16-row tiles, or
    # one tile and an 8-row tail tile)
    "split-heads-loads-first": ("split", SplitConfig(heads_per_program=1, block_p=16,
                                                     out_loads_first=True,
                                                     tail_tile=False)),
    "split-heads-loads-first-tail": ("split", SplitConfig(heads_per_program=1, block_p=16,
                                                          out_loads_first=True,
                                                          tail_tile=True)),
    # output: two heads per program, their rows as three 16-row tiles, the middle one
    # shared by both heads (a padding row among them)
    "split-heads-pairs": ("split", SplitConfig(out_pairs=True, block_p=16)),
    # the same, each tile's loads before the previous tile's row dot and stores
    "split-heads-pairs-ahead": ("split", SplitConfig(out_pairs=True, out_ahead=1,
                                                     block_p=16)),
    # flush programs of four / two warps (the default: one; a chunk's row reductions
    # across warps)
    "split-flush-4warps": ("split", SplitConfig(flush_warps=4, flush_maxnreg=0)),
    "split-flush-2warps": ("split", SplitConfig(flush_warps=2, flush_stages=3)),
}


@pytest.mark.parametrize("variant", list(SPLIT_CONFIGS))
def test_replay_slots_padding_and_bf16_inputs(variant) -> None:
    """state_indices with a padding row; raw bf16 inputs with softplus in the kernel."""
    design, L, batch = split("fp32", "fp8-e4m3", 3), 3, 3
    kind, params, raws = setup(steps=4, batch=batch)
    S_all = state0(5)
    idx = torch.tensor([4, -1, 1], dtype=torch.int32, device=DEV)
    launch, cfg = SPLIT_CONFIGS[variant]
    work = dict(rows_per_program=16) if variant == "fused-rows" else dict(heads_per_program=2)
    cache = Mamba2Cache.allocate(5, H, P, N, G, checkpoint_format="fp32",
                                 read_format="fp8-e4m3", window=L, device=DEV, seed=1,
                                 launch=launch, split_config=cfg, **work)
    cache.load_state(S_all)
    keep = idx >= 0
    rows = idx[keep].long()
    ref = TorchDesignRunner(design, kind, params, int(keep.sum()), DEV, torch.bfloat16, 1,
                            S_all[rows])
    head = HeadParams(params.A, params.D, params.dt_bias)
    for t, raw in enumerate(raws):
        r16 = {k: v.to(torch.bfloat16) for k, v in raw.items()}
        ref.ckpt = cache.ckpt.decode()[rows]  # the kernel's own copies (fp8 read)
        ref.read = cache.reader.decode()[rows]
        y = mamba2_step(cache, r16["x"], r16["dt_raw"], r16["B"], r16["C"], head, z=r16["z"],
                        state_indices=idx, dt_softplus=True)
        sub = {k: v[keep].float() for k, v in r16.items()}
        y_ref, _ = ref.step(kind.prepare(sub, params, torch.bfloat16), t)
        assert rel(y[keep], y_ref) < TOL
        assert torch.all(y[~keep] == 0)
    assert cache.committed().tolist() == [0, 1, 0, 0, 1]
    assert cache.steps_taken().tolist() == [0, 4, 0, 0, 4]


def test_split_step_with_staggered_phases_equals_fused() -> None:
    """Slots at different ring positions (admitted on different steps): every step some
    rows flush while the others output.  The split launches (nvfp4 read copy, its
    flush's scratch pass) give the one-launch kernel's outputs, checkpoints and clocks."""
    L, batch = 3, 3
    kind, params, raws = setup(steps=2 * L + 1, batch=batch, seed=9)
    head = HeadParams(params.A, params.D, params.dt_bias)
    res = {}
    for launch in ("fused", "split"):
        cache = Mamba2Cache.allocate(batch, H, P, N, G, checkpoint_format="fp16-sr",
                                     read_format="nvfp4", window=L, device=DEV, seed=3,
                                     launch=launch)
        cache.load_state(state0(batch))
        stagger_clocks(cache.tickets, L, cache.programs_per_slot)
        ys = [mamba2_step(cache, r["x"], r["dt_raw"], r["B"], r["C"], head, z=r["z"],
                          dt_softplus=True) for r in raws]
        res[launch] = ys, cache.committed().tolist(), cache.ckpt.decode(), cache.read.codes
    for a, b in zip(res["fused"][0], res["split"][0], strict=True):
        assert rel(a, b) < 1e-3  # fp16-sr/nvfp4 copies: a code can flip on a last bit
    assert res["fused"][1] == res["split"][1] == [(2 * L + 1 + b) % L for b in range(batch)]
    assert rel(res["split"][2], res["fused"][2]) < 1e-3


@pytest.mark.parametrize("ck,rd", [("fp32", "fp8-e4m3"), ("fp16-sr", "nvfp4")])
def test_concurrent_flush_equals_sequential(ck, rd) -> None:
    """The flush launch beside the weights and output launches
    (``SplitConfig.concurrent_flush``; on the CPU it runs after them, the order a second
    stream may take): the same outputs, copies and clocks as one stream, with rows at
    staggered ring positions (every step some flush) and a padding row."""
    L, batch = 3, 4
    kind, params, raws = setup(steps=2 * L + 1, batch=batch, seed=11)
    head = HeadParams(params.A, params.D, params.dt_bias)
    idx = torch.tensor([0, 3, -1, 1], dtype=torch.int32, device=DEV)
    res = []
    for conc in (False, True):
        cache = Mamba2Cache.allocate(batch, H, P, N, G, checkpoint_format=ck, read_format=rd,
                                     window=L, device=DEV, seed=3, launch="split",
                                     split_config=SplitConfig(concurrent_flush=conc))
        cache.load_state(state0(batch))
        stagger_clocks(cache.tickets, L, cache.programs_per_slot)
        ys = [mamba2_step(cache, r["x"], r["dt_raw"], r["B"], r["C"], head, z=r["z"],
                          state_indices=idx, dt_softplus=True).clone() for r in raws]
        res.append(ys + cache.ckpt.tensors() + cache.read.tensors() + [cache.tickets])
    assert_runs_same_bits(res)


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("stagger", [True, False], ids=["staggered", "aligned"])
def test_concurrent_flush_in_a_graph(stagger: bool) -> None:
    """The concurrent flush's fork and join captured in a CUDA graph: replays walk two
    windows with the bits of the one-stream step, rows at staggered ring positions or
    all at one (most steps' flush launches then find nothing to flush)."""
    L, batch = 3, 4
    kind, params, raws = setup(steps=1, batch=batch, seed=12)
    head = HeadParams(params.A, params.D, params.dt_bias)
    r = raws[0]
    res = []
    for conc in (False, True):
        cache = Mamba2Cache.allocate(batch, H, P, N, G, checkpoint_format="fp32",
                                     read_format="fp8-e4m3", window=L, device=DEV, seed=3,
                                     launch="split",
                                     split_config=SplitConfig(concurrent_flush=conc))
        cache.load_state(state0(batch))
        if stagger:
            stagger_clocks(cache.tickets, L, cache.programs_per_slot)
        out = torch.empty(batch, H, P, device=DEV)
        snap = cache.tickets.clone()
        mamba2_step(cache, r["x"], r["dt_raw"], r["B"], r["C"], head, z=r["z"],
                    dt_softplus=True, out=out)  # compile
        cache.load_state(state0(batch))
        cache.tickets.copy_(snap)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            mamba2_step(cache, r["x"], r["dt_raw"], r["B"], r["C"], head, z=r["z"],
                        dt_softplus=True, out=out)
        cache.load_state(state0(batch))
        cache.tickets.copy_(snap)
        outs = []
        for _ in range(2 * L + 1):
            g.replay()
            outs.append(out.clone())
        torch.cuda.synchronize()
        res.append(outs + cache.ckpt.tensors() + cache.read.tensors() + [cache.tickets])
    assert_runs_same_bits(res)


@pytest.mark.parametrize("field", ["out_weights", "flush_pass", "flush_tma", "concurrent_flush",
                                   "evict_first", "flush_grid", "read_encode"])
def test_split_config_rejects_unknown_values(field: str) -> None:
    cache = Mamba2Cache.allocate(2, H, P, N, G, checkpoint_format="fp16-sr",
                                 read_format="nvfp4", window=2, device=DEV, launch="split",
                                 split_config=SplitConfig(**{field: "twice"}))
    kind, params, raws = setup(steps=1, batch=2)
    r = raws[0]
    with pytest.raises(ValueError, match=f"{field} must be"):
        mamba2_step(cache, r["x"], r["dt_raw"], r["B"], r["C"],
                    HeadParams(params.A, params.D, params.dt_bias), z=r["z"], dt_softplus=True)


@pytest.mark.parametrize("read", ["nvfp4", None], ids=["split", "shared"])
def test_row_split_nvfp4_flush_at_model_size(read) -> None:
    """nemotron-3-nano-4b's head shape (80 x 128) flushed by five 16-row programs per
    head: after every flush -- the second one too, so the posting words were cleared --
    the stored copies are formats' encoding of the kernel's fp32 state, and the outputs
    agree with whole-head programs."""
    Hm, Pm, Nm, Gm, batch = 2, 80, 128, 1, 2
    ckpt = "fp16-sr" if read else "nvfp4"
    S0 = 0.5 * torch.randn(batch, Hm, Pm, Nm, generator=torch.Generator().manual_seed(2))

    def make(rows: int) -> Mamba2Cache:
        c = Mamba2Cache.allocate(batch, Hm, Pm, Nm, Gm, checkpoint_format=ckpt,
                                 read_format=read, window=2, device=DEV, seed=3,
                                 keep_fresh=True, launch="fused", rows_per_program=rows)
        c.load_state(S0.to(DEV))
        return c

    parts, whole = make(16), make(0)
    head = HeadParams(-torch.ones(Hm, device=DEV), torch.ones(Hm, device=DEV))
    g = torch.Generator().manual_seed(5)
    for t in range(5):  # flushes at steps 1 and 3
        x = torch.randn(batch, Hm, Pm, generator=g).to(DEV)
        dt = (0.1 * torch.rand(batch, Hm, generator=g)).to(DEV)
        B, C = (torch.randn(batch, Gm, Nm, generator=g).to(DEV) for _ in range(2))
        y = mamba2_step(parts, x, dt, B, C, head)
        assert rel(y, mamba2_step(whole, x, dt, B, C, head)) < TOL, t
        if t % 2 == 1:
            assert_store_bits(parts.ckpt, parts.fresh, 3, t)
            if read is not None:
                assert_read_bits(parts.read, parts.ckpt.fmt, parts.fresh, 3, t)


@pytest.mark.parametrize("kwargs,match", [
    (dict(rows_per_program=8), "power of two >= 16"),
    (dict(rows_per_program=24), "power of two >= 16"),
    (dict(rows_per_program=16, launch="split"), "fused launch"),
    (dict(rows_per_program=16, speculative=True), "fused launch"),
    (dict(rows_per_program=16, heads_per_program=2), "heads_per_program 1"),
])
def test_rows_per_program_rejects_what_it_cannot_run(kwargs, match) -> None:
    args = dict(checkpoint_format="fp32", window=2, device=DEV, launch="fused") | kwargs
    with pytest.raises(ValueError, match=match):
        Mamba2Cache.allocate(2, H, P, N, G, **args)


def test_row_split_step_programs_take_one_warp_for_fp32_and_fp8_reads() -> None:
    """Row-split step programs of an fp32 checkpoint read as fp32 or fp8 run one warp by
    default; 4-bit copies, 16-bit checkpoints, whole-head programs and an explicit
    ``num_warps`` keep theirs."""
    fp32, fp8, nv, f16 = (format_id(f) for f in ("fp32", "fp8-e4m3", "nvfp4", "fp16-sr"))
    assert fused_warps(16, 16, 128, fp32, fp32) == 1
    assert fused_warps(16, 16, 128, fp32, fp8) == 1
    assert fused_warps(16, 16, 128, fp32, nv) == 4
    assert fused_warps(16, 16, 128, f16, nv) == 4
    assert fused_warps(16, 16, 128, f16, f16) == 4
    assert fused_warps(0, 16, 128, fp32, fp8) == 4
    assert fused_warps(None, 64, 128, fp32, fp32) == 8
    assert fused_warps(16, 16, 128, fp32, fp8, num_warps=4) == 4


@pytest.mark.parametrize("rows", [0, 16])
def test_stale_ring_entries_never_reach_the_output(rows) -> None:
    """Ring entries past the slot's position (last window's, here NaN) do not leak
    into outputs or flushes: the row-split kernel loads the whole ring and masks it."""
    L, batch = 4, 2
    kind, params, raws = setup(steps=2 * L, batch=batch, seed=3)
    head = HeadParams(params.A, params.D, params.dt_bias)
    ys = {}
    for poison in (False, True):
        cache = Mamba2Cache.allocate(batch, H, P, N, G, checkpoint_format="fp32",
                                     read_format="fp8-e4m3", window=L, device=DEV,
                                     launch="fused", rows_per_program=rows)
        cache.load_state(state0(batch))
        ys[poison] = []
        for t, r in enumerate(raws):
            c = t % L
            if poison and c > 0:
                for ring in (cache.ring_x, cache.ring_B, cache.ring_dt):
                    ring[:, c:] = float("nan")
            ys[poison].append(mamba2_step(cache, r["x"], r["dt_raw"], r["B"], r["C"], head,
                                          z=r["z"], dt_softplus=True))
    for a, b in zip(ys[False], ys[True], strict=True):
        assert torch.equal(a, b)


def mk_shape(slots, heads, P, N, G, **kw) -> int:
    """``rows_per_program`` a cache of this shape defaults to (on the CPU)."""
    return Mamba2Cache.allocate(slots, heads, P, N, G, window=2, device="cpu",
                                **kw).rows_per_program


def test_rows_per_program_default() -> None:
    """Plain fused caches split heads into 16-row programs, nvfp4 copies on grids of at
    most 512 programs; speculative caches, split launches and explicit multi-head
    programs keep whole heads."""
    mk = lambda slots=2, **kw: Mamba2Cache.allocate(slots, H, P, N, G, window=2,  # noqa: E731
                                                    device=DEV, **kw)
    assert mk(launch="fused").rows_per_program == 16
    assert mk(launch="fused", read_format="fp8-e4m3").rows_per_program == 16
    assert mk(launch="fused", read_format="nvfp4").rows_per_program == 16
    # nemotron-3-super-120b's shape: 512 programs at batch 1, 1024 at batch 2
    big = dict(launch="fused", read_format="nvfp4", heads=128, P=64, N=128, G=8)
    assert (mk_shape(1, **big), mk_shape(2, **big)) == (16, 0)
    assert mk(launch="fused", heads_per_program=2).rows_per_program == 0
    assert mk(launch="fused", speculative=True).rows_per_program == 0
    assert mk(launch="split").rows_per_program == 0


def test_rows_per_program_block_p_must_agree() -> None:
    cache = Mamba2Cache.allocate(2, H, P, N, G, window=2, device=DEV, launch="fused",
                                 rows_per_program=16)
    kind, params, raws = setup(steps=1, batch=2)
    r = raws[0]
    assert cache.programs_per_slot == H * 2  # 24 rows: two 16-row programs per head
    with pytest.raises(ValueError, match="rows_per_program"):
        mamba2_step(cache, r["x"], r["dt_raw"], r["B"], r["C"], HeadParams(params.A),
                    block_p=32)


# ------------------------------------------------------- fast nvfp4 flush encoder


@triton.jit
def _e2m1_pair_kernel(y_ptr, ref_ptr, fast_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    y = tl.load(y_ptr + offs, mask=m, other=0.0)
    tl.store(ref_ptr + offs, e2m1_code(y, False), mask=m)
    tl.store(fast_ptr + offs, e2m1_code_fast(y), mask=m)


@triton.jit
def _nvfp4_fast_kernel(x_ptr, c_ptr, s1_ptr, s2_ptr, P, BLOCK_P: tl.constexpr, N: tl.constexpr):
    mat = tl.program_id(0).to(tl.int64)
    rows = tl.arange(0, BLOCK_P)
    m = rows < P
    S = tl.load(x_ptr + mat * P * N + tile_offsets(rows, N), mask=m[:, None], other=0.0)
    codes, s1, s2 = nvfp4_encode_fast(S, 0.0, True, BLOCK_P, N)
    store_codes(c_ptr, s1_ptr, s2_ptr, codes, s1, s2, mat, rows, m, P, K_NVFP4, BLOCK_P, N)


def test_e2m1_code_fast_equals_e2m1_code() -> None:
    """Every E2M1 rounding boundary, one fp32 ulp either side, zeros, huge, inf,
    fp32 subnormals and random magnitudes over 2**-30..2**30."""
    edges = torch.tensor([0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0,
                          6.0, 7.0, 8.0, 12.0, 16.0])
    up = torch.nextafter(edges, torch.tensor(float("inf")))
    dn = torch.nextafter(edges, torch.tensor(0.0))
    g = torch.Generator().manual_seed(3)
    rnd = torch.exp2(torch.empty(4000).uniform_(-30, 30, generator=g))
    special = torch.tensor([0.0, 1e-45, 1e-39, 1e-30, 3e38, float("inf")])
    y = torch.cat([edges, up, dn, rnd, special])
    y = torch.cat([y, -y]).float().to(DEV)
    ref = torch.empty(y.shape, dtype=torch.int32, device=DEV)
    fast = torch.empty_like(ref)
    _e2m1_pair_kernel[(triton.cdiv(y.numel(), 1024),)](y, ref, fast, y.numel(), BLOCK=1024)
    assert torch.equal(fast, ref)


def test_nvfp4_encode_fast_bits() -> None:
    """Whole matrices (one tile each, amax from the block maxima): codes, block scales
    and matrix scales equal formats' nvfp4 encoding, including E2M1 ties, zero blocks
    and matrices, -0.0, fp32 subnormals, huge values and non-finite blocks."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 20, 64, generator=g) * torch.logspace(-9, 4, 64)
    x[0, 0, 1, :16] = 0.0
    x[0, 1] = 0.0
    x[1, 2, 3, 5] = -0.0
    x[1, 0, 0, :8] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0])
    x[1, 0, 0, 8:16] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0]) * 2688 / 6
    x[1, 1, 2, :4] = torch.tensor([3e-39, -1e-45, 7e-8, 1e38])
    x[0, 2, 4, 3] = float("nan")
    x[0, 2, 5, 40] = -float("inf")
    x = x.to(DEV)
    ref = StateStore.encode(x, "nvfp4")
    ours = StateStore.empty("nvfp4", tuple(x.shape), DEV)
    _nvfp4_fast_kernel[(6,)](x, *ours.kernel_args(), 20, BLOCK_P=32, N=64)
    for a, b in zip(ours.tensors(), ref.tensors(), strict=True):
        assert torch.equal(bits(a), bits(b))


@triton.jit
def _nvfp4_given_amax_kernel(x_ptr, amax_ptr, c_ptr, s1_ptr, s2_ptr, P, BLOCK_P: tl.constexpr,
                             N: tl.constexpr):
    mat = tl.program_id(0).to(tl.int64)
    rows = tl.arange(0, BLOCK_P)
    m = rows < P
    S = tl.load(x_ptr + mat * P * N + tile_offsets(rows, N), mask=m[:, None], other=0.0)
    codes, s1, s2 = nvfp4_encode_fast(S, tl.load(amax_ptr + mat), False, BLOCK_P, N)
    store_codes(c_ptr, s1_ptr, s2_ptr, codes, s1, s2, mat, rows, m, P, K_NVFP4, BLOCK_P, N)


def test_nvfp4_encode_fast_ties_after_division() -> None:
    """Elements exactly at E2M1 ties (0.25, 0.75, ..., 5) times block divisors that are
    not powers of two (E4M3 scales 1.125..1.875 times matrix scales of 12-bit
    mantissas): the plain-tile path's quotient must be the correctly rounded one (a
    product by the reciprocal alone misses about one tie in eight).  Matrix amax taken
    from the tile and given by the caller."""
    g = torch.Generator().manual_seed(7)
    mats, P, N = 8, 16, 64
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=torch.float64)
    vals = torch.tensor([1.125, 1.375, 1.625, 1.875, 0.875, 0.625], dtype=torch.float64)
    x = torch.zeros(mats, P, N, dtype=torch.float64)
    for i in range(mats):
        s2 = float(torch.randint(2048, 4096, (1,), generator=g)) * 2.0 ** int(
            torch.randint(-40, -5, (1,), generator=g))
        blocks = x[i].view(P, N // 16, 16)
        v = vals[torch.randint(0, len(vals), (P, N // 16), generator=g)]
        den = v * s2
        t = ties[torch.randint(0, len(ties), (P, N // 16, 16), generator=g)]
        sign = torch.where(torch.rand(P, N // 16, 16, generator=g) < 0.5, -1.0, 1.0)
        blocks.copy_(sign * t * den[..., None])
        blocks[..., 0] = 6.0 * den  # the block max: its scale is exactly v
        x[i, 0, 0] = 2688.0 * s2  # the matrix amax: matrix scale exactly s2
    assert torch.equal(x.float().double(), x)  # every value exact in fp32
    x = x.float().reshape(1, mats, P, N).to(DEV)
    ref = StateStore.encode(x, "nvfp4")
    amax = x.abs().amax(dim=(2, 3)).reshape(mats).contiguous()
    for self_amax in (True, False):
        ours = StateStore.empty("nvfp4", tuple(x.shape), DEV)
        if self_amax:
            _nvfp4_fast_kernel[(mats,)](x, *ours.kernel_args(), P, BLOCK_P=P, N=N)
        else:
            _nvfp4_given_amax_kernel[(mats,)](x, amax, *ours.kernel_args(), P, BLOCK_P=P,
                                              N=N)
        for a, b in zip(ours.tensors(), ref.tensors(), strict=True):
            assert torch.equal(bits(a), bits(b)), self_amax


# ----------------------------------------------------------- speculative decoding


def _stack(inps, name):
    return torch.stack([getattr(i, name) for i in inps], dim=1).contiguous()


VERIFY_DESIGNS = [shared("fp32", 5), split("fp32", "fp8-e4m3", 5),
                  split("fp16-sr", "fp8-e4m3", 5), shared("nvfp4", 5)]
VERIFY_LAUNCHES = ("single", "staged", "staged-dot")
VERIFY_CASES = [(d, v) for v in VERIFY_LAUNCHES for d in VERIFY_DESIGNS]


@pytest.mark.parametrize("design,verify_launch", VERIFY_CASES,
                         ids=[f"{d.label}-{v}" for d, v in VERIFY_CASES])
def test_verify_commit_matches_torch_speculative(design, verify_launch) -> None:
    batch, T, seed = 3, 3, 2
    kind, params, raws = setup(steps=24, batch=batch, seed=3)
    inps = [kind.prepare(r, params, torch.bfloat16) for r in raws]
    S0 = state0(batch)
    ref = SpeculativeDecoder(design, kind, params, batch, DEV, torch.bfloat16, seed, S0)
    cache = Mamba2Cache.allocate(batch, H, P, N, G, checkpoint_format=design.checkpoint_format,
                                 read_format=None if design.kind == "shared" else
                                 design.read_format, window=design.window, device=DEV,
                                 seed=seed, speculative=True, heads_per_program=2)
    cache.load_state(S0)
    head = HeadParams(params.A, params.D)
    gen = torch.Generator().manual_seed(0)
    for it in range(6):
        drafts = inps[it * T:(it + 1) * T]
        y_ref = torch.stack(ref.verify(drafts), dim=1)
        y = mamba2_verify(cache, _stack(drafts, "x"), _stack(drafts, "dt"), _stack(drafts, "B"),
                          _stack(drafts, "C"), head, z=_stack(drafts, "z"),
                          verify_launch=verify_launch)
        # a lossy read copy may flip a code on a last-bit difference of the flush
        assert rel(y, y_ref) < (TOL if design.read_format == "fp32" else 1e-3), f"verify {it}"
        n = torch.randint(1, T + 1, (batch,), generator=gen).to(DEV)
        ref.commit(n)
        mamba2_commit(cache, n.to(torch.int32), T)
    assert cache.committed().tolist() == ref.committed.tolist()


@pytest.mark.parametrize("staged", VERIFY_LAUNCHES[1:])
@pytest.mark.parametrize("design", [split("fp16-sr", "nvfp4", 5), shared("nvfp4", 4)],
                         ids=lambda d: d.label)
def test_staged_verify_equals_single_launch(design, staged) -> None:
    """Lossy copies (nvfp4 folds included): a staged verify's outputs are within
    1e-5 of the single-launch verify's and both write the same checkpoint / read-copy
    bits (the same fold and encoders, one head per prep program)."""
    batch, T, seed = 3, 3, 2
    kind, params, raws = setup(steps=18, batch=batch, seed=3)
    inps = [kind.prepare(r, params, torch.bfloat16) for r in raws]
    S0 = state0(batch)
    caches = []
    for _ in range(2):
        c = Mamba2Cache.allocate(batch, H, P, N, G, checkpoint_format=design.checkpoint_format,
                                 read_format=None if design.kind == "shared" else
                                 design.read_format, window=design.window, device=DEV,
                                 seed=seed, speculative=True, heads_per_program=2)
        c.load_state(S0)
        caches.append(c)
    head = HeadParams(params.A, params.D, None)
    gen = torch.Generator().manual_seed(0)
    for it in range(5):
        d = inps[it * T:(it + 1) * T]
        ys = [mamba2_verify(c, _stack(d, "x"), _stack(d, "dt"), _stack(d, "B"), _stack(d, "C"),
                            head, z=_stack(d, "z"), verify_launch=v)
              for c, v in zip(caches, ("single", staged), strict=True)]
        assert rel(ys[1], ys[0]) < TOL, f"verify {it}"
        for a, b in zip(caches[0].ckpt.tensors(), caches[1].ckpt.tensors(), strict=True):
            assert torch.equal(bits(a), bits(b))
        for a, b in zip(caches[0].reader.tensors(), caches[1].reader.tensors(), strict=True):
            assert torch.equal(bits(a), bits(b))
        n = torch.randint(1, T + 1, (batch,), generator=gen).to(DEV).to(torch.int32)
        for c in caches:
            mamba2_commit(c, n, T)


@pytest.mark.parametrize("staged", VERIFY_LAUNCHES[1:])
def test_staged_verify_with_uneven_heads_per_group(staged) -> None:
    """Three heads per B/C group (the staged prep launch's per-group tile of heads is
    padded to four, as nemotron-3-nano-4b's 12 heads per group are to 16): the staged
    verify's outputs are within 1e-5 of the single launch's and both write the same
    checkpoint bits, over verifies that flush, with a padding row."""
    batch, T, L, H3, G3 = 3, 3, 5, 6, 2
    gen = torch.Generator().manual_seed(11)

    def rnd(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=gen)).to(DEV)

    A = -torch.exp(torch.rand(H3, generator=gen) * 2).to(DEV)
    head = HeadParams(A, rnd(H3), rnd(H3, scale=0.5))
    S0 = rnd(batch, H3, P, N, scale=0.5)
    idx = torch.tensor([1, -1, 0], dtype=torch.int32, device=DEV)
    caches = []
    for _ in range(2):
        c = Mamba2Cache.allocate(batch, H3, P, N, G3, window=L, device=DEV, speculative=True)
        c.load_state(S0)
        caches.append(c)
    for it in range(5):
        x, z = rnd(batch, T, H3, P), rnd(batch, T, H3, P)
        B, C = rnd(batch, T, G3, N), rnd(batch, T, G3, N)
        dt = rnd(batch, T, H3, scale=0.5)
        ys = [mamba2_verify(c, x, dt, B, C, head, z=z, state_indices=idx, dt_softplus=True,
                            verify_launch=v)
              for c, v in zip(caches, ("single", staged), strict=True)]
        live = idx >= 0
        assert rel(ys[1][live], ys[0][live]) < TOL, f"verify {it}"
        for a, b in zip(caches[0].ckpt.tensors(), caches[1].ckpt.tensors(), strict=True):
            assert torch.equal(bits(a), bits(b))
        n = torch.full((batch,), 2, dtype=torch.int32, device=DEV)
        for c in caches:
            mamba2_commit(c, n, T, state_indices=idx)


@pytest.mark.parametrize("verify_launch", VERIFY_LAUNCHES)
def test_spec_accepted_outputs_equal_plain_decoding(verify_launch) -> None:
    """Drafts that are the true next tokens: every accepted output equals plain
    replay decoding of the same tokens (fp32 shared design)."""
    batch, L, T = 2, 4, 3
    kind, params, raws = setup(steps=14, batch=batch, seed=4)
    inps = [kind.prepare(r, params, torch.bfloat16) for r in raws]
    S0 = state0(batch)
    head = HeadParams(params.A, params.D)
    plain = Mamba2Cache.allocate(batch, H, P, N, G, window=L, device=DEV)
    plain.load_state(S0)
    y_plain = torch.stack([mamba2_step(plain, i.x, i.dt, i.B, i.C, head, z=i.z) for i in inps], 1)
    spec = Mamba2Cache.allocate(batch, H, P, N, G, window=L, device=DEV, speculative=True)
    spec.load_state(S0)
    pos, accepted = 0, [3, 1, 2, 3, 2, 3]  # same for every row
    for n in accepted:
        d = inps[pos:pos + T]
        y = mamba2_verify(spec, _stack(d, "x"), _stack(d, "dt"), _stack(d, "B"), _stack(d, "C"),
                          head, z=_stack(d, "z"), verify_launch=verify_launch)
        assert rel(y[:, :n], y_plain[:, pos:pos + n]) < TOL, f"tokens {pos}..{pos + n}"
        mamba2_commit(spec, torch.full((batch,), n, dtype=torch.int32, device=DEV), T)
        pos += n


# ------------------------------------------------------------------ GPU only


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("launch", ["fused", "split", "fused-rows"])
def test_cuda_graph_replay_walks_the_window(launch) -> None:
    batch, L = 4, 4
    kind, params, raws = setup(steps=1, batch=batch)
    inp = kind.prepare(raws[0], params, torch.bfloat16)
    head = HeadParams(params.A, params.D)
    rows = launch == "fused-rows"
    mk = lambda: Mamba2Cache.allocate(batch, H, P, N, G, checkpoint_format="fp16-sr",  # noqa: E731
                                      read_format="fp8-e4m3" if rows else "nvfp4",
                                      window=L, device=DEV, seed=3,
                                      launch=launch.split("-")[0],
                                      rows_per_program=16 if rows else 0)
    eager, graphed = mk(), mk()
    S0 = state0(batch)
    eager.load_state(S0)
    graphed.load_state(S0)
    out = torch.empty_like(inp.x)
    mamba2_step(graphed, inp.x, inp.dt, inp.B, inp.C, head, z=inp.z, out=out)  # compile
    graphed.load_state(S0)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        mamba2_step(graphed, inp.x, inp.dt, inp.B, inp.C, head, z=inp.z, out=out)
    graphed.load_state(S0)
    for _ in range(2 * L + 1):
        y = mamba2_step(eager, inp.x, inp.dt, inp.B, inp.C, head, z=inp.z)
        g.replay()
        assert torch.equal(out, y)
    assert torch.equal(graphed.ckpt.codes, eager.ckpt.codes)
    assert graphed.steps_taken().tolist() == [2 * L + 1] * batch


@pytest.mark.skipif(DEVICE != "cuda", reason="L2 prefetch is compiled code only")
@pytest.mark.parametrize("ck,rd", [("fp32", None), ("fp32", "fp8-e4m3"), ("fp16-sr", "nvfp4")])
def test_prefetch_changes_no_bit(ck, rd) -> None:
    """The split launches' L2 prefetches (``SplitConfig.flush_prefetch``: flush chunks
    ahead, into the program's next unit; ``out_prefetch``: the output program that many
    launches later) write the same outputs and copies as none: one persistent flush
    program per SM, so each takes several units and prefetches across them, 16-row
    chunks of a 24-row head (the last one partly outside it).  Evict-first stores
    (``evict_first``) change no bit either."""
    batch, L = 48, 3
    kind, params, raws = setup(steps=2 * L + 1, batch=batch, seed=5)
    head = HeadParams(params.A, params.D, params.dt_bias)
    cfgs = [SplitConfig(flush_prefetch=pf, out_prefetch=po, evict_first=ev,
                        flush_ctas_per_sm=1, out_kernel="heads")
            for pf, po, ev in ((0, 0, False), (1, 3, True), (2, 64, True))]
    assert_runs_same_bits(_split_runs(cfgs, ck, rd, head, raws, state0(batch), L))


def _split_runs(cfgs: list[SplitConfig], ck: str, rd: str | None, head: HeadParams,
                raws: list[dict], S0: torch.Tensor, L: int) -> list[list[torch.Tensor]]:
    """For each split launch configuration, the outputs of ``raws`` from state ``S0``
    and the stored copies after them (:func:`assert_runs_same_bits`' runs)."""
    res = []
    for cfg in cfgs:
        cache = Mamba2Cache.allocate(S0.shape[0], H, S0.shape[2], N, G, checkpoint_format=ck,
                                     read_format=rd, window=L, device=DEV, seed=3,
                                     launch="split", split_config=cfg)
        cache.load_state(S0)
        ys = [mamba2_step(cache, r["x"], r["dt_raw"], r["B"], r["C"], head, z=r["z"],
                          dt_softplus=True).clone() for r in raws]
        res.append(ys + cache.ckpt.tensors() + (cache.read or cache.ckpt).tensors())
    return res


PRESET32 = Preset("kernel-test-32", "mamba2", H, 32, N, G, 1, "headdim 32: whole chunks")


def _headdim32_problem(batch: int, L: int, seed: int, state_seed: int):
    """Head constants, 2L + 1 steps of inputs and a random state for headdim 32 (two
    16-row flush chunks): the flush-variant tests' problem."""
    trace = SyntheticTrace(PRESET32, steps=2 * L + 1, batch=batch, seed=seed)
    kind = kind_for(PRESET32)
    params = kind.params({k: v.float().to(DEV) for k, v in trace.params.items()})
    head = HeadParams(params.A, params.D, params.dt_bias)
    raws = [{k: v.to(DEV) for k, v in raw.items()} for raw in trace]
    gen = torch.Generator().manual_seed(state_seed)
    return head, raws, torch.randn(batch, H, 32, N, generator=gen).to(DEV)


@pytest.mark.parametrize("ck,rd", [("fp32", None), ("fp32", "fp8-e4m3"), ("fp16-sr", "nvfp4")])
def test_flush_tma_changes_no_bit(ck, rd) -> None:
    """Checkpoint chunks loaded through a tensor descriptor (``SplitConfig.flush_tma``,
    one and two pipeline stages) give the same outputs, checkpoints and read copies as
    plain loads: headdim 32 (two 16-row chunks), fewer persistent programs than units,
    two windows and a flush step."""
    batch, L = 3, 3
    head, raws, S0 = _headdim32_problem(batch, L, seed=5, state_seed=4)
    cfgs = [SplitConfig(flush_tma=tma, flush_stages=stages, flush_ctas_per_sm=1)
            for tma, stages in ((False, 1), (True, 1), (True, 2))]
    assert_runs_same_bits(_split_runs(cfgs, ck, rd, head, raws, S0, L))


@pytest.mark.parametrize("ck,rd", [("fp32", None), ("fp32", "fp8-e4m3"), ("fp16-sr", "nvfp4")])
def test_dynamic_flush_grid_changes_no_bit(ck, rd) -> None:
    """Flush programs that claim their units from a counter (``SplitConfig.flush_grid``
    "dynamic", fewer programs than units) give the persistent grid's outputs,
    checkpoints and read copies over two windows and a flush step, and leave the
    counter and the count of programs done at zero after every flush launch."""
    batch, L, P32 = 3, 3, 32
    head, raws, S0 = _headdim32_problem(batch, L, seed=6, state_seed=5)
    res = []
    for grid in ("persistent", "dynamic"):
        cfg = SplitConfig(flush_grid=grid, flush_ctas_per_sm=1)
        cache = Mamba2Cache.allocate(batch, H, P32, N, G, checkpoint_format=ck, read_format=rd,
                                     window=L, device=DEV, seed=3, launch="split",
                                     split_config=cfg)
        cache.load_state(S0)
        ys = []
        for r in raws:
            ys.append(mamba2_step(cache, r["x"], r["dt_raw"], r["B"], r["C"], head, z=r["z"],
                                  dt_softplus=True).clone())
            assert grid == "persistent" or cache.flush_work.tolist() == [0, 0]
        res.append(ys + cache.ckpt.tensors() + (cache.read or cache.ckpt).tensors())
    assert_runs_same_bits(res)


def test_default_flush_programs_of_a_16bit_sr_checkpoint() -> None:
    """A flush that writes a stochastically rounded 16-bit checkpoint alone (shared, or
    split with its 4-bit copy encoded by a launch of its own) runs 2-warp programs at 128
    registers, 8 per SM; an fp32 checkpoint keeps 1-warp programs at 255."""
    for Hm, Pm in ((96, 80), (128, 64)):
        for ck in ("fp16-sr", "bf16-sr"):
            c = format_id(ck)
            for rd, amax in ((c, False), (format_id("nvfp4"), False)):
                cfg = _split_defaults(SplitConfig(), Pm, 128, Hm, 8, rd, amax, True, c)
                assert (cfg.flush_warps, cfg.flush_maxnreg, cfg.flush_ctas_per_sm) == (2, 128, 8)
        fp32 = _split_defaults(SplitConfig(), Pm, 128, Hm, 8, format_id("fp32"), False, True)
        assert (fp32.flush_warps, fp32.flush_maxnreg, fp32.flush_ctas_per_sm) == (1, 255, 8)
        mine = _split_defaults(SplitConfig(flush_warps=1), Pm, 128, Hm, 8, format_id("fp16-sr"),
                               False, True)
        assert (mine.flush_warps, mine.flush_maxnreg) == (1, 255)


def test_default_output_words_tail_and_loads_first() -> None:
    """At model shapes the "heads" output launch reads a 4-bit copy as words, without a
    tail tile or L2 prefetch, two heads per program whose rows are one run of tiles in
    the pair loop (headdim 80: a tile shared; 64: two full tiles each, ``out_pairs``);
    set to load each head's tiles first, headdim 64 keeps two heads per program without
    pairs; read as bytes, headdim 80 keeps one head per program, its 16-row tail tile and
    loads first and prefetches 2816 ahead; a 1-byte copy is read as bytes."""
    nv, fp8 = format_id("nvfp4"), format_id("fp8-e4m3")
    got = {Pm: _split_defaults(SplitConfig(), Pm, 128, Hm, 8, nv, False)
           for Hm, Pm in ((96, 80), (128, 64))}
    assert [(c.out_words, c.tail_tile, c.out_loads_first) for c in got.values()] == [
        (True, False, False), (True, False, False)]
    assert [(c.out_pairs, c.out_pair_loop, c.heads_per_program) for c in got.values()] == [
        (True, True, 2), (True, True, 2)]
    assert [(c.maxnreg, c.out_prefetch) for c in got.values()] == [(128, 0), (128, 0)]
    duo = _split_defaults(SplitConfig(out_loads_first=True), 64, 128, 128, 8, nv, False)
    assert (duo.out_pairs, duo.heads_per_program, duo.out_loads_first) == (False, 2, True)
    one = _split_defaults(SplitConfig(out_loads_first=False), 64, 128, 128, 8, nv, False)
    assert (one.heads_per_program, one.out_loads_first, one.out_prefetch) == (1, False, 1536)
    b = _split_defaults(SplitConfig(out_words=False), 80, 128, 96, 8, nv, False)
    assert (b.out_words, b.tail_tile, b.out_loads_first, b.out_pairs) == (False, True, True,
                                                                           False)
    assert (b.maxnreg, b.out_prefetch) == (128, 2816)
    assert _split_defaults(SplitConfig(), 80, 128, 96, 8, fp8, False).out_words is False


@pytest.mark.parametrize("design", ["replay-fp32", "split-fp32-fp8", "split-fp16sr-nvfp4"])
def test_split_tuning_candidates_are_accepted(design: str) -> None:
    """Every split-launch tuning candidate of the benchmark, with every flush candidate,
    is a configuration the split step accepts at both model shapes."""
    from precisionlab.studies.bench_mamba2 import CANDIDATES, DESIGNS, FLUSH_CANDIDATES

    ck, rd = DESIGNS[design]
    need_amax = "nvfp4" in (ck, rd) and ck not in ("fp16-sr", "bf16-sr")
    outs = [c for c in CANDIDATES[design] if c.get("launch") == "split"]
    assert outs
    for out in outs:
        for fl in FLUSH_CANDIDATES[design]:
            fields = {k: v for k, v in {**out, **fl}.items() if k != "launch"}
            for Hm, Pm in ((96, 80), (128, 64)):
                _split_defaults(SplitConfig(**fields), Pm, 128, Hm, 8, format_id(rd or ck),
                                need_amax, True, format_id(ck))


@pytest.mark.parametrize("ck,rd,grid", [("fp32", None, "persistent"),
                                         ("fp16-sr", None, "persistent"),
                                         ("fp32", "fp8-e4m3", "dynamic"),
                                         ("fp16-sr", "nvfp4", "dynamic")])
def test_default_flush_grid_by_copy(ck: str, rd: str | None, grid: str) -> None:
    """The split step's default flush grid: units claimed from a counter where the
    flush writes an nvfp4 or 1-byte copy, every G-th unit otherwise (model shapes)."""
    for Hm, Pm in ((96, 80), (128, 64)):
        cfg = _split_defaults(SplitConfig(), Pm, 128, Hm, 8, format_id(rd or ck),
                              "nvfp4" in (ck, rd))
        assert cfg.flush_grid == grid


@pytest.mark.parametrize("ck,rd", [("fp32", "nvfp4"), ("fp32", "mxfp4"), ("fp16-sr", "nvfp4"),
                                   ("bf16-sr", "nvfp4")])
@pytest.mark.parametrize("conc", [False, True], ids=["sequential", "concurrent-order"])
def test_read_encode_launch_changes_no_bit(ck: str, rd: str, conc: bool, monkeypatch) -> None:
    """A dense checkpoint's 4-bit read copy encoded by a launch of its own behind the
    flush (``SplitConfig.read_encode`` "launch"; its programs each take several heads
    here) is ``formats``' encoding of the checkpoint, and over two windows and a flush
    step, with the flush after the output launch too (the order a second stream may
    take), gives the flush's own encoder's outputs, checkpoints and read copies
    (compiled: the checkpoints to 1e-6, as the flush launches of the two differ in
    warps and passes, and a copy may then differ where its checkpoint does)."""
    monkeypatch.setattr(read_encode, "ENCODE_CTAS_PER_SM", 1)
    batch, L, P32 = 3, 3, 32
    head, raws, S0 = _headdim32_problem(batch, L, seed=7, state_seed=6)
    res = []
    for enc in ("flush", "launch"):
        cfg = SplitConfig(read_encode=enc, flush_ctas_per_sm=1, concurrent_flush=conc)
        cache = Mamba2Cache.allocate(batch, H, P32, N, G, checkpoint_format=ck,
                                     read_format=rd, window=L, device=DEV, seed=3,
                                     launch="split", split_config=cfg)
        cache.load_state(S0)
        ys = [mamba2_step(cache, r["x"], r["dt_raw"], r["B"], r["C"], head, z=r["z"],
                          dt_softplus=True).clone() for r in raws]
        ref = StateStore.encode(cache.ckpt.decode(), rd)
        for a, b in zip(cache.read.tensors(), ref.tensors(), strict=True):
            assert torch.equal(a, b)
        res.append(ys + cache.ckpt.tensors() + cache.read.tensors())
    if DEVICE == "cpu":
        assert_runs_same_bits(res)
    else:
        assert rel(res[1][len(raws)], res[0][len(raws)]) < 1e-6


def test_read_encode_launch_defaults_and_refusals() -> None:
    """A launch of its own encodes the read copy by default where the checkpoint is dense
    and the copy 4-bit; the flush launch then takes the settings of a flush without a
    read copy; other designs keep the flush's encoder, and "launch" is refused there."""
    fp32, nv = format_id("fp32"), format_id("nvfp4")
    for Hm, Pm in ((96, 80), (128, 64)):
        apart = _split_defaults(SplitConfig(), Pm, 128, Hm, 8, nv, False, True, fp32)
        plain = _split_defaults(SplitConfig(), Pm, 128, Hm, 8, fp32, False, True)
        inside = _split_defaults(SplitConfig(), Pm, 128, Hm, 8, nv, True, True)
        for key in ("flush_warps", "flush_maxnreg", "flush_ctas_per_sm", "flush_stages",
                    "flush_tma", "flush_grid", "flush_prefetch"):
            assert getattr(apart, key) == getattr(plain, key), key
        assert (apart.out_kernel, apart.block_p) == (inside.out_kernel, inside.block_p)
    stores = {f: StateStore.empty(f, (1, H, P, N), DEV) for f in ("nvfp4", "mxfp4", "fp8-e4m3")}
    assert _read_encode_apart(None, "fp32", stores["nvfp4"])
    assert _read_encode_apart(None, "fp32", stores["mxfp4"])
    assert _read_encode_apart(None, "fp16-sr", stores["nvfp4"])
    assert _read_encode_apart(None, "bf16-sr", stores["mxfp4"])
    assert not _read_encode_apart(None, "fp8-e4m3", stores["nvfp4"])
    assert not _read_encode_apart(None, "fp32", stores["fp8-e4m3"])
    assert not _read_encode_apart("flush", "fp32", stores["nvfp4"])
    kind, params, raws = setup(steps=1, batch=2)
    r = raws[0]
    for ck, rd in (("fp8-e4m3", "nvfp4"), ("fp32", "fp8-e4m3"), ("fp32", None)):
        cache = Mamba2Cache.allocate(2, H, P, N, G, checkpoint_format=ck, read_format=rd,
                                     window=2, device=DEV, launch="split",
                                     split_config=SplitConfig(read_encode="launch"))
        with pytest.raises(ValueError, match="read_encode='launch' needs a dense checkpoint"):
            mamba2_step(cache, r["x"], r["dt_raw"], r["B"], r["C"],
                        HeadParams(params.A, params.D, params.dt_bias), z=r["z"],
                        dt_softplus=True)


@pytest.mark.parametrize("ck,headdim", [("fp32", 24), ("fp8-e4m3", 32), ("nvfp4", 32)])
def test_flush_tma_rejects_what_it_cannot_load(ck, headdim) -> None:
    """``flush_tma`` takes dense checkpoints whose heads split into whole flush chunks."""
    cache = Mamba2Cache.allocate(1, H, headdim, N, G, checkpoint_format=ck, window=2,
                                 device=DEV, launch="split",
                                 split_config=SplitConfig(flush_tma=True))
    x = torch.zeros(1, H, headdim, device=DEV)
    with pytest.raises(ValueError, match="flush_tma needs a dense checkpoint"):
        mamba2_step(cache, x, torch.zeros(1, H, device=DEV), torch.zeros(1, G, N, device=DEV),
                    torch.zeros(1, G, N, device=DEV), HeadParams(-torch.ones(H, device=DEV)))


@pytest.mark.parametrize("read,cfg", [("fp8-e4m3", SplitConfig(out_words=True)),
                                      ("nvfp4", SplitConfig(out_words=True,
                                                            out_kernel="tiles"))])
def test_out_words_needs_heads_and_a_4bit_copy(read, cfg) -> None:
    """``out_words`` loads 4-bit codes as int32 words in the "heads" output launch only:
    a 1-byte copy or another output launch is refused with a clear message."""
    cache = Mamba2Cache.allocate(1, H, P, N, G, checkpoint_format="fp16-sr",
                                 read_format=read, window=2, device=DEV, launch="split",
                                 split_config=cfg)
    x = torch.zeros(1, H, P, device=DEV)
    with pytest.raises(ValueError, match="out_words needs the 'heads' output launch"):
        mamba2_step(cache, x, torch.zeros(1, H, device=DEV), torch.zeros(1, G, N, device=DEV),
                    torch.zeros(1, G, N, device=DEV), HeadParams(-torch.ones(H, device=DEV)))


@pytest.mark.parametrize("read,cfg,match", [
    ("fp8-e4m3", SplitConfig(out_pairs=True, block_p=32), "double is a multiple"),  # 24 < 32
    ("nvfp4", SplitConfig(out_pairs=True, block_p=16, out_kernel="tiles"), "'heads'"),
    ("nvfp4", SplitConfig(out_pairs=True, block_p=16, out_weights="program"), "'heads'"),
    ("nvfp4", SplitConfig(out_pairs=True, block_p=16, heads_per_program=1), "2 heads"),
    ("nvfp4", SplitConfig(out_pairs=True, block_p=16, tail_tile=True), "tail_tile"),
    ("nvfp4", SplitConfig(out_pairs=True, block_p=16, out_loads_first=True), "loads_first"),
    ("nvfp4", SplitConfig(out_pairs=False, out_ahead=1, block_p=16), "out_ahead needs"),
    ("nvfp4", SplitConfig(out_ahead=1, block_p=32), "out_ahead needs"),  # 24 < 32
    ("nvfp4", SplitConfig(out_ahead=3, block_p=16), "out_ahead takes 1 or 2"),
    ("nvfp4", SplitConfig(out_ahead=-1, block_p=16), "out_ahead must be an integer"),
    ("nvfp4", SplitConfig(out_pair_loop=True, out_pairs=False, block_p=16), "needs out_pairs"),
    ("nvfp4", SplitConfig(out_pair_loop=True, out_ahead=1, block_p=16), "exclude each other"),
])
def test_out_pairs_refuses_what_it_cannot_do(read, cfg, match) -> None:
    """``out_pairs`` needs "heads" programs of two heads with the weights launch and a
    headdim that two heads' tiles cover without masked rows; anything else is refused
    with a clear message."""
    cache = Mamba2Cache.allocate(1, H, P, N, G, checkpoint_format="fp16-sr",
                                 read_format=read, window=2, device=DEV, launch="split",
                                 split_config=cfg)
    x = torch.zeros(1, H, P, device=DEV)
    with pytest.raises(ValueError, match=match):
        mamba2_step(cache, x, torch.zeros(1, H, device=DEV), torch.zeros(1, G, N, device=DEV),
                    torch.zeros(1, G, N, device=DEV), HeadParams(-torch.ones(H, device=DEV)))


def test_out_pairs_settings() -> None:
    """nemotron-3-nano-4b's headdim of 80 runs as two heads per program in 32-row tiles
    (the default, as with ``out_pairs`` set), without tail tile, loads first or L2
    prefetch, at 128 registers for 4-bit copies (their tiles in a loop of 3 stages; one
    tile ahead where unrolled) and 80 for 1-byte ones; ``out_pairs`` false gives one head
    per program; a 1-byte copy's headdim of 64, and 16-row tiles of 80 rows, do not pair
    by default (a 4-bit copy's headdim of 64 does: see
    :func:`test_default_output_words_tail_and_loads_first`)."""
    for fmt, regs, loop, stages in (("nvfp4", 128, True, 3), ("fp8-e4m3", 80, False, 1)):
        for cfg in (SplitConfig(), SplitConfig(out_pairs=True)):
            c = _split_defaults(cfg, 80, 128, 96, 8, format_id(fmt), False)
            assert (c.heads_per_program, c.block_p, c.tail_tile, c.out_loads_first,
                    c.maxnreg, c.out_prefetch, c.out_pairs, c.out_ahead, c.out_pair_loop,
                    c.stages) == (2, 32, False, False, regs, 0, True, 0, loop, stages)
        c = _split_defaults(SplitConfig(out_ahead=2), 80, 128, 96, 8, format_id(fmt), False)
        assert (c.out_pairs, c.out_ahead, c.out_pair_loop, c.stages) == (True, 2, False, 1)
        c = _split_defaults(SplitConfig(out_pair_loop=False), 80, 128, 96, 8, format_id(fmt),
                            False)
        assert (c.out_ahead, c.out_pair_loop) == (int(fmt == "nvfp4"), False)
        c = _split_defaults(SplitConfig(out_pairs=False), 80, 128, 96, 8, format_id(fmt),
                            False)
        assert (c.heads_per_program, c.out_pairs, c.out_prefetch, c.out_ahead) == (
            1, False, 1536, 0)
    nv = format_id("nvfp4")
    assert not _split_defaults(SplitConfig(), 64, 128, 128, 8, format_id("fp8-e4m3"),
                               False).out_pairs
    assert not _split_defaults(SplitConfig(block_p=16), 80, 128, 96, 8, nv, False).out_pairs


@pytest.mark.parametrize("rd", ["fp8-e4m3", "nvfp4"])
def test_head_pairs_change_no_bit(rd) -> None:
    """Output programs of one head (two 16-row tiles, the second half masked) and of a
    pair of heads (three tiles, one shared), the pair's loads 0, 1 or 2 tiles ahead or
    its tiles in a loop of 1, 2 or 3 stages (``SplitConfig.out_pairs``, ``out_ahead``,
    ``out_pair_loop``), give the same outputs and stored copies
    bit for bit over two windows and a flush step: every row is the same row dot, ring
    sum and gate."""
    batch, L = 3, 3
    kind, params, raws = setup(steps=2 * L + 1, batch=batch, seed=7)
    head = HeadParams(params.A, params.D, params.dt_bias)
    ck = "fp16-sr" if rd == "nvfp4" else "fp32"
    cfgs = [SplitConfig(out_pairs=False, heads_per_program=1, block_p=16, tail_tile=False)]
    cfgs += [SplitConfig(out_pairs=True, out_ahead=ahead, block_p=16) for ahead in (0, 1, 2)]
    cfgs += [SplitConfig(out_pairs=True, out_pair_loop=True, stages=ns, block_p=16)
             for ns in (1, 2, 3)]
    assert_runs_same_bits(_split_runs(cfgs, ck, rd, head, raws, state0(batch), L))


def test_whole_tile_head_pairs_change_no_bit() -> None:
    """A headdim of two full tiles (32 rows in 16-row tiles): one head per program, two
    heads each loaded first, and the two heads' four tiles as one run in the pair loop
    (the default for a 4-bit copy read as words: 3 stages; and 1) give the same outputs
    and stored copies bit for bit over two windows and a flush step."""
    batch, L = 3, 3
    head, raws, S0 = _headdim32_problem(batch, L, seed=8, state_seed=9)
    cfgs = [SplitConfig(out_pairs=False, heads_per_program=1, block_p=16),
            SplitConfig(out_loads_first=True, heads_per_program=2, block_p=16),
            SplitConfig(block_p=16), SplitConfig(block_p=16, stages=1)]
    assert _split_defaults(cfgs[-1], 32, N, H, G, format_id("nvfp4"), False).out_pair_loop
    assert_runs_same_bits(_split_runs(cfgs, "fp16-sr", "nvfp4", head, raws, S0, L))


def test_loads_first_rejects_more_than_two_tiles() -> None:
    """``out_loads_first`` unrolls at most two tiles per head besides a tail tile: headdim
    80 in 16-row tiles is refused with a clear message."""
    cache = Mamba2Cache.allocate(1, H, 80, N, G, window=2, device=DEV, launch="split",
                                 split_config=SplitConfig(block_p=16, out_loads_first=True))
    x = torch.zeros(1, H, 80, device=DEV)
    with pytest.raises(ValueError, match="out_loads_first takes at most 2 tiles"):
        mamba2_step(cache, x, torch.zeros(1, H, device=DEV), torch.zeros(1, G, N, device=DEV),
                    torch.zeros(1, G, N, device=DEV), HeadParams(-torch.ones(H, device=DEV)))


@pytest.mark.parametrize("field", ["flush_prefetch", "out_prefetch"])
def test_prefetch_rejects_negative(field) -> None:
    cache = Mamba2Cache.allocate(1, H, P, N, G, window=2, device=DEV, launch="split",
                                 split_config=SplitConfig(**{field: -1}))
    x = torch.zeros(1, H, P, device=DEV)
    with pytest.raises(ValueError, match=f"{field} must be"):
        mamba2_step(cache, x, torch.zeros(1, H, device=DEV), torch.zeros(1, G, N, device=DEV),
                    torch.zeros(1, G, N, device=DEV), HeadParams(-torch.ones(H, device=DEV)))


@pytest.mark.skipif(DEVICE != "cuda", reason="the engine's triton backend needs a GPU")
def test_engine_triton_backend_matches_torch() -> None:
    from precisionlab.engine import run

    trace = SyntheticTrace("nemotron-3-super-120b", steps=9, batch=2, seed=1, dynamics="init")
    designs = [shared("fp32", 4), split("fp16-sr", "nvfp4", 4)]
    a = list(run(trace, designs, backend="torch", device="cuda"))
    b = list(run(trace, designs, backend="triton", device="cuda"))
    for ma, mb in zip(a, b, strict=True):
        torch.testing.assert_close(mb.rel_err, ma.rel_err, rtol=1e-3, atol=1e-6)

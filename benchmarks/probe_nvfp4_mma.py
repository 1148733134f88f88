"""Probe: the matrix-vector core of a 4-bit output step, ``y = s2 * (S @ c)`` for nvfp4
state matrices ``S`` (E2M1 codes, E4M3 block scales per 16 elements, an fp32 scale per
matrix) and one fp32 vector ``c`` per (sequence, group) (Mamba-2's C; for the GDN shapes,
q per key head), two ways:

* ``fma``: CUDA cores, as the output launches of ``kernels/`` do it: each word of eight
  codes turned into fp16 pairs by shifts and masks, widened to float32, one FMA per
  element with ``c``, a row sum (Triton);
* ``mma``: tensor cores without a layout conversion (Gluon, ``mma.sync`` m16n8k16):
  each thread loads the 16 bytes of a row that its mma operand fragment holds, decodes
  them in place into the fp16 values the fragment needs (exact: E2M1 value times its
  block scale, times 2**-14), and the product takes ``c`` (of unit scale here) times
  1024 as an fp16 head and remainder (two columns of the 16 x 8 operand), its rows in
  the order the fragments hold the codes.  Variants: ``mma-prefetch`` (the next tile's
  loads in flight while a tile is multiplied), ``mma-ahead2`` (two tiles),
  ``mma-async-S`` (the words through S shared-memory tiles by asynchronous copies),
  ``mma-prefetch/K`` (K programs share a group's rows), ``mma-128`` (128-row tiles: each
  warp's fragments hold two 16-row blocks, four 16-byte loads per thread and tile, where
  a group's rows are a multiple of 128), ``mma-block-cols`` (the block scales applied
  after the product: column n of ``c``'s operand holds ``c`` on block n's rows only, so
  the accumulator holds a row's eight block dots, each then times its scale; ``c``'s
  head and remainder in two products), ``mma-no-scales`` (timing only: no block-scale
  loads, results not checked).

Each runs over every matrix of a model's state at a batch, a program per (sequence,
group), its heads' rows 64 at a time; the probe checks each against a float64 product
of the decoded state, then times it as CUDA-graph replays, beside the library's
read-bandwidth probe over the same bytes.  It measures what the tensor-core form gains
on the 4-bit output step's state product; the ring terms, gates and stores of a real
output step are not in it.

    python benchmarks/probe_nvfp4_mma.py --out probe.json           # H200: check + time
    python benchmarks/probe_nvfp4_mma.py --sass                     # no GPU: sm_90 counts
    ncu --section MemoryWorkloadAnalysis -k regex:_mma_kernel \
        python benchmarks/probe_nvfp4_mma.py --kinds mma-prefetch --models nemotron-3-nano-4b
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2  # noqa: E402

from precisionlab import formats  # noqa: E402
from precisionlab.kernels.tl_dots import e2m1_word_pairs  # noqa: E402

SHAPES = {  # model: (heads, headdim, dstate, groups); GDN: value heads, V, K, key heads
    "nemotron-3-nano-4b": (96, 80, 128, 8),
    "nemotron-3-super-120b": (128, 64, 128, 8),
    "qwen3.5-4b": (32, 128, 128, 16),
    "qwen3.5-122b": (64, 128, 128, 16),
}
DEFAULT_MODELS = ["nemotron-3-nano-4b", "nemotron-3-super-120b"]
WARPS = 4
KINDS = ("fma", "mma", "mma-prefetch", "mma-ahead2", "mma-async-2", "mma-async-3",
         "mma-async-4", "mma-async-6", "mma-no-scales", "mma-128", "mma-block-cols")
TIMING_ONLY = ("mma-no-scales",)
"""Forms that leave work out to time the rest: their results are not checked."""
ROWS = 16 * WARPS  # rows per loop iteration of a program


def column_of(kd):
    """The state column whose code the mma kernel puts at operand row ``kd`` (0..127).

    ``kd``'s bits: 0 the fp16 half of a pair register (nibble m or m + 4 of a word), 1-2
    the lane's word quarter ``c``, 3 and 4 the pair index ``m = i + 2j``, 5-6 the word
    within the thread's four; see ``_mma_kernel``'s joins, reshape and permute."""
    half = kd & 1
    c = (kd >> 1) & 3
    i = (kd >> 3) & 1
    j = (kd >> 4) & 1
    wslot = (kd >> 5) & 3
    word = c * 4 + wslot
    return word * 8 + (i + 2 * j) + 4 * half


# the library's word decode (``kernels/tl_dots.py``: each E2M1 code of an int32 word as
# the fp16 bits of its value times 2**-14, nibbles j and j + 4 in one pair), compiled as
# Gluon for the tensor-core form
_e2m1_pairs = gluon.jit(e2m1_word_pairs.fn)


@gluon.jit
def _scaled_half(p, s16, HIGH: gl.constexpr, SCALED: gl.constexpr):
    """One fp16 half of int32 pairs ``p``, times its block scale ``s16`` if ``SCALED``."""
    if HIGH:
        h = (p >> 16).to(gl.int16)
    else:
        h = (p & 0xFFFF).to(gl.int16)
    if SCALED:
        return h.to(gl.float16, bitcast=True) * s16
    else:
        return h.to(gl.float16, bitcast=True)


@gluon.jit
def _halves_joined(e04, e15, e26, e37, s16, HIGH: gl.constexpr, SCALED: gl.constexpr):
    """(rows, words, j, i): the low (or high) halves of the four pairs, nibble i + 2j."""
    return gl.join(gl.join(_scaled_half(e04, s16, HIGH, SCALED),
                           _scaled_half(e26, s16, HIGH, SCALED)),
                   gl.join(_scaled_half(e15, s16, HIGH, SCALED),
                           _scaled_half(e37, s16, HIGH, SCALED)))


@gluon.jit
def _mma_kernel(words_ptr, scales_ptr, s2_ptr, c_ptr, y_ptr, H_PER_G: gl.constexpr,
                P: gl.constexpr, GROUPS: gl.constexpr, WARPS_: gl.constexpr,
                PREFETCH: gl.constexpr, SPLIT_: gl.constexpr = 1, STAGES: gl.constexpr = 0,
                AHEAD2: gl.constexpr = False, SCALES: gl.constexpr = True,
                TWO_M: gl.constexpr = False, BLOCK_COLS: gl.constexpr = False):
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[WARPS_, 1],
                                                  instr_shape=[16, 8])
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_op: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    if TWO_M:  # 128-row tiles: each warp's fragments hold two 16-row blocks, 64 rows apart
        WL: gl.constexpr = gl.DistributedLinearLayout(
            reg_bases=[[0, 1], [0, 2], [8, 0], [64, 0]],
            lane_bases=[[0, 4], [0, 8], [1, 0], [2, 0], [4, 0]],
            warp_bases=[[16, 0], [32, 0]], block_bases=[], shape=[128, 16])
        R: gl.constexpr = 32 * WARPS_
    else:
        WL: gl.constexpr = gl.DistributedLinearLayout(
            reg_bases=[[0, 1], [0, 2], [8, 0]],
            lane_bases=[[0, 4], [0, 8], [1, 0], [2, 0], [4, 0]],
            warp_bases=[[16, 0], [32, 0]], block_bases=[], shape=[64, 16])
        R: gl.constexpr = 16 * WARPS_
    pid = gl.program_id(0) // SPLIT_  # (sequence, group); SPLIT_ programs share its rows
    part = gl.program_id(0) % SPLIT_
    b = pid // GROUPS
    g = pid % GROUPS
    # B operand: c's fp16 head and remainder as columns 0 and 1, rows in fragment order
    kd = gl.arange(0, 128, layout=gl.SliceLayout(1, b_op))
    n = gl.arange(0, 8, layout=gl.SliceLayout(0, b_op))
    col = ((kd >> 1) & 3) * 32 + ((kd >> 5) & 3) * 8 + ((kd >> 3) & 1) + 2 * ((kd >> 4) & 1) \
        + 4 * (kd & 1)  # column_of(kd)
    cv = gl.load(c_ptr + pid * 128 + col) * 1024.0
    hi = cv.to(gl.float16)
    lo = (cv - hi.to(gl.float32)).to(gl.float16)
    zero = gl.zeros_like(hi)
    nn = gl.expand_dims(n, 0)
    if BLOCK_COLS:  # column n: c's head (Bm) and remainder (Bl) on block n's rows only
        own = gl.expand_dims(col // 16, 1) == nn
        Bm = gl.where(own, gl.expand_dims(hi, 1), gl.expand_dims(zero, 1))
        Bl = gl.where(own, gl.expand_dims(lo, 1), gl.expand_dims(zero, 1))
    else:
        Bm = gl.where(nn == 0, gl.expand_dims(hi, 1),
                      gl.where(nn == 1, gl.expand_dims(lo, 1), gl.expand_dims(zero, 1)))
    rows = gl.arange(0, R, layout=gl.SliceLayout(1, WL))
    wcol = gl.arange(0, 16, layout=gl.SliceLayout(0, WL))
    out_rows = gl.arange(0, R, layout=gl.SliceLayout(1, mma))
    out_cols = gl.arange(0, 8, layout=gl.SliceLayout(0, mma))
    TOTAL_: gl.constexpr = H_PER_G * P // SPLIT_
    base_row = (b * (GROUPS * H_PER_G) + g * H_PER_G) * P + part * TOTAL_
    ITERS: gl.constexpr = TOTAL_ // R
    wofs = gl.expand_dims(rows, 1) * 16 + gl.expand_dims(wcol, 0)
    sofs = gl.expand_dims(rows, 1) * 8 + gl.expand_dims(wcol // 2, 0)
    if BLOCK_COLS:  # the block scales where the accumulator holds the block dots
        sofs = gl.expand_dims(out_rows, 1) * 8 + gl.expand_dims(out_cols, 0)
    w_next = gl.load(words_ptr + base_row * 16 + wofs)
    sc_next = gl.load(scales_ptr + base_row * 8 + sofs)
    if AHEAD2:  # two tiles' loads in flight ahead of the one being multiplied
        w_next2 = gl.load(words_ptr + (base_row + R) * 16 + wofs)
        sc_next2 = gl.load(scales_ptr + (base_row + R) * 8 + sofs)
    if STAGES > 0:  # the words through a ring of STAGES shared-memory tiles (cp.async)
        buf = gl.allocate_shared_memory(gl.int32, [STAGES, R, 16],
                                        gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
        for s in gl.static_range(STAGES - 1):
            async_copy.async_copy_global_to_shared(buf.index(s),
                                                   words_ptr + (base_row + s * R) * 16 + wofs)
            async_copy.commit_group()
    for it in range(ITERS):
        r0 = base_row + it * R
        if STAGES > 0:
            nxt = it + STAGES - 1  # a stage consumed last iteration (the tail copies again)
            async_copy.async_copy_global_to_shared(
                buf.index(nxt % STAGES),
                words_ptr + (base_row + gl.minimum(nxt, ITERS - 1) * R) * 16 + wofs)
            async_copy.commit_group()
            async_copy.wait_group(STAGES - 1)
            w = buf.index(it % STAGES).load(WL)  # the rows this thread copied itself
            sc = sc_next
            rn = base_row + gl.minimum(it + 1, ITERS - 1) * R
            sc_next = gl.load(scales_ptr + rn * 8 + sofs)
        elif AHEAD2:
            w = w_next
            sc = sc_next
            w_next = w_next2
            sc_next = sc_next2
            rn = base_row + gl.minimum(it + 2, ITERS - 1) * R
            w_next2 = gl.load(words_ptr + rn * 16 + wofs)
            sc_next2 = gl.load(scales_ptr + rn * 8 + sofs)
        elif PREFETCH:
            w = w_next
            sc = sc_next
            # the next rows' loads go out before this tile's work (the last reloads itself)
            rn = base_row + gl.minimum(it + 1, ITERS - 1) * R
            w_next = gl.load(words_ptr + rn * 16 + wofs)
            sc_next = gl.load(scales_ptr + rn * 8 + sofs)
        else:
            w = gl.load(words_ptr + r0 * 16 + wofs)
            sc = gl.load(scales_ptr + r0 * 8 + sofs)
        if not SCALES:  # timing only: every block scale 1.0, no scale bytes read
            sc = gl.full([R, 16], 0x38, gl.uint8, layout=WL)
        if BLOCK_COLS:
            s16 = gl.full([R, 16], 1.0, gl.float16, layout=WL)  # not used
        else:
            s16 = sc.to(gl.float8e4nv, bitcast=True).to(gl.float16)
        e04, e15, e26, e37 = _e2m1_pairs(w)
        xs = gl.join(_halves_joined(e04, e15, e26, e37, s16, False, not BLOCK_COLS),
                     _halves_joined(e04, e15, e26, e37, s16, True, not BLOCK_COLS))
        # xs: (R, 16, j, i, half): nibble i + 2j + 4 half of the word
        # k = word * 8 + j * 4 + i * 2 + half, word = c * 4 + wslot; the operand's k
        # bits: half, c (the lane's quarter), i, j, wslot (see column_of)
        x8 = gl.reshape(xs, [R, 2, 2, 2, 2, 2, 2, 2])
        x8 = gl.permute(x8, [0, 3, 4, 5, 6, 1, 2, 7])
        A = gl.convert_layout(gl.reshape(x8, [R, 128]), a_op, assert_trivial=True)
        acc = mma_v2(A, Bm, gl.zeros([R, 8], gl.float32, layout=mma))
        if BLOCK_COLS:  # acc[r, n]: row r's dot over block n, times its scale
            acc = mma_v2(A, Bl, acc)
            yv = gl.sum(acc * sc.to(gl.float8e4nv, bitcast=True).to(gl.float32), axis=1)
        else:
            yv = gl.sum(gl.where(gl.expand_dims(out_cols, 0) < 2, acc, 0.0), axis=1)
        orow = r0 + out_rows
        s2 = gl.load(s2_ptr + orow // P)
        gl.store(y_ptr + orow, yv * (s2 * (16384.0 / 1024.0)))


@triton.jit
def _fma_kernel(words_ptr, scales_ptr, s2_ptr, c_ptr, y_ptr, H_PER_G: tl.constexpr,
                P: tl.constexpr, GROUPS: tl.constexpr, R: tl.constexpr):
    pid = tl.program_id(0)
    b = pid // GROUPS
    g = pid % GROUPS
    wcol = tl.arange(0, 16)
    rows = tl.arange(0, R)
    # c at the columns of each nibble j of every word
    c0 = tl.load(c_ptr + pid * 128 + wcol * 8 + 0)
    c1 = tl.load(c_ptr + pid * 128 + wcol * 8 + 1)
    c2 = tl.load(c_ptr + pid * 128 + wcol * 8 + 2)
    c3 = tl.load(c_ptr + pid * 128 + wcol * 8 + 3)
    c4 = tl.load(c_ptr + pid * 128 + wcol * 8 + 4)
    c5 = tl.load(c_ptr + pid * 128 + wcol * 8 + 5)
    c6 = tl.load(c_ptr + pid * 128 + wcol * 8 + 6)
    c7 = tl.load(c_ptr + pid * 128 + wcol * 8 + 7)
    base_row = (b * (GROUPS * H_PER_G) + g * H_PER_G) * P
    TOTAL: tl.constexpr = H_PER_G * P
    for it in tl.range(TOTAL // R, num_stages=3):
        r0 = base_row + it * R
        roff = (r0 + rows)[:, None]
        w = tl.load(words_ptr + roff * 16 + wcol[None, :])
        sc = tl.load(scales_ptr + roff * 8 + (wcol // 2)[None, :])
        s = sc.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        e04, e15, e26, e37 = e2m1_word_pairs(w)
        acc = _pair_dot(e04, c0, c4)
        acc += _pair_dot(e15, c1, c5)
        acc += _pair_dot(e26, c2, c6)
        acc += _pair_dot(e37, c3, c7)
        yv = tl.sum(acc * s, axis=1)
        orow = r0 + rows
        s2 = tl.load(s2_ptr + orow // P)
        tl.store(y_ptr + orow, yv * (s2 * 16384.0))


@triton.jit
def _pair_dot(p, clo, chi):
    lo = (p & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    hi = (p >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return lo * clo[None, :] + hi * chi[None, :]


# ------------------------------------------------------------------ host side

def tiles_per_group(model: str) -> int:
    """64-row tiles of a B/C group's (key head's) rows: a program's loop trips."""
    heads, p, _, groups = SHAPES[model]
    return heads // groups * p // ROWS


def make_state(model: str, batch: int, device: str, seed: int = 0):
    heads, p, n, groups = SHAPES[model]
    gen = torch.Generator(device="cpu").manual_seed(seed)
    rows = batch * heads * p
    words = torch.randint(-2**31, 2**31 - 1, (rows, n // 8), generator=gen, dtype=torch.int64)
    words = words.to(torch.int32)
    scales = torch.randint(0x08, 0x70, (rows, n // 16), generator=gen, dtype=torch.int64)
    scales = scales.to(torch.uint8)
    s2 = torch.rand(batch * heads, generator=gen) * 1e-3 + 1e-4
    c = torch.randn(batch * groups, n, generator=gen)
    return [t.to(device) for t in (words, scales, s2, c)]


def reference(model, batch, words, scales, s2, c):
    """float64 ``s2 * (S @ c)`` of the state as ``precisionlab.formats`` decodes it (rows
    of all matrices), and ``sum |S c|`` per row, the scale of the errors."""
    heads, p, n, groups = SHAPES[model]
    mats = words.shape[0] // p
    packed = formats.Packed("nvfp4", words.view(torch.uint8).reshape(mats, p, n // 2),
                            (mats, p, n), {"block": scales.reshape(mats, p, n // 16),
                                           "matrix": s2.reshape(mats, 1, 1)})
    S = formats.get("nvfp4").decode(packed).double().reshape(mats * p, n)
    mat = torch.arange(S.shape[0], device=S.device) // p
    cg = c.double()[(mat // heads) * groups + (mat % heads) // (heads // groups)]
    return (S * cg).sum(dim=1), (S.abs() * cg.abs()).sum(dim=1)


def launch(kind, model, batch, words, scales, s2, c, y):
    heads, p, n, groups = SHAPES[model]
    grid = (batch * groups,)
    if kind.startswith("mma"):
        split = int(kind.rpartition("/")[2]) if "/" in kind else 1
        stages = int(kind.rpartition("-")[2]) if kind.startswith("mma-async-") else 0
        _mma_kernel[(batch * groups * split,)](
            words, scales, s2, c, y, H_PER_G=heads // groups, P=p, GROUPS=groups,
            WARPS_=WARPS,
            PREFETCH=kind.startswith("mma-prefetch") or kind in ("mma-128", "mma-block-cols"),
            SPLIT_=split,
            STAGES=stages, AHEAD2=kind == "mma-ahead2", SCALES=kind != "mma-no-scales",
            TWO_M=kind == "mma-128", BLOCK_COLS=kind == "mma-block-cols", num_warps=WARPS)
    else:
        _fma_kernel[grid](words, scales, s2, c, y, H_PER_G=heads // groups, P=p,
                          GROUPS=groups, R=ROWS, num_warps=WARPS)


def time_graph(fn, reps: int = 20, rounds: int = 5) -> float:
    """us per launch: one CUDA graph of ``reps`` back-to-back launches (``timing.capture``),
    the median of ``rounds`` replays."""
    from precisionlab.timing import capture

    step = capture(lambda: [fn() for _ in range(reps)])
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step.graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / reps)
    return sorted(times)[len(times) // 2]


def read_rate(words: torch.Tensor, scales: torch.Tensor) -> dict:
    """The library's read-bandwidth probe (``kernels/bandwidth.py``) over as many bytes
    as the codes and block scales, timed as the products are: what a plain streaming
    read of a launch of this size reaches."""
    from precisionlab.kernels.bandwidth import programs, read_launch

    flat = torch.empty((words.numel() * 4 + scales.numel() + 3) // 4, device=words.device)
    part = torch.empty(programs(flat.numel()), device=words.device)
    us = time_graph(functools.partial(read_launch, flat, part))
    return {"us": us, "tb_s": flat.numel() * 4 / 1e6 / us}


def run_gpu(models, batches, out, kinds=None):
    results = []
    bad = False
    for model in models:
        for batch in batches:
            words, scales, s2, c = make_state(model, batch, "cuda")
            ref, scale = reference(model, batch, words, scales, s2, c)
            row = {"model": model, "batch": batch,
                   "state_mb": (words.numel() * 4 + scales.numel()) / 1e6}
            tiles = tiles_per_group(model)
            splits = [f"mma-prefetch/{k}" for k in (2, 3) if tiles % k == 0]
            default = [k for k in KINDS if k != "mma-128" or tiles % 2 == 0] + splits
            for kind in kinds or default:
                y = torch.empty(words.shape[0], device="cuda")
                launch(kind, model, batch, words, scales, s2, c, y)
                torch.cuda.synchronize()
                err = ((y.double() - ref).abs() / scale.clamp_min(1e-30)).max().item()
                us = time_graph(functools.partial(launch, kind, model, batch, words, scales,
                                                  s2, c, y))
                row[kind] = {"max_rel_err": err, "us": us, "tb_s": row["state_mb"] / us,
                             "checked": kind not in TIMING_ONLY}
                bad = bad or (not err <= 1e-5 and kind not in TIMING_ONLY)
                check = "timing only, not checked" if kind in TIMING_ONLY else "of sum |S c|"
                print(f"{model} b{batch} {kind}: {us:.1f} us, max error {err:.2e} ({check})",
                      flush=True)
            row["read"] = read_rate(words, scales)
            print(f"{model} b{batch} the library's read probe over the same bytes: "
                  f"{row['read']['us']:.1f} us ({row['read']['tb_s']:.2f} TB/s)", flush=True)
            results.append(row)
    text = json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "triton": triton.__version__, "rows": results}, indent=1)
    if out:
        tmp = Path(out).with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(out)
    return 1 if bad else 0


def sass_counts(model: str):
    """sm_90 SASS of both kernels (no GPU): instructions per loop body and in all."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.experimental.gluon._runtime import GluonASTSource

    heads, p, n, groups = SHAPES[model]
    perm = sorted(column_of(k) for k in range(n)) == list(range(n))
    print(f"operand rows name every column once: {perm}")
    target = GPUTarget("cuda", 90, 64)
    sig = {"words_ptr": "*i32", "scales_ptr": "*u8", "s2_ptr": "*fp32", "c_ptr": "*fp32",
           "y_ptr": "*fp32"}
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(5)}
    common = {"H_PER_G": heads // groups, "P": p, "GROUPS": groups}
    mma_sig = {**sig, **{name: "constexpr" for name in (
        "H_PER_G", "P", "GROUPS", "WARPS_", "PREFETCH", "SPLIT_", "STAGES", "AHEAD2", "SCALES",
        "TWO_M", "BLOCK_COLS")}}
    mma_args = {**common, "WARPS_": WARPS, "PREFETCH": True, "SPLIT_": 1, "STAGES": 0,
                "AHEAD2": False, "SCALES": True, "TWO_M": False, "BLOCK_COLS": False}
    srcs = {
        "mma": GluonASTSource(_mma_kernel, mma_sig, mma_args, attrs),
        "mma-block-cols": GluonASTSource(_mma_kernel, mma_sig,
                                         {**mma_args, "BLOCK_COLS": True}, attrs),
        "fma": ASTSource(_fma_kernel, {**sig, "H_PER_G": "constexpr", "P": "constexpr",
                                       "GROUPS": "constexpr", "R": "constexpr"},
                         {**common, "R": ROWS}, attrs),
    }
    if tiles_per_group(model) % 2 == 0:  # a group's rows in 128-row tiles
        srcs["mma-128"] = GluonASTSource(_mma_kernel, mma_sig, {**mma_args, "TWO_M": True},
                                         attrs)
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    counts = {}
    for kind, src in srcs.items():
        k = triton.compile(src, target=target, options={"num_warps": WARPS})
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(k.asm["cubin"])
            f.flush()
            sass = subprocess.run([str(cuobjdump), "-sass", f.name], capture_output=True,
                                  text=True, check=True).stdout
            res = subprocess.run([str(cuobjdump), "-res-usage", f.name], capture_output=True,
                                 text=True, check=True).stdout
        ops = re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass)
        ops = [o for o in ops if o != "NOP"]
        hist: dict[str, int] = {}
        for o in ops:
            hist[o.split(".")[0]] = hist.get(o.split(".")[0], 0) + 1
        usage = re.findall(r"(REG:\d+|STACK:\d+|SHARED:\d+|LOCAL:\d+)", res)
        counts[kind] = {"instructions": len(ops), "resources": " ".join(usage),
                        "top": sorted(hist.items(), key=lambda t: -t[1])[:14]}
        print(kind, counts[kind])
    return counts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=DEFAULT_MODELS, choices=list(SHAPES),
                    help="state shapes (GDN: S q per value head, q per key head)")
    ap.add_argument("--batches", nargs="+", type=int, default=[256])
    ap.add_argument("--out", default=None, help="JSON file of the checks and timings")
    ap.add_argument("--sass", action="store_true", help="sm_90 SASS counts, no GPU")
    ap.add_argument("--kinds", nargs="+", default=None, metavar="KIND",
                    help="only these forms (" + ", ".join(KINDS) + ", mma-prefetch/K), "
                    "e.g. under a profiler")
    args = ap.parse_args(argv)
    if min(args.batches) < 1:
        ap.error("--batches must be >= 1")
    for kind in args.kinds or ():
        base, _, k = kind.partition("/")
        if base not in KINDS or (k and not (base == "mma-prefetch" and k.isdigit()
                                            and int(k) >= 1)):
            ap.error(f"--kinds: unknown form {kind!r}")
        for model in args.models if k or base == "mma-128" else ():
            tiles = tiles_per_group(model)
            if tiles % int(k or 2):
                ap.error(f"--kinds {kind}: {model}'s {tiles} tiles per group do not split "
                         f"{k or 2} ways")
    if args.out and not Path(args.out).resolve().parent.is_dir():
        ap.error(f"--out: no directory {Path(args.out).parent}")
    if args.sass:
        sass_counts(args.models[0])
        return 0
    if not torch.cuda.is_available():
        print("probe_nvfp4_mma.py: needs a CUDA GPU (or --sass)", file=sys.stderr)
        return 2
    return run_gpu(args.models, args.batches, args.out, args.kinds)


if __name__ == "__main__":
    sys.exit(main())

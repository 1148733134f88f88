"""Launch defaults of the Gated DeltaNet kernels (host side): the conventional step's
programs (:func:`default_config`) and a replay cache's launch configuration by batch
size and formats (:func:`replay_defaults`), each rule with the H200 timings that picked
it.  :class:`gdn_decode.GDNReplayCache` resolves its keywords against these."""

from __future__ import annotations

import triton

from .read_encode import encodes_apart
from .state import DENSE_FORMATS


def default_config(batch: int, v_heads: int, V: int, K: int,
                   fmt: str | None = None) -> tuple[int, int]:
    """``(BV, num_warps)`` of the conventional kernel for a state of format ``fmt``:
    rows of V per program and warps.  An nvfp4 state takes BV = V: its matrix scale
    needs the whole (V, K) matrix in one program.  An fp32 state takes 8-row one-warp
    programs, the configuration the benchmark has timed against fla since its first
    run (H200: 1.45x at batch 256; thirty-second run, qwen3.5-4b at batch 1, block
    timing 7.0 us, 1.06x, where the 16-row 2-warp programs this rule gave before took
    7.65 us, 0.98x in paired rounds)."""
    if fmt == "fp32":
        return min(V, 8), 1
    bv = V if fmt == "nvfp4" else min(V, 32 if batch * v_heads >= 1024 else 16)
    return bv, triton.next_power_of_2(max(1, min(16, bv * K // 1024)))


_MMA_KINDS = {"fp8-e4m3": 1, "nvfp4": 1, "fp32": 2}
"""Copies whose output tiles can be read by tensor-core products (``out_mma``) and
the prep launch's form of k and q for them (``gdn_step._prep_kernel``'s ``MMA``)."""
_OUT_CFG = {"fp32": (32, 2, 1, 1), "fp8-e4m3": (128, 2, 2, 2), "nvfp4": (128, 2, 4, 2),
            "mxfp4": (64, 2, 1, 1)}
"""Staged output launch by the format it reads: rows per tile, warps, tiles per program
(at most a k-head group's), pipeline stages (fp8 and nvfp4 copies: tensor-core row sums,
``out_mma``).  nvfp4 tiles decoded from words (sixteenth H200 run, qwen3.5-122b output
step us): 4 tiles per program 96.5 / 98.3 / 98.2 against 99.5 / 100.3 / 100.2 with 2; fp8
copies lost with 4 (112.7 / 113.8 against 111.2 / 110.8).  fp32 copies in 32-row tiles of
2 warps (thirty-sixth run, qwen3.5-4b replay fp32, us per step, three alternating
pairs, evict-first tile loads and evict-last prep rows on): 168.4-168.8 against
170.0-171.1 with 16-row one-warp tiles; 64 rows of 2 warps 168.2, 32 rows of 1 warp
174.5."""


def replay_defaults(batch: int, k_heads: int, v_heads: int, V: int, K: int, checkpoint: str,
                    read: str | None, read_encode: str | None = None,
                    ring_rows: int = 16) -> dict:
    """Launch configuration of a replay cache by batch size, formats and ring rows (keywords of
    :class:`GDNReplayCache`).  Small batches: one fused launch of 16-row programs (ring
    tiles loaded eagerly).  Large batches (batch * v_heads >= 1024): "staged" -- a
    persistent flush launch (whole-head units folded in 16-row chunks, 2-stage
    pipeline; as many programs as fit at once under its register cap), a prep launch
    (one program per sequence and k-head) and an output launch of tiles by the copy's
    format (:data:`_OUT_CFG`: 32 rows of 2 warps for fp32, 128-row tensor-core tiles
    for fp8 and nvfp4; many resident programs, each waiting only for the slot index
    and the ring position before all its loads); verify "staged-dot" (16-row
    tiles, 1 warp: every draft's reductions of a tile as one tensor-core product);
    integer-rounding encoders in the flushes; an nvfp4 flush keeps its first pass's
    fp32 rows in a per-program scratch instead of folding twice.  Picked from sweeps on
    an H200 (qwen3.5-4b, batch 256, L = 16: verify 593 -> 328 us; the flush launch
    capped at 128 registers, 4 programs per SM: nvfp4 split 225 -> 166 us per step, fp8
    split 171 -> 165); the staged prep launch uses plain (masked) ring loads (14.8 vs
    16.3 us eager); batch-1 verify programs of 4 warps (18.8 against 22.2 us with 2).
    The units flush grid (one program per unit) flushes faster, but on the main stream
    its launch costs every output step ~14 us when nothing flushes.  On a GPU the staged flush
    launch runs on a second stream beside the prep and output launches
    (``concurrent_flush``: its empty launch leaves the critical path; 158.8 -> 154.5
    us per fp8 split step, 204.0 -> 201.5 replay fp32).  With the flush off the
    critical path, the last sweep (same session) picked one-warp prep programs (fp8
    156.8 -> 155.0 us per step), loop-invariant code motion in the flush's chunk loop
    (fp8 -> 154.0, fp32 202.3 -> 201.3), each within ~2%, and for nvfp4 copies the
    units grid (164.3 -> 161.4), which stays opt-in: its scratch pass keeps one fp32
    block per unit of every slot, a full fp32 copy of the state (537 MB at batch 256,
    qwen3.5-4b) against 34 MB for the persistent grid's per-program blocks.  The flush
    prefetches the next chunk into L2 (eighth run, flush us: fp32 805 -> 784, fp8 1090
    -> 1055; nvfp4 1256 -> 1264, so not there).  A dense checkpoint's chunks come by TMA
    (``flush_tma``; tenth run, flush us, 4-warp programs: fp8 1096 -> 999 with 168
    registers, 3 per SM and 3 stages, fp32 802 -> 780; nvfp4 1309 -> 1322, so not
    there; at 128 registers, 4 per SM, TMA spilled and lost: fp8 1085, fp32 854), which
    also frees the registers the loads held, so fewer warps per program pay: the
    replay fp32 and fp8-copy flushes in 1-warp programs (255 registers, 8 per SM, one
    stage: fp32 467 us, fp8 743; fp8 in 2-warp programs, 4 per SM, 3 stages: 845;
    offline sm_90 warp-instructions per 16-row chunk: fp32 2768 -> 1178, fp8 5080 ->
    3057).  The fp8 copy is encoded by the hardware conversion (``hw_fp8``; eleventh
    run: fp8 flush 749 -> 609 us, 132.3 -> 122.8 us per step); with it, two stages
    lost (742 us), as did TMA-loaded nvfp4 flushes in 1- or 2-warp programs (1353 /
    1324 against 1312 us) and 2 or 3 stages for fp32 (570 / 555 against 468).  Twelfth
    run (same-process timings, qwen3.5-4b / 122b): the window's deltas by split tf32
    tensor-core passes instead of fp32 FMAs and the fp32 checkpoint stored by TMA
    (fp32 flush 476 -> 411 / 934 -> 843 us, fp8 616 -> 549), the triangular system by
    forward substitution in one-warp flush programs (fp32 410 -> 383 / 841 -> 754,
    fp8 551 -> 494), the fp8 encoder's finite-tile path (fp8 493 -> 467 / 965 -> 915);
    re-timed then, two chunks of L2 prefetch (415 / 525 against 381 / 482 us), none
    (419) or two stages at 6 per SM (392 / 531) still lost.  An fp8 copy's output
    tiles are read by tensor-core products (``out_mma``; thirteenth run, qwen3.5-4b /
    122b, output step us): with 16-row 1-warp tiles 89.4 -> 90.8 / 160.6 -> 159.2, so
    its instructions (818 -> 462 per tile, offline sm_90) were not what held it back,
    but with fewer instructions per row larger programs pay: 128-row tiles of 2 warps,
    two per program in a 2-stage pipeline, 68.5 / 111.2 (64-row 2-warp tiles 74.5 /
    129.4; 128-row 2-warp tiles alone 74.7 / 122.4).  An nvfp4 copy's tiles the same
    way: 84.7 -> 82.5 / 150.4 -> 142.1 (64-row 2-warp tiles, the CUDA-core default
    before, 85.6 / 149.4 with tensor-core sums).  fp32 tiles by two tf32 passes lost
    (161.2 -> 182.5 us, 119 registers per thread).  Nineteenth run (flush us, qwen3.5-4b /
    122b, one process): the ring v rows loaded a chunk ahead (``flush_ring_ahead``) in
    the single-pass chunk loop, fp32 382 -> 372 / 744 -> 732, fp8 466 -> 445 / 902 ->
    895; flush programs that claim their units from a counter (``flush_grid="dynamic"``)
    where there is a read copy, fp8 (with the ring ahead) 443 / 870, nvfp4 1162 -> 1049
    / 2399 -> 2303, but not for a shared fp32 checkpoint (403 / 771).  Twenty-first run:
    an fp32 checkpoint's nvfp4 or mxfp4 read copy encoded by a launch of its own
    (``read_encode="launch"``; the flush launch then takes the settings of a flush
    without a read copy), qwen3.5-4b / 122b us per step: nvfp4 110.9 -> 102.0 / 203.2
    -> 179.2, mxfp4 139.4 -> 116.5 / 256.8 -> 209.3."""
    whole = "nvfp4" in (checkpoint, read)
    if batch * v_heads < 1024:
        # 16-row programs.  An nvfp4 copy: 16-row programs (each flushes its rows, the
        # last of a head's to post its amax encodes the copy) on grids of at most 512
        # of them, else whole-matrix programs (H200, us per step, against the parent
        # tree whose head's first program flushed the whole matrix: batch 1 qwen3.5-4b
        # 12.2 -> 9.0, qwen3.5-122b 15.0-15.8 -> 10.3 against 13.6-14.0 with 128-row
        # programs; batch 4 16-row programs lost, 14.9 / 22.2 against 13.9 / 16.5)
        bv = min(V, 16)
        if whole and batch * v_heads * (V // bv) > 512:
            bv = V
        # warps per program by grid size (H200, us per step, L = 16).  fp32 tiles: 2
        # warps once the grid passes 384 programs (178 registers, 5 per SM, against 3 of
        # 4 warps at 136: qwen3.5-122b batch 1 12.1-12.2 -> 9.6-9.9, batch 4 25.2 ->
        # 22.1, qwen3.5-4b batch 4 16.2 -> 14.0), 8 below (qwen3.5-4b batch 1: faster
        # than 4 in eight paired timings, 8.25-8.43 -> 7.92-8.39).  An fp8 copy of an fp32
        # checkpoint: 1 warp once the grid passes 384 programs (255 registers;
        # qwen3.5-122b batch 1 9.23-9.25 -> 8.68-8.82, batch 4 19.8-20.0 -> 17.9-18.1,
        # batch 12 45.3-45.4 -> 38.5-38.6; qwen3.5-4b batch 4 13.3 -> 12.8-13.1, batch 12
        # 26.5 -> 22.9-23.1), else 4 (qwen3.5-4b batch 1: 7.67-8.21 against 7.79-8.45
        # with 2)
        programs = batch * v_heads * (V // bv)
        big = programs > 384
        if (read or checkpoint) == "fp32":
            nw = 2 if big else 8
        elif read == "fp8-e4m3" and checkpoint == "fp32":
            # past 32 ring rows (``ring_rows``: window plus drafts), 4 warps as for the
            # other copies: one warp holds the flush's whole (64, 64) triangular system,
            # whose code then took 18-21 s to compile for sm_90 (37,004 PTX lines against
            # 13,915 for an fp16-sr checkpoint's 4-warp programs; qwen3.5-4b, batch 2)
            nw = 1 if big and ring_rows <= 32 else 4
        else:
            nw = 4
        # 4-warp programs on a grid past 384: capped at 128 registers, 4 per SM (with the
        # step's inputs loaded beside the slot index, qwen3.5-122b's nvfp4 programs took
        # 168 and 3 per SM: 9.8 -> 11.4 us per step at batch 1; at 128, no spills)
        mr = 128 if big and nw == 4 else None
        return dict(launch="fused", block_v=bv, num_warps=nw, maxnreg=mr,
                    tiles_per_program=1, stages=1, flush_chunk=min(bv, 16), flush_stages=1,
                    out_maxnreg=None, verify_maxnreg=None, prep_maxnreg=None,
                    flush_ctas_per_sm=4,
                    out_block_v=min(V, 16), out_num_warps=2, out_tiles_per_program=1,
                    out_stages=1, verify_block_v=min(V, 16), verify_num_warps=4,
                    verify_stages=1, eager=True, prep_num_warps=2,
                    verify_launch="single", flush_licm=False, flush_grid="persistent",
                    flush_pass="recompute", fast_encode=True, concurrent_flush=False,
                    flush_prefetch=0, flush_tma=False, hw_fp8=False,
                    out_mma=False, out_evict=False, prep_keep=False, prep_release=False,
                    flush_ring_ahead=False,
                    flush_evict=False,
                    read_encode="flush")
    if read_encode is None:
        read_encode = "launch" if encodes_apart(checkpoint, read) else "flush"
    # the flush launch's settings follow what it writes: without the read copy where a
    # launch of its own encodes that (``read_encode="launch"``)
    fread = None if read_encode == "launch" else read
    fwhole = "nvfp4" in (checkpoint, fread)
    out_fmt = read or checkpoint
    obv, onw, otpp, ons = _OUT_CFG.get(out_fmt, (16, 1, 1, 1))
    # tensor-core row sums of pipelined tiles (fp8, nvfp4); the others' plain tile loads
    # stream evict-first (out_evict)
    mma = out_fmt in ("fp8-e4m3", "nvfp4")
    obv = min(V, obv)
    while (v_heads // k_heads * (V // obv)) % otpp:  # tiles of a k-head group
        otpp //= 2
    # TMA chunk loads for a dense checkpoint, with an nvfp4 read copy in 1-warp programs
    # (seventeenth run, flush us against 4-warp programs with plain loads, in one process:
    # qwen3.5-4b 1128 / 1147 / 1148 against 1203-1213; qwen3.5-122b 2381 / 2475 / 2447
    # against 2384-2419, so then only up to 8192 units, batch x v-heads; nineteenth run,
    # with the dynamic flush grid, qwen3.5-122b 2220 / 2228 against 2297-2314)
    tma = checkpoint in DENSE_FORMATS
    # flush programs that claim their units from a counter where the flush writes a read
    # copy, or a stochastically rounded 16-bit checkpoint, whose units are slow (twenty-
    # fourth run, fp16-sr checkpoint, nvfp4 copy by the encode launch, us per step (flush
    # us), three alternating pairs: qwen3.5-4b 108.4-109.4 (779-807) -> 107.3-107.8
    # (766-769), qwen3.5-122b 188.4-190.9 (1551-1573) -> 186.7 (1511-1512); an fp32
    # checkpoint alone lost: 173.2 / 174.5 (373 / 372) -> 174.7 (383))
    sr16 = checkpoint in ("fp16-sr", "bf16-sr")
    # flush programs (warps, registers, programs per SM, pipeline stages)
    if tma and fread in (None, "fp8-e4m3", "nvfp4"):
        fw, fr, fc, fs = 1, 255, 8, 1
    elif tma:
        fw, fr, fc, fs = 4, 168, 3, 2
    else:
        fw, fr, fc, fs = 4, 128, 4, 2
    return dict(launch="staged", block_v=V, num_warps=fw, maxnreg=fr,
                tiles_per_program=1, stages=1, flush_chunk=16, flush_stages=fs, out_maxnreg=0,
                verify_maxnreg=0, prep_maxnreg=0, flush_ctas_per_sm=fc,
                out_block_v=obv, out_num_warps=onw, out_tiles_per_program=otpp,
                out_stages=ons if otpp > 1 else 1, verify_block_v=min(V, 16),
                verify_num_warps=1, verify_stages=2,
                eager=False, prep_num_warps=1, verify_launch="staged-dot",
                flush_licm=not fwhole, flush_grid="dynamic" if fread or sr16 else "persistent",
                flush_pass="scratch", fast_encode=True, concurrent_flush=True,
                flush_prefetch=0 if fwhole else 1, flush_tma=tma,
                hw_fp8=read == "fp8-e4m3", out_mma=mma, out_evict=not mma, prep_keep=True,
                prep_release=True,
                flush_ring_ahead=not fwhole, flush_evict=fread == "fp8-e4m3",
                read_encode=read_encode)

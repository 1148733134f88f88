"""Fused Triton kernels for Gated DeltaNet decoding: conventional step, replay
(output steps and flushes), speculative verify of T drafts and commit.

Every kernel takes the raw per-step inputs (``q``, ``k`` per k-head, ``v`` per
v-head, gate pre-activations ``a``, ``b``) and does the layer's preprocessing in
fp32: L2-normalise q and k (q scaled by ``K**-0.5``), round k and v to the ring
dtype (the values the ring stores; the step uses them everywhere),
``g = -exp(A_log) softplus(a + dt_bias)``, ``beta = sigmoid(b)``.

Sequences index state slots through ``state_indices`` (a negative index skips the
sequence).

This module holds the host side (:class:`GDNReplayCache`, :func:`conventional_step`);
the launch defaults, with the timings that picked them, are in ``gdn_config``; the
kernels live beside it: ``gdn_step`` (conventional step, fused
replay launch, staged prep and output launches), ``gdn_flush`` (fold and flush, commit
counters), ``gdn_verify`` (speculative verify) and ``gdn_device`` (device functions they
share), over ``gdn_extra``, ``tl_formats``, ``tl_common`` and ``tl_dots``.

**Counters.**  A plain replay cache keeps one int32 clock per slot (``tickets``).
Every program of the step's replay launch reads it once at its start (from L2) and
adds 1 at its very end -- a fire-and-forget relaxed atomic behind a barrier, so all
of the program's warps have read the clock before its own increment.  With ``P``
programs per slot, every program of a launch reads a value in ``[kP, kP + P - 1]``
(only the launch's other P - 1 increments can precede it), so ``k = clock // P`` is
the slot's step count and ``k mod L`` its ring position.  Nothing waits on a counter
and nothing is published: no host sync, CUDA-graph capturable.  Speculative caches
keep explicit ``ring_len`` (committed entries) and ``steps`` that only the commit
writes.  The conventional kernel's stochastic rounding uses ``steps`` with
``tl_common.finish_slot``.

**Output step.**  Grid ``(HV * (V // BV) // TPP, batch)``: a program streams TPP
tiles (BV rows of one v-head each, all in one k-head group) of the stored copy
through a ``tl.range(num_stages=NS)`` software pipeline (the tile loads become
``cp.async`` copies to shared memory, so the bytes in flight cost no registers).
Once per program: q, k and the k-head's ring products ``k_i . k``, ``k_i . q``
(``(RP, K)`` ring tile, masked by the ring position so only live entries are read).
Per tile: its two row sums against k and q, the ring's d rows weighted by those
products and the decay, ``S_{t-1} k = e^G S k + sum_i e^{G - c_i} (k_i . k) d_i``
(likewise for q), then ``d``, ``o`` and the appends (d, v; g, beta once per head;
k and the row of products ``k_i . k`` once per k-head, in ``ring_kk``).  A one-tile
program (small batches) issues its tile load right after the slot index.

**Flush** (the delta rule over the window, from the checkpoint), per unit of BVF
rows of one head, in chunks of FB rows (a pipelined loop): ``P = S_c K^T`` (one
``tl.dot``), the window's d recomputed as ``D = RHS (I + N)^-T`` with ``N_ij = beta_i
e^{c_i - c_j} k_i . k_j`` (j < i; the products from ``ring_kk``, the inverse once
per unit: by repeated squaring, or by forward substitution in one-warp programs), and
the rank-L fold ``S = e^{c_L} S_c + (w D) K`` (another ``tl.dot``).  The two large
products run in ``dot_precision``: "tf32x2" (the ring's k is exact in tf32, so only
the other operand is split: two tensor-core passes, ~fp32 accuracy), "tf32x3" or
"ieee"; ``RHS (I + N)^-T`` in three explicitly split tf32 passes (fp32 FMAs under
"ieee"), the inverse in ieee fp32.  An nvfp4 copy needs its whole matrix's amax before it can
encode: its flush units are whole matrices with two passes over the chunks (the
first only for the amax; the recompute reads L2-hot data).  ``flush_tma``: a dense
checkpoint's chunks arrive by TMA (tensor-descriptor bulk copies into shared memory,
issued ahead by the chunk loop's pipeline), which leaves the loads out of the
registers and lets one warp hold a whole unit (the staged default for an fp32
checkpoint with no read copy or an fp8 one); an fp32 checkpoint's fresh chunks go
back through the same descriptor (TMA bulk stores from shared memory).

An fp32 checkpoint's nvfp4 or mxfp4 read copy is, in the staged launch, encoded by a
launch of its own behind the flush (``read_encode="launch"``: persistent whole-matrix
programs over the rows the flush flagged), from the checkpoint the flush just wrote:
the same fp32 values, so the same bits as the flush's own encoder.

Launch modes of a step: ``"fused"`` -- one launch; a flushing slot's programs run
the output loop (results unused) and then flush their own tiles; ``"split"`` -- a
persistent flush launch over the flushing slots' units (it returns at once where
nothing flushes, and leaves a per-row flag), then the output launch, whose programs
of flushing slots load nothing and only advance the clock.  The fused kernel
carries the flush path's registers, so large batches use "split", or "staged" (the
default there): the flush launch, a prep launch that reads and advances the clock
(one program per sequence and k-head) and an output launch that skips flushing rows
(an fp8 or nvfp4 copy's tiles there: their row sums as one fp16 tensor-core product
with k and q split in two fp16 parts each, ``out_mma``).
On a GPU the staged flush launch runs on a second stream beside the other two
(``concurrent_flush``): they touch disjoint rows, and as either the flush or the prep
launch may run first, the prep launch then leaves the clocks alone, and a one-program
launch on the flush's stream, behind the flush and (an event) the prep launch,
advances them (``clocks.advance_clocks_kernel``, shared with the Mamba-2 split step).

**Verify** (T drafts from one read of the stored copy, kept packed in registers):
draft j is an output step at ring position ``n + j``; drafts 0..j-1 join the
program's ring tiles (k, the ring-rounded d, the log-decay) in registers as they
are computed, and are written behind the commit pointer.  Commit = the persistent
flush launch (committed entries >= L) plus a counter launch.
"""

from __future__ import annotations

import torch
import triton

from .clocks import FlushStream, advance_clocks_kernel
from .codec import as_int32, encode_state
from .gdn_config import _MMA_KINDS, default_config, replay_defaults
from .gdn_flush import _commit_counters, _flush_kernel
from .gdn_step import _conventional_kernel, _out_kernel, _prep_kernel, _replay_kernel
from .gdn_verify import _verify_kernel, _vout_kernel, _vout_mm_kernel, _vprep_kernel
from .read_encode import encode_read_copies, encodes_apart
from .state import DENSE_FORMATS, StateStore, split_unsupported
from .tl_common import RING_BF16, RING_FP16, RING_FP32
from .tl_formats import FMT_BF16_SR, FMT_FP16_SR, FMT_NONE, compiled_on

RING_IDS = {torch.float32: RING_FP32, torch.bfloat16: RING_BF16, torch.float16: RING_FP16}
_RING_STORAGE = {torch.float32: torch.float32, torch.bfloat16: torch.int16,
                 torch.float16: torch.int16}
DOT_PRECISIONS = ("tf32x2", "tf32x3", "ieee")
LAUNCHES = ("fused", "split", "staged")
FLUSH_GRIDS = ("persistent", "dynamic", "units")
VERIFY_LAUNCHES = ("single", "staged", "staged-dot")
FLUSH_PASSES = ("recompute", "scratch")
READ_ENCODES = ("flush", "launch")


def _pow2_at_least(n: int, lo: int = 2) -> int:
    return max(lo, triton.next_power_of_2(max(1, n)))


def _check_shapes(q: torch.Tensor, v: torch.Tensor, K: int, V: int) -> None:
    for name, dim in (("K", K), ("V", V)):
        if dim & (dim - 1) or dim < 16:
            raise ValueError(f"{name} must be a power of two >= 16, got {dim}")
    if q.shape[-1] != K or v.shape[-1] != V:
        raise ValueError(f"q/k last axis must be K={K} and v's V={V}")


def _pow2(name: str, x: int, lo: int = 16) -> int:
    if x < lo or x & (x - 1):
        raise ValueError(f"{name} must be a power of two >= {lo}, got {x}")
    return x


def empty_store(fmt: str, shape: tuple[int, int, int, int], device) -> StateStore:
    """A zero-filled :class:`StateStore` (scales included)."""
    st = StateStore.empty(fmt, shape, device)
    for t in st.tensors():
        t.zero_()
    return st


def store_into(dst: StateStore, S: torch.Tensor, *, seed: int, step: int,
               slots: torch.Tensor | None = None) -> StateStore:
    """Encode ``S`` into ``dst`` (all slots or ``slots``), the bits of the torch formats
    (``codec.encode_state``); returns the encoded ``S`` on its own."""
    src = encode_state(S, dst.fmt, seed=seed, step=step)
    for mine, theirs in zip(dst.tensors(), src.tensors(), strict=True):
        if slots is None:
            mine.copy_(theirs.reshape(mine.shape))
        else:
            mine[slots] = theirs.reshape(mine[slots].shape)
    return src


class SlotCounters:
    """Per-slot int32 counters: ``ring_len`` and ``steps`` (speculative caches; the
    conventional kernel's SR step), ``tickets`` (a plain replay cache's clock; the
    conventional kernel's tickets)."""

    def __init__(self, slots: int, device):
        self.ring_len = torch.zeros(slots, dtype=torch.int32, device=device)
        self.steps = torch.zeros(slots, dtype=torch.int32, device=device)
        self.tickets = torch.zeros(slots, dtype=torch.int32, device=device)

    def args(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.ring_len, self.steps, self.tickets

    def reset(self, slots: torch.Tensor | None = None) -> None:
        for t in self.args():
            if slots is None:
                t.zero_()
            else:
                t[slots] = 0


def conventional_step(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
    A_log: torch.Tensor, dt_bias: torch.Tensor, state: StateStore,
    state_indices: torch.Tensor, *, out: torch.Tensor | None = None,
    counters: SlotCounters | None = None, seed: int = 0,
    kv_dtype: torch.dtype = torch.float32, block_v: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """Conventional GDN decode step in place on ``state`` (any kernel format; the
    state is decoded, updated in fp32 and re-encoded).

    ``q``, ``k``: (B, HK, K); ``v``: (B, HV, V); ``a``, ``b``: (B, HV); ``state_indices``:
    (B,) int32 slots.  ``kv_dtype`` rounds normalised k and v first (the ring dtype of a
    replay design; fp32 = no rounding).  Stochastic rounding (bf16-sr, fp16-sr) needs
    ``counters`` (the slot's step counter keys the random bits with ``seed``).
    Returns the fp32 output (B, HV, V).
    """
    B, HK, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    _check_shapes(q, v, K, V)
    if state.fmt_id in (FMT_BF16_SR, FMT_FP16_SR) and counters is None:
        raise ValueError("stochastic rounding needs the per-slot step counters")
    bv, nw = default_config(B, HV, V, K, state.fmt)
    bv, nw = block_v or bv, num_warps or nw
    if V % bv:
        raise ValueError(f"block_v {bv} does not divide V = {V}")
    if out is None:
        out = torch.empty((B, HV, V), dtype=torch.float32, device=q.device)
    cargs = counters.args() if counters is not None else (state_indices,) * 3
    _conventional_kernel[(V // bv, B * HV)](
        q.contiguous(), k.contiguous(), v.contiguous(), a.contiguous(), b.contiguous(),
        A_log, dt_bias, state_indices, out, *state.kernel_args(), *cargs, as_int32(seed),
        HK, HV, K, V, bv, state.fmt_id, RING_IDS[kv_dtype], num_warps=nw,
    )
    return out


class GDNReplayCache:
    """Device-side state of a replay design for a pool of ``slots`` sequences.

    ``checkpoint`` is the recursion's format (fp32, bf16, fp16, bf16-sr, fp16-sr, or a
    packed format for a shared design); ``read`` the read copy's format (None: shared,
    outputs read the checkpoint).  ``window`` is L; ``drafts`` the largest number of
    speculative drafts verified at once (a speculative cache: :meth:`verify` and
    :meth:`commit` instead of :meth:`step`; the ring holds L - 1 + drafts entries).

    Launch configuration (defaults: :func:`replay_defaults` for ``batch_hint``):

    * ``launch``: ``"fused"`` (one launch per step: programs of ``block_v``-row tiles,
      ``tiles_per_program`` of them in a ``stages``-deep pipeline, ``num_warps``; a
      flushing slot's programs flush their own tiles) or ``"split"`` (a persistent
      flush launch over units of ``block_v`` rows with ``num_warps`` and
      ``flush_ctas_per_sm`` programs per SM, then the output launch: ``out_block_v``,
      ``out_tiles_per_program``, ``out_stages``, ``out_num_warps``).  Tiles per program
      must lie in one k-head group (divide ``v_heads // k_heads * V // block``).
    * ``flush_chunk``: rows a flush folds at once (FB; at least 16).
    * ``flush_stages``: software-pipeline depth of a flush unit's chunk loop.
    * ``dot_precision``: the flush's two large products (``S_c K^T``, the rank-L fold):
      ``"tf32x2"`` (two tensor-core passes: the other operand, the ring's k, must be
      exact in tf32 -- a bf16 or fp16 ring; with an fp32 ring it means ``"tf32x3"``),
      ``"tf32x3"`` (three passes) or ``"ieee"`` (fp32 FMAs).  Default: ``"tf32x2"``.
      The window's deltas ``RHS (I + N)^-T`` take three explicitly split tf32 passes
      unless ``"ieee"``.
    * ``verify_block_v`` / ``verify_num_warps`` / ``verify_stages``: the verify kernel.
    * ``flush_grid``: ``"persistent"`` (every program takes every G-th unit; the default
      without a read copy), ``"dynamic"`` (persistent programs that claim their units one
      at a time from a counter; the staged default where there is a read copy) or
      ``"units"`` (the split/staged flush launch as one program per (row, head, block_v
      rows) unit; programs of rows that do not flush return after two scalar loads).
    * ``flush_pass``: ``"recompute"`` (a chunked nvfp4 flush folds every chunk twice,
      once for the matrix amax; the fused launch's default) or ``"scratch"`` (the
      first pass keeps the fp32 rows in a global scratch (beside a 16-bit checkpoint, its
      stored values, its rounding drawn once), the second only encodes them; the staged
      launch's default).
    * ``concurrent_flush``: the staged step's flush launch on a second CUDA stream,
      forked and joined around the prep and output launches (default on a GPU; the
      launches touch disjoint rows).
    * ``flush_prefetch``: L2 prefetch in the flush (compiled code only), chunks ahead
      of the one being folded (0: none).
    * ``flush_tma``: the staged flush launch loads a dense checkpoint's (fp32 or 16-bit)
      chunks through a tensor descriptor (TMA bulk copies into shared memory on Hopper,
      issued ahead by the chunk loop's ``flush_stages``-deep pipeline) and stores an
      fp32 checkpoint's fresh chunks back through it.  On by default in the staged
      launch (for a dense checkpoint).
    * ``flush_ring_ahead``: the flush's chunk loop loads a chunk's ring v rows while the
      chunk before it folds (the single-pass loop: no nvfp4 copy).
    * ``flush_evict``: the staged flush launch's plain stores of the checkpoint and read
      copy evict first from L2 (not the nvfp4 scratch rows, nor a TMA-stored fp32
      checkpoint).  On by default in the staged launch where the flush writes an fp8
      read copy: on an H200 (batch 256, L = 16) qwen3.5-122b's fp8 and nvfp4 flushes
      took 1-3% less (847 / 866 against 872 / 872 us; 2253 / 2214 against 2286 / 2245),
      qwen3.5-4b's the same within noise; the same bits.  Re-timed for the fp8 copy in
      three alternating pairs: qwen3.5-122b 157.8-158.0 against 158.4-158.9 us per
      step (flush 863-866 against 867-870).
    * ``read_encode``: ``"flush"`` (the flush encodes the read copy beside the
      checkpoint) or ``"launch"`` (the flush writes the checkpoint only, and a launch of
      its own behind it on the same stream encodes the flushed rows' read copies from
      their checkpoints: :func:`read_encode.encode_read_copies`, persistent programs of
      4 warps, 8 per SM, whole matrices in 32-row chunks).  "launch" needs the staged
      launch, no drafts, a dense checkpoint (the copy encodes the checkpoint's stored
      values either way: the same bits) and an nvfp4 or mxfp4 copy, and is the default
      there: the
      flush's one-warp programs, sized for the fold, encode 4-bit copies slowly.  H200,
      batch 256, L = 16, us per step (flush step): qwen3.5-4b nvfp4 110.9 -> 102.0 (858
      -> 695), mxfp4 139.4 -> 116.5 (1021 -> 618); qwen3.5-122b nvfp4 203.2 -> 179.2
      (1767 -> 1390), mxfp4 256.8 -> 209.3 (2015 -> 1220); with an fp16-sr checkpoint,
      against the twentieth run's flush that encoded the copy itself, nvfp4 123.5 ->
      108.2 (1054 -> 792) and 232.6 -> 189.9 (2240 -> 1564).
    * ``hw_fp8``: the staged flush encodes an fp8 read copy with the hardware
      conversion (compiled code only; ``tl_formats.fp8_encode_hw``, the encoder of
      the Mamba-2 flush, the same bits).  On by default in the staged launch (offline
      sm_90 it cuts the fp8 flush's chunk loop from 3051 to 2036 instructions; on an
      H200, qwen3.5-4b, batch 256, L = 16: flush 749 -> 609 us).
    * ``out_mma``: the staged output launch's row sums as tensor-core products
      (:func:`_staged_rows`; fp8 and nvfp4 copies in fp16, fp32 ones in two tf32
      passes).  On by default in the staged launch for fp8 and nvfp4 copies.
    * ``out_evict``: the staged output launch streams its copy's rows with the
      ``evict_first`` L2 policy, so the prep launch's q, k and coefficients, which every
      output program reads, stay in L2 (the same bits).  On by default in the staged
      launch for the copies whose tiles are plain loads (fp32, 16-bit and mxfp4 copies;
      the pipelined loads of fp8 and nvfp4 tiles, read by tensor-core row sums, go
      through shared memory and drop the hint).  Timed for fp32 copies (H200, batch
      256, L = 16, replay fp32, three / two alternating pairs): qwen3.5-4b 169.7-170.8
      against 171.6-171.8 us per step, qwen3.5-122b 316.2-316.4 against 317.2-317.6.
    * ``prep_keep``: the staged prep launch stores the rows that every output program
      reads (q and k, ring coefficients, ring position) with the ``evict_last`` L2
      policy, so the output launch's stream of the copy does not push them out of L2
      (the same bits).  On by default in the staged launch.  Timed (H200, batch 256,
      L = 16, three alternating pairs, us per step, output step / flush step):
      qwen3.5-122b fp32 + fp8 155.8-156.4 (108.0 / 876) against 158.2-158.8
      (111.4 / 864); qwen3.5-4b fp32 + fp8 89.4-89.8 against 89.2-89.9 (level);
      qwen3.5-4b replay fp32 170.0 / 170.0 against 171.2 / 170.7 (two pairs).  The
      output steps gain 0.3-3.4 us and the flush steps lose 6-15 us.  With 4 or 16
      layers per timed step (``bench_gdn.time_replay``'s ``layers``) the fp8 rows gain
      0.8-1.6 us per layer step.  The rows (5.4 MB for qwen3.5-4b, 6.6 MB for qwen3.5-122b at
      batch 256) stay at that priority in L2 until the next step rewrites them.
    * ``prep_release``: with ``prep_keep``, a flushing row's prep programs put its kept
      rows back to the normal L2 eviction priority (``applypriority``; compiled
      launches only), so they do not hold L2 through the flush (the same bits).  On by
      default in the staged launch.  Timed (H200, batch 256, L = 16, us per step,
      three alternating pairs): qwen3.5-4b replay fp32 167.3-167.8 against
      168.6-170.9 (flush 365-369 against 374-377), fp16-sr + nvfp4 98.9-99.4 against
      99.6-100.4, fp32 + fp8 88.4-89.9 against 89.2-90.4; qwen3.5-122b fp32 + fp8
      155.6-156.2 against 155.7-156.3 (level; flush 866-868 against 872-874).
    * ``fast_encode``: the flush's encoders by integer rounding (default; the same
      bits as the reference encoders of ``tl_formats``, which ``False`` selects), in
      the flush launch and in the fused launch's own flushes.
    * ``maxnreg`` (fused or flush launch), ``out_maxnreg``, ``verify_maxnreg``,
      ``prep_maxnreg`` (the staged prep launch): register caps per thread (0: none, the
      compiler's choice; None: the default).

    An nvfp4 copy is written whole-matrix (its matrix scale): a split or staged flush
    unit, or a speculative cache's commit unit, owns all V rows (``block_v`` must be V
    there); in the fused launch with a smaller ``block_v`` a head's programs each fold
    their rows and the last of them to post its part of the matrix amax encodes the copy
    of all V rows.
    """

    def __init__(
        self, slots: int, k_heads: int, v_heads: int, K: int, V: int, *, window: int,
        checkpoint: str = "fp32", read: str | None = None,
        ring_dtype: torch.dtype = torch.bfloat16, drafts: int = 0, seed: int = 0,
        device: torch.device | str = "cuda", batch_hint: int | None = None,
        launch: str | None = None, block_v: int | None = None, num_warps: int | None = None,
        tiles_per_program: int | None = None, stages: int | None = None,
        out_block_v: int | None = None, out_num_warps: int | None = None,
        out_tiles_per_program: int | None = None, out_stages: int | None = None,
        verify_block_v: int | None = None, verify_num_warps: int | None = None,
        verify_stages: int | None = None, flush_chunk: int | None = None,
        flush_stages: int | None = None, dot_precision: str = "tf32x2",
        flush_ctas_per_sm: int | None = None, maxnreg: int | None = None,
        out_maxnreg: int | None = None, verify_maxnreg: int | None = None,
        prep_maxnreg: int | None = None, eager: bool | None = None,
        prep_num_warps: int | None = None,
        verify_launch: str | None = None, flush_licm: bool | None = None, keep_fresh: bool = False,
        flush_grid: str | None = None, flush_pass: str | None = None,
        fast_encode: bool | None = None, concurrent_flush: bool | None = None,
        flush_prefetch: int | None = None, flush_tma: bool | None = None,
        hw_fp8: bool | None = None, out_mma: bool | None = None, out_evict: bool | None = None,
        prep_keep: bool | None = None, prep_release: bool | None = None,
        flush_ring_ahead: bool | None = None, flush_evict: bool | None = None,
        read_encode: str | None = None,
    ):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if (why := split_unsupported(checkpoint, read)) is not None:
            raise ValueError(why)
        if v_heads % k_heads:
            raise ValueError(f"v_heads ({v_heads}) must be a multiple of k_heads ({k_heads})")
        if dot_precision not in DOT_PRECISIONS:
            raise ValueError(f"dot_precision must be one of {DOT_PRECISIONS}, got "
                             f"{dot_precision!r}")
        self.slots, self.HK, self.HV, self.K, self.V = slots, k_heads, v_heads, K, V
        self.L, self.T, self.seed = window, drafts, seed
        self.R = window + max(drafts - 1, 0)
        self.RP = _pow2_at_least(self.R, 16)
        self.LOG2RP = self.RP.bit_length() - 1
        self.ring_dtype, self.ring_id = ring_dtype, RING_IDS[ring_dtype]
        self.dot = ("tf32x3" if dot_precision == "tf32x2" and ring_dtype == torch.float32
                    else dot_precision)
        shape = (slots, v_heads, V, K)
        self.ckpt = empty_store(checkpoint, shape, device)
        self.read = empty_store(read, shape, device) if read is not None else None
        encode = read_encode
        if encode is None and (drafts or launch not in (None, "staged")):
            encode = "flush"  # a launch of its own only behind the staged step's flushes
        cfg = replay_defaults(batch_hint or slots, k_heads, v_heads, V, K, checkpoint, read,
                              encode, ring_rows=self.R)
        given = dict(launch=launch, block_v=block_v, num_warps=num_warps,
                     tiles_per_program=tiles_per_program, stages=stages,
                     flush_chunk=flush_chunk, out_block_v=out_block_v,
                     out_num_warps=out_num_warps, out_tiles_per_program=out_tiles_per_program,
                     out_stages=out_stages, flush_stages=flush_stages, maxnreg=maxnreg,
                     out_maxnreg=out_maxnreg, verify_maxnreg=verify_maxnreg,
                     prep_maxnreg=prep_maxnreg,
                     flush_ctas_per_sm=flush_ctas_per_sm, eager=eager,
                     prep_num_warps=prep_num_warps, verify_launch=verify_launch,
                     flush_licm=flush_licm, flush_grid=flush_grid, flush_pass=flush_pass,
                     fast_encode=fast_encode, concurrent_flush=concurrent_flush,
                     flush_prefetch=flush_prefetch, flush_tma=flush_tma, hw_fp8=hw_fp8,
                     out_mma=out_mma, out_evict=out_evict, prep_keep=prep_keep,
                     prep_release=prep_release,
                     flush_ring_ahead=flush_ring_ahead,
                     flush_evict=flush_evict, read_encode=read_encode,
                     verify_block_v=verify_block_v,
                     verify_num_warps=verify_num_warps, verify_stages=verify_stages)
        if out_block_v is not None and out_tiles_per_program is None:
            cfg["out_tiles_per_program"] = 1
        if block_v is not None:
            if tiles_per_program is None:
                cfg["tiles_per_program"] = 1
            if flush_chunk is None:
                cfg["flush_chunk"] = min(block_v, cfg["flush_chunk"])
        if num_warps is not None and maxnreg is None and cfg["launch"] == "fused":
            cfg["maxnreg"] = None  # the fused default's cap is its 4-warp programs'
        cfg.update({k: v for k, v in given.items() if v is not None})
        if cfg["launch"] != "staged":  # defaults of the staged launch only
            cfg["out_mma"] = bool(out_mma)
            cfg["out_evict"] = bool(out_evict)
            cfg["prep_keep"] = bool(prep_keep)
            cfg["prep_release"] = bool(prep_release)
            cfg["flush_tma"] = bool(flush_tma)
        if ((cfg["launch"] != "fused" or drafts) and block_v is None
                and "nvfp4" in (checkpoint, read)):
            cfg["block_v"] = V  # flush (and commit) units of whole matrices: the matrix scale
        self.config = cfg
        """The launch configuration in use (keywords of this class)."""
        self.launch = cfg["launch"]
        if self.launch not in LAUNCHES:
            raise ValueError(f"launch must be one of {LAUNCHES}, got {self.launch!r}")
        self.eager, self.prep_num_warps = bool(cfg["eager"]), cfg["prep_num_warps"]
        self.verify_launch = cfg["verify_launch"]
        self.flush_licm = bool(cfg["flush_licm"])
        self.flush_grid, self.flush_pass = cfg["flush_grid"], cfg["flush_pass"]
        self.fast_encode = bool(cfg["fast_encode"])
        self.concurrent_flush = bool(cfg["concurrent_flush"])
        self.flush_prefetch = int(cfg["flush_prefetch"])
        if self.flush_prefetch < 0:
            raise ValueError(f"flush_prefetch must be >= 0, got {self.flush_prefetch}")
        self.flush_tma = bool(cfg["flush_tma"])
        self.hw_fp8 = bool(cfg["hw_fp8"])
        self.out_mma = bool(cfg["out_mma"])
        self.out_evict = bool(cfg["out_evict"])
        self.prep_keep = bool(cfg["prep_keep"])
        self.prep_release = bool(cfg["prep_release"])
        self.flush_ring_ahead = bool(cfg["flush_ring_ahead"])
        self.flush_evict = bool(cfg["flush_evict"])
        self.read_encode = cfg["read_encode"]
        if self.read_encode not in READ_ENCODES:
            raise ValueError(f"read_encode must be one of {READ_ENCODES}, got "
                             f"{self.read_encode!r}")
        if self.read_encode == "launch" and (self.launch != "staged" or drafts
                                             or not encodes_apart(checkpoint, read)):
            raise ValueError(f"read_encode='launch' needs the staged launch, no drafts, a "
                             f"dense checkpoint and an nvfp4 or mxfp4 read copy, got launch "
                             f"{self.launch!r}, drafts {drafts}, {checkpoint!r} + {read!r}")
        out_fmt = read if read is not None else checkpoint
        if self.out_mma and (self.launch != "staged" or out_fmt not in _MMA_KINDS):
            raise ValueError(f"out_mma needs the staged launch and a copy to read in "
                             f"{' or '.join(_MMA_KINDS)}, got launch {self.launch!r}, "
                             f"copy {out_fmt!r}")
        self._mma = _MMA_KINDS[out_fmt] if self.out_mma else 0
        for name in ("out_evict", "prep_keep", "prep_release"):
            if getattr(self, name) and self.launch != "staged":
                raise ValueError(f"{name} needs the staged launch, got launch {self.launch!r}")
        if self.flush_tma and (self.launch != "staged" or checkpoint not in DENSE_FORMATS):
            raise ValueError(f"flush_tma needs the staged launch and a dense checkpoint "
                             f"({', '.join(DENSE_FORMATS)}), got launch {self.launch!r}, "
                             f"checkpoint {checkpoint!r}")
        self._flush_stream = FlushStream()
        if self.flush_grid not in FLUSH_GRIDS:
            raise ValueError(f"flush_grid must be one of {FLUSH_GRIDS}, got {self.flush_grid!r}")
        if self.flush_pass not in FLUSH_PASSES:
            raise ValueError(f"flush_pass must be one of {FLUSH_PASSES}, got "
                             f"{self.flush_pass!r}")
        if self.verify_launch not in VERIFY_LAUNCHES:
            raise ValueError(f"verify_launch must be one of {VERIFY_LAUNCHES}, got "
                             f"{self.verify_launch!r}")
        self._vscratch = None
        self._fscratch = None
        self._flush_work = torch.zeros(2, dtype=torch.int32, device=device)
        """The dynamic flush grid's unit counter and count of programs done (zero between
        flushes)."""
        self._pscratch = None
        self.compiled: dict = {}
        """The last compiled kernel of each launch (``n_regs``, ``n_spills``: tuning aid)."""
        self.BV, self.num_warps = cfg["block_v"], cfg["num_warps"]
        self.TPP, self.stages = cfg["tiles_per_program"], cfg["stages"]
        self.out_BV, self.out_num_warps = cfg["out_block_v"], cfg["out_num_warps"]
        self.out_TPP, self.out_stages = cfg["out_tiles_per_program"], cfg["out_stages"]
        self.verify_BV, self.verify_num_warps = cfg["verify_block_v"], cfg["verify_num_warps"]
        self.verify_stages = cfg["verify_stages"]
        self.FB, self.flush_stages = cfg["flush_chunk"], cfg["flush_stages"]
        self.maxnreg, self.out_maxnreg = cfg["maxnreg"] or None, cfg["out_maxnreg"] or None
        self.verify_maxnreg = cfg["verify_maxnreg"] or None
        self.prep_maxnreg = cfg["prep_maxnreg"] or None
        whole = "nvfp4" in (checkpoint, read)
        if whole and self.BV != V and (self.launch != "fused" or self.T):
            raise ValueError("an nvfp4 copy needs block_v == V (flush units of whole "
                             "matrices) outside the fused launch and in speculative caches")
        for name, bv_ in (("block_v", self.BV), ("out_block_v", self.out_BV),
                          ("verify_block_v", self.verify_BV), ("flush_chunk", self.FB)):
            _pow2(name, bv_)
            if V % bv_:
                raise ValueError(f"{name} {bv_} does not divide V = {V}")
        if self.BV % self.FB:
            raise ValueError(f"flush_chunk {self.FB} does not divide block_v {self.BV}")
        group = v_heads // k_heads
        for name, tpp, bv_ in (("tiles_per_program", self.TPP, self.BV),
                               ("out_tiles_per_program", self.out_TPP, self.out_BV)):
            if tpp < 1 or (group * (V // bv_)) % tpp:
                raise ValueError(f"{name} {tpp} must divide the {group * (V // bv_)} tiles of "
                                 "a k-head group")
        R, rdt = self.R, _RING_STORAGE[ring_dtype]
        self.ring_k = torch.zeros((slots, R, k_heads, K), dtype=rdt, device=device)
        self.ring_v = torch.zeros((slots, R, v_heads, V), dtype=rdt, device=device)
        self.ring_d = torch.zeros((slots, R, v_heads, V), dtype=rdt, device=device)
        self.ring_g = torch.zeros((slots, R, v_heads), dtype=torch.float32, device=device)
        self.ring_beta = torch.zeros((slots, R, v_heads), dtype=torch.float32, device=device)
        self.ring_kk = torch.zeros((slots, R, k_heads, self.RP), dtype=torch.float32,
                                   device=device)
        """Row i: ``k_j . k_i`` for the entries j < i (written with entry i; the flush's
        triangular system)."""
        self.counters = SlotCounters(slots, device)
        dev = torch.device(device)
        self.n_sm = (torch.cuda.get_device_properties(dev).multi_processor_count
                     if dev.type == "cuda" else 2)
        self.flush_ctas_per_sm = cfg["flush_ctas_per_sm"]
        self._skip = torch.zeros(max(slots, batch_hint or 0), dtype=torch.int32, device=device)
        self.CW = 2 * self.RP + 8
        self._scratch = self._staged_scratch(max(slots, batch_hint or 0), device)
        self.fresh = (torch.zeros(shape, dtype=torch.float32, device=device) if keep_fresh
                      else None)
        """fp32 state of each slot's last flush (``keep_fresh=True``), for inspection."""

    def _staged_scratch(self, B: int, device) -> tuple[torch.Tensor, ...]:
        """The staged launch's per-step buffers: prepared q, k per (row, k-head) (fp32, or
        two parts each: fp16 in the same bytes, tf32 parts in twice them); ring
        coefficients and scalars per (row, v-head); the ring position per row."""
        if self.launch != "staged":
            return ()
        qk = (4 if self._mma == 2 else 2) * self.K
        return (torch.zeros((B, self.HK, qk), dtype=torch.float32, device=device),
                torch.zeros((B, self.HV, self.CW), dtype=torch.float32, device=device),
                torch.zeros((B,), dtype=torch.int32, device=device))

    @property
    def programs_per_slot(self) -> int:
        """Programs per slot of the launch that advances the clock."""
        if self.launch == "staged":
            return self.HK
        if self.launch == "fused":
            return self.HV * (self.V // self.BV) // self.TPP
        return self.HV * (self.V // self.out_BV) // self.out_TPP

    @property
    def steps(self) -> torch.Tensor:
        """Decode steps (committed tokens) per slot, int32 on the device."""
        if self.T:
            return self.counters.steps
        return self.counters.tickets // self.programs_per_slot

    @property
    def ring_len(self) -> torch.Tensor:
        """Entries in each slot's ring since its checkpoint, int32 on the device."""
        if self.T:
            return self.counters.ring_len
        return self.steps % self.L

    def ring(self, name: str) -> torch.Tensor:
        """A ring field as float values (k, v, d in the ring dtype; g, beta fp32)."""
        t = getattr(self, f"ring_{name}")
        return t.view(self.ring_dtype) if t.dtype == torch.int16 else t

    def reset(self, S0: torch.Tensor | None = None, slots: torch.Tensor | None = None) -> None:
        """Load a float state (zeros if None) into the checkpoint and the read copy of
        that checkpoint (the torch formats' bits, SR step 0) and clear the counters
        of ``slots`` (all if None)."""
        device = self.ring_g.device
        if S0 is None:
            n = self.slots if slots is None else len(slots)
            S0 = torch.zeros((n, self.HV, self.V, self.K), device=device)
        S0 = S0.to(device=device, dtype=torch.float32)
        ck = store_into(self.ckpt, S0, seed=self.seed, step=0, slots=slots)
        if self.read is not None:
            store_into(self.read, ck.decode(), seed=self.seed + 1, step=0, slots=slots)
        self.counters.reset(slots)

    def _copies(self):
        c, f = self.ckpt, self.read
        fargs = f.kernel_args() if f is not None else c.kernel_args()
        f_id = f.fmt_id if f is not None else FMT_NONE
        return c, fargs, f_id

    def _skip_flags(self, B: int) -> torch.Tensor:
        if self._skip.numel() < B:
            self._skip = torch.zeros(B, dtype=torch.int32, device=self._skip.device)
        return self._skip

    # -- steps -------------------------------------------------------------
    def step(self, q, k, v, a, b, A_log, dt_bias, state_indices, out=None) -> torch.Tensor:
        """One decode step for the B sequences (shapes as :func:`conventional_step`)."""
        if self.T:
            raise RuntimeError("a speculative cache (drafts > 0) advances by verify + commit")
        B = q.shape[0]
        _check_shapes(q, v, self.K, self.V)
        if out is None:
            out = torch.empty((B, self.HV, self.V), dtype=torch.float32, device=q.device)
        q, k, v, a, b = (t.contiguous() for t in (q, k, v, a, b))
        c, fargs, f_id = self._copies()
        skip = self._skip_flags(B)
        fresh = self.fresh if self.fresh is not None else self.ring_g
        heads = (self.HK, self.HV, self.K, self.V)
        fused = self.launch == "fused"
        if self.launch == "staged" and self.concurrent_flush and q.is_cuda:
            self._staged_concurrent(q, k, v, a, b, A_log, dt_bias, state_indices, out)
            return out
        if not fused:
            self._flush(q, k, v, a, b, A_log, dt_bias, state_indices, state_indices, out,
                        commit=False)
        if self.launch == "staged":
            self._staged(q, k, v, a, b, A_log, dt_bias, state_indices, out)
            return out
        if fused:
            bv, nw, tpp, ns = self.BV, self.num_warps, self.TPP, self.stages
            mr = self.maxnreg
        else:
            bv, nw, tpp, ns = self.out_BV, self.out_num_warps, self.out_TPP, self.out_stages
            mr = self.out_maxnreg
        self.compiled["replay"] = _replay_kernel[(self.HV * (self.V // bv) // tpp, B)](
            q, k, v, a, b, A_log, dt_bias, state_indices, skip, out, *c.kernel_args(), *fargs,
            self.ring_k, self.ring_v, self.ring_d, self.ring_g, self.ring_beta, self.ring_kk,
            self.counters.tickets, fresh, *self._part_scratch(B, fused),
            as_int32(self.seed), *heads, bv, tpp, ns,
            min(self.FB, bv), self.flush_stages, self.L, self.R, self.RP, self.LOG2RP, c.fmt_id,
            f_id, self.ring_id, fused, self.fresh is not None, self.dot,
            self.eager and tpp == 1, self.fast_encode, num_warps=nw, maxnreg=mr,
        )
        return out

    def _part_scratch(self, B: int, fused: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """The fused launch's buffers for an nvfp4 copy flushed in part-matrix programs:
        fp32 rows of every (batch row, v-head) matrix and its two sync words (zero
        between flushes; the kernel clears them).  Placeholders otherwise."""
        whole = "nvfp4" in (self.ckpt.fmt, self.read.fmt if self.read is not None else None)
        if not (fused and whole and self.BV < self.V):
            return self.ring_g, self._skip
        if self._pscratch is None or self._pscratch[1].shape[0] < B * self.HV * 2:
            dev = self.ring_g.device
            self._pscratch = (
                torch.empty(B * self.HV * self.V * self.K, dtype=torch.float32, device=dev),
                torch.zeros(B * self.HV * 2, dtype=torch.int32, device=dev))
        return self._pscratch

    def _staged_concurrent(self, q, k, v, a, b, A_log, dt_bias, state_indices, out) -> None:
        """The staged step with the flush launch on a second stream, beside the prep and
        output launches (a fork and a join; CUDA-graph capturable).  They touch
        disjoint rows -- a flushing row's programs of the other two do nothing -- and
        either may run first, so neither reads a clock the other advanced: the prep
        launch leaves the clocks alone, and a one-program launch on the flush's stream,
        behind the flush launch and an event recorded after the prep launch, advances
        them (:func:`clocks.advance_clocks_kernel`)."""
        self._flush_stream.step(
            q.device,
            lambda: self._prep_launch(q, k, a, b, A_log, dt_bias, state_indices,
                                      concurrent=True),
            lambda: self._out_launch(v, state_indices, out),
            lambda: self._flush(q, k, v, a, b, A_log, dt_bias, state_indices, state_indices,
                                out, commit=False),
            lambda: self._advance_clocks(state_indices))

    def _advance_clocks(self, state_indices) -> None:
        """The concurrent staged step's clock advance: on the flush's stream, behind the
        flush launch and the prep launch (:func:`clocks.advance_clocks_kernel`)."""
        B = state_indices.shape[0]
        self.compiled["advance"] = advance_clocks_kernel[(1,)](
            self.counters.tickets, state_indices, B, self.HK, _pow2_at_least(B, 256),
            num_warps=4)

    def _staged(self, q, k, v, a, b, A_log, dt_bias, state_indices, out,
                concurrent: bool = False) -> None:
        """The staged output step: the prep launch, then the output launch."""
        self._prep_launch(q, k, a, b, A_log, dt_bias, state_indices, concurrent)
        self._out_launch(v, state_indices, out)

    def _prep_launch(self, q, k, a, b, A_log, dt_bias, state_indices,
                     concurrent: bool = False) -> None:
        B = q.shape[0]
        if self._scratch[0].shape[0] < B:
            self._scratch = self._staged_scratch(B, q.device)
        pqk, pco, pn = self._scratch
        if self._mma == 1:
            pqk = pqk.view(torch.float16)
        self.compiled["prep"] = _prep_kernel[(self.HK, B)](
            q, k, a, b, A_log, dt_bias, state_indices, self.ring_k, self.ring_g, self.ring_beta,
            self.ring_kk, self.counters.tickets, pqk, pco, pn, self.HK, self.HV, self.K, self.L,
            self.R, self.RP, self.CW, _pow2_at_least(self.HV // self.HK, 1), self.ring_id,
            self.eager, CONC=concurrent, MMA=self._mma, KEEP=self.prep_keep,
            RELEASE=self.prep_release and compiled_on(q.device),
            num_warps=self.prep_num_warps,
            maxnreg=self.prep_maxnreg,
        )

    def _out_launch(self, v, state_indices, out) -> None:
        B = v.shape[0]
        pqk, pco, pn = self._scratch
        r = self.read if self.read is not None else self.ckpt
        bv, tpp = self.out_BV, self.out_TPP
        if self._mma == 1:
            pqk = pqk.view(torch.float16)
        self.compiled["out"] = _out_kernel[(self.HV * (self.V // bv) // tpp, B)](
            v, state_indices, out, *r.kernel_args(), self.ring_v, self.ring_d, pqk, pco, pn,
            self.HK, self.HV, self.K, self.V, bv, tpp, self.out_stages, self.R, self.RP, self.CW,
            r.fmt_id, self.ring_id, self._mma, self.out_evict,
            num_warps=self.out_num_warps,
            maxnreg=self.out_maxnreg,
        )

    def _flush_scratch(self, programs: int, B: int) -> torch.Tensor | None:
        """fp32 rows of the scratch flush pass (None where it is not used): one
        ``(block_v, K)`` block per persistent program, or per unit of every slot."""
        read = self.read.fmt if self.read is not None and self.read_encode == "flush" else ""
        if self.flush_pass != "scratch" or "nvfp4" not in (self.ckpt.fmt, read) \
                or self.BV == self.FB:
            return None
        n = self.slots * self.HV * (self.V // self.BV) if self.flush_grid == "units" \
            else programs
        if self._fscratch is None or self._fscratch.numel() < n * self.BV * self.K:
            self._fscratch = torch.empty(n * self.BV * self.K, dtype=torch.float32,
                                         device=self.ring_g.device)
        return self._fscratch

    def _flush(self, q, k, v, a, b, A_log, dt_bias, state_indices, accepted, out,
               commit: bool) -> None:
        """The flush launch (returns at once where nothing flushes): persistent, or one
        program per unit (``flush_grid="units"``); with ``read_encode="launch"`` it
        writes the checkpoint only and :func:`read_encode.encode_read_copies` the read
        copy."""
        B = state_indices.shape[0]
        c, fargs, f_id = self._copies()
        apart = self.read_encode == "launch"
        if apart:
            fargs, f_id = c.kernel_args(), FMT_NONE
        NU = self.V // self.BV
        units = B * self.HV * NU
        if self.flush_grid == "units":
            grid = (self.HV * NU, B)
        else:
            grid = (max(1, min(units, self.n_sm * self.flush_ctas_per_sm)),)
        scr = self._flush_scratch(grid[0], B)
        self.compiled["flush"] = _flush_kernel[grid](
            q, k, v, a, b, A_log, dt_bias, state_indices, accepted, self._skip_flags(B), out,
            *c.kernel_args(), *fargs, self.ring_k, self.ring_v, self.ring_g, self.ring_beta,
            self.ring_kk, self.counters.ring_len, self.counters.steps, self.counters.tickets,
            self.fresh if self.fresh is not None else self.ring_g,
            scr if scr is not None else self.ring_g, as_int32(self.seed), B,
            self.HK, self.HV, self.K, self.V, self.BV, self.FB, self.flush_stages, self.L, self.R,
            self.RP,
            self.LOG2RP, _pow2_at_least(B, 256), self.programs_per_slot, c.fmt_id, f_id,
            self.ring_id, self.fresh is not None, commit, self.dot, not self.flush_licm,
            self.flush_grid == "units", scr is not None, self.fast_encode,
            self.flush_prefetch if compiled_on(q.device) else 0,
            self.ckpt.rows_descriptor(self.FB) if self.flush_tma else None, self.flush_tma,
            self.hw_fp8 and compiled_on(q.device), self.num_warps == 1, self._flush_work,
            self.flush_grid == "dynamic", self.flush_ring_ahead, self.flush_evict,
            num_warps=self.num_warps, maxnreg=self.maxnreg,
        )
        if apart:
            self.compiled["encode"] = encode_read_copies(
                c, self.read, self.counters.tickets, state_indices, self.L,
                self.programs_per_slot, self.n_sm)

    def verify(self, q, k, v, a, b, A_log, dt_bias, state_indices, out=None) -> torch.Tensor:
        """Outputs of T drafts per sequence: q, k (B, T, HK, K), v (B, T, HV, V),
        a, b (B, T, HV).  Drafts go behind the commit pointer; call :meth:`commit`."""
        B, T = q.shape[0], q.shape[1]
        if T > max(self.T, 1):
            raise ValueError(f"this cache was built for at most {self.T} drafts, got {T}")
        _check_shapes(q, v, self.K, self.V)
        if out is None:
            out = torch.empty((B, T, self.HV, self.V), dtype=torch.float32, device=q.device)
        r = self.read if self.read is not None else self.ckpt
        if self.verify_launch.startswith("staged"):
            self._verify_staged(q, k, v, a, b, A_log, dt_bias, state_indices, out, r, T)
            return out
        _verify_kernel[(self.V // self.verify_BV, B * self.HV)](
            q.contiguous(), k.contiguous(), v.contiguous(), a.contiguous(), b.contiguous(),
            A_log, dt_bias, state_indices, out, *r.kernel_args(),
            self.ring_k, self.ring_v, self.ring_d, self.ring_g, self.ring_beta, self.ring_kk,
            self.counters.ring_len, T, self.HK, self.HV, self.K, self.V, self.verify_BV, self.R,
            self.RP, r.fmt_id, self.ring_id, self.verify_stages,
            num_warps=self.verify_num_warps, maxnreg=self.verify_maxnreg,
        )
        return out

    def _verify_staged(self, q, k, v, a, b, A_log, dt_bias, state_indices, out, r, T: int
                       ) -> None:
        """Verify as two launches: per (row, k-head) the drafts' products and
        coefficients, then one read of each tile for all drafts."""
        B = q.shape[0]
        dev = q.device
        if self._vscratch is None or self._vscratch[2].shape[0] < B or \
                self._vscratch[0].shape[0] < B * T:
            self._vscratch = (
                torch.zeros((B * T, self.HK, 2 * self.K), dtype=torch.float32, device=dev),
                torch.zeros((B * T, self.HV, self.CW), dtype=torch.float32, device=dev),
                torch.zeros((B,), dtype=torch.int32, device=dev))
        pqk, pco, pn = self._vscratch
        q, k, v, a, b = (t.contiguous() for t in (q, k, v, a, b))
        self.compiled["vprep"] = _vprep_kernel[(self.HK, B)](
            q, k, a, b, A_log, dt_bias, state_indices, self.ring_k, self.ring_g, self.ring_beta,
            self.ring_kk, self.counters.ring_len, pqk, pco, pn, T, _pow2_at_least(T, 2),
            self.HK, self.HV, self.K, self.R, self.RP, self.CW, self.ring_id,
            num_warps=self.prep_num_warps,
        )
        bv = self.verify_BV
        if self.verify_launch == "staged-dot":
            self.compiled["vout"] = _vout_mm_kernel[(self.HV * (self.V // bv), B)](
                v, state_indices, out, *r.kernel_args(), self.ring_v, self.ring_d, pqk, pco,
                pn, T, _pow2_at_least(T, 2), _pow2_at_least(2 * T, 16), self.HK, self.HV,
                self.K, self.V, bv, self.R, self.RP, self.CW, r.fmt_id, self.ring_id,
                num_warps=self.verify_num_warps, maxnreg=self.verify_maxnreg,
            )
            return
        self.compiled["vout"] = _vout_kernel[(self.HV * (self.V // bv), B)](
            v, state_indices, out, *r.kernel_args(), self.ring_v, self.ring_d, pqk, pco, pn,
            T, self.HK, self.HV, self.K, self.V, bv, self.R, self.RP, self.CW, r.fmt_id,
            self.ring_id, num_warps=self.verify_num_warps, maxnreg=self.verify_maxnreg,
        )

    def commit(self, accepted: torch.Tensor, state_indices: torch.Tensor) -> None:
        """Advance each sequence's commit pointer by ``accepted`` (B,) int32 drafts;
        slots holding L or more committed entries are flushed (SR step = the slot's
        step counter of its last committed draft).  Two launches: the persistent flush
        (returns at once where nothing flushes) and the counter update."""
        B = accepted.shape[0]
        d = self.ring_g  # unused input pointers of a commit flush
        self._flush(d, d, d, d, d, d, d, state_indices, accepted, d, commit=True)
        _commit_counters[(triton.cdiv(B, 256),)](
            accepted, state_indices, self.counters.ring_len, self.counters.steps, B, self.L,
            256)

    def nbytes(self) -> dict[str, int]:
        """Bytes of the checkpoint, read copy and ring."""
        ring = sum(t.numel() * t.element_size() for t in
                   (self.ring_k, self.ring_v, self.ring_d, self.ring_g, self.ring_beta,
                    self.ring_kk))
        return {"checkpoint": self.ckpt.nbytes(),
                "read": self.read.nbytes() if self.read is not None else 0, "ring": ring}

"""Python entry points of the fused Mamba-2 decode kernels: the per-slot cache of
a replay design, the replay step (output or flush) and the conventional step.

Torch references: ``precisionlab.layers.mamba2.conventional_step`` (conventional),
``replay_output`` / ``fold`` / ``read_output`` driven as in
``precisionlab.designs.TorchDesignRunner.step`` (replay step).

Every launch is host-sync free and CUDA-graph capturable: ring positions and
step counters live in device tensors that the kernels themselves advance.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
import triton

from .clocks import FlushStream, advance_clocks_kernel
from .codec import as_int32, encode_state
from .mamba2_conv import mamba2_conv_kernel
from .mamba2_fast import (
    m2_flush_kernel,
    m2_out_heads_kernel,
    m2_out_kernel,
    m2_weights_kernel,
)
from .mamba2_kernel import MODE_STEP, mamba2_kernel
from .read_encode import encode_read_copies, encodes_apart
from .state import DENSE_FORMATS, StateStore, split_unsupported
from .tl_common import RING_BF16, RING_FP16, RING_FP32
from .tl_formats import (
    FMT_BF16_SR,
    FMT_FP8,
    FMT_FP16_SR,
    FMT_FP32,
    FMT_NVFP4,
    compiled_on,
    format_id,
)

_RING_IDS = {torch.float32: RING_FP32, torch.bfloat16: RING_BF16, torch.float16: RING_FP16}
_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "bf16-sr": 2.0, "fp16-sr": 2.0,
          "fp8-e4m3": 1.0, "nvfp4": 0.5, "mxfp4": 0.5}
_BYTES_BY_ID = {format_id(name): b for name, b in _BYTES.items()}
_ARANGE: dict[tuple[int, str], torch.Tensor] = {}
FLUSH_ROWS = 16
"""Rows per flush chunk (the M of the fold's tensor-core dot: at least 16)."""


@dataclass
class HeadParams:
    """Per-head constants: ``A`` (negative), optional ``D`` and ``dt_bias`` (heads,)."""

    A: torch.Tensor
    D: torch.Tensor | None = None
    dt_bias: torch.Tensor | None = None


def default_heads_per_program(slots: int, heads: int, groups: int, sms: int = 132) -> int:
    """Heads per replay program: the largest divisor of heads-per-group that still
    gives about four programs per SM for ``slots`` sequences (1 at batch 1)."""
    hpg = heads // groups
    best = 1
    for d in range(1, hpg + 1):
        if hpg % d == 0 and slots * (heads // d) >= 4 * sms:
            best = d
    return best


ROWS_PER_PROGRAM = 16
"""Default ``rows_per_program`` of a plain cache of the fused launch (one-launch
kernel, small batches).  H200, batch 1, per replay step against whole heads per
program (nemotron-3-nano-4b / -super-120b): fp32 9.2 / 9.0 us against 10.9 / 10.2,
fp32 + fp8 8.8 / 8.8 against 10.9 / 9.9.  nvfp4 copies (the last of a head's programs
to post its part of the matrix amax encodes the copy) take it on grids of at most
``NVFP4_ROWS_MAX_PROGRAMS`` programs: batch 1 9.7 / 9.6 us against 11.9 / 9.6 (a
head's first program folding the whole head, before: 12.2 / 12.4); at batch 4 (1920 /
2048 programs) 19.7 / 20.3 against 25.2 / 17.0."""

ROW_SPLIT_ONE_WARP = (FMT_FP32, FMT_FP8)
"""Read formats (fp32 checkpoint, no read copy or this copy) whose row-split step
programs (``ROWS_PER_PROGRAM`` rows) run one warp by default: their reductions stay
within the warp, with no shared-memory barriers (7 against 32 in the nano-4b fp32
program, offline sm_90).  H200, batch 1, L = 16, us per step (window mean), means of
three timings with 1 / 4 warps, nano-4b and super-120b: fp32 8.60 / 9.08 and 8.84 /
9.03; fp32 + fp8 8.47 / 8.73 and 8.60 / 8.75 (single timings move by 0.2-0.3 us; 2
warps were no faster).  nvfp4 copies keep 4 warps (2: within 0.1 us)."""

NVFP4_ROWS_MAX_PROGRAMS = 512
"""Largest fused grid (slots x heads x row blocks) on which an nvfp4 copy's cache
takes ``ROWS_PER_PROGRAM`` by default."""

SPLIT_MIN_ROWS = 1024
"""Default launch of a replay cache: "split" when slots * heads reaches this, else "fused"."""


@dataclass(frozen=True)
class SplitConfig:
    """Launch configuration of the split replay step (None: the H200-tuned default for
    the stored formats, see :func:`_split_defaults`).

    Output launch: ``out_kernel`` "heads" (a program per ``heads_per_program`` heads,
    a pipelined loop over heads, each head's tiles unrolled; per-head work done once),
    "tiles" (a program per ``tiles_per_program`` tiles, a pipelined loop over tiles) or
    "group" (the one-launch kernel's output path, one tile prefetched in registers,
    ``heads_per_program`` heads; its flush branch compiled out); ``block_p`` rows per
    tile, ``num_warps``, ``stages`` (pipeline depth), ``maxnreg`` (register cap; 0 =
    none).  Flush launch: ``flush_rows`` per chunk (also the flush chunks of the
    one-launch kernel of a "fused" cache), ``flush_chunks`` per unit (None = a
    whole head), ``flush_stages``, ``flush_warps``, ``flush_ctas_per_sm`` (persistent
    programs per SM), ``flush_maxnreg`` (0 = none), ``flush_encoder`` ("fast", the
    default: the nvfp4 encoder of ``tl_mamba2_fast.nvfp4_encode_fast``, and one fold
    per head where ``flush_rows >= headdim``; "ref": the ``tl_formats`` encoders; the
    same bits either way; fast measured 2365 -> 2052 us per nvfp4 flush on an H200),
    ``flush_pass`` (nvfp4 folded in several chunks: "scratch", the default, folds each
    chunk once and its fp32 rows (beside a 16-bit checkpoint, its stored values) wait in
    an L2-resident per-program scratch for the nvfp4 encode; "recompute" folds every
    chunk twice, the matrix amax first; the same bits; H200, nano-4b: 2059 -> 1615 us
    per nvfp4 flush), ``out_weights`` ("heads"
    output only: where each output row's per-head ring weights, ``B_i . C`` folded in,
    are computed: "launch", the default, in a small launch of their own (a program per
    B/C group and row, its heads as one tile) for the output programs to load;
    "program", every output program from the ring of B itself; on an H200 the nvfp4
    output step took 129 instead of 143 us (nano-4b) and 119 instead of 137
    (super-120b) with "launch", the fp8 one 109 instead of 111 and 111 instead of 118;
    the same programs appended to the flush launch's grid made the output steps 12-17%
    slower), ``tail_tile``
    ("heads" output: a power-of-two remainder of headdim as a smaller tile of its own
    instead of a masked full one; None = for 4-bit copies read as bytes only: on an
    H200, nano-4b's 80 rows as 32 + 32 + 16 took 133 instead of 139 us per nvfp4 output
    step; read as words (``out_words``) 114.9 / 112.6 against 107.8 without),
    ``flush_prefetch`` (compiled code only: L2 prefetch of the flush chunk that many
    chunks ahead, the program's next unit included; None = 1 for 1-warp flushes that
    write a 1-byte copy, else 0: on an H200, nano-4b / super-120b, the fp8 flush took
    778 / 843 us with it against 802 / 857 without (one stage, evict-first stores; with
    two stages 821 against 875 on nano-4b), the replay fp32 flush 619 / 675 against
    614 / 648), ``out_prefetch`` (compiled code only: each "heads" output program
    prefetches into L2 what the program that many launches later will load; None =
    2816 for 4-bit copies read as bytes, 1536 for the others read by "heads" programs
    (super-120b, nvfp4 words: 98.5-99.7 -> 96.2-96.9 us), 0 otherwise; fp8 output step
    111.2 -> 108.0 us, nvfp4 bytes 129.4 -> 126.4 on nano-4b), ``evict_first`` (the
    flush's stores of the checkpoint and read copy evict first from L2, so that they do
    not push out the chunks still to be read; None = on: fp8 flush 815 -> 802 us on
    nano-4b, 866 -> 857 on super-120b, nvfp4 1574 -> 1557 on nano-4b).
    ``out_loads_first`` ("heads" output:
    every tile's loads before the first store, for up to 2 tiles per head and a tail
    tile; a tile's stores otherwise keep the compiler from hoisting the next tile's
    loads; None = where that fits the registers: at most 2 tiles and the tail, with
    the cap at 128 for 4-bit copies and 96 for 1-byte ones; H200 output us: nvfp4
    123.3 -> 118.1 on nano-4b, 112.8 -> 109.9 on super-120b, fp8 108.2 -> 104.2 on
    super-120b; nano-4b's three fp8 tiles spill or, at 128 registers, lose: 114.8
    against 107.5; with ``out_words`` not where there is a tail tile, whose loads then
    spill; tail tiles are off with words by default).  ``out_words`` ("heads" output,
    4-bit copies): the codes load as int32 words, each nibble pair turned into fp16 bits
    by two shifts and two masks and widened to float32, instead of bytes whose nibbles
    each take their own integer operations (offline sm_90: 3032 -> 2733 instructions on
    nano-4b, 2270 -> 1917 on super-120b); None = on there (H200, fp16-sr + nvfp4, output
    us: 119.6 / 118.7 -> 113.2 / 112.8 on nano-4b, 114.7 / 111.2 -> 99.7 / 99.5 on
    super-120b; nano-4b without its tail tile 107.8).
    ``flush_tma`` (dense checkpoints, headdim a multiple of ``flush_rows``): the flush
    loads the checkpoint's chunks through a tensor descriptor (TMA bulk copies into
    shared memory on Hopper, issued ``flush_stages - 1`` chunks ahead by the chunk
    loop's pipeline); None = on, with two stages, where the flush writes a 1-byte read
    copy from 1-warp programs (see :func:`_split_defaults`).
    ``concurrent_flush`` ("heads" output with the weights launch): the flush launch and
    the clock advance run on a second CUDA stream beside the weights and output
    launches (``mamba2_fast``'s "Concurrent flush"); None = on for CUDA tensors.  On the
    CPU, True runs the flush after the output launch, the order a second stream may
    take.  (Starting the second stream after the weights launch instead lost 0.5-2 us per
    step on an H200.)  ``flush_grid``: "persistent" (every flush program takes every
    G-th unit) or "dynamic" (the programs claim their units one at a time from a
    counter, so programs that start late or run slow take fewer; the chunks prefetched
    ahead then stop at a unit's end); None = "dynamic" for nvfp4 and 1-byte copies,
    else "persistent" (see :func:`_split_defaults`).  ``read_encode``: "flush" (the
    flush encodes the read copy beside the checkpoint) or "launch" (the flush writes
    the checkpoint only, with the settings of a flush without a read copy, and a launch
    of its own behind it encodes the flushed heads' read copies from their checkpoints:
    ``read_encode.encode_read_copies``, the same bits); "launch" needs a dense
    checkpoint (``read_encode.encodes_apart``) and an nvfp4 or mxfp4 read copy, and None
    means it there (H200, batch 256, L = 16, us per step, nano-4b / super-120b: nvfp4 193.5 ->
    186.1 / 193.9 -> 185.1, mxfp4 203.1 -> 176.4 / 202.7 -> 175.2; the flush step
    1373 -> 1226 / 1477 -> 1293 and 1518 -> 1062 / 1625 -> 1153; an fp16-sr
    checkpoint's nvfp4 copy, with the flush's 2-warp programs, against the twentieth
    run's flush that encoded it: 200.5 -> 190.9 / 199.5 -> 188.1).
    ``out_pairs`` ("heads" output of 1-byte and 4-bit copies with the weights launch;
    headdim not a multiple of ``block_p``, twice it is, heads per group even): a program
    takes two heads and their rows as one run of tiles, none of them masked (a headdim of
    80 in 32-row tiles: 5 tiles per two heads instead of 6); None = on where it applies
    and no other setting excludes it (tail tiles, loads first, a 4-bit copy read as
    bytes), with no L2 prefetch (``out_prefetch``) and 128 registers for 4-bit copies
    (H200, nano-4b, batch 256, L = 16, output step us: nvfp4 105.7-108.7 -> 99.2-101.2,
    fp8 105.2-106.3 -> 103.8-104.4; with the one-head programs' prefetch distance nvfp4
    stayed at 106.6 and fp8 lost, 121.9); also on, as a pair loop, for a 4-bit copy read as
    words whose headdim is one or two full tiles (two heads' tiles as one run, none
    shared; super-120b nvfp4 output step 93.2 us with each head's tiles loaded first ->
    91.0, once the words' decode had become cheaper); set explicitly, it takes any headdim
    that is a multiple of ``block_p``.
    ``out_ahead`` (with ``out_pairs``; 0, 1 or 2, fewer than the pair's tiles): the loads of
    the tile that many places later go out before a tile's row dot and stores, so that many
    tiles' bytes are in flight while one is finished; None = 1 for 4-bit copies' pairs
    unrolled, at their 128 registers (H200, nano-4b, batch 256, L = 16, nvfp4 output step
    101.5-102.9 -> 97.4 us; two ahead spill there and, at 168 registers, lost: 103.9), else
    0 (fp8 pairs one ahead fit at 128 registers: 102.2-103.1 against 103.6-105.8 us, within
    the runs' spread; super-120b's 4-bit copy as pairs one ahead, 97.9 us, lost to its
    default two heads with loads first, 94.8); 0 where ``out_pair_loop`` runs, and set (0
    too) it unrolls the pair. ``out_pair_loop`` (with ``out_pairs``): the pair's tiles in a
    ``tl.range`` loop of ``stages`` stages (the tile loads become asynchronous copies into
    shared memory, issued stages - 1 tiles ahead), every tile computed as one that straddles
    the two heads (per-row weights), instead of unrolled: a third of the code; None = on,
    with 3 stages, for 4-bit copies (H200, nano-4b, batch 256, L = 16, nvfp4 output step
    96.2-97.4 us unrolled one tile ahead -> 91.2; 1 / 2 stages 97.1 / 98.9), else off (fp8:
    2 stages 102.8 against 103.1-104.4; super-120b's 4-bit copy as a pair loop of 2 stages
    lost at first, 105.3 against its two heads with loads first, 94.9, and won with 3
    stages after the decode changes, 91.0 against 93.2).
    The fold runs on the tensor cores in two tf32 passes (three for an fp32 ring),
    splits explicit."""

    out_kernel: str | None = None
    block_p: int | None = None
    num_warps: int | None = None
    tiles_per_program: int | None = None
    heads_per_program: int | None = None
    stages: int | None = None
    flush_rows: int = 16
    flush_chunks: int | None = None
    flush_stages: int | None = None
    flush_warps: int | None = None
    flush_ctas_per_sm: int | None = None
    maxnreg: int | None = None
    flush_maxnreg: int | None = None
    flush_encoder: str = "fast"
    flush_pass: str = "scratch"
    out_weights: str = "launch"
    tail_tile: bool | None = None
    flush_prefetch: int | None = None
    out_prefetch: int | None = None
    evict_first: bool | None = None
    out_loads_first: bool | None = None
    out_words: bool | None = None
    flush_tma: bool | None = None
    concurrent_flush: bool | None = None
    flush_grid: str | None = None
    read_encode: str | None = None
    out_pairs: bool | None = None
    out_ahead: int | None = None
    out_pair_loop: bool | None = None


_SMS: dict[str, int] = {}


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 2
    key = str(device)
    if key not in _SMS:
        _SMS[key] = torch.cuda.get_device_properties(device).multi_processor_count
    return _SMS[key]


@dataclass
class Mamba2Cache:
    """Device state of one replay design for a pool of ``slots`` sequences.

    ``ckpt`` is the checkpoint (the shared copy for shared designs); ``read`` the
    split read copy (None for shared).  A plain cache's ring position and step
    come from the per-slot clock ``tickets`` (advanced by every replay step); a
    ``speculative`` cache has two ring halves and explicit ``ring_len`` (committed
    entries | half << 16) and ``steps`` that only :func:`mamba2_commit` writes.
    ``heads_per_program`` fixes the one-launch kernel's work split (its clock counts
    programs), so it is chosen once per cache, as is ``rows_per_program`` (fused
    launch only: a program per head and block of that many rows instead of whole
    heads, 0; for small batches).  ``launch`` is "fused" (one launch
    per step, :mod:`mamba2_kernel`) or "split" (a flush launch and an output launch,
    :mod:`mamba2_fast`; the clock counts steps); also fixed per cache.
    """

    ckpt: StateStore
    read: StateStore | None
    ring_x: torch.Tensor
    ring_B: torch.Tensor
    ring_dt: torch.Tensor
    ring_len: torch.Tensor
    steps: torch.Tensor
    tickets: torch.Tensor
    window: int
    heads_per_program: int = 1
    rows_per_program: int = 0
    seed: int = 0
    fresh: torch.Tensor | None = None
    launch: str = "fused"
    split_config: SplitConfig = field(default_factory=SplitConfig)
    pos: torch.Tensor | None = None
    out_wts: torch.Tensor | None = None
    """Per (batch row, head) ring weights for the "heads" output launch."""
    flush_scratch: torch.Tensor | None = None
    """fp32 rows of the nvfp4 flush's scratch pass (one head per persistent program)."""
    flush_work: torch.Tensor | None = None
    """The dynamic flush grid's unit counter and count of programs done (zero between
    flushes)."""
    part_scratch: tuple[torch.Tensor, torch.Tensor] | None = None
    """Row-split fused programs of an nvfp4 copy: fp32 rows and sync words per (batch
    row, head) matrix (:func:`_part_buffers`)."""
    flush_stream: FlushStream = field(default_factory=FlushStream)
    """The concurrent flush's stream and the event after the weights launch."""

    @classmethod
    def allocate(
        cls,
        slots: int,
        heads: int,
        headdim: int,
        dstate: int,
        groups: int,
        *,
        checkpoint_format: str = "fp32",
        read_format: str | None = None,
        window: int = 16,
        ring_dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str = "cuda",
        seed: int = 0,
        keep_fresh: bool = False,
        speculative: bool = False,
        heads_per_program: int | None = None,
        launch: str | None = None,
        split_config: SplitConfig | None = None,
        rows_per_program: int | None = None,
    ) -> Mamba2Cache:
        """Zero state, empty rings.  ``read_format=None`` is a shared design;
        ``keep_fresh`` also keeps the fp32 state of every flush in ``fresh``;
        ``speculative`` gives each slot two ring halves (verify/commit only);
        ``launch``: "fused" or "split" (None: split from ``SPLIT_MIN_ROWS`` slot-heads);
        ``rows_per_program``: fused launch only, a power of two >= 16 or 0 for whole
        heads (None: ``ROWS_PER_PROGRAM`` for a plain fused cache without
        ``heads_per_program`` > 1 -- with nvfp4 copies only on grids of at most
        ``NVFP4_ROWS_MAX_PROGRAMS`` programs -- else 0)."""
        shape = (slots, heads, headdim, dstate)
        if ring_dtype not in _RING_IDS:
            raise ValueError(f"ring dtype must be fp32, bf16 or fp16, got {ring_dtype}")
        if window < 1:
            raise ValueError("window must be >= 1")
        if (why := split_unsupported(checkpoint_format, read_format)) is not None:
            raise ValueError(why)
        if launch is None:
            launch = "split" if slots * heads >= SPLIT_MIN_ROWS else "fused"
        if launch not in ("fused", "split"):
            raise ValueError(f"launch must be 'fused' or 'split', got {launch!r}")
        if rows_per_program is None:  # small batches: latency decides
            small = ("nvfp4" not in (checkpoint_format, read_format)
                     or slots * heads * -(-headdim // ROWS_PER_PROGRAM)
                     <= NVFP4_ROWS_MAX_PROGRAMS)
            rows_per_program = (ROWS_PER_PROGRAM if launch == "fused" and not speculative
                                and heads_per_program in (None, 1) and small else 0)
        if rows_per_program:
            _check_rows_per_program(rows_per_program, launch, speculative, heads_per_program)
            heads_per_program = 1
        hpp = heads_per_program or default_heads_per_program(slots, heads, groups)
        if (heads // groups) % hpp:
            raise ValueError(f"heads_per_program {hpp} must divide heads per group "
                             f"{heads // groups}")
        i32 = dict(dtype=torch.int32, device=device)
        cap = 2 * window if speculative else window
        cache = cls(
            ckpt=StateStore.empty(checkpoint_format, shape, device),
            read=None if read_format is None else StateStore.empty(read_format, shape, device),
            ring_x=torch.zeros((slots, cap, heads, headdim), dtype=ring_dtype, device=device),
            ring_B=torch.zeros((slots, cap, groups, dstate), dtype=ring_dtype, device=device),
            ring_dt=torch.zeros((slots, cap, heads), dtype=torch.float32, device=device),
            ring_len=torch.zeros(slots, **i32),
            steps=torch.zeros(slots, **i32),
            tickets=torch.zeros(slots, **i32),
            window=window,
            heads_per_program=hpp,
            rows_per_program=rows_per_program,
            seed=seed,
            fresh=torch.zeros(shape, dtype=torch.float32, device=device) if keep_fresh else None,
            launch=launch,
            split_config=split_config or SplitConfig(),
        )
        cache.load_state(torch.zeros(shape, dtype=torch.float32, device=device))
        return cache

    @property
    def split(self) -> bool:
        return self.read is not None

    @property
    def speculative(self) -> bool:
        return self.ring_x.shape[1] == 2 * self.window

    @property
    def reader(self) -> StateStore:
        """The copy output steps read."""
        return self.read if self.read is not None else self.ckpt

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return self.ckpt.shape

    @property
    def programs_per_slot(self) -> int:
        """Increments of a slot's clock per replay step."""
        if self.launch == "split":
            return 1
        if self.rows_per_program:
            return self.shape[1] * triton.cdiv(self.shape[2], self.rows_per_program)
        return self.shape[1] // self.heads_per_program

    def steps_taken(self) -> torch.Tensor:
        """Decode steps (committed tokens) per slot, int32 on the device."""
        if self.speculative:
            return self.steps.clone()
        return self.tickets // self.programs_per_slot

    def committed(self) -> torch.Tensor:
        """Entries in each slot's ring since its checkpoint, int32 on the device."""
        if self.speculative:
            return self.ring_len & 0xFFFF
        return self.steps_taken() % self.window

    def load_state(self, S: torch.Tensor, step: int = 0) -> None:
        """Store fp32 states ``S`` (slots, heads, P, N) as the checkpoint (seed) and
        the read copy of that checkpoint (seed + 1), the bits of the torch formats
        (``codec.encode_state``); empty the rings and counters."""
        self.ckpt.copy_(encode_state(S, self.ckpt.fmt, seed=self.seed, step=step))
        if self.read is not None:
            self.read.copy_(encode_state(self.ckpt.decode(), self.read.fmt,
                                         seed=self.seed + 1, step=step))
        self.reset_counters()

    def reset_counters(self, slots: torch.Tensor | None = None) -> None:
        """Empty the rings of ``slots`` (all when None): a new sequence in a slot."""
        for t in (self.ring_len, self.steps, self.tickets):
            if slots is None:
                t.zero_()
            else:
                t[slots] = 0

    def state_bytes(self) -> tuple[int, int]:
        """``(checkpoint bytes, read-copy bytes)`` over all slots."""
        return self.ckpt.nbytes(), self.reader.nbytes()


def _read_encode_apart(read_encode: str | None, ckpt: str, read: StateStore | None) -> bool:
    """Whether a split step's read copy is encoded by a launch of its own
    (``SplitConfig.read_encode``)."""
    fits = read is not None and encodes_apart(ckpt, read.fmt)
    if read_encode is None:
        return fits
    if read_encode not in ("flush", "launch"):
        raise ValueError(f"read_encode must be 'flush' or 'launch', got {read_encode!r}")
    if read_encode == "launch" and not fits:
        raise ValueError(f"read_encode='launch' needs a dense checkpoint and an nvfp4 or "
                         f"mxfp4 read copy, got {ckpt!r} + "
                         f"{read.fmt if read is not None else None!r}")
    return read_encode == "launch"


def _check_rows_per_program(rpp: int, launch: str, speculative: bool, hpp: int | None
                            ) -> None:
    """Reject a ``rows_per_program`` the one-launch kernel cannot run."""
    if rpp < FLUSH_ROWS or rpp & (rpp - 1):
        raise ValueError(f"rows_per_program must be a power of two >= {FLUSH_ROWS}, "
                         f"got {rpp}")
    if launch != "fused" or speculative:
        raise ValueError("rows_per_program is for plain caches of the fused launch")
    if hpp not in (None, 1):
        raise ValueError("rows_per_program needs heads_per_program 1")


def device_buffer(buf: torch.Tensor | None, n: int, device: torch.device,
                  dtype: torch.dtype = torch.float32, zero: bool = False) -> torch.Tensor:
    """``buf`` where it holds ``n`` elements on ``device``, else a new (zeroed where
    ``zero``) 1-D buffer of ``n``: a cache's scratch, reused across steps."""
    if buf is not None and buf.numel() >= n and buf.device == device:
        return buf
    return (torch.zeros if zero else torch.empty)(n, dtype=dtype, device=device)


def slot_indices(batch: int, device: torch.device) -> torch.Tensor:
    """Cached ``arange(batch)`` int32 (batch row b uses slot b)."""
    key = (batch, str(device))
    if key not in _ARANGE:
        _ARANGE[key] = torch.arange(batch, dtype=torch.int32, device=device)
    return _ARANGE[key]


def pick_block_p(headdim: int, dstate: int, fmt_ids: tuple[int, ...],
                 block_p: int | None = None, minimum: int = 16) -> int:
    """Rows per output tile: ``block_p``, else the H200-tuned default (32 rows for
    fp32 / 16-bit / fp8 read copies, 64 for 4-bit), at least ``minimum`` and at most
    the padded headdim."""
    whole = triton.next_power_of_2(headdim)
    if block_p is None:
        block_p = 64 if min(_BYTES_BY_ID[f] for f in fmt_ids) < 1 else 32
    return max(minimum, min(block_p, whole))


def pick_warps(block_p: int, dstate: int, num_warps: int | None = None) -> int:
    """Warps per program: 4 up to 32-row tiles, 8 above (the H200-tuned choice)."""
    if num_warps is not None:
        return num_warps
    return 4 if block_p * dstate <= 4096 else 8


def fused_warps(rows_per_program: int | None, block_p: int, dstate: int, ck_id: int,
                rd_id: int, num_warps: int | None = None) -> int:
    """Warps per program of the fused launch: ``num_warps`` if given; one for row-split
    step programs of an fp32 checkpoint read as fp32 or fp8 (``ROW_SPLIT_ONE_WARP``);
    else :func:`pick_warps`."""
    if num_warps is None and rows_per_program and ck_id == FMT_FP32 \
            and rd_id in ROW_SPLIT_ONE_WARP:
        return 1
    return pick_warps(block_p, dstate, num_warps)


def _strides(t: torch.Tensor | None, token_dim: bool) -> tuple[int, int]:
    if t is None:
        return 0, 0
    return t.stride(0), (t.stride(1) if token_dim else 0)


def _inner_contiguous(t: torch.Tensor | None, inner: int, name: str) -> None:
    if t is None:
        return
    want = 1
    for d in range(t.dim() - 1, t.dim() - 1 - inner, -1):
        if t.shape[d] != 1 and t.stride(d) != want:
            raise ValueError(f"{name} must be contiguous in its last {inner} dims")
        want *= t.shape[d]


def _check_inputs(x, dt, B, C, z, out) -> None:
    for t, name, inner in ((x, "x", 2), (B, "B", 2), (C, "C", 2), (dt, "dt", 1), (z, "z", 2),
                           (out, "out", 2)):
        _inner_contiguous(t, inner, name)


def launch_replay(
    mode: int,
    cache: Mamba2Cache,
    x: torch.Tensor,
    dt: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    params: HeadParams,
    *,
    z: torch.Tensor | None,
    out: torch.Tensor,
    state_indices: torch.Tensor,
    T: int,
    dt_softplus: bool,
    block_p: int | None = None,
    num_warps: int | None = None,
) -> None:
    """Launch :func:`mamba2_kernel` (replay step, or verify of ``T`` drafts when
    the inputs are token-major (batch, T, ...))."""
    ckpt, read = cache.ckpt, cache.read
    slots, H, P, N = ckpt.shape
    if N & (N - 1) or N < 16:
        raise ValueError(f"dstate must be a power of two >= 16, got {N}")
    _check_inputs(x, dt, B, C, z, out)
    tok = x.dim() == 4
    G = B.shape[-2]
    rd = read if read is not None else ckpt
    ids = (ckpt.fmt_id, rd.fmt_id)
    rpp = cache.rows_per_program if mode == MODE_STEP else None
    if rpp and block_p not in (None, rpp):
        raise ValueError(f"block_p {block_p} differs from the cache's rows_per_program {rpp}")
    bp = rpp or pick_block_p(P, N, ids, block_p)
    nw = fused_warps(rpp, bp, N, ckpt.fmt_id, rd.fmt_id, num_warps)
    hpp = cache.heads_per_program
    ring_id = _RING_IDS[cache.ring_x.dtype]
    rx, rB = cache.ring_x, cache.ring_B
    if ring_id != RING_FP32:
        rx, rB = rx.view(torch.int16), rB.view(torch.int16)
    L, LR = cache.window, cache.ring_x.shape[1]
    npb = triton.cdiv(P, bp)
    need_amax = FMT_NVFP4 in ids
    fb = cache.split_config.flush_rows if mode == MODE_STEP else FLUSH_ROWS
    if rpp:  # a row-split program flushes its own rows (nvfp4: the last encodes them all)
        fb = min(fb, bp)
    # row split: a program per (head, tile)
    grid0, nt = (H * npb, 1) if rpp else (H // hpp, hpp * npb)
    nq = bp // fb if rpp else triton.cdiv(P, fb)
    scr, sync = _part_buffers(cache, x.shape[0]) if rpp and need_amax else (out, ckpt.codes)
    mamba2_kernel[(grid0, x.shape[0])](
        *ckpt.kernel_args(), *rd.kernel_args(),
        cache.fresh if cache.fresh is not None else ckpt.codes,
        rx, rB, cache.ring_dt, cache.ring_len, cache.steps, cache.tickets, state_indices,
        x, dt, B, C, z if z is not None else x, out, params.A,
        params.D if params.D is not None else params.A,
        params.dt_bias if params.dt_bias is not None else params.A, scr, sync,
        as_int32(cache.seed), as_int32(cache.seed + 1),
        *_strides(x, tok), *_strides(dt, tok), *_strides(B, tok), *_strides(C, tok),
        *_strides(z, tok), *_strides(out, tok),
        H, G, P, L, LR,
        N=N, BLOCK_P=bp, NPB=npb, HPP=hpp, NT=nt, FB=fb, NQ=nq,
        RB=max(16, triton.next_power_of_2(L)), T=T, TB=max(2, triton.next_power_of_2(T)),
        MODE=mode, CK_FMT=ckpt.fmt_id, RD_FMT=rd.fmt_id, SPLIT=read is not None,
        RING=ring_id, HAS_Z=z is not None, HAS_D=params.D is not None,
        HAS_DT_BIAS=params.dt_bias is not None, DT_SOFTPLUS=dt_softplus,
        WRITE_FRESH=cache.fresh is not None, NEED_AMAX=need_amax,
        ROW_SPLIT=bool(rpp), HW_CVT=compiled_on(x.device), NQH=triton.cdiv(P, fb),
        num_warps=nw,
    )


def _part_buffers(cache: Mamba2Cache, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-split programs of an nvfp4 copy: the fp32 rows of every (batch row, head)
    matrix and its two sync words (zero between flushes; the kernel clears them)."""
    H, P, N = cache.shape[1:]
    bufs = cache.part_scratch
    if bufs is None or bufs[1].numel() < batch * H * 2:
        dev = cache.ckpt.codes.device
        bufs = (torch.empty(batch * H * P * N, dtype=torch.float32, device=dev),
                torch.zeros(batch * H * 2, dtype=torch.int32, device=dev))
        cache.part_scratch = bufs
    return bufs


SMEM_PER_SM = 228 * 1024
"""Shared memory of an H100 / H200 SM (each resident program also reserves 1 KB)."""


def _resident_flush_programs(cfg: SplitConfig, N: int, RB: int) -> int:
    """``flush_ctas_per_sm``, capped at the persistent flush programs that fit on one
    SM at once (estimated shared memory: the chunk pipeline's fp32 stages and the
    ring's B tile; registers where capped): a program that has to wait for another to
    finish would add its whole share of units to the flush's tail (H200, nano-4b, L =
    32: the fp32 flush took 1948 us with 6 programs of 43 KB per SM, of which 5 fit,
    against 653 us at L = 16 where all fit)."""
    smem = (cfg.flush_stages * cfg.flush_rows + RB) * N * 4 + 1024
    fit = SMEM_PER_SM // smem
    if cfg.flush_maxnreg:
        fit = min(fit, 65536 // (cfg.flush_warps * 32 * cfg.flush_maxnreg))
    return max(1, min(cfg.flush_ctas_per_sm, fit))


def _pairs_fit(kind: str, narrow: bool, P: int, bp: int, hpg: int, whole: bool = False
               ) -> bool:
    """Whether two heads' rows make whole ``bp``-row tiles and (unless ``whole``) one
    head's do not, in "heads" programs of a 1-byte or 4-bit copy
    (``SplitConfig.out_pairs``)."""
    return (kind == "heads" and narrow and (whole or P % bp != 0) and (2 * P) % bp == 0
            and bp <= P and hpg % 2 == 0)


def _check_pairs(cfg: SplitConfig, kind: str, narrow: bool, P: int, bp: int, hpg: int) -> None:
    """Raise ValueError where ``out_pairs`` cannot apply."""
    if kind != "heads" or not narrow or cfg.out_weights != "launch":
        raise ValueError("out_pairs needs the 'heads' output launch, a 1-byte or 4-bit read "
                         "copy and out_weights='launch'")
    if cfg.heads_per_program not in (None, 2):
        raise ValueError(f"out_pairs takes 2 heads per program, got "
                         f"{cfg.heads_per_program}")
    if not _pairs_fit(kind, narrow, P, bp, hpg, whole=True):
        raise ValueError(f"out_pairs needs a headdim whose double is a multiple of block_p "
                         f"(block_p <= headdim) and an even number of heads per group; got "
                         f"headdim {P}, block_p {bp}, {hpg} heads per group")


def _tail_rows(tail_tile: bool, P: int, bp: int) -> int:
    """Rows of the "heads" output's tail tile (0: none): with ``tail_tile`` (as
    :func:`_split_defaults` resolves it), a power-of-two remainder of headdim (at least
    8) as a tile of its own."""
    tail = P % bp
    return tail if tail_tile and tail >= 8 and tail & (tail - 1) == 0 else 0


def _split_defaults(cfg: SplitConfig, P: int, N: int, H: int, G: int, rd_id: int,
                    need_amax: bool, ck_dense: bool = True,
                    flush_rd_id: int | None = None) -> SplitConfig:
    """Fill the None fields of a split launch configuration.  Defaults (the H200
    sweeps at batch 256, L = 16, nemotron-3-nano-4b / -super-120b shapes): an fp32 or
    16-bit read copy streams through the "group" output kernel (4 warps, 4 heads per
    program, 32-row tiles where they divide headdim, else 16); 1-byte and 4-bit copies
    through 1-warp "heads" programs of 32-row tiles, one head each (two: where their
    rows pair into whole tiles, ``out_pairs``, and for 4-bit copies read as words whose
    head is at most two tiles, each head's loads first), capped at 80 (fp8)
    / 96 (4-bit) registers so that 25 / 21 programs fit per SM instead of 16 (fp8
    output step 121 -> 111 us on nano-4b, 135 -> 117 on super-120b), their ring weights
    from the weights launch (``out_weights``) and an L2 prefetch of a later program's
    rows (``out_prefetch``); flush chunks of 16 rows: 1-warp programs (one warp per
    2048 chunk elements, up to 4), 8 per SM at up to 255 registers, one pipeline stage
    (two before the eighth H200 run) and evict-first stores (H200, batch 256, against
    4-warp programs: fp32 + fp8 flush 1108 -> 915 us on nano-4b, 1236 -> 979 on
    super-120b; replay fp32 785 -> 643 and 900 -> 704; then one stage: fp8 875 -> 815,
    replay fp32 644 -> 604); where they write a 1-byte copy from a dense checkpoint,
    TMA loads of the checkpoint in two stages (``flush_tma``; tenth H200 run, fp8 flush
    795-809 -> 749 us on nano-4b, 864-867 -> 817 on super-120b; one stage 778, three
    807; the replay fp32 flush lost, 606 -> 624-654, and so did nvfp4's, 1562 ->
    1628-1755); nvfp4 flushes in 4-warp programs of one stage (their units fold once
    into a scratch and encode from it), 4 per SM, capped at 128 registers (1- or 2-warp
    ones took 1.2-1.4x as long).  nvfp4 and 1-byte copies' flush units are claimed from
    a counter (``flush_grid`` "dynamic"; nineteenth H200 run, flush us: nvfp4 1501-1510
    -> 1459-1462 on nano-4b, 1638-1640 -> 1599-1600 on super-120b, fp8 701 -> 703 and
    771 -> 741; twentieth, fp8 733 / 733 -> 700 and 792 / 795 -> 745); fp32 and 16-bit
    copies keep the persistent grid (replay fp32 within 1%).  ``flush_rd_id``: the
    format the flush launch writes as its read copy where that is not ``rd_id`` (the
    checkpoint's, when a launch of its own encodes the copy); the flush settings follow
    it."""
    hpg = H // G
    f_id = rd_id if flush_rd_id is None else flush_rd_id
    f_wide = _BYTES_BY_ID[f_id] >= 2
    f_narrow = _BYTES_BY_ID[f_id] <= 1
    f_one_byte = _BYTES_BY_ID[f_id] == 1
    wide = _BYTES_BY_ID[rd_id] >= 2
    kind = cfg.out_kernel or ("group" if wide else "heads")
    if cfg.flush_encoder not in ("ref", "fast"):
        raise ValueError(f"flush_encoder must be 'ref' or 'fast', got {cfg.flush_encoder!r}")
    if cfg.flush_pass not in ("recompute", "scratch"):
        raise ValueError(f"flush_pass must be 'recompute' or 'scratch', got "
                         f"{cfg.flush_pass!r}")
    if cfg.flush_grid not in (None, "persistent", "dynamic"):
        raise ValueError(f"flush_grid must be 'persistent' or 'dynamic', got "
                         f"{cfg.flush_grid!r}")
    if cfg.out_weights not in ("launch", "program"):
        raise ValueError(f"out_weights must be 'launch' or 'program', got "
                         f"{cfg.out_weights!r}")
    for name in ("flush_prefetch", "out_prefetch", "out_ahead"):
        val = getattr(cfg, name)
        if val is not None and (not isinstance(val, int) or isinstance(val, bool) or val < 0):
            raise ValueError(f"{name} must be an integer >= 0, got {val!r}")
    for name in ("tail_tile", "evict_first", "out_loads_first", "out_words", "flush_tma",
                 "concurrent_flush", "out_pairs", "out_pair_loop"):
        if getattr(cfg, name) not in (None, True, False):
            raise ValueError(f"{name} must be true, false or unset, got {getattr(cfg, name)!r}")
    if kind not in ("heads", "tiles", "group"):
        raise ValueError(f"out_kernel must be 'heads', 'tiles' or 'group', got {kind!r}")
    if kind == "group":
        bp = cfg.block_p or (32 if P % 32 == 0 else 16)
    else:
        bp = cfg.block_p or (32 if kind == "heads" else (64 if P % 64 == 0 else 32))
    bp = max(16, min(bp, triton.next_power_of_2(P)))
    npb = triton.cdiv(P, bp)
    nw = cfg.num_warps or (1 if kind == "heads" else 4)
    narrow = _BYTES_BY_ID[rd_id] <= 1  # 1-byte and 4-bit copies
    want = 1 if (kind == "heads" and narrow) else 4
    four_bit = _BYTES_BY_ID[rd_id] < 1
    words = cfg.out_words
    if words is None:
        words = kind == "heads" and four_bit
    if words and not (kind == "heads" and four_bit):
        raise ValueError("out_words needs the 'heads' output launch and a 4-bit read copy")
    # a 4-bit copy read as words whose head is one or two full tiles
    whole_heads = (kind == "heads" and four_bit and words and P % bp == 0 and P // bp <= 2
                   and hpg % 2 == 0 and not cfg.tail_tile)
    pairs = cfg.out_pairs
    if pairs is None:  # where it applies and is not excluded; 4-bit copies read as words
        pairs = (_pairs_fit(kind, narrow, P, bp, hpg) and cfg.out_weights == "launch"
                 and cfg.heads_per_program in (None, 2) and not cfg.tail_tile
                 and not cfg.out_loads_first and (words or not four_bit))
        # whole heads too: the two heads' tiles as one run, in the pair loop (H200,
        # super-120b, batch 256, L = 16, nvfp4 output step 93.2 us with each head's tiles
        # loaded first -> 91.0)
        pairs = pairs or (whole_heads and cfg.out_weights == "launch"
                          and cfg.heads_per_program in (None, 2)
                          and cfg.out_loads_first is None)
    elif pairs:
        _check_pairs(cfg, kind, narrow, P, bp, hpg)
    if cfg.out_pair_loop and not pairs:
        raise ValueError("out_pair_loop needs out_pairs")
    if cfg.out_pair_loop and cfg.out_ahead:
        raise ValueError("out_pair_loop and out_ahead exclude each other (a loop's loads "
                         "run ahead through its stages)")
    # a 4-bit copy's pairs: their tiles in a loop of 3 stages (H200, nano-4b, batch 256,
    # L = 16, nvfp4 output step 96.2-97.4 us unrolled one tile ahead -> 91.2)
    pair_loop = bool(cfg.out_pair_loop if cfg.out_pair_loop is not None
                     else pairs and four_bit and cfg.out_ahead is None)
    if cfg.out_ahead and not pairs:
        raise ValueError("out_ahead needs out_pairs (two heads' rows as one run of tiles)")
    # a 4-bit copy's pairs unrolled (out_pair_loop false): one tile's loads ahead (H200,
    # nano-4b, batch 256, L = 16, nvfp4 output step 101.5-102.9 -> 97.4 us)
    ahead = cfg.out_ahead if cfg.out_ahead is not None else int(
        bool(pairs) and four_bit and not pair_loop)
    if cfg.out_ahead and (cfg.out_ahead > 2 or cfg.out_ahead >= 2 * P // bp):
        raise ValueError(f"out_ahead takes 1 or 2 tiles, fewer than the {2 * P // bp} tiles "
                         f"of two heads; got {cfg.out_ahead}")
    # whole heads not paired (pairs are their default; set out_loads_first to get this):
    # two heads per program, each head's tiles loaded first, no L2 prefetch (H200,
    # super-120b, batch 256, L = 16, nvfp4 output step 97.0-97.9 -> 94.2-94.6 us, before
    # the pair loop took over; fp8 copies lost, 102.5 -> 110.9-119.2)
    duo = (cfg.heads_per_program is None and not pairs and whole_heads
           and cfg.out_loads_first is not False)
    hpp = cfg.heads_per_program or (2 if pairs or duo else max(
        d for d in (1, 2, 4) if hpg % d == 0 and d <= want) if kind != "tiles" else 1)
    if hpg % hpp:
        raise ValueError(f"heads_per_program {hpp} must divide heads per group {hpg}")
    tpp = cfg.tiles_per_program or npb * hpp
    if (npb * hpg) % tpp:
        raise ValueError(f"tiles_per_program {tpp} must divide a group's {npb * hpg} tiles")
    # "heads" programs of one head: every tile's loads before the first store where
    # they fit the registers (4-bit copies; 1-byte ones of at most two tiles)
    one_head = kind == "heads" and narrow and (hpp == 1 or duo)  # (duo: loads per head)
    narrow_heads = one_head or pairs  # 1-warp programs, register caps
    use_tail = cfg.tail_tile if cfg.tail_tile is not None else four_bit and not words
    if pairs and use_tail:
        if cfg.tail_tile:
            raise ValueError("out_pairs and tail_tile exclude each other")
        use_tail = False
    tail = _tail_rows(use_tail, P, bp)
    full = P // bp if tail else npb  # tiles but the tail
    loads_first = cfg.out_loads_first
    if loads_first is None:  # words: a tail tile's loads too spill at 128 registers
        loads_first = one_head and full <= 2 and not (words and tail) and not pairs
    if loads_first and pairs:
        raise ValueError("out_pairs and out_loads_first exclude each other")
    if loads_first and full > 2:
        raise ValueError(f"out_loads_first takes at most 2 tiles per head besides a tail "
                         f"tile, got headdim {P} in {bp}-row tiles")
    tma_ok = ck_dense and P % cfg.flush_rows == 0
    if cfg.flush_tma and not tma_ok:
        raise ValueError(f"flush_tma needs a dense checkpoint (fp32 or 16-bit) and headdim "
                         f"a multiple of flush_rows, got headdim {P}, flush_rows "
                         f"{cfg.flush_rows}")
    fc = cfg.flush_chunks
    if fc is None or need_amax:
        fc = triton.cdiv(P, cfg.flush_rows)  # a whole head (nvfp4: must be)
    # flush programs: one warp per 16 x 128 chunk elements (up to 4), as many programs
    # per SM as their registers allow; nvfp4 flushes keep 4 warps.  A flush that writes
    # a stochastically rounded 16-bit checkpoint alone (its 4-bit copy, if any, encoded
    # by a launch of its own): 2-warp programs at 128 registers, 8 per SM (H200, batch
    # 256, L = 16, fp16-sr + nvfp4, us per step (flush us) against 1-warp programs at
    # 255: nano-4b 196.6 / 195.8 (1386 / 1383) -> 190.0 (1288), super-120b 193.7 /
    # 193.3 (1442 / 1437) -> 188.6 (1357); 4-warp ones 193.2 / 193.5)
    sr16 = f_id in (FMT_FP16_SR, FMT_BF16_SR) and not need_amax
    few = 4 if need_amax else 2 if sr16 else min(4, max(1, cfg.flush_rows * N // 2048))
    fw = cfg.flush_warps or few
    sr16 = sr16 and fw == 2
    fmax = cfg.flush_maxnreg
    if fmax is None:
        fmax = (128 if need_amax or sr16 or (fw == 4 and not f_wide)
                else (0 if fw == 4 else 255))
    # TMA loads in two stages where the flush writes a 1-byte copy from 1-warp programs
    tma = cfg.flush_tma if cfg.flush_tma is not None else (
        tma_ok and fw == 1 and f_narrow and not need_amax)
    return replace(cfg, out_kernel=kind, block_p=bp, tail_tile=use_tail,
                   num_warps=nw, heads_per_program=hpp,
                   tiles_per_program=tpp, flush_chunks=fc,
                   stages=cfg.stages or (3 if pair_loop else 1 if kind == "heads" else 2),
                   flush_stages=cfg.flush_stages or (2 if tma else 1 if need_amax or fw == 1
                                                     else 2 if fw < 4 else 3),
                   flush_warps=fw,
                   flush_ctas_per_sm=cfg.flush_ctas_per_sm or (
                       8 if sr16 else 4 if fw == 4 else 8 // fw),
                   maxnreg=cfg.maxnreg if cfg.maxnreg is not None else
                   (((128 if four_bit else 96) if loads_first or pairs and four_bit
                     else (96 if four_bit else 80)) if narrow_heads else None),
                   out_loads_first=loads_first, out_words=words, flush_tma=tma,
                   out_pairs=pairs, out_ahead=ahead,
                   out_pair_loop=pair_loop,
                   flush_grid=cfg.flush_grid or ("dynamic" if need_amax or f_one_byte
                                                 else "persistent"),
                   flush_maxnreg=fmax,
                   flush_prefetch=(cfg.flush_prefetch if cfg.flush_prefetch is not None
                                   else int(fw == 1 and f_narrow and not need_amax)),
                   evict_first=cfg.evict_first if cfg.evict_first is not None else True,
                   out_prefetch=(cfg.out_prefetch if cfg.out_prefetch is not None else
                                 (2816 if four_bit and not words else 1536)
                                 if kind == "heads" and narrow and not (pairs or duo)
                                 else 0))


def launch_split_step(
    cache: Mamba2Cache,
    x: torch.Tensor,
    dt: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    params: HeadParams,
    *,
    z: torch.Tensor | None,
    out: torch.Tensor,
    state_indices: torch.Tensor,
    dt_softplus: bool,
    config: SplitConfig | None = None,
) -> None:
    """One replay step as two launches: the persistent flush launch (rows at ring
    position L - 1; writes each row's position to ``cache.pos``), then the output
    launch (rows at other positions; advances the clocks); between them, for "heads"
    output programs, the ring-weights launch (``SplitConfig.out_weights``).  With
    ``SplitConfig.concurrent_flush`` the flush launch goes to a second stream (a fork
    and a join, CUDA-graph capturable), the weights launch writes the positions and
    the clock advance follows the flush there."""
    ckpt, read = cache.ckpt, cache.read
    slots, H, P, N = ckpt.shape
    if N & (N - 1) or N < 16:
        raise ValueError(f"dstate must be a power of two >= 16, got {N}")
    _check_inputs(x, dt, B, C, z, out)
    batch = x.shape[0]
    G = B.shape[-2]
    rd = read if read is not None else ckpt
    ring_id = _RING_IDS[cache.ring_x.dtype]
    given = config or cache.split_config
    apart = _read_encode_apart(given.read_encode, ckpt.fmt, read)
    fd = ckpt if apart else rd  # what the flush launch writes as its read copy
    need_amax = FMT_NVFP4 in (ckpt.fmt_id, fd.fmt_id)
    cfg = _split_defaults(given, P, N, H, G, rd.fmt_id, need_amax, ckpt.fmt in DENSE_FORMATS,
                          fd.fmt_id)
    rx, rB = cache.ring_x, cache.ring_B
    if ring_id != RING_FP32:
        rx, rB = rx.view(torch.int16), rB.view(torch.int16)
    L, LR = cache.window, cache.ring_x.shape[1]
    cache.pos = device_buffer(cache.pos, max(batch, 1), x.device, torch.int32, zero=True)
    RB = max(16, triton.next_power_of_2(L))
    zz = z if z is not None else x
    D = params.D if params.D is not None else params.A
    dtb = params.dt_bias if params.dt_bias is not None else params.A
    strides = (x.stride(0), dt.stride(0), B.stride(0), C.stride(0),
               z.stride(0) if z is not None else 0, out.stride(0))
    flags = dict(HAS_Z=z is not None, HAS_D=params.D is not None,
                 HAS_DT_BIAS=params.dt_bias is not None, DT_SOFTPLUS=dt_softplus)
    fb, nq = cfg.flush_rows, cfg.flush_chunks
    uph = triton.cdiv(P, fb * nq)
    per_sm = _resident_flush_programs(cfg, N, RB)
    nprog = max(1, min(batch * H * uph, _sm_count(x.device) * per_sm))
    extra = {"maxnreg": cfg.flush_maxnreg} if cfg.flush_maxnreg else {}
    one_pass = cfg.flush_encoder == "fast" and need_amax and nq == 1
    scratch = cfg.flush_pass == "scratch" and need_amax and not one_pass
    if scratch:
        cache.flush_scratch = device_buffer(cache.flush_scratch, nprog * fb * nq * N, x.device)
    claim = cfg.flush_grid == "dynamic"
    if claim:
        cache.flush_work = device_buffer(cache.flush_work, 2, x.device, torch.int32, zero=True)
    weights = cfg.out_kernel == "heads" and cfg.out_weights == "launch"
    if weights:
        cache.out_wts = device_buffer(cache.out_wts, batch * H * (RB + 4), x.device)
    wts = cache.out_wts if weights else out
    conc = weights and (cfg.concurrent_flush if cfg.concurrent_flush is not None
                        else x.is_cuda)

    bp_rows = max(16, triton.next_power_of_2(batch))  # the batch's rows as one vector

    def flush() -> None:
        m2_flush_kernel[(nprog,)](
            *ckpt.kernel_args(), *fd.kernel_args(),
            cache.fresh if cache.fresh is not None else ckpt.codes,
            rx, rB, cache.ring_dt, cache.tickets, state_indices, cache.pos,
            x, dt, B, C, zz, out, params.A, D, dtb,
            as_int32(cache.seed), as_int32(cache.seed + 1), *strides,
            batch, H, G, P, L, LR,
            N=N, BP=bp_rows, FB=fb, NQ=nq, UPH=uph, RB=RB,
            NSF=cfg.flush_stages, CK_FMT=ckpt.fmt_id, RD_FMT=fd.fmt_id,
            SPLIT=read is not None and not apart, RING=ring_id, WRITE_FRESH=cache.fresh is not None,
            NEED_AMAX=need_amax, HW_CVT=compiled_on(x.device),
            FAST_ENC=cfg.flush_encoder == "fast", ONE_PASS=one_pass,
            scr=cache.flush_scratch if scratch else out, SCRATCH=scratch,
            PF=min(cfg.flush_prefetch, nq) if compiled_on(x.device) else 0,
            EV=cfg.evict_first, TMA=cfg.flush_tma,
            ck_desc=ckpt.rows_descriptor(fb) if cfg.flush_tma else None, CONC=conc,
            work=cache.flush_work if claim else cache.pos, CLAIM=claim,
            num_warps=cfg.flush_warps, **flags, **extra,
        )
        if apart:
            encode_read_copies(ckpt, read, cache.tickets, state_indices, L, 1,
                               _sm_count(x.device))

    def advance() -> None:  # behind the flush and the weights launch
        advance_clocks_kernel[(1,)](cache.tickets, state_indices, batch, STEP=1, BP=bp_rows,
                                    num_warps=4)

    def weights_launch() -> None:
        m2_weights_kernel[(G, batch)](
            wts, rB, cache.ring_dt, cache.tickets, state_indices, dt, B, C, params.A, dtb,
            strides[1], strides[2], strides[3], H, G, L, LR, N=N, RB=RB,
            HPG=triton.next_power_of_2(H // G), RING=ring_id,
            HAS_DT_BIAS=params.dt_bias is not None, DT_SOFTPLUS=dt_softplus, pos=cache.pos,
            CONC=conc, num_warps=2)

    def output() -> None:
        _output_launch(cache, cfg, rd, read, ckpt, rx, rB, state_indices, x, dt, B, C, zz,
                       out, params, D, dtb, strides, wts, weights, ring_id, flags, conc)

    if not conc:
        flush()
        if weights:
            weights_launch()
        output()
    elif x.is_cuda:  # the flush and the clock advance on a second stream
        cache.flush_stream.step(x.device, weights_launch, output, flush, advance)
    else:  # one stream (CPU): the order a second stream may take, the flush last
        weights_launch()
        output()
        flush()
        advance()


def _output_launch(cache: Mamba2Cache, cfg: SplitConfig, rd: StateStore,
                   read: StateStore | None, ckpt: StateStore, rx, rB, state_indices, x, dt, B,
                   C, zz, out, params: HeadParams, D, dtb, strides, wts, weights: bool,
                   ring_id: int, flags: dict, conc: bool) -> None:
    """The split step's output launch (``SplitConfig.out_kernel``); ``conc``: the flush
    launch runs on a second stream and the clocks are left to the clock advance."""
    slots, H, P, N = ckpt.shape
    batch, G = x.shape[0], B.shape[-2]
    L, LR = cache.window, cache.ring_x.shape[1]
    RB = max(16, triton.next_power_of_2(L))
    bp, tpp, hpp = cfg.block_p, cfg.tiles_per_program, cfg.heads_per_program
    npb = triton.cdiv(P, bp)
    extra = {"maxnreg": cfg.maxnreg} if cfg.maxnreg else {}
    args = (*rd.kernel_args(), rx, rB, cache.ring_dt, cache.tickets, state_indices, cache.pos,
            x, dt, B, C, zz, out, params.A, D, dtb, *strides, H, G, P, L, LR)
    common = dict(N=N, BLOCK_P=bp, NPB=npb, NS=cfg.stages, RB=RB, RD_FMT=rd.fmt_id,
                  RING=ring_id, num_warps=cfg.num_warps, **flags, **extra)
    if cfg.out_kernel == "heads":
        tail = _tail_rows(cfg.tail_tile, P, bp)
        if tail:
            common["NPB"] = P // bp
        m2_out_heads_kernel[(H // hpp, batch)](
            *args, HPP=hpp, TAIL=tail, wts=wts, WEIGHTS=weights,
            PFO=cfg.out_prefetch if compiled_on(x.device) else 0,
            LOADS_FIRST=cfg.out_loads_first, CONC=conc, WORDS=cfg.out_words,
            PAIRS=P if cfg.out_pairs else 0, AHEAD=cfg.out_ahead or 0,
            LOOP=bool(cfg.out_pair_loop), **common)
    elif cfg.out_kernel == "tiles":
        m2_out_kernel[(H * npb // tpp, batch)](*args, TPP=tpp, **common)
    else:  # "group": the one-launch kernel's output path (prefetch of one tile)
        mamba2_kernel[(H // hpp, batch)](
            *ckpt.kernel_args(), *rd.kernel_args(), ckpt.codes,
            rx, rB, cache.ring_dt, cache.pos, cache.steps, cache.tickets, state_indices,
            x, dt, B, C, zz, out, params.A, D, dtb, out, ckpt.codes, 0, 0,
            strides[0], 0, strides[1], 0, strides[2], 0, strides[3], 0, strides[4], 0,
            strides[5], 0, H, G, P, L, LR,
            N=N, BLOCK_P=bp, NPB=npb, HPP=hpp, NT=hpp * npb, FB=FLUSH_ROWS,
            NQ=triton.cdiv(P, FLUSH_ROWS), RB=RB, T=1, TB=2, MODE=MODE_STEP,
            CK_FMT=ckpt.fmt_id, RD_FMT=rd.fmt_id, SPLIT=read is not None, RING=ring_id,
            WRITE_FRESH=False, NEED_AMAX=False, OUT_ONLY=True, num_warps=cfg.num_warps,
            **flags, **extra)


def mamba2_step(
    cache: Mamba2Cache,
    x: torch.Tensor,
    dt: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    params: HeadParams,
    *,
    z: torch.Tensor | None = None,
    state_indices: torch.Tensor | None = None,
    dt_softplus: bool = False,
    out: torch.Tensor | None = None,
    block_p: int | None = None,
    num_warps: int | None = None,
    split_config: SplitConfig | None = None,
) -> torch.Tensor:
    """One replay decode step for a batch (output or flush chosen per slot on the
    device; one launch for a "fused" cache, two for a "split" one).

    ``x, z``: (batch, heads, P); ``dt``: (batch, heads) (raw when ``dt_softplus``,
    then ``softplus(dt + dt_bias)`` is applied); ``B, C``: (batch, groups, N);
    ``state_indices``: int32 (batch,) slot of each row (-1: padding, output 0).
    Appends the step to each slot's ring; a slot whose ring fills folds it into
    a new checkpoint (and read copy) and outputs from the fresh fp32 state.
    Returns ``y`` (batch, heads, P) float32 (or ``out``).
    """
    if cache.speculative:
        raise ValueError("a speculative cache advances with mamba2_verify / mamba2_commit")
    idx = state_indices if state_indices is not None else slot_indices(x.shape[0], x.device)
    if out is None:
        out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    if cache.launch == "split":
        cfg = split_config or cache.split_config
        if block_p is not None or num_warps is not None:
            cfg = replace(cfg, block_p=block_p or cfg.block_p,
                          num_warps=num_warps or cfg.num_warps)
        launch_split_step(cache, x, dt, B, C, params, z=z, out=out, state_indices=idx,
                          dt_softplus=dt_softplus, config=cfg)
    else:
        launch_replay(MODE_STEP, cache, x, dt, B, C, params, z=z, out=out, state_indices=idx,
                      T=1, dt_softplus=dt_softplus, block_p=block_p, num_warps=num_warps)
    return out


_TICKETS: dict[int, torch.Tensor] = {}


def _tickets_for(steps: torch.Tensor) -> torch.Tensor:
    """A zeroed ticket tensor paired with a conventional step counter."""
    key = steps.data_ptr()
    t = _TICKETS.get(key)
    if t is None or t.numel() != steps.numel() or t.device != steps.device:
        t = torch.zeros_like(steps)
        _TICKETS[key] = t
    return t


def mamba2_conventional_step(
    state: StateStore,
    x: torch.Tensor,
    dt: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    params: HeadParams,
    *,
    z: torch.Tensor | None = None,
    state_indices: torch.Tensor | None = None,
    dt_softplus: bool = False,
    steps: torch.Tensor | None = None,
    seed: int = 0,
    out: torch.Tensor | None = None,
    block_p: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """Conventional decode step: read the state, update it in fp32, write it back.

    ``state`` in fp32, bf16, fp16 (RNE) or bf16-sr / fp16-sr (stochastic rounding
    with ``seed`` and ``step = steps[slot]``, which the kernel then increments;
    ``steps`` is an int32 (slots,) tensor).  Shapes as :func:`mamba2_step`.
    """
    slots, H, P, N = state.shape
    _check_inputs(x, dt, B, C, z, out)
    idx = state_indices if state_indices is not None else slot_indices(x.shape[0], x.device)
    if out is None:
        out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    fid = state.fmt_id
    count = fid in (FMT_BF16_SR, FMT_FP16_SR)
    if count and steps is None:
        raise ValueError("stochastic-rounding conventional steps need a `steps` counter tensor")
    # H200 sweeps: 16-row, 4-warp programs at batch 64-256; at batch 1 (a few hundred
    # programs, latency-bound) 8 rows and 2 warps (7.6 / 8.1 against 8.3 / 8.2 us)
    small = x.shape[0] * H < SPLIT_MIN_ROWS
    bp = pick_block_p(P, N, (fid,), block_p or (8 if small else 16), minimum=1)
    if num_warps is None and small and block_p is None:
        num_warps = 2
    counter = steps if steps is not None else idx
    mamba2_conv_kernel[(H * triton.cdiv(P, bp), x.shape[0])](
        *state.kernel_args(), counter, _tickets_for(counter), idx,
        x, dt, B, C, z if z is not None else x, out, params.A,
        params.D if params.D is not None else params.A,
        params.dt_bias if params.dt_bias is not None else params.A, as_int32(seed),
        x.stride(0), dt.stride(0), B.stride(0), C.stride(0), z.stride(0) if z is not None else 0,
        out.stride(0), H, B.shape[-2], P,
        N=N, BLOCK_P=bp, FMT=fid, HAS_Z=z is not None, HAS_D=params.D is not None,
        HAS_DT_BIAS=params.dt_bias is not None, DT_SOFTPLUS=dt_softplus, COUNT_STEPS=count,
        num_warps=pick_warps(bp, N, num_warps),
    )
    return out

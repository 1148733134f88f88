"""The read copies of a replay step's flushed rows, encoded by a launch of their own
from the checkpoints the flush launch just wrote (shared by the GDN staged step and the
Mamba-2 split step).

A split design's read copy encodes the checkpoint's stored values (``designs.store_state``),
so the copy is encoded from the same values the flush would have encoded, and the bits
are those of the flush's own encoder and of the torch reference,
``formats.get(read).encode(decoded checkpoint)``.  The flush's programs are sized for the
fold (one warp and up to 255 registers each on an H200) and encode 4-bit copies slowly;
this launch runs whole-matrix programs of 4 warps, 8 per SM.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .state import DENSE_FORMATS, StateStore
from .tl_common import at_flushing_row, batch_slots, flushing_rows
from .tl_formats import K_NVFP4, load_state, matrix_amax, store_state_with

ENCODE_CTAS_PER_SM = 8
"""Programs per SM of the persistent encode launch."""
ENCODE_ROWS = 0
"""Rows per tile of the encode launch (0: :func:`encode_rows`)."""
ENCODE_WHOLE_BYTES = 16384
"""A stored matrix of at most this many bytes (its rows rounded up to a power of two)
is encoded from one tile: one read, no amax pass.  Timed at batch 256 on an H200 (fp16-sr
checkpoint, nvfp4 copy): nemotron-3-super-120b's 64 x 128 fp16 matrices, 189.8 -> 185.9
us per step; larger tiles took as long or longer (qwen3.5-4b's 128 x 128 fp16 109.3 /
113.5 us against 109.3 in 32-row chunks, nemotron-3-nano-4b's 80 x 128 in a 128-row tile
192.6 / 201.6 against 191.7), as did fp32 matrices of 128 rows."""
ENCODE_WARPS = 4
"""Warps per program of the encode launch."""


def encode_rows(rows: int, cols: int, code_bytes: int) -> int:
    """Rows per tile of the encode launch for ``(rows, cols)`` matrices stored with
    ``code_bytes`` bytes per element: :data:`ENCODE_ROWS` where set; else the whole
    matrix where it fits :data:`ENCODE_WHOLE_BYTES`; else 32 where they divide the
    matrix, else 16 (an amax pass precedes the encode pass)."""
    if ENCODE_ROWS:
        return ENCODE_ROWS
    whole = triton.next_power_of_2(rows)
    if whole * cols * code_bytes <= ENCODE_WHOLE_BYTES:
        return whole
    return 32 if rows % 32 == 0 else 16


def encodes_apart(checkpoint: str, read: str | None) -> bool:
    """Whether a launch of its own encodes the read copy: a dense checkpoint (fp32, or
    16 bits with or without stochastic rounding) and an nvfp4 or mxfp4 read copy."""
    return checkpoint in DENSE_FORMATS and read in ("nvfp4", "mxfp4")


@triton.jit
def encode_read_copies_kernel(tickets, state_idx, c_data, c_s1, c_s2, f_data, f_s1, f_s2, B,
                              PCLK, L, H: tl.constexpr, P: tl.constexpr, N: tl.constexpr,
                              FB: tl.constexpr, BP: tl.constexpr, C_FMT: tl.constexpr,
                              F_FMT: tl.constexpr):
    """Persistent: every program reads the clocks of all B rows (a row flushed this step
    where ``tickets // PCLK`` is at ring position L - 1; the clocks advance only after
    the flush) and takes every G-th (flushed row, head) matrix of P x N, so a step that
    flushes nothing costs one vector load per program.  nvfp4: a pass for the matrix
    amax, then one that encodes."""
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    _, _, live, sl0 = batch_slots(state_idx, B, BP)
    t = tl.load(tickets + sl0, mask=live, other=0) // PCLK
    key, units = flushing_rows(live & (t % L == L - 1), H)
    NCH: tl.constexpr = (P + FB - 1) // FB
    u = pid
    while u < units:
        slot = at_flushing_row(key, u // H, sl0)
        mat = slot.to(tl.int64) * H + u % H
        amax = 0.0
        if NCH == 1:  # the whole matrix in one tile: one read
            offs_p = tl.arange(0, FB)
            S = load_state(c_data, c_s1, c_s2, mat, offs_p, offs_p < P, P, C_FMT, FB, N)
            if F_FMT == K_NVFP4:
                amax = matrix_amax(S)
            store_state_with(f_data, f_s1, f_s2, S, mat, offs_p, offs_p < P, P, 0, 0, amax,
                             F_FMT, FB, N, True)
        elif F_FMT == K_NVFP4:
            for c in tl.range(0, NCH):
                offs_p = c * FB + tl.arange(0, FB)
                S = load_state(c_data, c_s1, c_s2, mat, offs_p, offs_p < P, P, C_FMT, FB, N)
                amax = tl.maximum(amax, matrix_amax(S))
        if NCH > 1:
            for c in tl.range(0, NCH):
                offs_p = c * FB + tl.arange(0, FB)
                S = load_state(c_data, c_s1, c_s2, mat, offs_p, offs_p < P, P, C_FMT, FB, N)
                store_state_with(f_data, f_s1, f_s2, S, mat, offs_p, offs_p < P, P, 0, 0,
                                 amax, F_FMT, FB, N, True)
        u += G


def encode_read_copies(ckpt: StateStore, read: StateStore, tickets, state_indices,
                       window: int, programs_per_slot: int, n_sm: int):
    """Launch :func:`encode_read_copies_kernel` for a batch (``state_indices``) whose
    flush launch has just run; returns the compiled kernel."""
    slots, H, P, N = ckpt.shape
    B = state_indices.shape[0]
    fb = encode_rows(P, N, ckpt.codes.element_size())
    grid = (max(1, min(B * H, n_sm * ENCODE_CTAS_PER_SM)),)
    return encode_read_copies_kernel[grid](
        tickets, state_indices, *ckpt.kernel_args(), *read.kernel_args(), B,
        programs_per_slot, window, H, P, N, fb, max(16, triton.next_power_of_2(B)),
        ckpt.fmt_id, read.fmt_id, num_warps=ENCODE_WARPS)

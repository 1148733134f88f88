"""L2 hints for compiled kernels (sm_90).  Prefetches: data a loop will load a few
iterations later is asked for now, without registers or shared memory held and with
nothing to wait for, so the load finds it in L2 instead of paying a DRAM round trip.
Demotions: lines stored with the ``evict_last`` policy that no launch will read again
go back to the normal eviction priority.

A hint changes no value.  Kernels call these helpers only under a constexpr (the
flushes' ``PF``, the Mamba-2 output programs' ``PFO``) that the host sets to 0 where
``tl_formats.compiled_on`` is false: the Triton interpreter cannot run inline PTX."""

from __future__ import annotations

import triton
import triton.language as tl

from .tl_formats import K_FP8, K_FP32, K_MXFP4, K_NVFP4


@triton.jit
def l2_prefetch_bytes(ptr, nbytes):
    """One bulk prefetch into L2 (``cp.async.bulk.prefetch.L2``) of ``nbytes`` from
    ``ptr``, issued by the program's first thread.  ``ptr``: 16-byte aligned;
    ``nbytes``: int32, a positive multiple of 16."""
    p = ptr + tl.zeros([1], tl.int32)
    n = nbytes + tl.zeros([1], tl.int32)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .u32 t; mov.u32 t, %tid.x; setp.eq.u32 p, t, 0; "
        "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r", [p, n], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def l2_prefetch_lines(ptrs):
    """A prefetch into L2 (``prefetch.global.L2``) of the cache line of every pointer
    of the tensor ``ptrs`` (any alignment)."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs],
                              dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def l2_demote_lines(ptrs):
    """``applypriority.global.L2::evict_normal`` on the 128-byte cache line of every
    pointer of the tensor ``ptrs`` (any alignment): lines kept with ``evict_last`` that
    no launch will read again may leave L2 like any other line."""
    tl.inline_asm_elementwise(
        "{ .reg .b64 a; and.b64 a, $1, -128; "
        "applypriority.global.L2::evict_normal [a], 128; mov.u32 $0, 0; }",
        "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def l2_prefetch_rows(codes_ptr, mat, row, P, rows, FMT: tl.constexpr, N: tl.constexpr):
    """:func:`l2_prefetch_bytes` of the stored codes of rows ``[row, row + rows)`` of state
    matrix ``mat`` (``P`` rows of ``N`` elements in format ``FMT``; rows past ``P`` are
    left out, a ``row`` past it is taken as the last one).  Scales are not prefetched."""
    if (FMT == K_NVFP4) or (FMT == K_MXFP4):
        ROWB: tl.constexpr = N // 2
    elif FMT == K_FP8:
        ROWB: tl.constexpr = N
    elif FMT == K_FP32:
        ROWB: tl.constexpr = 4 * N
    else:
        ROWB: tl.constexpr = 2 * N
    r = tl.minimum(row, P - 1)
    l2_prefetch_bytes(codes_ptr.to(tl.pointer_type(tl.uint8)) + (mat * P + r) * ROWB,
                      tl.minimum(P - r, rows) * ROWB)

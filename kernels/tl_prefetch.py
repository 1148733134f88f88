"""L2 prefetch hints for compiled kernels (sm_90): data a loop will load a few
iterations later is asked for now, without registers or shared memory held and with
nothing to wait for, so the load finds it in L2 instead of paying a DRAM round trip.

A prefetch changes no value: kernels pass these helpers a ``PREFETCH`` constexpr that
is off in the Triton interpreter (which cannot run inline PTX)."""

from __future__ import annotations

import triton
import triton.language as tl


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

"""Bandwidth probes: a streaming copy and a read-only reduction, the kernels behind
:func:`precisionlab.timing.bandwidth`'s copy and read ceilings.  Each launch helper
names its torch reference: ``dst.copy_(src)`` and per-block sums of ``src``."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .compile_worker import settle_module_keys

BLOCK = 4096
ITERS = 8
"""Elements per load and loads per program of both probes."""


@triton.jit
def _copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    base = tl.program_id(0).to(tl.int64) * BLOCK * ITERS
    for i in range(ITERS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


@triton.jit
def _read_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    base = pid.to(tl.int64) * BLOCK * ITERS
    for i in range(ITERS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(out_ptr + pid, tl.sum(acc, axis=0))


def programs(numel: int, block: int = BLOCK, iters: int = ITERS) -> int:
    """Programs of either probe over ``numel`` elements (``block * iters`` each)."""
    return triton.cdiv(numel, block * iters)


def copy_launch(src: torch.Tensor, dst: torch.Tensor, block: int = BLOCK,
                iters: int = ITERS) -> None:
    """``dst.copy_(src)`` for contiguous float32 tensors of one size, by the copy probe."""
    n = src.numel()
    _copy_kernel[(programs(n, block, iters),)](src, dst, n, BLOCK=block, ITERS=iters,
                                               num_warps=8)


def read_launch(src: torch.Tensor, part: torch.Tensor, block: int = BLOCK,
                iters: int = ITERS) -> None:
    """``part[p]`` = the float32 sum of ``src``'s p-th span of ``block * iters``
    elements (the read probe; ``part`` holds :func:`programs` of them)."""
    n = src.numel()
    _read_kernel[(programs(n, block, iters),)](src, part, n, BLOCK=block, ITERS=iters,
                                               num_warps=8)


settle_module_keys(__name__)  # every process looks its kernels up under one key

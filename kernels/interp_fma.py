"""A fused ``tl.fma`` for the Triton interpreter.

The interpreter evaluates ``tl.fma(x, y, z)`` as a rounded product plus a rounded sum;
the GPU rounds once.  Kernels here rely on the single rounding (exact remainders in
``tl_formats.div_shared``, exact splits in ``tl_mamba2_fast.fold_dot``), so under the
interpreter the float32 op is replaced by one that rounds once: the float64 product
of two float32 values is exact, the float64 sum is rounded to odd (``TwoSum`` error
term) and the cast to float32 then rounds to nearest even exactly once.
"""

from __future__ import annotations

import numpy as np

_ORIGINAL = None


def _fused(self, x, y, z):
    if not (x.data.dtype == y.data.dtype == z.data.dtype == np.float32):
        return _ORIGINAL(self, x, y, z)
    from triton.runtime.interpreter import TensorHandle

    with np.errstate(all="ignore"):
        p = x.data.astype(np.float64) * y.data.astype(np.float64)
        c = z.data.astype(np.float64)
        s = p + c
        t = s - p
        e = (p - (s - t)) + (c - t)  # s + e == p + c exactly (finite s)
        even = (s.view(np.uint64) & 1) == 0
        odd = np.nextafter(s, np.where(e > 0, np.inf, -np.inf))
        s = np.where(np.isfinite(s) & (e != 0) & even, odd, s)
        out = s.astype(np.float32)
    return TensorHandle(np.asarray(out, dtype=np.float32), z.dtype.scalar)


def install() -> None:
    """Make the interpreter's ``tl.fma`` fused (idempotent)."""
    global _ORIGINAL
    from triton.runtime.interpreter import InterpreterBuilder

    if _ORIGINAL is None:
        _ORIGINAL = InterpreterBuilder.create_fma
        InterpreterBuilder.create_fma = _fused

"""fp8-e4m3 and fp8-e5m2 with one float32 scale per row (last axis).

Bit layout (what the kernels read and write):

- ``codes``: uint8, same shape as ``x``; OCP FP8 codes (E4M3 = ``float8_e4m3fn``:
  bias 7, max 448, no inf; E5M2 = ``float8_e5m2``: bias 15, max 57344).
- ``scales["row"]``: float32 of shape ``(..., 1)``::

      scale = amax_row / max_normal          # float32 division (RNE)

  where ``amax_row`` is the largest ``|x|`` over the row's *finite* elements.
- finite element: ``code = RNE(clamp(x / scale, -max_normal, max_normal))``; a row
  with ``scale == 0`` (all finite elements zero, or amax so small that amax/max
  underflows) divides by 1 instead, giving ±0 codes (sign kept).
- NaN: code 0x7F (both formats).  ±inf: E5M2 ±inf codes 0x7C / 0xFC; E4M3 has no
  inf, so 0x7F (NaN).  Non-finite inputs never decode to finite values.
- ``decode = float(code) * scale`` (float32).  A ±inf E5M2 code in a row whose
  scale is 0 decodes to NaN (inf * 0).
"""

from __future__ import annotations

import torch

from .base import Format, FormatError, FormatSpec, Packed
from .bitops import INF, as_float32, div_scalar, finite_abs, require_last_axis

NAN_CODE = 0x7F


class _RowScaledFP8(Format):
    dtype: torch.dtype
    has_inf: bool

    def encode(self, x, *, generator=None, seed=None, step=0) -> Packed:
        x = as_float32(x, self.name)
        require_last_axis(x, self.name)
        mx = self.spec.max_normal
        a, finite = finite_abs(x)
        scale = div_scalar(a.amax(dim=-1, keepdim=True), mx)
        y = x / torch.where(scale > 0, scale, 1.0)
        codes = y.clamp_(-mx, mx).to(self.dtype).view(torch.uint8)
        codes = torch.where(finite, codes, NAN_CODE)
        if self.has_inf:
            codes = torch.where(x == INF, 0x7C, codes)
            codes = torch.where(x == -INF, 0xFC, codes)
        return Packed(self.name, codes, tuple(x.shape), {"row": scale})

    def decode(self, packed: Packed) -> torch.Tensor:
        if packed.format != self.name:
            raise FormatError(f"{self.name} cannot decode a {packed.format} value")
        return packed.codes.view(self.dtype).to(torch.float32) * packed.scales["row"]

    def bits_per_element(self, shape=None) -> float:
        n = 128 if shape is None else shape[-1]
        return 8.0 + 32.0 / n


class FP8E4M3(_RowScaledFP8):
    """OCP FP8 E4M3 (e4m3fn, max 448) with a float32 amax scale per row."""

    name = "fp8-e4m3"
    dtype = torch.float8_e4m3fn
    has_inf = False
    spec = FormatSpec(4, 3, 7, 448.0, 2.0**-9, scale_format="fp32 per row")


class FP8E5M2(_RowScaledFP8):
    """OCP FP8 E5M2 (max 57344) with a float32 amax scale per row."""

    name = "fp8-e5m2"
    dtype = torch.float8_e5m2
    has_inf = True
    spec = FormatSpec(5, 2, 15, 57344.0, 2.0**-16, scale_format="fp32 per row")

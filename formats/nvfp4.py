"""nvfp4: E2M1 elements, an E4M3 scale per 16 elements along the last axis and a
float32 scale per matrix (the last two axes).

Follows nvidia-modelopt's ``NVFP4QTensor.quantize`` (dynamic path) operation for
operation, so element codes and block scales match it bit for bit, except where
modelopt returns NaN (zero matrix) or lets one non-finite value poison the tensor.

Bit layout (what the kernels read and write), for ``x`` of shape ``(..., m, n)``
(a 1-D ``x`` of shape ``(n,)`` is one 1 x n matrix):

- ``scales["matrix"]``: float32 ``(..., 1, 1)`` (``(1,)`` for 1-D ``x``)::

      g = amax_matrix / 2688.0                     # 2688 = 6 * 448, float32 division

  where ``amax_matrix`` is over the matrix's finite elements.
- ``scales["block"]``: uint8 E4M3 (e4m3fn) codes ``(..., m, n/16)``::

      s = amax_block / (6.0 * g)                   # 6.0 * g rounded to float32 first
      s = 1.0 where s == 0                         # zero block
      s = e4m3_rne(clamp(s, 2**-9, 448))
- ``codes``: uint8 ``(..., m, n/2)``, E2M1 codes packed two per byte as in mxfp4
  (element 2i low nibble, 2i+1 high nibble)::

      y    = x / (float(s) * g)                    # product rounded to float32 first
      code = e2m1_rne(y), saturating at 6; sign bit = (y < 0), so -0.0 gives +0
- zero matrix (``g == 0``, also when amax/2688 underflows): block codes 0x38
  (1.0), element codes 0, ``g = 0``: exact zeros (modelopt gives NaN here).
- a block holding NaN or ±inf: block code 0x7F (NaN), element codes 0: the block
  decodes to NaN, other blocks are unaffected.
- ``decode = e2m1_value * (float(s) * g)`` (the product first, as modelopt).
"""

from __future__ import annotations

import torch

from .base import Format, FormatError, FormatSpec, Packed
from .bitops import (
    as_float32,
    decode_e2m1,
    div_scalar,
    encode_e2m1,
    finite_abs,
    pack_nibbles,
    require_last_axis,
    unpack_nibbles,
)

BLOCK = 16
E2M1_MAX = 6.0
E4M3_MAX = 448.0
E4M3_ONE = 0x38
E4M3_NAN = 0x7F


class NVFP4(Format):
    """NVIDIA NVFP4 (see module docstring for the exact bit layout and rounding)."""

    name = "nvfp4"
    spec = FormatSpec(
        2, 1, 1, 6.0, 0.5, block_size=BLOCK, scale_format="e4m3 per 16 + fp32 per matrix"
    )

    def encode(self, x, *, generator=None, seed=None, step=0) -> Packed:
        x = as_float32(x, self.name)
        require_last_axis(x, self.name, BLOCK)
        shape = tuple(x.shape)
        xm = x if x.dim() >= 2 else x.unsqueeze(0)
        if xm.shape[-2] == 0:
            raise FormatError(f"{self.name} needs a non-empty matrix, got shape {shape}")
        a, finite = finite_abs(xm)
        g = div_scalar(a.amax(dim=(-2, -1), keepdim=True), E2M1_MAX * E4M3_MAX)
        nonzero = g > 0  # (..., 1, 1)

        blocks = (*xm.shape[:-1], xm.shape[-1] // BLOCK, BLOCK)
        s = a.reshape(blocks).amax(dim=-1) / (E2M1_MAX * g)
        s = torch.where((s == 0) | ~nonzero, 1.0, s)
        s8 = s.clamp(2.0**-9, E4M3_MAX).to(torch.float8_e4m3fn)
        y = xm.reshape(blocks) / (s8.to(torch.float32) * g).unsqueeze(-1)

        block_finite = finite.reshape(blocks).all(dim=-1)
        ok = block_finite & nonzero
        codes = torch.where(ok.unsqueeze(-1), encode_e2m1(y, negative_zero=False), 0)
        scodes = torch.where(block_finite, s8.view(torch.uint8), E4M3_NAN)
        codes = pack_nibbles(codes.reshape(xm.shape))
        if x.dim() == 1:
            codes, scodes, g = codes[0], scodes[0], g.reshape(1)
        return Packed(self.name, codes, shape, {"block": scodes, "matrix": g})

    def decode(self, packed: Packed) -> torch.Tensor:
        if packed.format != self.name:
            raise FormatError(f"{self.name} cannot decode a {packed.format} value")
        values = decode_e2m1(unpack_nibbles(packed.codes))
        s = packed.scales["block"].view(torch.float8_e4m3fn).to(torch.float32)
        g = packed.scales["matrix"]
        if values.dim() == 1:
            g = g.reshape(1, 1)
            values, s = values.unsqueeze(0), s.unsqueeze(0)
        vb = values.reshape(*values.shape[:-1], -1, BLOCK)
        out = vb * (s * g).unsqueeze(-1)
        return out.reshape(packed.shape)

    def bits_per_element(self, shape=None) -> float:
        if shape is None:
            shape = (128, 128)
        matrix = shape[-1] * (shape[-2] if len(shape) >= 2 else 1)
        return 4.0 + 8.0 / BLOCK + 32.0 / matrix

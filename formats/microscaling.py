"""OCP Microscaling formats mxfp8 (E4M3 elements) and mxfp4 (E2M1 elements):
one E8M0 scale per block of 32 consecutive elements along the last axis.

Bit layout (what the kernels read and write), for ``x`` of shape ``(..., n)``:

- ``scales["block"]``: uint8 E8M0 codes, shape ``(..., n/32)``; code ``c`` means
  ``2**(c - 127)``, 0xFF is NaN.  Per block (OCP MX v1.0 rule)::

      k    = clamp(floor(log2(amax_block)) - emax_elem, -127, 127)   # emax: E4M3 8, E2M1 2
      code = k + 127

  ``floor(log2)`` is the fp32 exponent field (zero and fp32-subnormal amax count
  as -127, so an all-zero block gets code 0, i.e. 2**-127).
- elements: ``RNE(x / 2**k)`` saturated to ±max (448 / 6); ``x / 2**k`` is exact.
  mxfp8 ``codes``: uint8 E4M3 codes, shape ``(..., n)``.  mxfp4 ``codes``: uint8
  ``(..., n/2)``, two E2M1 codes per byte, element 2i in the low nibble and 2i+1
  in the high nibble; E2M1 code = sign (bit 3), exponent (bits 2-1), mantissa
  (bit 0), magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6; -0.0 and negatives that round
  to zero keep the sign bit.
- a block holding NaN or ±inf: scale code 0xFF and all element codes 0, so the
  whole block decodes to NaN (E2M1 has no NaN; non-finite never becomes finite).
- ``decode = element_value * 2**(code - 127)`` (exact in float32).
"""

from __future__ import annotations

import torch

from .base import Format, FormatError, FormatSpec, Packed
from .bitops import (
    E2M1,
    E4M3,
    MiniFloat,
    as_float32,
    decode_e2m1,
    encode_e2m1,
    exponent_of,
    finite_abs,
    pack_nibbles,
    pow2,
    require_last_axis,
    unpack_nibbles,
)

BLOCK = 32
E8M0_NAN = 0xFF


def e8m0_decode(codes: torch.Tensor) -> torch.Tensor:
    """float32 values of E8M0 codes: ``2**(c - 127)``, NaN for 0xFF."""
    c = codes.to(torch.int32)
    return torch.where(c == E8M0_NAN, float("nan"), pow2(c - 127))


class _MXFormat(Format):
    element: MiniFloat
    emax_elem: int

    def encode(self, x, *, generator=None, seed=None, step=0) -> Packed:
        x = as_float32(x, self.name)
        require_last_axis(x, self.name, BLOCK)
        shape = tuple(x.shape)
        xb = x.reshape(*shape[:-1], shape[-1] // BLOCK, BLOCK)
        a, finite = finite_abs(xb)
        k = (exponent_of(a.amax(dim=-1)) - self.emax_elem).clamp(-127, 127)
        y = xb / pow2(k).unsqueeze(-1)
        ok = finite.all(dim=-1)
        codes = torch.where(ok.unsqueeze(-1), self._elements(y), 0).to(torch.uint8)
        scale = torch.where(ok, k + 127, E8M0_NAN).to(torch.uint8)
        return Packed(self.name, self._pack(codes.reshape(shape)), shape, {"block": scale})

    def decode(self, packed: Packed) -> torch.Tensor:
        if packed.format != self.name:
            raise FormatError(f"{self.name} cannot decode a {packed.format} value")
        values = self._element_values(packed.codes)
        vb = values.reshape(*values.shape[:-1], -1, BLOCK)
        out = vb * e8m0_decode(packed.scales["block"]).unsqueeze(-1)
        return out.reshape(packed.shape)

    def bits_per_element(self, shape=None) -> float:
        return self.element.exponent_bits + self.element.mantissa_bits + 1 + 8.0 / BLOCK

    # element codec hooks
    def _elements(self, y: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _pack(self, codes: torch.Tensor) -> torch.Tensor:
        return codes

    def _element_values(self, codes: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class MXFP8(_MXFormat):
    """mxfp8: E4M3 elements, E8M0 scale per 32 (see module docstring)."""

    name = "mxfp8"
    element = E4M3
    emax_elem = 8
    spec = FormatSpec(4, 3, 7, 448.0, 2.0**-9, block_size=BLOCK, scale_format="e8m0 per 32")

    def _elements(self, y):
        return y.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8)

    def _element_values(self, codes):
        return codes.view(torch.float8_e4m3fn).to(torch.float32)


class MXFP4(_MXFormat):
    """mxfp4: E2M1 elements (two per byte), E8M0 scale per 32."""

    name = "mxfp4"
    element = E2M1
    emax_elem = 2
    spec = FormatSpec(2, 1, 1, 6.0, 0.5, block_size=BLOCK, scale_format="e8m0 per 32")

    def _elements(self, y):
        return encode_e2m1(y)

    def _pack(self, codes):
        return pack_nibbles(codes)

    def _element_values(self, codes):
        return decode_e2m1(unpack_nibbles(codes))

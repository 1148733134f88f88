"""A minimal third-party format: bf16 with rounding toward zero (truncation)."""

from __future__ import annotations

import torch

from precisionlab.formats import Format, FormatSpec, Packed


class BF16TowardZero(Format):
    """bf16 by dropping the low 16 bits of fp32 (NaN kept as the canonical 0x7FC0)."""

    name = "bf16-rz"
    spec = FormatSpec(8, 7, 127, 3.3895313892515355e38, 2.0**-133, rounding="toward-zero")

    def encode(self, x, *, generator=None, seed=None, step=0) -> Packed:
        x = x.to(torch.float32).contiguous()
        codes = (x.view(torch.int32) >> 16).to(torch.int16)
        codes = torch.where(torch.isnan(x), torch.full_like(codes, 0x7FC0), codes)
        return Packed(self.name, codes, tuple(x.shape))

    def decode(self, packed: Packed) -> torch.Tensor:
        return packed.codes.view(torch.bfloat16).to(torch.float32)

    def bits_per_element(self, shape=None) -> float:
        return 16.0

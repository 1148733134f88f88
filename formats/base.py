"""The Format protocol: how a tensor of SSM state is stored, bit for bit.

A format turns a float tensor into a :class:`Packed` value holding the real bit
layout (integer codes plus any scales) and back.  The last axis is the blocked
axis; the last two axes form the "matrix" that gets a matrix-level scale.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class FormatSpec:
    """Numeric description of a format's element type and scaling."""

    exponent_bits: int
    mantissa_bits: int
    bias: int
    max_normal: float
    min_subnormal: float
    block_size: int | None = None
    """Elements sharing one block scale along the last axis (None: no block scale)."""
    scale_format: str = "none"
    """Human-readable scale layout, e.g. 'fp32 per row' or 'e4m3 per 16 + fp32 per matrix'."""
    rounding: str = "nearest-even"
    """'nearest-even' or 'stochastic'."""


@dataclass
class Packed:
    """Encoded tensor: integer codes in the storage bit layout, plus scales.

    ``codes`` holds raw bits (uint8 for 8- and 4-bit formats, with two 4-bit codes
    per byte, low nibble first; int16/int32 bit views for 16/32-bit formats).
    ``scales`` maps a scale's name to its tensor (e.g. ``"block"`` as uint8 E4M3 or
    E8M0 codes, ``"row"``/``"matrix"`` as float32).  ``shape`` is the logical
    shape of the decoded tensor.
    """

    format: str
    codes: torch.Tensor
    shape: tuple[int, ...]
    scales: dict[str, torch.Tensor] = field(default_factory=dict)

    def nbytes(self) -> int:
        """Bytes this value occupies in memory, scales included."""
        total = self.codes.numel() * self.codes.element_size()
        return total + sum(s.numel() * s.element_size() for s in self.scales.values())


class FormatError(ValueError):
    """Raised for input a format cannot encode (bad shape, bad dtype)."""


class Format:
    """Base class of all state formats.

    Subclasses set ``name`` and ``spec`` and implement :meth:`encode` and
    :meth:`decode`.  ``seed`` and ``step`` feed the counter-based generator of
    stochastic-rounding formats (see :mod:`precisionlab.formats.random_bits`);
    round-to-nearest formats ignore them.
    """

    name: str = ""
    spec: FormatSpec

    def encode(
        self,
        x: torch.Tensor,
        *,
        generator: torch.Generator | None = None,
        seed: int | None = None,
        step: int = 0,
    ) -> Packed:
        raise NotImplementedError

    def decode(self, packed: Packed) -> torch.Tensor:
        raise NotImplementedError

    def quantize(
        self,
        x: torch.Tensor,
        *,
        generator: torch.Generator | None = None,
        seed: int | None = None,
        step: int = 0,
    ) -> torch.Tensor:
        """``decode(encode(x))``: the float32 values the stored bits represent."""
        return self.decode(self.encode(x, generator=generator, seed=seed, step=step))

    def bits_per_element(self, shape: tuple[int, ...] | None = None) -> float:
        """Storage bits per element, scales included.

        Row and matrix scales depend on the shape; ``None`` means a 128 x 128 matrix.
        """
        raise NotImplementedError

    @property
    def stochastic(self) -> bool:
        return self.spec.rounding == "stochastic"

    def __repr__(self) -> str:
        return f"<Format {self.name}>"

"""Plain-data descriptions of formats (for tables and JSON)."""

from __future__ import annotations

from typing import Any

from .base import Format
from .registry import get


def describe(name: str | Format) -> dict[str, Any]:
    """A JSON-ready summary of a format.

    Keys: name, bits_per_element (scales included, for a 128 x 128 matrix),
    block (elements per block scale, or None), scale (scale layout), rounding
    ('nearest-even' or 'stochastic'), and the element type's max_normal,
    min_subnormal, exponent_bits and mantissa_bits.
    """
    fmt = get(name)
    spec = fmt.spec
    return {
        "name": fmt.name,
        "bits_per_element": float(fmt.bits_per_element()),
        "block": spec.block_size,
        "scale": spec.scale_format,
        "rounding": spec.rounding,
        "max_normal": float(spec.max_normal),
        "min_subnormal": float(spec.min_subnormal),
        "exponent_bits": spec.exponent_bits,
        "mantissa_bits": spec.mantissa_bits,
    }

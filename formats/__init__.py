"""State formats: bit-exact encoders/decoders for fp32 down to NVFP4.

``get(name)`` returns a :class:`Format`; ``names()`` lists them.  Built-ins:
fp32, bf16, fp16, bf16-sr, fp16-sr, fp8-e4m3, fp8-e5m2, mxfp8, nvfp4, mxfp4.
"""

from .base import Format, FormatError, FormatSpec, Packed
from .registry import ENTRY_POINT_GROUP, UnknownFormatError, get, names, register

from . import builtin as _builtin  # noqa: E402,F401  (registers the built-in formats)

__all__ = [
    "ENTRY_POINT_GROUP",
    "Format",
    "FormatError",
    "FormatSpec",
    "Packed",
    "UnknownFormatError",
    "get",
    "names",
    "register",
]

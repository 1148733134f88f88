"""State formats: bit-exact encoders/decoders for fp32 down to NVFP4.

``get(name)`` returns a :class:`Format`; ``names()`` lists them.  Built-ins:
fp32, bf16, fp16, bf16-sr, fp16-sr, fp8-e4m3, fp8-e5m2, mxfp8, nvfp4, mxfp4.
"""

from . import builtin as _builtin  # noqa: F401  (registers the built-in formats)
from .base import Format, FormatError, FormatSpec, Packed
from .info import describe
from .registry import (
    ENTRY_POINT_GROUP,
    UnknownFormatError,
    get,
    names,
    register,
    reload_plugins,
    unregister,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "Format",
    "FormatError",
    "FormatSpec",
    "Packed",
    "UnknownFormatError",
    "describe",
    "get",
    "names",
    "register",
    "reload_plugins",
    "unregister",
]

"""Registers the built-in formats, in their canonical order."""

from __future__ import annotations

from .floats import BF16, BF16SR, FP16, FP16SR, FP32
from .fp8 import FP8E4M3, FP8E5M2
from .microscaling import MXFP4, MXFP8
from .nvfp4 import NVFP4
from .registry import register

BUILTIN_FORMATS = (FP32, BF16, FP16, BF16SR, FP16SR, FP8E4M3, FP8E5M2, MXFP8, NVFP4, MXFP4)

for _cls in BUILTIN_FORMATS:
    register(_cls)

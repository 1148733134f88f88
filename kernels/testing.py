"""Test support: run the kernels in the Triton interpreter where there is no GPU.

``TRITON_INTERPRET`` is read when ``@triton.jit`` decorates a kernel, so it must
be set before the kernel modules are imported; :func:`kernel_device` sets it and
re-imports any kernel module that was imported earlier in compiled mode.
"""

from __future__ import annotations

import importlib
import os
import sys

import torch

_MODULES = ("tl_formats", "tl_common", "tl_dots", "tl_mamba2_fast", "state", "codec", "mamba2_conv",
            "mamba2_kernel", "mamba2_fast", "mamba2_verify", "mamba2_step", "mamba2_spec",
            "mamba2_backend", "gdn_extra", "gdn_decode", "gdn_backend", "backend")


def kernel_device() -> str:
    """'cuda' when a GPU is present; else switch to the interpreter and return 'cpu'."""
    if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1":
        return "cuda"
    if os.environ.get("TRITON_INTERPRET") != "1":
        os.environ["TRITON_INTERPRET"] = "1"
        pkg = __package__
        loaded = [f"{pkg}.{m}" for m in _MODULES if f"{pkg}.{m}" in sys.modules]
        for name in loaded:
            importlib.reload(sys.modules[name])
    return "cpu"

"""Test support: run the kernels in the Triton interpreter where there is no GPU.

``TRITON_INTERPRET`` is read when ``@triton.jit`` decorates a kernel, Triton's own
library included (``tl.cumsum``'s combine function), so it must be set before Triton
is imported (``tests/conftest.py`` does so for the test suite); :func:`kernel_device`
sets it and re-imports any kernel module that was imported earlier in compiled mode.
"""

from __future__ import annotations

import importlib
import os
import sys

import torch

_MODULES = ("tl_formats", "tl_common", "tl_dots", "tl_prefetch", "tl_mamba2_fast", "state",
            "codec", "clocks", "read_encode", "mamba2_conv", "mamba2_kernel", "mamba2_fast",
            "mamba2_verify", "mamba2_step", "mamba2_spec", "mamba2_backend", "gdn_extra",
            "gdn_device", "gdn_flush", "gdn_step", "gdn_verify", "gdn_decode", "gdn_backend",
            "backend", "bandwidth")


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


def assert_runs_same_bits(runs: list[list[torch.Tensor]]) -> None:
    """Every run's tensors (outputs, stored copies, in the same order) equal the first
    run's bit for bit (floats compared as their integer bits, so NaNs compare too)."""

    def bits(t: torch.Tensor) -> torch.Tensor:
        return t.view(torch.int32) if t.dtype == torch.float32 else t

    for run in runs[1:]:
        assert len(run) == len(runs[0])
        for a, b in zip(run, runs[0], strict=True):
            assert torch.equal(bits(a), bits(b))

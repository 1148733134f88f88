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


def skip_repatching_device_calls() -> bool:
    """Make the Triton interpreter (3.6.0) skip re-patching ``triton.language`` at every
    device-function call inside a running kernel; returns whether it was installed.

    A kernel launch patches the language's builtins for the interpreter and restores
    them when its grid is done.  Each call of a ``@triton.jit`` helper from that kernel
    patches the language modules its own module sees again, scanning them whole, which
    takes about a quarter of an interpreted test's time in kernels built from many
    small helpers.  A call whose modules (``triton.language``, ``triton.language.core``)
    this launch has already patched is skipped: the scan would find every builtin
    patched and change nothing.  Calls that see a module not yet patched (Triton's own
    helpers see ``core``), the launch's own patching and every call outside a kernel
    run as before; other Triton versions are left alone.
    """
    import inspect

    import triton
    import triton.language as tl
    from triton.runtime import interpreter as itp

    if triton.__version__ != "3.6.0" or getattr(itp, "_skips_device_repatch", False):
        return False
    if not (hasattr(itp, "_patch_lang") and hasattr(itp, "GridExecutor")
            and hasattr(itp, "_LangPatchScope")):
        return False
    patch_lang = itp._patch_lang
    grid_call = itp.GridExecutor.__call__
    patched: list[set[int]] = []  # per running launch: the language modules patched

    def launch(self, *args, **kwargs):
        patched.append(set())
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            patched.pop()

    def patch(fn):
        langs = {id(v) for v in fn.__globals__.values()
                 if inspect.ismodule(v) and v in (tl, tl.core)}
        if patched and langs and langs <= patched[-1]:
            return itp._LangPatchScope()  # a device call: the launch patched these
        scope = patch_lang(fn)
        if patched:
            patched[-1].update(langs)
        return scope

    itp._patch_lang = patch
    itp.GridExecutor.__call__ = launch
    itp._skips_device_repatch = True
    return True

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


def ptxas_available() -> bool:
    """Whether Triton's own ``ptxas`` is installed, so kernels can be compiled for a GPU
    target (e.g. sm_90) on a machine without a GPU."""
    import triton

    return os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends",
                                       "nvidia", "bin", "ptxas"))


def compiling_env() -> dict[str, str]:
    """This process's environment without ``TRITON_INTERPRET``: for a child process
    that compiles kernels instead of interpreting them."""
    return {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}


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

    seen: dict[tuple[int, int], set[int]] = {}  # by a module's globals (id, size)

    def patch(fn):
        g = fn.__globals__
        langs = seen.get((id(g), len(g)))
        if langs is None:
            langs = {id(v) for v in g.values() if inspect.ismodule(v) and v in (tl, tl.core)}
            seen[id(g), len(g)] = langs
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


def cache_interpreter_types() -> bool:
    """Make the Triton interpreter's (3.6.0) bookkeeping of every operation cheaper;
    returns whether it was installed (other versions are left alone).

    - ``interpreter._get_np_dtype`` built its 19-entry table of numpy types at every
      call (once or more per operation); the table is now looked up once per type.
    - ``tuple_type`` and ``block_type`` formatted their printed names whenever one was
      made (every tensor makes a tuple type for its shape); the names are now
      formatted when they are read.
    - Every ``block_type`` and every ``tensor`` of a block type built and checked its
      shape tuples anew; a block shape's tuples (its ints, checked once, and the
      tensors' constexprs) are now made once per shape and shared.
    Results are unchanged; an interpreted flush test takes 40% less CPU time.
    """
    import triton
    from triton.language import core
    from triton.runtime import interpreter as itp

    if triton.__version__ != "3.6.0" or getattr(itp, "_caches_types", False):
        return False
    needs = ("tuple_type", "block_type", "tensor", "tuple", "constexpr", "_unwrap_shape",
             "validate_block_shape")
    if not (hasattr(itp, "_get_np_dtype") and all(hasattr(core, n) for n in needs)):
        return False
    itp._get_np_dtype = _np_dtypes_by_type(itp._get_np_dtype, core)
    _lazy_type_names(core)
    _shared_block_shapes(core)
    itp._caches_types = True
    return True


def _np_dtypes_by_type(np_dtype, core):
    """``np_dtype`` (the interpreter's ``_get_np_dtype``) asked once per scalar type;
    the original is the result's ``__wrapped__``."""
    table: dict = {}

    def get_np_dtype(tt_dtype):
        ty = tt_dtype.element_ty if isinstance(tt_dtype, core.block_type) else tt_dtype
        if isinstance(ty, core.pointer_type):
            return np_dtype(ty)
        found = table.get(ty)
        if found is None:
            found = table[ty] = np_dtype(ty)
        return found

    get_np_dtype.__wrapped__ = np_dtype
    return get_np_dtype


def _lazy_type_names(core) -> None:
    """``tuple_type`` and ``block_type`` names formatted as Triton formats them, when
    read (a name set explicitly is kept)."""

    def tuple_init(self, types, fields=None):
        self.types = types
        self.fields = fields or [""] * len(types)

    def tuple_name(self) -> str:
        named = self.__dict__.get("_name")
        if named is None:
            pairs = zip(self.fields, self.types, strict=False)
            named = "[" + ",".join(f"{k}:{v}" for k, v in pairs) + "]"
        return named

    def block_name(self) -> str:
        named = self.__dict__.get("_name")
        return f"<{self.shape}, {self.element_ty}>" if named is None else named

    def set_name(self, value: str) -> None:
        self.__dict__["_name"] = value

    core.tuple_type.__init__ = tuple_init
    core.tuple_type.name = property(tuple_name, set_name)
    core.block_type.name = property(block_name, set_name)


def _shared_block_shapes(core) -> None:
    """Block types of one shape share its tuples, made and checked once: the ints
    (``block_type.shape``) and the constexprs of their tensors' ``shape`` and
    ``numel``; scalar tensors share one empty shape."""
    shapes: dict[tuple, tuple] = {}  # block shape (ints) -> its tuples and numels

    def block_init(self, element_ty, shape):
        self.element_ty = element_ty
        assert isinstance(shape, (list, core.tuple))
        dims = shape.values if isinstance(shape, core.tuple) else shape
        if all(type(d) is int for d in dims):
            key = tuple(dims)
        else:
            key = tuple(core._unwrap_shape(shape))
        made = shapes.get(key)
        if made is None:
            ints = core.tuple(list(key))
            if not ints:
                raise TypeError("0d block_type is forbidden")
            numel = core.validate_block_shape(ints)
            consts = core.tuple([core.constexpr(d) for d in ints])
            made = shapes[key] = (ints, numel, consts, core.constexpr(numel))
        self.shape, self.numel, self._tensor_shape, self._tensor_numel = made

    tensor_init = core.tensor.__init__
    no_dims = core.tuple([])
    one = core.constexpr(1)

    def shared_tensor_init(self, handle, type):  # (Triton's parameter names)
        if type.is_block():
            made = getattr(type, "_tensor_shape", None)
            if made is None:  # a block type made before these caches
                tensor_init(self, handle, type)
                return
            numel = type._tensor_numel
        else:
            made, numel = no_dims, one
        self.handle = handle
        self.type = type
        self.dtype = type.scalar
        self.shape = made
        self.numel = numel

    core.block_type.__init__ = block_init
    core.tensor.__init__ = shared_tensor_init

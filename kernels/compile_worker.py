"""A worker process that compiles Triton kernels into Triton's disk cache.

:func:`precisionlab.kernels.precompile.compile_only` starts a few of these
(``python -m precisionlab.kernels.compile_worker``) so that a study's kernels compile
in parallel without sharing one interpreter lock.  Each line on stdin is one task, a
JSON object ``{"id", "module", "name", "spec", "target"}``: the kernel's module and
name, Triton's serialized specialization data of one launch (what
``JITFunction.preload`` reads) and the GPU target ``[backend, arch, warp_size]``.  Each
task gets one line back, ``{"id", "ok", "seconds"}`` plus ``"error"`` when it failed.
The worker needs no GPU: it compiles for the target it is given, under the same
cache key as the launch in the parent process, which then loads the kernel from disk
(both first make the kernel's key independent of what else the process hashed,
:func:`settle_cache_keys`).
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import json
import sys
import time
from typing import Any

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.cache import get_cache_key, get_cache_manager
from triton.runtime.jit import JITCallable, JITFunction, KernelInterface

try:
    from triton._C.libtriton import get_cache_invalidating_env_vars
except ImportError:  # pragma: no cover - another Triton layout: every probe misses
    get_cache_invalidating_env_vars = None


def as_jit_function(obj: Any) -> JITFunction | None:
    """The ``JITFunction`` of a kernel, through autotune / heuristics wrappers; None for
    anything that is not a kernel."""
    while isinstance(obj, KernelInterface) and not isinstance(obj, JITFunction):
        obj = obj.fn
    return obj if isinstance(obj, JITFunction) else None


def jit_function(module: str, name: str) -> JITFunction:
    """The ``JITFunction`` named ``name`` in ``module``."""
    fn = as_jit_function(getattr(importlib.import_module(module), name))
    if fn is None:
        raise TypeError(f"{module}.{name} is not a Triton kernel")
    return fn


_SETTLED: dict[int, JITCallable] = {}
"""The Triton functions whose cache keys :func:`settle_cache_keys` has made canonical in
this process, by id (held here, so that no other function can take a settled one's id)."""


def settle_cache_keys(fn: JITCallable) -> None:
    """Make the cache key of ``fn`` the same in every process: recompute the keys of
    ``fn`` and of every Triton function it calls, callees first.

    Triton folds a callee's recorded globals into its caller's key only when the
    callee's own key was computed earlier, so a kernel's key depends on which other
    kernels this process hashed before it.  A worker that compiles kernels in another
    order than this process launched them would then fill the disk cache under keys
    that this process never looks up.  Hashed callees first, every function's key
    takes in the globals of everything it calls, whatever the order."""
    order: list[JITCallable] = []
    seen: set[int] = set()

    def visit(f: JITCallable) -> None:
        if id(f) in seen or id(f) in _SETTLED:
            return
        seen.add(id(f))
        for callee in _callees(f):
            visit(callee)
        order.append(f)

    visit(fn)
    for f in order:
        with f._hash_lock:
            f.hash = None
            f.cache_key  # noqa: B018 - computed now that its callees' keys are final
        _SETTLED[id(f)] = f


def settle_module_keys(module: str) -> None:
    """:func:`settle_cache_keys` for every Triton kernel that ``module`` defines.

    Each module of launched kernels calls this as its last line, so every process that
    launches a kernel (a study, a benchmark, a worker) looks it up in Triton's disk
    cache under the same key, whichever kernels it happened to hash first.  Under
    ``TRITON_INTERPRET=1`` there are no keys to settle."""
    for value in list(vars(sys.modules[module]).values()):
        fn = as_jit_function(value)
        if fn is not None and fn.__module__ == module:
            settle_cache_keys(fn)


def _callees(fn: JITCallable) -> list[JITCallable]:
    """The Triton functions that ``fn``'s body names (globals, closure variables and
    module attributes, as Triton's dependency finder resolves them)."""
    scope = {**fn.__globals__, **inspect.getclosurevars(fn.fn).nonlocals}

    def resolve(node: ast.AST) -> Any:
        if isinstance(node, ast.Name):
            return scope.get(node.id)
        if isinstance(node, ast.Attribute):
            base = resolve(node.value)
            try:
                return None if base is None else getattr(base, node.attr, None)
            except Exception:  # an object whose attribute lookup itself fails
                return None
        return None

    found = [resolve(n) for n in ast.walk(fn.parse()) if isinstance(n, (ast.Name, ast.Attribute))]
    return [f for f in found if isinstance(f, JITCallable) and f is not fn]


def source_of(fn: JITFunction, spec: str) -> tuple[ASTSource, dict]:
    """The compile source and raw options of one launch from its specialization data
    (the decoding of ``JITFunction.preload``), with ``fn``'s cache key settled
    (:func:`settle_cache_keys`)."""
    data = json.loads(spec)
    if data["name"] != fn._fn_name:
        raise ValueError(f"specialization data of {data['name']}, not of {fn._fn_name}")
    settle_cache_keys(fn)
    constexprs = {
        tuple(k): tl.dtype(v) if tl.dtype.is_dtype(v)
        else tl.constexpr(v["constexpr"]) if isinstance(v, dict) and "constexpr" in v else v
        for k, v in zip(data["constant_keys"], data["constant_vals"], strict=True)
    }
    attrs = {tuple(k): v for k, v in zip(data["attrs_keys"], data["attrs_vals"], strict=True)}
    signature = {k: _tuples(v) for k, v in data["signature"].items()}
    options = {k: tuple(v) if isinstance(v, list) else v for k, v in data["options"].items()}
    return ASTSource(fn, signature, constexprs, attrs), options


def _tuples(value: Any) -> Any:
    """JSON lists back to the tuples Triton's signatures use."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def on_disk(fn: JITFunction, spec: str, target: GPUTarget) -> bool:
    """Whether Triton's disk cache already holds this launch's kernel (the lookup that
    ``triton.compile`` makes first)."""
    if get_cache_invalidating_env_vars is None:
        return False
    src, raw_options = source_of(fn, spec)
    backend = make_backend(target)
    options = backend.parse_options(dict(backend.parse_options(raw_options).__dict__,
                                         **src.parse_options()))
    key = get_cache_key(src, backend, options, env_vars=get_cache_invalidating_env_vars())
    metadata = f"{src.name[:150]}.json"  # the file name triton.compile looks for
    group = get_cache_manager(hashlib.sha256(key.encode("utf-8")).hexdigest()).get_group(
        metadata)
    return bool(group) and group.get(metadata) is not None


def compile_task(task: dict):
    """Compile one task's kernel into the disk cache (only loaded where it is there);
    returns Triton's compiled kernel."""
    target = GPUTarget(*task["target"])
    src, raw_options = source_of(jit_function(task["module"], task["name"]), task["spec"])
    options = make_backend(target).parse_options(raw_options)
    return triton.compile(src, target=target, options=options.__dict__)


def main() -> int:
    """Serve tasks from stdin until it closes."""
    for line in sys.stdin:
        if not line.strip():
            continue
        task = json.loads(line)
        t0 = time.perf_counter()
        reply: dict[str, Any] = {"id": task["id"], "ok": True}
        try:
            compile_task(task)
        except Exception as exc:  # reported to the parent, which compiles it itself
            reply.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:2000])
        reply["seconds"] = round(time.perf_counter() - t0, 3)
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""CPU tensors of a transformers SSM mixer through transformers' own torch path.

When a modeling module is imported, transformers binds an installed kernel package
(fla for Gated DeltaNet, mamba_ssm, causal_conv1d) in place of each torch function it
can replace, whatever device a model later runs on. Those packages launch GPU kernels,
which cannot take CPU tensors, so with fla installed a Qwen3.5 model on the CPU fails in
its first forward. :func:`route_cpu_to_torch` wraps each such function of a modeling
module so that calls on CPU tensors take transformers' torch function (as they would
without the package) and every other call goes to the package as before.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable, Iterable
from typing import Any

import torch

ROUTED_ATTR = "_precisionlab_routed_from"
"""Attribute of a routed function: the transformers wrapper it replaced."""
PACKED_KWARGS = ("cu_seqlens", "seq_idx")
"""Keywords of packed sequences, which transformers' torch functions cannot keep apart
(such calls always go to the package)."""


def _fallback_closure(fn: Any, depth: int = 0) -> dict[str, Any] | None:
    """The closure of transformers' kernel-fallback wrapper inside ``fn``: ``fn`` itself,
    or, where the ``kernels`` package is installed, the function that its hub layer
    (an ``nn.Module`` instance standing for the function) calls."""
    if isinstance(fn, torch.nn.Module):
        fn = type(fn).forward
    if not inspect.isfunction(fn) or fn.__closure__ is None or depth > 3:
        return None
    try:
        nonlocals = inspect.getclosurevars(fn).nonlocals
    except (TypeError, ValueError):
        return None
    if "torch_function" in nonlocals and "implementation" in nonlocals:
        return nonlocals
    return _fallback_closure(nonlocals.get("func"), depth + 1)


def package_bound_torch_function(fn: Any) -> Callable | None:
    """The torch function behind a transformers kernel-fallback wrapper ``fn`` whose
    implementation is an installed package's and which does not send CPU inputs to the
    torch function itself (newer transformers do, for the packages they know), else
    None (a plain function, or a wrapper that already runs the torch function)."""
    if hasattr(fn, ROUTED_ATTR):
        return None
    nonlocals = _fallback_closure(fn)
    if nonlocals is None or nonlocals.get("supported_devices") is not None:
        return None
    torch_fn, impl = nonlocals.get("torch_function"), nonlocals.get("implementation")
    if inspect.isfunction(torch_fn) and impl is not None and impl is not torch_fn:
        return torch_fn
    return None


def _first_tensor(args: tuple, kwargs: dict) -> torch.Tensor | None:
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            return a
    return None


def _routed(wrapper: Callable, torch_fn: Callable) -> Callable:
    """``wrapper`` with calls on CPU tensors sent to ``torch_fn`` (keywords it does not
    take dropped, as transformers drops them)."""
    params = inspect.signature(torch_fn).parameters
    any_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())

    @functools.wraps(torch_fn)
    def routed(*args, **kwargs):
        t = _first_tensor(args, kwargs)
        packed = any(kwargs.get(k) is not None for k in PACKED_KWARGS)
        if t is None or t.device.type != "cpu" or packed:
            return wrapper(*args, **kwargs)
        if not any_kwargs:
            kwargs = {k: v for k, v in kwargs.items() if k in params}
        return torch_fn(*args, **kwargs)

    setattr(routed, ROUTED_ATTR, wrapper)
    return routed


def route_cpu_to_torch(module_names: Iterable[str]) -> list[str]:
    """Route CPU calls of every package-bound function of the named (imported) modeling
    modules to transformers' torch function; returns the ``module.function`` names newly
    routed (none for a module already routed or without an installed package)."""
    done = []
    for name in sorted(set(module_names)):
        mod = sys.modules.get(name)
        if mod is None:
            continue
        for attr, fn in list(vars(mod).items()):
            torch_fn = package_bound_torch_function(fn)
            if torch_fn is not None:
                setattr(mod, attr, _routed(fn, torch_fn))
                done.append(f"{name}.{attr}")
    return done

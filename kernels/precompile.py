"""Compile a study's kernels in parallel before it runs.

A study on the Triton backend runs each configuration through its own kernel
variants: the window, the stored formats and the tile sizes are compile-time constants,
so a sweep of 18 configurations compiles tens of kernels.  Compiled one after the other
as the run reaches them, they take most of a first run's wall time on a fresh machine.

:func:`compile_only` turns every Triton launch inside it into a compile request that a
thread pool serves (Triton's ``AsyncCompileMode``; its compiler and ``ptxas`` release
the interpreter lock), and launches nothing.  :func:`precompile` uses it to walk
throwaway runners over the steps a real run will take first, so the real run then finds
each kernel compiled, in memory and in Triton's on-disk cache.  Nothing here changes
what a kernel computes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import triton
from triton.runtime.jit import JITFunction

from .tl_formats import INTERPRETED

MAX_WORKERS = 8
"""Compile threads at most (each compile also starts one ``ptxas`` process)."""


def default_workers() -> int:
    """Threads for :func:`compile_only`: the machine's cores, at most :data:`MAX_WORKERS`."""
    return max(1, min(MAX_WORKERS, os.cpu_count() or 1))


@contextmanager
def compile_only(workers: int | None = None) -> Iterator[None]:
    """Inside, a Triton launch compiles its kernel on a pool of ``workers`` threads and
    does not run it; on exit every compile has finished (an error in one is raised) and
    the kernels are in their functions' caches.  Under ``TRITON_INTERPRET=1`` there is
    nothing to compile, and launches run as usual."""
    if INTERPRETED.value:
        yield
        return
    original = JITFunction.run

    def compile_request(fn, *args, grid, warmup, **kwargs):
        return original(fn, *args, grid=grid, warmup=True, **kwargs)

    with ThreadPoolExecutor(workers or default_workers(),
                            thread_name_prefix="precisionlab-compile") as pool:
        with triton.AsyncCompileMode(pool):
            JITFunction.run = compile_request
            try:
                yield
            finally:
                JITFunction.run = original


def precompile(make_runners: Callable[[], Iterable[tuple[object, int]]], inputs, raw,
               workers: int | None = None) -> int:
    """Compile the kernels that runners launch when built and over their first steps, in
    parallel.

    ``make_runners()`` builds throwaway runners (inside :func:`compile_only`: no kernel
    runs, their state is never set) as ``(runner, steps)`` pairs: how many steps to
    walk each, e.g. its window plus one, so its output, flush and post-flush launches
    are all seen.  ``inputs`` and ``raw``: one real step's arguments of
    ``runner.step``, given at every step (launch arguments keep their shapes from step
    to step).  Returns the steps walked."""
    walked = 0
    with compile_only(workers):
        for runner, steps in make_runners():
            for t in range(steps):
                runner.step(inputs, t, raw)
                walked += 1
    return walked

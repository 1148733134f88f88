"""Compile a study's kernels in parallel before it runs.

A study on the Triton backend runs each configuration through its own kernel
variants: the window, the stored formats and the tile sizes are compile-time constants,
so a sweep of 18 configurations compiles tens of kernels.  Compiled one after the other
as the run reaches them, they take most of a first run's wall time on a fresh machine.

:func:`compile_only` turns every Triton launch inside it into a compile request and
launches nothing.  By default the requests are collected and compiled by worker
processes (:mod:`precisionlab.kernels.compile_worker`) into Triton's disk cache, then
loaded here; a request a worker could not serve is compiled here on a thread pool.
Threads alone (``processes=False``; Triton's ``AsyncCompileMode``) share this process's
interpreter lock, which part of every compile holds.  :func:`precompile` uses it to walk
throwaway runners over the steps a real run will take first, so the real run then finds
each kernel compiled, in memory and in Triton's on-disk cache.  Nothing here changes
what a kernel computes.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

import triton
from triton.runtime.jit import JITFunction

from .tl_formats import INTERPRETED

MAX_WORKERS = 16
"""Compile threads or worker processes at most (each compile also starts one
``ptxas`` process).  A study's kernels are about 20 variants of 3-7 s each, so 16
workers start nearly all of them at once (on a 16-core H200 host the compile phase of
qwen3.5-4b's default sweep took 10.4 s with 16 workers, 11.0 with 12, 14.3 with 8)."""


CGROUP_CPU_MAX = "/sys/fs/cgroup/cpu.max"
"""A cgroup v2 CPU quota, ``"<quota> <period>"`` or ``"max <period>"`` (containers)."""
CGROUP_V1_CPU = "/sys/fs/cgroup/cpu"
"""A cgroup v1 CPU controller: ``cpu.cfs_quota_us`` (-1: none) and ``cpu.cfs_period_us``."""


def _cgroup_quota(cpu_max: str, v1_dir: str) -> tuple[int, int] | None:
    """(quota, period) in microseconds of the cgroup's CPU limit, or None without one."""
    try:
        with open(cpu_max) as f:
            quota, period = f.read().split()[:2]
        return None if quota == "max" else (int(quota), int(period))
    except (OSError, ValueError):
        pass
    try:
        with open(os.path.join(v1_dir, "cpu.cfs_quota_us")) as f:
            quota = int(f.read())
        with open(os.path.join(v1_dir, "cpu.cfs_period_us")) as f:
            period = int(f.read())
        return (quota, period) if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def available_cpus(cpu_max: str = CGROUP_CPU_MAX, v1_dir: str = CGROUP_V1_CPU) -> int:
    """CPUs this process may use: those its affinity allows, capped by the cgroup's CPU
    quota where one is set (a container may see more cores than it may use)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        n = os.cpu_count() or 1
    if (limit := _cgroup_quota(cpu_max, v1_dir)) is not None:
        quota, period = limit
        n = min(n, -(-quota // period))
    return max(1, n)


WORKERS_ENV = "PRECISIONLAB_COMPILE_WORKERS"
"""An environment variable that caps the compile workers (a positive integer), for a
shared machine or several studies at once."""


def workers_cap() -> int:
    """:data:`MAX_WORKERS`, or the cap :data:`WORKERS_ENV` sets (ValueError naming the
    variable if it is not a positive integer)."""
    value = os.environ.get(WORKERS_ENV, "").strip()
    if not value:
        return MAX_WORKERS
    try:
        cap = int(value)
    except ValueError:
        cap = 0
    if cap < 1:
        raise ValueError(f"{WORKERS_ENV} must be a positive integer, got {value!r}")
    return cap


def default_workers() -> int:
    """Workers for :func:`compile_only`: the CPUs available, at most
    :func:`workers_cap`."""
    return min(workers_cap(), available_cpus())


@dataclass
class CompileReport:
    """What a :func:`compile_only` block compiled, filled in when it ends."""

    kernels: int = 0
    """Distinct kernel variants requested."""
    on_disk: int = 0
    """Of those, already in Triton's disk cache (loaded, not compiled)."""
    in_workers: int = 0
    """Of those, compiled by worker processes."""
    worker_errors: list[str] = field(default_factory=list)
    """Why a worker could not serve a request (each then compiled here)."""
    worker_seconds: list[tuple[str, float]] = field(default_factory=list)
    """(kernel name, seconds) of every compile a worker made, in the order they ended."""
    timeline: list[tuple[str, float, float, float]] = field(default_factory=list)
    """(kernel name, queued, sent to a worker, answered), seconds from the block's start,
    of every request sent to a worker, in the order answered (the first request of a
    worker waits for it to start)."""
    phases: dict[str, float] = field(default_factory=dict)
    """Seconds from the block's start at which each phase ended: ``walk`` (the block's
    body, which queues the requests), ``workers`` (every worker answered and exited) and
    ``load`` (every kernel loaded here)."""
    worker_exits: list[float] = field(default_factory=list)
    """Seconds from the block's start at which each worker process had exited."""
    compiled_here: int = 0
    """Kernels compiled in this process while loading, not found on disk: the requests no
    worker served, or any whose disk cache entry this process could not use."""


@contextmanager
def compile_only(workers: int | None = None, processes: bool = True
                 ) -> Iterator[CompileReport]:
    """Inside, a Triton launch requests its kernel's compile and does not run it; on exit
    every kernel has compiled (an error in one is raised) and is in its function's
    cache.  The compiles run on ``workers`` worker processes (``processes``), started as
    the first requests come and fed while the block runs, or on threads.  A kernel
    already in Triton's disk cache is only loaded.  Under ``TRITON_INTERPRET=1`` there is
    nothing to compile, and launches run as usual."""
    report = CompileReport()
    t0 = time.perf_counter()
    if INTERPRETED.value:
        yield report
        return
    if not processes:
        with _threads(workers), _launches_compile_only():
            yield report
        report.phases["load"] = time.perf_counter() - t0
        return
    from .compile_worker import on_disk

    requests: dict[str, JITFunction] = {}
    target = triton.runtime.driver.active.get_current_target()
    pool = WorkerPool(workers or default_workers(), target)

    def collect(*, fn, compile, **_) -> bool:
        spec = compile["specialization_data"]
        if spec not in requests:
            requests[spec] = fn.jit_function
            try:
                cached = on_disk(fn.jit_function, spec, target)
            except Exception:  # a probe that fails only costs a compile
                cached = False
            if cached:
                report.on_disk += 1
            else:
                pool.submit(spec, fn.module, fn.name)
        return True  # tells Triton not to compile it here

    saved = triton.knobs.runtime.jit_cache_hook
    triton.knobs.runtime.jit_cache_hook = collect
    try:
        with _launches_compile_only():
            yield report
    except BaseException:
        pool.cancel()  # the error is raised once the compiles under way end
        raise
    finally:
        triton.knobs.runtime.jit_cache_hook = saved
        report.phases["walk"] = time.perf_counter() - t0
        served, report.worker_errors = pool.close()
        report.phases["workers"] = time.perf_counter() - t0
        report.worker_seconds, report.timeline = pool.seconds, pool.timeline
        report.worker_exits = pool.exits
    report.kernels, report.in_workers = len(requests), len(served)
    misses: list[bool] = []
    saved_listener = triton.knobs.compilation.listener
    triton.knobs.compilation.listener = lambda **kw: misses.append(not kw["cache_hit"])
    try:
        with _threads(workers):  # loads from disk; compiles here what no worker did
            for spec, fn in requests.items():
                fn.preload(spec)
    finally:
        triton.knobs.compilation.listener = saved_listener
    report.compiled_here = sum(misses)
    report.phases["load"] = time.perf_counter() - t0


@contextmanager
def _threads(workers: int | None) -> Iterator[ThreadPoolExecutor]:
    """Triton compiles on a pool of threads inside (``AsyncCompileMode``)."""
    with ThreadPoolExecutor(workers or default_workers(),
                            thread_name_prefix="precisionlab-compile") as pool:
        with triton.AsyncCompileMode(pool):
            yield pool


@contextmanager
def _launches_compile_only() -> Iterator[None]:
    """Inside, a launch of a Triton kernel only gets it compiled (``warmup``), under a
    cache key that does not depend on what this process hashed before
    (:func:`~precisionlab.kernels.compile_worker.settle_cache_keys`), so that compiles
    on threads, in workers and in later processes share disk cache entries."""
    from .compile_worker import settle_cache_keys

    original = JITFunction.run

    def compile_request(fn, *args, grid, warmup, **kwargs):
        settle_cache_keys(fn)
        return original(fn, *args, grid=grid, warmup=True, **kwargs)

    JITFunction.run = compile_request
    try:
        yield
    finally:
        JITFunction.run = original


class WorkerPool:
    """Up to ``workers`` compile worker processes
    (``python -m precisionlab.kernels.compile_worker``), each fed by a thread here from
    one queue of requests; a worker starts with the request that finds the others
    busy.  A worker that cannot start or dies leaves its requests unserved, never
    raises."""

    def __init__(self, workers: int, target) -> None:
        self.workers, self.target = max(1, workers), target
        self.tasks: queue.Queue = queue.Queue()
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()
        self.specs: list[str] = []
        self.served: set[str] = set()
        self.errors: list[str] = []
        self.seconds: list[tuple[str, float]] = []
        self.timeline: list[tuple[str, float, float, float]] = []
        self.queued: list[float] = []
        self.exits: list[float] = []
        self.t0 = time.perf_counter()
        self.idle = 0

    def submit(self, spec: str, module: str, name: str) -> None:
        """Queue one launch's kernel (its specialization data, module and name)."""
        self.specs.append(spec)
        self.queued.append(time.perf_counter() - self.t0)
        t = self.target
        self.tasks.put({"id": len(self.specs) - 1, "module": module, "name": name,
                        "spec": spec, "target": [t.backend, t.arch, t.warp_size]})
        with self.lock:
            start = self.idle == 0 and len(self.threads) < self.workers
        if start:
            thread = threading.Thread(target=self._serve, daemon=True,
                                      name=f"precisionlab-compile-{len(self.threads)}")
            self.threads.append(thread)
            thread.start()

    def cancel(self) -> None:
        """Drop the requests no worker has taken yet."""
        while True:
            try:
                self.tasks.get_nowait()
            except queue.Empty:
                return

    def close(self) -> tuple[set[str], list[str]]:
        """Wait for every queued request; the ones served and, for the others, why not."""
        for _ in self.threads:
            self.tasks.put(None)
        for thread in self.threads:
            thread.join()
        return self.served, self.errors

    def _serve(self) -> None:
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "precisionlab.kernels.compile_worker"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                text=True, env=_worker_env())
        except OSError as exc:
            with self.lock:
                self.errors.append(f"worker did not start: {exc}")
            proc = None
        alive = proc is not None
        while True:
            with self.lock:
                self.idle += 1
            task = self.tasks.get()
            with self.lock:
                self.idle -= 1
            if task is None:
                break
            if not alive:  # drain: the requests are compiled in the parent instead
                continue
            sent = time.perf_counter() - self.t0
            try:
                proc.stdin.write(json.dumps(task) + "\n")
                proc.stdin.flush()
                line = proc.stdout.readline()
            except OSError:
                line = ""
            alive = bool(line.strip())
            reply = json.loads(line) if alive else {
                "ok": False, "error": f"worker exited with {proc.poll()}"}
            with self.lock:
                self.timeline.append((task["name"], round(self.queued[task["id"]], 3),
                                      round(sent, 3), round(time.perf_counter() - self.t0, 3)))
                if reply["ok"]:
                    self.served.add(self.specs[task["id"]])
                    self.seconds.append((task["name"], reply["seconds"]))
                else:
                    self.errors.append(f"{task['name']}: {reply['error']}")
        if proc is not None:
            with proc:
                proc.stdin.close()
            with self.lock:
                self.exits.append(round(time.perf_counter() - self.t0, 3))


def compile_in_processes(requests: dict[str, tuple[str, str]], workers: int,
                         target=None) -> tuple[set[str], list[str]]:
    """Compile kernels into Triton's disk cache on ``workers`` worker processes
    (:class:`WorkerPool`).  ``requests`` maps each launch's specialization data to its
    kernel's module and name; ``target`` is the GPU target (the current device's by
    default).  Returns the requests served and, for the others, why not."""
    pool = WorkerPool(workers, target or triton.runtime.driver.active.get_current_target())
    for spec, (module, name) in requests.items():
        pool.submit(spec, module, name)
    return pool.close()


def _worker_env() -> dict[str, str]:
    """A worker's environment: this process's, its import path and its Triton cache
    folder (which may have been set in code)."""
    path = os.pathsep.join(p for p in sys.path if p)
    return dict(os.environ, PYTHONPATH=path, TRITON_CACHE_DIR=triton.knobs.cache.dir)


def precompile(make_runners: Callable[[], Iterable[tuple[object, int]]], inputs, raw,
               workers: int | None = None, processes: bool = True) -> int:
    """Compile the kernels that runners launch when built and over their first steps, in
    parallel.

    ``make_runners()`` builds throwaway runners (inside :func:`compile_only`: no kernel
    runs, their state is never set) as ``(runner, steps)`` pairs: how many steps to
    walk each, e.g. its window plus one, so its output, flush and post-flush launches
    are all seen.  ``inputs`` and ``raw``: one real step's arguments of
    ``runner.step``, given at every step (launch arguments keep their shapes from step
    to step).  Returns the steps walked."""
    walked = 0
    with compile_only(workers, processes):
        for runner, steps in make_runners():
            for t in range(steps):
                runner.step(inputs, t, raw)
                walked += 1
    return walked

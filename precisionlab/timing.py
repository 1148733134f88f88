"""GPU timing: CUDA-graph replays with a cold L2, and memory-bandwidth ceilings.

Method (shared by the Mamba-2 and GDN benchmarks): capture one decode step in a
CUDA graph; before every replay write a buffer of at least 256 MB (and at least
twice the L2) so the replay starts with a cold L2; time each replay alone with
CUDA events; subtract nothing; report medians.  A step whose graph advances
device counters (a replay design's ring) walks through its window on successive
replays, so replay ``i`` is ring position ``(start + i) mod L``.

Bandwidth ceilings are measured the same way: a device-to-device copy (bytes
read + written) and a read-only Triton reduction (bytes read), the probes of
:mod:`precisionlab.kernels.bandwidth`.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

FLUSH_BYTES = 256 << 20


def layer_count(layers: object, error: type[Exception] = ValueError) -> int:
    """The layers a timed step runs in turn, checked: an integer >= 1, else one
    ``error`` (the caller's usage error)."""
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise error(f"layers must be an integer >= 1, got {layers!r}")
    return layers


@dataclass
class GraphStep:
    """A captured CUDA graph of ``fn`` (warmed up once before capture)."""

    graph: torch.cuda.CUDAGraph
    fn: Callable[[], object]


def capture(fn: Callable[[], object], warmup: int = 1) -> GraphStep:
    """Run ``fn`` ``warmup`` times (compiles kernels), then capture one call.

    ``fn`` must write into preallocated outputs.  Capturing runs nothing, but the
    warm-up calls do: reset any state ``fn`` advances afterwards.
    """
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    return GraphStep(g, fn)


class ColdL2Timer:
    """Times graph replays, each after a write of ``flush_bytes`` (cold L2)."""

    def __init__(self, device: torch.device | str = "cuda", flush_bytes: int | None = None):
        dev = torch.device(device)
        l2 = torch.cuda.get_device_properties(dev).L2_cache_size
        n = max(flush_bytes or FLUSH_BYTES, 2 * l2)
        self.flush = torch.empty(n // 4, dtype=torch.float32, device=dev)

    def replays(self, step: GraphStep | torch.cuda.CUDAGraph, n: int) -> list[float]:
        """Microseconds of ``n`` consecutive replays, each with a cold L2."""
        pending = self._enqueue(step, n)
        self._sync()
        return self._elapsed(pending)

    def _enqueue(self, step: GraphStep | torch.cuda.CUDAGraph, n: int) -> list:
        """Queue ``n`` replays, each behind an L2 flush and between two events."""
        g = step.graph if isinstance(step, GraphStep) else step
        pending = []
        for i in range(n):
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            self.flush.fill_(float(i & 7))
            start.record()
            g.replay()
            end.record()
            pending.append((start, end))
        return pending

    @staticmethod
    def _sync() -> None:
        torch.cuda.synchronize()

    @staticmethod
    def _elapsed(pending: list) -> list[float]:
        return [s.elapsed_time(e) * 1e3 for s, e in pending]

    def median(self, step: GraphStep | torch.cuda.CUDAGraph, n: int = 20) -> float:
        """Median microseconds of ``n`` cold-L2 replays (one warm-up replay first)."""
        self.replays(step, 1)
        return statistics.median(self.replays(step, n))

    def cycle(self, step: GraphStep | torch.cuda.CUDAGraph, period: int, rounds: int
              ) -> list[float]:
        """Per-position medians of a graph whose effect cycles with ``period``
        replays (a ring window): ``rounds`` cycles, replay i at position i % period."""
        times = self.replays(step, period * rounds)
        return [statistics.median(times[p::period]) for p in range(period)]

    def interleaved(self, steps: Mapping[str, tuple[GraphStep | torch.cuda.CUDAGraph, int]],
                    rounds: int) -> dict[str, list[float]]:
        """Paired timing of several graphs: in each of ``rounds`` rounds every graph
        replays its period (a replay design's window, else 1) in the order
        :func:`round_orders` gives, so drifts of the device's clocks and temperature
        between rounds touch every graph alike.  A round's replays are queued behind
        one extra flush and waited for together, so the host stays ahead of the device
        (a replay queued after a synchronisation would time the host's launch too).
        Returns, per graph, the mean us per step of each round (a window mean where
        the period is a window)."""
        means: dict[str, list[float]] = {name: [] for name in steps}
        for order in round_orders(list(steps), rounds):
            self.flush.fill_(0.0)  # device work while the round is queued
            pending = {name: self._enqueue(*steps[name]) for name in order}
            self._sync()
            for name, timed in pending.items():
                means[name].append(float(np.mean(self._elapsed(timed))))
        return means


def round_orders(names: Sequence[str], rounds: int) -> list[list[str]]:
    """The order of ``names`` in each round of :meth:`ColdL2Timer.interleaved`: rotated
    by one place per round, so each name comes first, second, ... equally often."""
    n = len(names)
    return [[names[(r + i) % n] for i in range(n)] for r in range(rounds)]


def paired_speedups(means: Mapping[str, Sequence[float]], peer: str, *, level: float = 0.95,
                    resamples: int = 4000, seed: int = 0) -> dict[str, dict[str, float]]:
    """Speedups over ``peer`` from per-round times of :meth:`ColdL2Timer.interleaved`.

    For every name: ``us`` (median over rounds of its per-round us per step),
    ``speedup`` (median over rounds of ``peer / name`` within a round), ``low`` and
    ``high`` (a percentile-bootstrap interval of that median at ``level``, resampling
    rounds with a fixed seed) and ``faster`` (the share of rounds in which it took at
    most the peer's time).  Raises ValueError without the peer, with rounds of
    unequal count, or with fewer than 2 rounds."""
    if peer not in means:
        raise ValueError(f"no times of the peer {peer!r} (have: {', '.join(means)})")
    counts = {len(v) for v in means.values()}
    if len(counts) != 1:
        raise ValueError(f"every name needs the same number of rounds, got {sorted(counts)}")
    if counts.pop() < 2:
        raise ValueError("paired speedups need at least 2 rounds")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    base = np.asarray(means[peer], dtype=np.float64)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, base.size, size=(resamples, base.size))
    out = {}
    for name, times in means.items():
        t = np.asarray(times, dtype=np.float64)
        ratio = base / t
        boot = np.median(ratio[picks], axis=1)
        lo, hi = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
        out[name] = {"us": float(np.median(t)), "speedup": float(np.median(ratio)),
                     "low": float(lo), "high": float(hi),
                     "faster": float(np.mean(t <= base))}
    return out


def bandwidth(nbytes: int = 2 << 30, device: torch.device | str = "cuda",
              timer: ColdL2Timer | None = None, n: int = 10) -> dict[str, float]:
    """Measured ceilings in TB/s: ``copy`` (read + write, a Triton copy kernel;
    ``torch_copy`` for ``Tensor.copy_``) and ``read`` (a read-only reduction), each
    a median of cold-L2 graph replays."""
    from precisionlab.kernels.bandwidth import copy_launch, programs, read_launch

    timer = timer or ColdL2Timer(device)
    numel = nbytes // 4
    src = torch.randn(numel, device=device)
    dst = torch.empty_like(src)
    copy_us = timer.median(capture(lambda: copy_launch(src, dst)), n)
    torch_copy_us = timer.median(capture(lambda: dst.copy_(src)), n)
    part = torch.empty(programs(numel), device=device)
    read_us = timer.median(capture(lambda: read_launch(src, part)), n)
    return {"copy_TBps": 2 * nbytes / copy_us / 1e6, "read_TBps": nbytes / read_us / 1e6,
            "torch_copy_TBps": 2 * nbytes / torch_copy_us / 1e6,
            "copy_us": copy_us, "read_us": read_us, "bytes": float(nbytes)}


PHASES = ("aligned", "staggered")
"""Ring-position mixes of a batch the benchmarks time: every sequence at position 0, or
sequence b at position b mod L (:func:`stagger_clocks`)."""


def stagger_clocks(tickets: torch.Tensor, window: int, per_step: int) -> None:
    """Start slot b's replay clock at ring position ``b mod window`` (``per_step`` clock
    ticks per decode step), as when a server admits sequences on different steps:
    each step then flushes about ``1 / window`` of the batch instead of all of it at
    once every ``window`` steps."""
    n = tickets.numel()
    pos = torch.arange(n, device=tickets.device) % window
    tickets.copy_((pos * per_step).to(tickets.dtype))

"""Paired speedups against the peer: our kernels and the peer's timed in turn, round
after round, in one process.

The main benchmarks time each kernel in a block of its own, so a drift of the
device's clocks between blocks (at batch 1 a step is ~8 us and single cells move by
+-0.3 us between runs) lands on one kernel's figure and not the other's.  Here every
round replays each kernel's graph -- a replay design's whole window, else one step,
each replay after an L2 flush as in the benchmarks -- in an order rotated per round;
the speedup is the median over rounds of the within-round ratio, with a bootstrap
interval over rounds (:func:`precisionlab.timing.paired_speedups`).

    ds = paired_bench("nemotron-3-nano-4b", batch=1, rounds=60,
                      mamba_ssm_path="/path/to/mamba")
    paired_summary(ds)["replay-fp32"]["speedup"]
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
import xarray as xr

from precisionlab.presets import get_preset
from precisionlab.studies.drift import StudyError
from precisionlab.timing import layer_count

PEERS = {"mamba2": "mamba_ssm", "gdn": "fla"}
"""The peer kernel of each family."""
KERNELS = {"mamba2": ("conventional", "replay-fp32", "split-fp32-fp8", "split-fp16sr-nvfp4"),
           "gdn": ("conventional", "replay-fp32", "split-fp32-fp8", "split-fp16sr-nvfp4")}
"""Our kernels each family can pair with its peer (the speculative verify has no
one-step peer)."""


class PairedError(StudyError):
    """A usage error of :func:`paired_bench` (unknown model or kernel, bad counts)."""


def check_paired(model: str, kernels: Sequence[str] | None, batch: int, window: int,
                 rounds: int, layers: int = 1) -> tuple[str, list[str]]:
    """``(family, kernels)`` after the argument checks (no kernels: all of the
    family's); :class:`PairedError` with one line otherwise."""
    try:
        kind = get_preset(model).kind
    except KeyError as e:
        raise PairedError(str(e).strip("'\"")) from None
    if kind not in KERNELS:
        raise PairedError(f"{model} is a {kind} model; paired timing covers mamba2 and gdn")
    kernels = list(kernels or KERNELS[kind])
    bad = [k for k in kernels if k not in KERNELS[kind]]
    if bad:
        raise PairedError(f"unknown {kind} kernel(s) {', '.join(bad)}; choose from "
                          f"{', '.join(KERNELS[kind])}")
    if batch < 1 or window < 2 or rounds < 2:
        raise PairedError("batch must be >= 1, window >= 2 and rounds >= 2")
    layer_count(layers, PairedError)
    return kind, list(dict.fromkeys(kernels))


def _mamba2_graphs(model: str, batch: int, window: int, kernels: Sequence[str],
                   mamba_ssm_path: str | Path | None, dev: torch.device, timer,
                   layers: int = 1) -> dict:
    from precisionlab.studies.bench_mamba2 import (
        CANDIDATES,
        _Problem,
        _Runner,
        config_at,
        load_mamba_ssm,
    )

    try:
        ssu = load_mamba_ssm(mamba_ssm_path or "")
    except (ImportError, FileNotFoundError, OSError) as e:
        raise PairedError(f"mamba_ssm is needed as the peer ({e}); pass its checkout") from None
    runner = _Runner(timer, 1, lambda _: None, layers)  # (replays each window once, untimed)
    prob = _Problem(model, batch, dev)
    cfgs = {k: CANDIDATES[k][0] for k in kernels if k in CANDIDATES}
    return {k: runner.graph(k, prob, window, config_at(k, batch, prob.H, cfgs), ssu)
            for k in ("mamba_ssm", *kernels)}


def _gdn_graphs(model: str, batch: int, window: int, kernels: Sequence[str],
                dev: torch.device, layers: int = 1) -> dict:
    from precisionlab.studies.bench_gdn import (
        DESIGNS,
        Clock,
        conventional_graph,
        fla_available,
        fla_graph,
        replay_graph,
        shape_of,
    )

    if not fla_available():
        raise PairedError("fla (package fla-core) is needed as the peer")
    s, clock = shape_of(model, batch), Clock(dev)
    graphs = {"fla": (fla_graph(s, clock, layers), 1)}
    for k in kernels:
        if k == "conventional":
            graphs[k] = (conventional_graph(s, clock, layers=layers), 1)
        else:
            graphs[k] = (replay_graph(s, clock, *DESIGNS[k], window, {"layers": layers}),
                         window)
    return graphs


def paired_bench(model: str, *, batch: int = 1, window: int = 16,
                 kernels: Sequence[str] | None = None, rounds: int = 60,
                 mamba_ssm_path: str | Path | None = None, device: str = "cuda",
                 layers: int = 1, log: Callable[[str], None] = print) -> xr.Dataset:
    """Paired timing of our kernels and the family's peer at one (model, batch,
    window) point: an ``xarray.Dataset`` with ``us_step`` over (kernel, round) -- the
    mean us per step of each round, a replay design's window mean (flush included)
    -- and, over kernel, ``speedup`` (median within-round ratio, peer / ours),
    ``speedup_low`` / ``speedup_high`` (its 95% bootstrap interval) and
    ``faster_share`` (rounds in which ours took at most the peer's time).  The peer
    is mamba_ssm's ``selective_state_update`` (Mamba-2; loaded from ``mamba_ssm_path``
    or the installed package) or fla's ``fused_recurrent_gated_delta_rule`` (GDN).
    Kernels run as the block benchmarks run them untuned: Mamba-2 with each design's
    first candidate (the library's own defaults at small batches), GDN with the
    library's defaults.  ``layers``: every graph, the peer's included, runs that
    many layers in turn, each with its own state and inputs, as a model's decode step
    does; ``us_step`` is then per layer."""
    import triton

    from precisionlab.timing import ColdL2Timer, paired_speedups

    kind, kernels = check_paired(model, kernels, batch, window, rounds, layers)
    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        raise PairedError("paired timing needs a CUDA GPU")
    peer = PEERS[kind]
    timer = ColdL2Timer(dev)
    graphs = (_mamba2_graphs(model, batch, window, kernels, mamba_ssm_path, dev, timer, layers)
              if kind == "mamba2" else _gdn_graphs(model, batch, window, kernels, dev, layers))
    timer.interleaved(graphs, 1)  # one untimed round: every window back at position 0
    means = {k: [m / layers for m in v] for k, v in timer.interleaved(graphs, rounds).items()}
    stats = paired_speedups(means, peer)
    names = [peer, *kernels]
    per = f" ({layers} layers, per layer)" if layers > 1 else ""
    for k in names:
        st = stats[k]
        log(f"{model} b{batch} L{window}{per} {k:>20}: {st['us']:7.2f} us/step, "
            f"{st['speedup']:.3f}x {peer} [{st['low']:.3f}, {st['high']:.3f}], "
            f"faster in {st['faster']:.0%} of rounds")
    ds = xr.Dataset(
        {"us_step": (("kernel", "round"), np.array([means[k] for k in names])),
         "speedup": ("kernel", [stats[k]["speedup"] for k in names]),
         "speedup_low": ("kernel", [stats[k]["low"] for k in names]),
         "speedup_high": ("kernel", [stats[k]["high"] for k in names]),
         "faster_share": ("kernel", [stats[k]["faster"] for k in names])},
        coords={"kernel": names, "round": np.arange(rounds)})
    ds.attrs.update({
        "model": model, "family": kind, "batch": batch, "window": window, "layers": layers,
        "peer": peer,
        "rounds": rounds, "device": torch.cuda.get_device_name(dev),
        "torch": torch.__version__, "triton": triton.__version__,
        "method": "CUDA-graph replays, >=256 MB L2 flush before each; every round times "
                  "each kernel's window (else one step) in an order rotated per round; "
                  "speedup = median over rounds of the within-round ratio, 95% "
                  "percentile-bootstrap interval over rounds",
    })
    return ds


def paired_summary(ds: xr.Dataset) -> dict:
    """JSON-ready summary of :func:`paired_bench`: the attributes, and per kernel its
    median us per step, speedup, interval and share of rounds faster than the peer."""
    out = {k: (v.item() if hasattr(v, "item") else v) for k, v in ds.attrs.items()}
    out["kernels"] = {
        str(k): {"us_step": float(np.median(ds.us_step.sel(kernel=k).values)),
                 "speedup": float(ds.speedup.sel(kernel=k)),
                 "speedup_low": float(ds.speedup_low.sel(kernel=k)),
                 "speedup_high": float(ds.speedup_high.sel(kernel=k)),
                 "faster_share": float(ds.faster_share.sel(kernel=k))}
        for k in ds.kernel.values}
    return json.loads(json.dumps(out))

"""GPU benchmark of the fused Gated DeltaNet decode kernels.

Every variant is timed per decode step as a CUDA-graph replay with a cold L2
(``precisionlab.timing``), median over replays; a replay design's graph walks its
window (ring positions 0 .. L-2 are output steps, L-1 the flush), and its per-step
time is the mean over the window.  flash-linear-attention's
``fused_recurrent_gated_delta_rule`` (the peer conventional kernel, fp32 state) is
timed in the same run when installed.

Variants: ``conventional`` (fp32 state), ``fla``, ``replay-fp32`` (shared fp32),
``split-fp32-fp8`` (fp32 checkpoint, fp8-e4m3 read copy), ``split-fp16sr-nvfp4``
(fp16-sr checkpoint, nvfp4 read copy), ``verify-T<T>`` (speculative verify of T
drafts on the shared fp32 design, ring half full; commit timed separately).

Bytes per step are modelled (each tensor read or written once; ring traffic
included); effective TB/s = bytes / time; ``frac_roofline`` = time the bytes take at
the measured read bandwidth over the measured time (output steps, verify and, with
their read + written bytes, the conventional kernels: a copy runs a few percent below
the read rate).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import xarray as xr

from precisionlab.presets import get_preset
from precisionlab.timing import PHASES, layer_count

VARIANTS = ("conventional", "fla", "replay-fp32", "split-fp32-fp8", "split-fp16sr-nvfp4",
            "verify-T4")
DESIGNS = {"replay-fp32": ("fp32", None), "split-fp32-fp8": ("fp32", "fp8-e4m3"),
           "split-fp16sr-nvfp4": ("fp16-sr", "nvfp4")}
STATE_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "bf16-sr": 2.0, "fp16-sr": 2.0,
               "fp8-e4m3": 1.0, "nvfp4": 0.5, "mxfp4": 0.5}


class BenchError(ValueError):
    """Bad benchmark settings."""


@dataclass
class Shape:
    """One GDN layer's decode problem."""

    model: str
    batch: int
    HK: int
    HV: int
    K: int
    V: int
    ring_bytes: int = 2  # bf16 ring

    @property
    def elements(self) -> int:
        return self.batch * self.HV * self.V * self.K

    def state_bytes(self, fmt: str) -> float:
        """Bytes of one stored copy of the batch's state, scales included."""
        per = STATE_BYTES[fmt]
        if fmt == "fp8-e4m3":
            per += 4.0 / self.K
        elif fmt == "nvfp4":
            per += 1.0 / 16 + 4.0 / (self.V * self.K)
        elif fmt == "mxfp4":
            per += 1.0 / 32
        return per * self.elements

    def io_bytes(self, tokens: int = 1) -> float:
        """Step inputs (bf16 q, k, v; fp32 a, b) and fp32 outputs."""
        B, HK, HV, K, V = self.batch, self.HK, self.HV, self.K, self.V
        return tokens * B * (2 * 2 * HK * K + 2 * HV * V + 2 * 4 * HV + 4 * HV * V)

    def entry_bytes(self, window: int = 16) -> dict[str, float]:
        """Ring entry fields of the whole batch (``kk``: the fp32 row of ``k_j . k_i``
        products written with each entry, padded to >= 16 entries)."""
        B, rb = self.batch, self.ring_bytes
        rp = max(16, 1 << max(0, window - 1).bit_length())
        return {"k": B * self.HK * self.K * rb, "v": B * self.HV * self.V * rb,
                "d": B * self.HV * self.V * rb, "g": B * self.HV * 4.0,
                "beta": B * self.HV * 4.0, "kk": B * self.HK * rp * 4.0}

    def output_step_bytes(self, read_fmt: str, n: int, window: int = 16) -> float:
        e = self.entry_bytes(window)
        reads = self.state_bytes(read_fmt) + n * (e["k"] + e["d"] + e["g"])
        return reads + sum(e.values()) + self.io_bytes()

    def flush_bytes(self, ckpt_fmt: str, read_fmt: str | None, n: int,
                    window: int = 16) -> float:
        e = self.entry_bytes(window)
        b = 2 * self.state_bytes(ckpt_fmt) + n * (e["k"] + e["v"] + e["g"] + e["beta"]
                                                  + e["kk"])
        if read_fmt is not None:
            b += self.state_bytes(read_fmt)
        return b + self.io_bytes()

    def conventional_bytes(self) -> float:
        return 2 * self.state_bytes("fp32") + self.io_bytes()

    def verify_bytes(self, T: int, n: int, window: int = 16) -> float:
        e = self.entry_bytes(window + T - 1)
        return (self.state_bytes("fp32") + n * (e["k"] + e["d"] + e["g"])
                + T * sum(e.values()) + self.io_bytes(T))


def shape_of(model: str, batch: int) -> Shape:
    p = get_preset(model)
    if p.kind != "gdn":
        raise BenchError(f"{model} is a {p.kind} model, not gdn")
    return Shape(model, batch, p.groups, p.heads, p.state_dim, p.head_dim)


# --------------------------------------------------------------------- timing
@dataclass
class Clock:
    """Cold-L2 CUDA-graph timing on a GPU; plain wall-clock calls elsewhere (the
    Triton interpreter; smoke runs only)."""

    device: torch.device
    reps: int = 20
    timer: object = field(default=None, repr=False)

    def __post_init__(self):
        if self.device.type == "cuda":
            from precisionlab.timing import ColdL2Timer

            self.timer = ColdL2Timer(self.device)

    def graph(self, fn: Callable[[], object]):
        if self.device.type == "cuda":
            from precisionlab.timing import capture

            return capture(fn)
        fn()
        return fn

    def median(self, g) -> float:
        if self.device.type == "cuda":
            return self.timer.median(g, self.reps)
        return statistics.median(self._wall(g, 3))

    def run(self, g, n: int) -> None:
        """``n`` untimed steps."""
        if self.device.type == "cuda":
            self.timer.replays(g, n)
        else:
            for _ in range(n):
                g()

    def cycle(self, g, period: int, rounds: int) -> list[float]:
        if self.device.type == "cuda":
            return self.timer.cycle(g, period, rounds)
        times = self._wall(g, period * rounds)
        return [statistics.median(times[p::period]) for p in range(period)]

    @staticmethod
    def _wall(fn, n: int) -> list[float]:
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e6)
        return out


def _inputs(s: Shape, device: torch.device, T: int = 0, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator(device="cpu").manual_seed(seed)
    lead = (s.batch, T) if T else (s.batch,)

    def rnd(*shape, dtype=torch.bfloat16):
        return torch.randn(*lead, *shape, generator=g).to(device=device, dtype=dtype)

    A_log = torch.log(1.0 + 15.0 * torch.rand(s.HV, generator=g))
    dt0 = torch.exp(math.log(1e-3) + torch.rand(s.HV, generator=g) * math.log(100.0))
    dt_bias = dt0 + torch.log(-torch.expm1(-dt0))
    return {"q": rnd(s.HK, s.K), "k": rnd(s.HK, s.K), "v": rnd(s.HV, s.V),
            "a": rnd(s.HV, dtype=torch.float32), "b": rnd(s.HV, dtype=torch.float32),
            "A_log": A_log.to(device), "dt_bias": dt_bias.to(device)}


def _state0(s: Shape, device: torch.device, seed: int = 1) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(seed)
    return (0.1 * torch.randn(s.batch, s.HV, s.V, s.K, generator=g)).to(device)


def _cfg(configs: dict | None, variant: str, batch: int) -> dict:
    """Per-variant launch configuration: ``configs[variant]`` or
    ``configs[(variant, batch)]`` (keys block_v, num_warps, out_block_v, out_num_warps,
    launch); empty = the kernels' defaults."""
    configs = configs or {}
    return dict(configs.get((variant, batch), configs.get(variant, {})))


def time_conventional(s: Shape, clock: Clock, cfg: dict | None = None) -> float:
    return clock.median(conventional_graph(s, clock, cfg))


def conventional_graph(s: Shape, clock: Clock, cfg: dict | None = None, layers: int = 1):
    """The captured conventional step (``cfg``: block_v, num_warps) of ``layers`` layers
    in turn, each with its own state and inputs."""
    from precisionlab.kernels.gdn_decode import conventional_step
    from precisionlab.kernels.state import StateStore

    cfg = cfg or {}
    idx = torch.arange(s.batch, dtype=torch.int32, device=clock.device)
    runs = []
    for layer in range(layer_count(layers, BenchError)):
        x = _inputs(s, clock.device, seed=layer)
        store = StateStore.encode(_state0(s, clock.device, seed=1 + layer), "fp32")
        out = torch.empty(s.batch, s.HV, s.V, device=clock.device)
        runs.append((x, store, out))

    def step() -> None:
        for x, store, out in runs:
            conventional_step(x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"],
                              x["dt_bias"], store, idx, out=out, block_v=cfg.get("block_v"),
                              num_warps=cfg.get("num_warps"))

    return clock.graph(step)


def fla_available() -> bool:
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means "not available"
        return False
    return True


def time_fla(s: Shape, clock: Clock) -> float:
    """fla's fused_recurrent_gated_delta_rule, one token, fp32 state, gates and
    L2 norm in the kernel (its Qwen3-Next decode configuration)."""
    return clock.median(fla_graph(s, clock))


def fla_graph(s: Shape, clock: Clock, layers: int = 1):
    """The captured step of the peer (:func:`time_fla`) for ``layers`` layers in turn,
    each with its own state and inputs."""
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

    runs = []
    for layer in range(layer_count(layers, BenchError)):
        x = _inputs(s, clock.device, seed=layer)
        h0 = (0.1 * torch.randn(s.batch, s.HV, s.K, s.V, device=clock.device))
        runs.append((x, h0))

    def run() -> None:
        for x, h0 in runs:
            fused_recurrent_gated_delta_rule(
                x["q"][:, None], x["k"][:, None], x["v"][:, None], g=x["a"][:, None],
                beta=x["b"][:, None], initial_state=h0, output_final_state=True,
                use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=x["A_log"],
                dt_bias=x["dt_bias"], use_beta_sigmoid_in_kernel=True)

    with torch.inference_mode():
        return clock.graph(run)


def time_replay(s: Shape, clock: Clock, ckpt: str, read: str | None, L: int,
                rounds: int = 3, cfg: dict | None = None) -> list[float]:
    """Per-ring-position medians (positions 0 .. L-2 output steps, L-1 the flush), per
    layer.

    ``cfg["phases"]`` (not a cache keyword): "aligned" (default: every sequence starts
    at ring position 0, so the whole batch flushes at the same step) or "staggered"
    (sequence b starts at position b mod L, as when a server admits sequences on
    different steps: every step flushes about 1/L of the batch; the medians are then
    per step of the cycle, not per ring position).  ``cfg["layers"]`` (not a cache
    keyword either; default 1): the captured step runs that many layers of the design
    one after another, each with its own cache and inputs, as a model's decode step
    does, so each layer's launches see the others' traffic in L2; the times are the
    step's divided by the layers."""
    layers = layer_count((cfg or {}).get("layers", 1), BenchError)
    times = clock.cycle(replay_graph(s, clock, ckpt, read, L, cfg), L, rounds)
    return [t / layers for t in times]


def replay_graph(s: Shape, clock: Clock, ckpt: str, read: str | None, L: int,
                 cfg: dict | None = None):
    """The captured step of a replay design (:func:`time_replay`; ``cfg["layers"]``
    caches stepped in turn), its rings at position 0: each further window of L replays
    times every position once."""
    from precisionlab.kernels.gdn_decode import GDNReplayCache

    cfg = dict(cfg or {})
    phases = cfg.pop("phases", "aligned")
    if phases not in PHASES:
        raise BenchError(f"phases must be one of {', '.join(PHASES)}, got {phases!r}")
    layers = layer_count(cfg.pop("layers", 1), BenchError)
    dev = clock.device
    idx = torch.arange(s.batch, dtype=torch.int32, device=dev)
    steps = []
    for layer in range(layers):
        x = _inputs(s, dev, seed=layer)
        cache = GDNReplayCache(s.batch, s.HK, s.HV, s.K, s.V, window=L, checkpoint=ckpt,
                               read=read, device=dev, **cfg)
        cache.reset(_state0(s, dev, seed=1 + layer))
        out = torch.empty(s.batch, s.HV, s.V, device=dev)
        steps.append((cache, x, out))

    def step() -> None:
        for cache, x, out in steps:
            cache.step(x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"], idx,
                       out=out)

    g = clock.graph(step)
    for cache, _, _ in steps:
        cache.counters.reset()  # the warm-up call advanced the ring
    if phases == "staggered":
        from precisionlab.timing import stagger_clocks

        for cache, _, _ in steps:
            stagger_clocks(cache.counters.tickets, L, cache.programs_per_slot)
        clock.run(g, L)  # one untimed window: every ring entry written once
    return g


def time_verify(s: Shape, clock: Clock, T: int, L: int, cfg: dict | None = None
                ) -> tuple[float, float]:
    """``(verify_us, commit_us)``: T drafts with the ring half full (shared fp32); the
    commit accepts nothing (no flush), so every replay sees the same state."""
    from precisionlab.kernels.gdn_decode import GDNReplayCache

    cfg = {k: v for k, v in (cfg or {}).items()
           if k in ("verify_block_v", "verify_num_warps", "verify_stages", "verify_maxnreg",
                    "verify_launch", "prep_num_warps")}
    x = _inputs(s, clock.device, T=T)
    cache = GDNReplayCache(s.batch, s.HK, s.HV, s.K, s.V, window=L, checkpoint="fp32",
                           drafts=T, device=clock.device, **cfg)
    cache.reset(_state0(s, clock.device))
    cache.counters.ring_len.fill_(L // 2)
    idx = torch.arange(s.batch, dtype=torch.int32, device=clock.device)
    out = torch.empty(s.batch, T, s.HV, s.V, device=clock.device)
    acc = torch.zeros(s.batch, dtype=torch.int32, device=clock.device)
    gv = clock.graph(lambda: cache.verify(x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"],
                                          x["dt_bias"], idx, out=out))
    gc = clock.graph(lambda: cache.commit(acc, idx))
    return clock.median(gv), clock.median(gc)


# ------------------------------------------------------------------ the study
def bench_gdn(
    models: Sequence[str] = ("qwen3.5-4b", "qwen3.5-122b"),
    batches: Sequence[int] = (1, 64, 256),
    windows: Sequence[int] = (16,),
    *,
    extra_windows: Sequence[int] = (4, 8, 32),
    extra_batches: Sequence[int] = (256,),
    extra_models: Sequence[str] | None = None,
    variants: Sequence[str] = VARIANTS,
    rounds: int = 3,
    reps: int = 20,
    configs: dict | None = None,
    device: str = "cuda",
    on_result: Callable[[dict], None] | None = None,
    deadline: float | None = None,
    phases: str = "aligned",
) -> xr.Dataset:
    """Per-step decode time of every variant, model, batch and window.

    ``extra_windows`` are also run at ``extra_batches`` for ``extra_models`` (default:
    all models).
    Returns a Dataset over (model, batch, window, variant) with ``us_per_step``
    (window mean for replay designs), ``us_output`` (mean output step), ``us_flush``,
    ``us_output_first`` / ``us_output_last`` (ring positions 0 and L-2),
    ``bytes_per_step``, ``eff_TBps``, ``frac_roofline``, ``speedup_vs_fla`` and
    ``us_commit`` (verify); attrs hold the device, versions and measured bandwidths.
    ``deadline`` (a ``time.time()`` value): variants not started by then are left NaN.
    ``phases``: the replay designs' ring-position mix, "aligned" or "staggered" (see
    :func:`time_replay`; its per-position times are then per step of the cycle).
    """
    dev = torch.device(device)
    if phases not in PHASES:
        raise BenchError(f"phases must be one of {', '.join(PHASES)}, got {phases!r}")

    def late() -> bool:
        return deadline is not None and time.time() > deadline

    if dev.type == "cuda" and not torch.cuda.is_available():
        raise BenchError("the GDN kernel benchmark needs a CUDA device")
    for v in variants:
        if v not in VARIANTS and not v.startswith("verify-T"):
            raise BenchError(f"unknown variant {v!r}; choose from {', '.join(VARIANTS)}")
    clock = Clock(dev, reps)
    bw = {"copy_TBps": float("nan"), "read_TBps": float("nan")}
    if dev.type == "cuda":
        from precisionlab.timing import bandwidth

        bw = bandwidth(device=dev, timer=clock.timer)
    has_fla = "fla" in variants and dev.type == "cuda" and fla_available()
    all_windows = sorted(set(windows) | set(extra_windows))
    names = ("us_per_step", "us_output", "us_flush", "us_output_first", "us_output_last",
             "bytes_per_step", "eff_TBps", "frac_roofline", "speedup_vs_fla", "us_commit")
    shape = (len(models), len(batches), len(all_windows), len(variants))
    data = {n: np.full(shape, np.nan) for n in names}

    def put(mi, bi, wi, vi, **vals):
        for k, val in vals.items():
            data[k][mi, bi, wi, vi] = val
        if on_result is not None:
            on_result({"model": models[mi], "batch": batches[bi], "window": all_windows[wi],
                       "variant": variants[vi], **vals})

    for mi, model in enumerate(models):
        for bi, batch in enumerate(batches):
            s = shape_of(model, batch)
            extra = batch in extra_batches and (extra_models is None or model in extra_models)
            wins = [w for w in all_windows if w in windows or (w in extra_windows and extra)]
            fla_us = time_fla(s, clock) if has_fla else float("nan")
            conv_us = float("nan")
            for vi, var in enumerate(variants):
                cfg = _cfg(configs, var, batch)
                if late():
                    continue
                if var in ("conventional", "fla"):
                    if var == "fla" and not has_fla:
                        continue
                    us = time_conventional(s, clock, cfg) if var == "conventional" else fla_us
                    if var == "conventional":
                        conv_us = us
                    nbytes = s.conventional_bytes()
                    for w in wins:
                        put(mi, bi, all_windows.index(w), vi, us_per_step=us,
                            bytes_per_step=nbytes, eff_TBps=nbytes / us / 1e6,
                            frac_roofline=nbytes / (bw["read_TBps"] * 1e6) / us,
                            speedup_vs_fla=fla_us / us)
                elif var.startswith("verify-T"):
                    T = int(var[len("verify-T"):])
                    for w in wins:
                        if w not in windows:
                            continue
                        us, cus = time_verify(s, clock, T, w, cfg)
                        nbytes = s.verify_bytes(T, w // 2, w)
                        put(mi, bi, all_windows.index(w), vi, us_per_step=us, us_commit=cus,
                            bytes_per_step=nbytes, eff_TBps=nbytes / us / 1e6,
                            frac_roofline=nbytes / (bw["read_TBps"] * 1e6) / us,
                            speedup_vs_fla=fla_us / us)
                else:
                    ckpt, read = DESIGNS[var]
                    rfmt = read or ckpt
                    for w in wins:
                        pos = time_replay(s, clock, ckpt, read, w, rounds,
                                          {**cfg, "phases": phases})
                        outs = pos[:-1] if w > 1 else []
                        out_b = [s.output_step_bytes(rfmt, n, w) for n in range(w - 1)]
                        fl_b = s.flush_bytes(ckpt, read, w - 1, w)
                        us = statistics.fmean(pos)
                        nbytes = (sum(out_b) + fl_b) / w
                        frac = (sum(out_b) / (bw["read_TBps"] * 1e6) / sum(outs)) if outs \
                            else float("nan")
                        put(mi, bi, all_windows.index(w), vi, us_per_step=us,
                            us_output=statistics.fmean(outs) if outs else float("nan"),
                            us_flush=pos[-1], us_output_first=outs[0] if outs else float("nan"),
                            us_output_last=outs[-1] if outs else float("nan"),
                            bytes_per_step=nbytes, eff_TBps=nbytes / us / 1e6,
                            frac_roofline=frac, speedup_vs_fla=fla_us / us)
            del conv_us
            if dev.type == "cuda":
                torch.cuda.empty_cache()

    ds = xr.Dataset(
        {n: (("model", "batch", "window", "variant"), a) for n, a in data.items()},
        coords={"model": list(models), "batch": list(batches), "window": all_windows,
                "variant": list(variants)},
    )
    ds.attrs.update(_meta(dev, bw, has_fla, rounds, reps, configs))
    ds.attrs["phases"] = phases
    return ds


def _meta(dev: torch.device, bw: dict, has_fla: bool, rounds: int, reps: int,
          configs: dict | None) -> dict:
    import triton

    meta = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
            "torch": torch.__version__, "triton": triton.__version__,
            "copy_TBps": float(bw["copy_TBps"]), "read_TBps": float(bw["read_TBps"]),
            "timer": "CUDA-graph replay, cold L2 (256 MB write before each), median",
            "rounds": rounds, "reps": reps, "configs": repr(configs or {})}
    if has_fla:
        import fla

        meta["fla"] = getattr(fla, "__version__", "?")
    return meta


def sweep_configs(model: str, batch: int, window: int, variant: str,
                  configs: Sequence[dict], *, device: str = "cuda", rounds: int = 2,
                  reps: int = 10, deadline: float | None = None) -> list[dict]:
    """Time one variant under several launch configurations (tuning aid): a list of
    ``{**config, "us_per_step", "us_output", "us_flush"}``."""
    dev = torch.device(device)
    clock = Clock(dev, reps)
    s = shape_of(model, batch)
    rows = []
    for cfg in configs:
        if deadline is not None and time.time() > deadline:
            rows.append({**cfg, "error": "skipped: past the deadline"})
            continue
        try:
            if variant == "conventional":
                us = time_conventional(s, clock, cfg)
                rows.append({**cfg, "us_per_step": us})
            elif variant.startswith("verify-T"):
                us, cus = time_verify(s, clock, int(variant[8:]), window, cfg)
                rows.append({**cfg, "us_per_step": us, "us_commit": cus})
            else:
                ckpt, read = DESIGNS[variant]
                pos = time_replay(s, clock, ckpt, read, window, rounds, cfg)
                rows.append({**cfg, "us_per_step": statistics.fmean(pos),
                             "us_output": statistics.fmean(pos[:-1]), "us_flush": pos[-1]})
        except Exception as e:  # noqa: BLE001 - a config that fails to compile/run is reported
            rows.append({**cfg, "error": f"{type(e).__name__}: {e}"[:200]})
    return rows


def _kinfo(h) -> dict:
    """Registers, spills and shared memory of a compiled kernel (empty off the GPU)."""
    if h is None:
        return {}
    md = getattr(h, "metadata", None)
    return {"n_regs": getattr(h, "n_regs", None), "n_spills": getattr(h, "n_spills", None),
            "shared": getattr(md, "shared", None)}


def diag_replay(s: Shape, clock: Clock, ckpt: str, read: str | None, L: int, cfg: dict,
                pos: int) -> dict:
    """Per-launch times of a staged replay step at ring position ``pos`` (tuning aid):
    the flush launch where nothing flushes, the prep launch, the output launch, the two
    back to back as the step runs them (``us_prep_out``: less ``us_out``, what the prep
    launch adds to an output step's path), and the whole step (mean over the window),
    with each kernel's registers and spills."""
    from precisionlab.kernels.gdn_decode import GDNReplayCache

    x = _inputs(s, clock.device)
    cache = GDNReplayCache(s.batch, s.HK, s.HV, s.K, s.V, window=L, checkpoint=ckpt,
                           read=read, device=clock.device, **cfg)
    cache.reset(_state0(s, clock.device))
    idx = torch.arange(s.batch, dtype=torch.int32, device=clock.device)
    out = torch.empty(s.batch, s.HV, s.V, device=clock.device)
    args = (x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"])
    P = cache.programs_per_slot
    cache.counters.tickets.fill_(pos * P)
    cache.step(*args, idx, out=out)
    cache.counters.tickets.fill_(pos * P)
    row = {}
    if cache.launch != "fused":
        gf = clock.graph(lambda: cache._flush(*args, idx, idx, out, commit=False))
        row["us_flush_noop"] = clock.median(gf)
    if cache.launch == "staged":
        q, k, v, a, b, A_log, dt_bias = args
        gp = clock.graph(lambda: cache._prep_launch(q, k, a, b, A_log, dt_bias, idx))
        row["us_prep"] = clock.median(gp)
        cache.counters.tickets.fill_(pos * P)
        cache._prep_launch(q, k, a, b, A_log, dt_bias, idx)
        go = clock.graph(lambda: cache._out_launch(v, idx, out))
        row["us_out"] = clock.median(go)
        # the concurrent step's prep launch leaves the clocks alone: every replay is at pos
        cache.counters.tickets.fill_(pos * P)
        gpo = clock.graph(lambda: cache._staged(q, k, v, a, b, A_log, dt_bias, idx, out,
                                                concurrent=True))
        row["us_prep_out"] = clock.median(gpo)
    cache.counters.tickets.fill_(0)
    g = clock.graph(lambda: cache.step(*args, idx, out=out))
    cache.counters.reset()
    per = clock.cycle(g, L, 2)
    row["us_step_output"] = statistics.fmean(per[:-1])
    row["us_step_flush"] = per[-1]
    for name, h in cache.compiled.items():
        row.update({f"{name}_{k}": v for k, v in _kinfo(h).items()})
    return row

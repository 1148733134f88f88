"""Traces: the per-step SSM-layer inputs of a batch of sequences.

A trace has a layer shape (a :class:`~precisionlab.presets.Preset`), per-head
parameters, and an iterator of steps; each step is a dict of float32 tensors:

* mamba2: ``x`` (batch, heads, P), ``dt_raw`` (batch, heads), ``B``/``C``
  (batch, groups, N), ``z`` (batch, heads, P); parameters ``A``, ``D``, ``dt_bias``.
* gdn: ``q``/``k`` (batch, k_heads, K), ``v`` (batch, v_heads, V), ``a``/``b``
  (batch, v_heads); parameters ``A_log``, ``dt_bias``.

Sources: :class:`SyntheticTrace` (seeded, streamed step by step) and
:class:`SavedTrace` (a safetensors file, see :func:`save_trace` for the schema).
"""

from __future__ import annotations

import json
import math
import numbers
import os
from collections.abc import Iterator
from pathlib import Path

import torch

from .atomic import atomic_path
from .presets import Preset, get_preset

SCHEMA = "precisionlab.trace/1"
STEP_KEYS = {"mamba2": ("x", "dt_raw", "B", "C", "z"), "gdn": ("q", "k", "v", "a", "b")}
OPTIONAL_STEP_KEYS = {"z"}
PARAM_KEYS = {"mamba2": ("A", "D", "dt_bias"), "gdn": ("A_log", "dt_bias")}
DYNAMICS = ("trained", "init")


class TraceError(ValueError):
    """A trace that cannot be built or read."""


def step_shapes(preset: Preset, batch: int) -> dict[str, tuple[int, ...]]:
    """Shape of each per-step input for ``batch`` sequences."""
    H, P, N, G = preset.heads, preset.head_dim, preset.state_dim, preset.groups
    if preset.kind == "mamba2":
        return {"x": (batch, H, P), "dt_raw": (batch, H), "B": (batch, G, N),
                "C": (batch, G, N), "z": (batch, H, P)}
    return {"q": (batch, G, N), "k": (batch, G, N), "v": (batch, H, P), "a": (batch, H),
            "b": (batch, H)}


def param_shapes(preset: Preset) -> dict[str, tuple[int, ...]]:
    return {k: (preset.heads,) for k in PARAM_KEYS[preset.kind]}


class Trace:
    """Base class: a layer shape, parameters, and an iterable of steps."""

    preset: Preset
    batch: int
    steps: int
    params: dict[str, torch.Tensor]
    state0: torch.Tensor | None = None
    source: str = ""

    @property
    def kind(self) -> str:
        return self.preset.kind

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        raise NotImplementedError

    def __len__(self) -> int:
        return self.steps


def _log_uniform(gen: torch.Generator, n: int, lo: float, hi: float) -> torch.Tensor:
    u = torch.rand(n, generator=gen, dtype=torch.float64)
    return torch.exp(math.log(lo) + u * (math.log(hi) - math.log(lo)))


def _inverse_softplus(y: torch.Tensor) -> torch.Tensor:
    return y + torch.log(-torch.expm1(-y))


class SyntheticTrace(Trace):
    """Seeded synthetic inputs for a preset, generated one step at a time.

    ``dynamics="trained"``: per-head decay rate |A| (Mamba-2) or exp(A_log) (GDN)
    log-uniform over [1e-3, 1e4], so near-accumulator heads (decay ~ 1) exist as in
    trained models.  ``dynamics="init"``: the standard initialisation, |A| ~ U[1, 16].
    Both draw ``dt0`` log-uniform in [1e-3, 0.1] (floored at 1e-4) for ``dt_bias``.
    Inputs follow an AR(1) process with correlation ``rho`` and unit variance.
    """

    def __init__(
        self,
        preset: Preset | str,
        *,
        steps: int,
        batch: int = 1,
        seed: int = 0,
        dynamics: str = "trained",
        rho: float = 0.9,
    ):
        self.preset = get_preset(preset) if isinstance(preset, str) else preset
        if dynamics not in DYNAMICS:
            raise TraceError(
                f"unknown dynamics {dynamics!r}; choose one of {', '.join(DYNAMICS)}")
        if steps < 1 or batch < 1:
            raise TraceError(f"steps and batch must be positive, got steps={steps}, batch={batch}")
        if not 0.0 <= rho < 1.0:
            raise TraceError(f"rho must be in [0, 1), got {rho}")
        # torch seeds a generator with any of these; the inputs' generator takes seed + 1
        if not (isinstance(seed, numbers.Integral) and -(2**63) <= seed <= 2**64 - 2):
            raise TraceError(f"seed must be an integer from -2**63 to 2**64 - 2, got {seed!r}")
        self.steps, self.batch, self.seed = steps, batch, seed
        self.dynamics, self.rho = dynamics, rho
        self.source = f"synthetic({self.preset.name}, dynamics={dynamics}, seed={seed})"
        self.params = self._make_params()

    def _make_params(self) -> dict[str, torch.Tensor]:
        gen = torch.Generator().manual_seed(self.seed)
        H = self.preset.heads
        if self.dynamics == "trained":
            rate = _log_uniform(gen, H, 1e-3, 1e4)
        else:
            rate = 1.0 + 15.0 * torch.rand(H, generator=gen, dtype=torch.float64)
        dt0 = _log_uniform(gen, H, 1e-3, 0.1).clamp_min(1e-4)
        dt_bias = _inverse_softplus(dt0)
        if self.kind == "mamba2":
            return {"A": -rate, "D": torch.ones(H, dtype=torch.float64), "dt_bias": dt_bias}
        return {"A_log": torch.log(rate), "dt_bias": dt_bias}

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        gen = torch.Generator().manual_seed(self.seed + 1)
        shapes = step_shapes(self.preset, self.batch)
        rho, noise = self.rho, math.sqrt(1.0 - self.rho**2)
        state = {k: torch.randn(s, generator=gen) for k, s in shapes.items()}
        for _ in range(self.steps):
            yield dict(state)
            state = {k: rho * v + noise * torch.randn(v.shape, generator=gen)
                     for k, v in state.items()}


class SavedTrace(Trace):
    """A trace read from a safetensors file written by :func:`save_trace`."""

    def __init__(self, path: str | os.PathLike):
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        self.path = Path(path)
        if not self.path.is_file():
            raise TraceError(f"trace file not found: {self.path}")
        try:
            tensors = load_file(str(self.path))
            with open(self.path, "rb") as fh:
                header_len = int.from_bytes(fh.read(8), "little")
                meta = json.loads(fh.read(header_len)).get("__metadata__", {})
        except (SafetensorError, OSError, ValueError) as exc:
            raise TraceError(f"{self.path} is not a readable safetensors trace: {exc}") from None
        if meta.get("schema") != SCHEMA:
            raise TraceError(
                f"{self.path}: not a precisionlab trace (schema {meta.get('schema')!r})")
        try:
            kind = meta["kind"]
            dims = json.loads(meta["dims"])
            self.preset = Preset(
                name=meta.get("model", self.path.stem), kind=kind, heads=int(dims["heads"]),
                head_dim=int(dims["head_dim"]), state_dim=int(dims["state_dim"]),
                groups=int(dims["groups"]), ssm_layers=int(dims.get("ssm_layers", 1)),
                source=f"trace file {self.path.name}",
            )
        except (KeyError, ValueError, TypeError) as exc:
            raise TraceError(f"{self.path}: malformed trace metadata ({exc})") from None
        if kind not in STEP_KEYS:
            raise TraceError(f"{self.path}: unknown layer kind {kind!r}")
        self.source = meta.get("source", str(self.path))
        self._load(tensors)

    def _load(self, tensors: dict[str, torch.Tensor]) -> None:
        kind = self.kind
        missing = [k for k in (*STEP_KEYS[kind], *(f"param.{p}" for p in PARAM_KEYS[kind]))
                   if k not in tensors and k not in OPTIONAL_STEP_KEYS]
        if missing:
            raise TraceError(f"{self.path}: missing tensors {', '.join(missing)}")
        first = tensors[STEP_KEYS[kind][0]]
        if first.ndim < 2:
            raise TraceError(f"{self.path}: step tensors need (steps, batch, ...) shape")
        self.steps, self.batch = int(first.shape[0]), int(first.shape[1])
        expected = step_shapes(self.preset, self.batch)
        self.data = {}
        for key, shape in expected.items():
            if key not in tensors:
                continue
            t = tensors[key]
            if tuple(t.shape) != (self.steps, *shape):
                raise TraceError(
                    f"{self.path}: tensor {key!r} has shape {tuple(t.shape)}, expected "
                    f"{(self.steps, *shape)}"
                )
            self.data[key] = t.to(torch.float32)
        self.params = {}
        for key, shape in param_shapes(self.preset).items():
            t = tensors[f"param.{key}"]
            if tuple(t.shape) != shape:
                raise TraceError(f"{self.path}: parameter {key!r} has shape {tuple(t.shape)}, "
                                 f"expected {shape}")
            self.params[key] = t.to(torch.float64)
        if "state0" in tensors:
            s0 = tensors["state0"]
            if tuple(s0.shape) != (self.batch, *self.preset.state_shape):
                raise TraceError(f"{self.path}: state0 has shape {tuple(s0.shape)}")
            self.state0 = s0.to(torch.float64)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        for t in range(self.steps):
            yield {k: v[t] for k, v in self.data.items()}


def save_trace(trace: Trace, path: str | os.PathLike, *, steps: int | None = None) -> Path:
    """Write ``trace`` (its first ``steps`` steps) to a safetensors file, atomically.

    Schema ``precisionlab.trace/1``: metadata keys ``schema``, ``kind``, ``model``,
    ``dims`` (JSON: heads, head_dim, state_dim, groups, ssm_layers) and ``source``;
    tensors: each step input stacked as (steps, batch, ...) under its name,
    parameters as ``param.<name>`` (per head), optional ``state0``.
    """
    from safetensors.torch import save_file

    path = Path(path)
    n = trace.steps if steps is None else min(steps, trace.steps)
    # allocated whole at the first step: a trace too large for the memory fails at once
    tensors: dict[str, torch.Tensor] = {}
    for t, step in enumerate(trace):
        if t >= n:
            break
        for k, v in step.items():
            if t == 0:
                tensors[k] = torch.empty((n, *v.shape), dtype=torch.float32)
            tensors[k][t] = v
    tensors.update({f"param.{k}": v.contiguous() for k, v in trace.params.items()})
    if trace.state0 is not None:
        tensors["state0"] = trace.state0.contiguous()
    p = trace.preset
    meta = {
        "schema": SCHEMA,
        "kind": p.kind,
        "model": p.name,
        "dims": json.dumps({"heads": p.heads, "head_dim": p.head_dim, "state_dim": p.state_dim,
                            "groups": p.groups, "ssm_layers": p.ssm_layers}),
        "source": trace.source,
    }
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=meta)
    return path


def open_trace(model: str | os.PathLike, **synthetic_kwargs) -> Trace:
    """A preset name gives a synthetic trace; a ``.safetensors`` path a saved one."""
    s = str(model)
    if s.endswith(".safetensors") or os.path.sep in s:
        return SavedTrace(s)
    return SyntheticTrace(s, **synthetic_kwargs)

"""Decode a whole hybrid model with every SSM layer's recurrent state kept under a
precision design, next to a reference that keeps the state exact.

How the designs are realised
----------------------------
One forward pass carries every configuration: the batch is laid out in groups of
``batch`` rows, group 0 the reference and group g the g-th design, all fed the
same tokens (the study teacher-forces the reference's greedy tokens).  Attention,
FFN and every other non-SSM computation is transformers' own and is per row, so
rows of different groups never mix (batched kernels may round rows of different
groups differently in the last bit: fp32 designs match the reference to ~1e-7).

Each SSM mixer's ``forward`` is wrapped per instance while a :class:`DesignDecode`
is open (the wrapper is an instance attribute, removed on exit; transformers'
classes and files are untouched).  Prompt tokens (prefill, sequence length > 1)
go through the mixer's own forward, once for the ``batch`` prompts; the cache
(SSM and conv states, attention KV) is then replicated to every group, so all
configurations start bit-identical from the exact chunked-scan state.  That state
seeds the reference (fp64) and each design's
``TorchDesignRunner`` (``state0``: rounded into the checkpoint and read copy as the
engine does at step -1).  For every decode step the wrapper

1. runs the mixer's own projections and causal-conv update (the transformers conv
   state advances in place) to get the step's SSM inputs (x, dt, B, C / q, k, v,
   a, b: :mod:`precisionlab.models.adapters`);
2. runs the recurrence with precisionlab's engine: ``kind.prepare`` (inputs
   rounded to the ring dtype, gates computed), then for the reference rows
   ``kind.reference_step_`` on an fp64 state and for each design's rows
   ``TorchDesignRunner.step`` (the design's checkpoint / read copies and ring,
   output steps by replay, flushes every L steps) - exactly the engine's
   semantics, including GDN's ring of ``d`` values computed from the read copy
   and recomputed from the checkpoint at a flush;
3. hands the SSM output back to the mixer's gated norm and output projection.

So the design's state never passes through the transformers cache during decode
(its recurrent-state tensor keeps the prefill state and is stale afterwards).  The
engine's replay itself produces each output, so no equivalence is relied on.  For
the record, the alternative (run the mixer's own step on a cache state set to the
decoded read copy advanced over the ring) would agree with it: exactly, up to fp32
summation order, for Mamba-2 (linear in the state); for GDN only up to the ring's
rounding of ``d``, because ``d_t = beta_t (v_t - alpha_t S_{t-1} k_t)`` depends on the
state: advancing the read copy recomputes each ``d`` in fp32 where the engine reads the
ring's stored (ring-dtype) ``d``; and a split design's flush folds the ring into its
own *checkpoint* with every ``d`` recomputed from that checkpoint, so the design's
copies have to be kept outside the cache either way.  As in the engine, the
reference consumes the inputs rounded to the ring dtype, so errors measure the
state's storage; with
``ring_dtype="fp32"`` the reference is the model's exact recurrence (fp64 state).

With ``backend="triton"`` each design's rows run on the fused kernels' runner
(:func:`precisionlab.kernels.backend.make_triton_runner`: the same constructor and
``step``, the same stored bits) instead of ``TorchDesignRunner``, so the drift is the
real kernels' inside the real model; the reference stays the fp64 torch step.

Limits: every SSM layer of one configuration uses the same design (its stochastic
rounding seed is ``seed + 2 * layer_index``, the read copy's ``+ 1``, so layers draw
independent bits); the prompt is exact for every configuration; decoding is one
token per step (no speculative drafts).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from ..designs import Design, TorchDesignRunner
from ..kinds import LayerKind, kind_for, ring_dtype_of
from .adapters import MixerAdapter, ModelError, recurrent_state
from .loading import HybridModel

CACHE_KWARGS = ("cache", "past_key_values", "cache_params")  # transformers 5.x spellings
RUNTIME_BACKENDS = ("torch", "triton")


def design_runner_factory(backend: str):
    """The class (or factory) that runs one design's rows: torch emulation or the
    fused Triton kernels (CUDA, or the Triton interpreter on CPU tensors)."""
    if backend == "torch":
        return TorchDesignRunner
    if backend == "triton":
        from ..kernels.backend import make_triton_runner

        return make_triton_runner
    raise ModelError(f"unknown backend {backend!r}; choose one of {', '.join(RUNTIME_BACKENDS)}")


def rows(inp: Any, sl: slice) -> Any:
    """The rows ``sl`` of a kind's prepared inputs (a dataclass of tensors)."""
    return type(inp)(**{f.name: None if getattr(inp, f.name) is None else getattr(inp, f.name)[sl]
                        for f in dataclasses.fields(inp)})


def rel_l2(diff: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Per-row relative L2 norm over every non-batch axis."""
    den = ref.flatten(1).norm(dim=1)
    return diff.flatten(1).norm(dim=1) / den.clamp_min(torch.finfo(den.dtype).tiny)


class _LayerRun:
    """One SSM layer's reference state and design runners.  The runners are built at
    their first use, the first decode step: on the kernels, after that step has compiled
    their kernels (building one encodes its initial state, a kernel launch)."""

    def __init__(self, idx: int, hm: HybridModel, designs: Sequence[Design], batch: int,
                 ring_dtype: torch.dtype, seed: int, S0: torch.Tensor, runner_factory):
        self.idx = idx
        self.mixer = hm.mixers[idx]
        self.adapter: MixerAdapter = hm.adapter(idx)
        self.kind: LayerKind = kind_for(hm.layer_shape(idx))
        raw = {k: v.to(S0.device) for k, v in self.adapter.params(self.mixer).items()}
        self.params32 = self.kind.params({k: v.float() for k, v in raw.items()})
        self.params64 = self.kind.params(raw)
        self.raw_params = raw
        self.S_ref = S0[:batch].double().clone()
        self.state0 = S0[:batch].double().clone()
        self._build: Callable[[], list] | None = lambda: [
            runner_factory(d, self.kind, self.params32, batch, S0.device, ring_dtype,
                           seed + 2 * idx, S0[g * batch:(g + 1) * batch].contiguous())
            for g, d in enumerate(designs, start=1)
        ]
        self._runners: list | None = None

    @property
    def runners(self) -> list:
        """The designs' runners, in the order of ``designs``."""
        if self._runners is None:
            self._runners, self._build = self._build(), None
        return self._runners


class DesignDecode:
    """Context manager: decode ``hm`` with its SSM states under ``designs``.

    ``prefill(ids)`` then ``step(tokens)`` repeatedly; both return fp32 logits of
    shape ``(groups * batch, vocab)``, group 0 the reference.  After each step,
    ``ssm_out_err`` (designs, batch) is the relative error of the SSM outputs
    against the reference rows (mean over layers) and ``state_err`` (designs, batch)
    that of the fresh fp32 state at flush steps (mean over layers; NaN elsewhere).
    ``record`` (decoder-layer indices) keeps the reference rows' raw SSM inputs of
    those layers, per step, in ``recorded``; ``outputs[i]`` is layer i's SSM output
    (all rows, fp32, engine layout) of the last step.  ``backend``: ``"torch"`` (the
    emulation) or ``"triton"`` (the fused kernels) runs the designs' rows; on the
    kernels, the first decode step first compiles the designs' kernels in parallel, once
    per SSM layer shape (``precompile``; it changes no result).
    """

    def __init__(self, hm: HybridModel, designs: Sequence[Design], *, batch: int,
                 ring_dtype: str = "bf16", seed: int = 0, record: Iterable[int] = (),
                 backend: str = "torch", precompile: bool = True):
        self.runner_factory = design_runner_factory(backend)
        self.precompile = precompile and backend == "triton"
        self._precompiled: set[tuple] = set()
        self.hm, self.designs, self.batch = hm, list(designs), int(batch)
        self.groups = 1 + len(self.designs)
        self.rows = self.groups * self.batch
        self.ring_dtype = ring_dtype_of(ring_dtype)
        self.seed = seed
        self.recorded: dict[int, list[dict[str, torch.Tensor]]] = {int(i): [] for i in record}
        unknown = [i for i in self.recorded if i not in hm.mixers]
        if unknown:
            raise ModelError(f"layer {unknown[0]} is not an SSM layer; SSM layers: "
                             f"{', '.join(map(str, hm.ssm_layers))}")
        self.t = -1
        self.cache = None
        params = inspect.signature(hm.model.forward).parameters
        self._cache_kw = next((k for k in CACHE_KWARGS if k in params), "past_key_values")
        self.layers: dict[int, _LayerRun] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self._out: list[list[torch.Tensor]] = []
        self._state: list[list[torch.Tensor]] = []

    # --- hooks ---------------------------------------------------------------
    def __enter__(self) -> DesignDecode:
        for idx, mixer in self.hm.mixers.items():
            mixer.forward = self._wrap(idx, mixer.forward)
        return self

    def __exit__(self, *exc) -> None:
        for mixer in self.hm.mixers.values():
            if "forward" in mixer.__dict__:
                del mixer.forward

    def _wrap(self, idx: int, orig):
        def forward(*args, **kwargs):
            hs = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            cache = next((kwargs[k] for k in CACHE_KWARGS if kwargs.get(k) is not None), None)
            if cache is None and len(args) > 1:
                cache = args[1]
            mask = kwargs.get("attention_mask", args[2] if len(args) > 2 else None)
            if self.t < 0 or hs.shape[1] != 1 or cache is None:
                return orig(*args, **kwargs)
            return self._decode_layer(idx, hs, cache, mask)

        return forward

    def _decode_layer(self, idx: int, hs: torch.Tensor, cache, mask) -> torch.Tensor:
        run = self.layers[idx]
        b = self.batch
        raw, gate = run.adapter.inputs(run.mixer, hs, cache, mask)
        raw32 = {k: v.float() for k, v in raw.items()}
        if idx in self.recorded:
            extra = {k: v.float() for k, v in run.adapter.trace_gate(run.mixer, gate).items()}
            self.recorded[idx].append({k: v[:b].cpu() for k, v in {**raw32, **extra}.items()})
        inp = run.kind.prepare(raw32, run.params32, self.ring_dtype)
        if self.precompile and self.t == 0:
            self._precompile_layer(run, inp, raw32)
        y_ref = run.kind.reference_step_(run.S_ref, rows(inp, slice(0, b)).to(torch.float64),
                                         run.params64)
        ys = [y_ref.float()]
        for g, runner in enumerate(run.runners, start=1):
            sl = slice(g * b, (g + 1) * b)
            y, S_new = runner.step(rows(inp, sl), self.t, {k: v[sl] for k, v in raw32.items()})
            ys.append(y)
            self._out[g - 1].append(rel_l2(y.double() - y_ref, y_ref))
            if S_new is not None:
                self._state[g - 1].append(rel_l2(S_new.double() - run.S_ref, run.S_ref))
        self.outputs[idx] = y_all = torch.cat(ys)
        return run.adapter.output(run.mixer, y_all, gate, hs.dtype)

    def _precompile_layer(self, run: _LayerRun, inp: Any, raw32: dict) -> None:
        """Compile the designs' kernels for ``run``'s layer shape, unless done for
        another layer of the same shape (:func:`kernels.backend.precompile_designs`)."""
        shape = (getattr(run.kind, "name", ""), tuple(run.S_ref.shape))
        if shape in self._precompiled:
            return
        self._precompiled.add(shape)
        from ..kernels.backend import precompile_designs

        sl = slice(self.batch, 2 * self.batch)  # the first design's rows
        precompile_designs(self.designs, run.kind, run.params32, self.batch,
                           run.S_ref.device, self.ring_dtype, self.seed,
                           run.state0.float(), rows(inp, sl),
                           {k: v[sl] for k, v in raw32.items()})

    # --- decoding ------------------------------------------------------------
    def _forward(self, ids: torch.Tensor, **kwargs) -> torch.Tensor:
        out = self.hm.model(input_ids=ids, use_cache=True, **{self._cache_kw: self.cache}, **kwargs)
        return out.logits[:, -1].float()

    @torch.inference_mode()
    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Run the prompt (batch, T) through every row; seed the designs."""
        from transformers import DynamicCache

        if input_ids.dim() != 2 or input_ids.shape[0] != self.batch:
            raise ModelError(f"prompt ids must be (batch={self.batch}, tokens), got "
                             f"{tuple(input_ids.shape)}")
        self.cache = DynamicCache(config=self.hm.model.config)
        self.t = -1
        logits = self._forward(input_ids.to(self.hm.device), logits_to_keep=1)
        # every group starts from the same prefill (state, conv state, KV cache)
        self.cache.reorder_cache(torch.arange(self.batch, device=self.hm.device)
                                 .repeat(self.groups))
        for idx in self.hm.ssm_layers:
            S = recurrent_state(self.cache, idx)
            if S is None:
                raise ModelError(f"layer {idx} kept no recurrent state after the prompt")
            S0 = self.hm.adapter(idx).state_to_engine(S).float().contiguous()
            self.layers[idx] = _LayerRun(idx, self.hm, self.designs, self.batch,
                                         self.ring_dtype, self.seed, S0, self.runner_factory)
        return logits.repeat(self.groups, 1)

    @torch.inference_mode()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed ``tokens`` (batch,) to every group; one decode step."""
        if self.cache is None:
            raise ModelError("call prefill() before step()")
        self.t += 1
        self._out = [[] for _ in self.designs]
        self._state = [[] for _ in self.designs]
        ids = tokens.to(self.hm.device).reshape(1, -1).repeat(self.groups, 1).reshape(-1, 1)
        return self._forward(ids)

    @property
    def ssm_out_err(self) -> torch.Tensor:
        """(designs, batch): SSM output error of this step, mean over layers."""
        return torch.stack([torch.stack(e).mean(0) for e in self._out]).cpu() if self._out \
            else torch.empty(0, self.batch)

    @property
    def state_err(self) -> torch.Tensor:
        """(designs, batch): fresh-state error at a flush step (mean over layers), else NaN."""
        nan = torch.full((self.batch,), float("nan"), dtype=torch.float64)
        return torch.stack([torch.stack(e).mean(0).cpu() if e else nan for e in self._state]) \
            if self._state else torch.empty(0, self.batch)

"""Model-level drift: a whole hybrid model decodes with every SSM layer's state kept
under each (design, format, window), next to a reference whose state is exact, and
the next-token distributions are compared step by step.

The reference decodes greedily; its tokens are teacher-forced into every design so
the steps align (:mod:`precisionlab.models.runtime` says how the designs are
realised).  Returns an ``xarray.Dataset`` over ``design``, ``format``, ``window``,
``step`` that ``precisionlab.plot`` and ``precisionlab gate`` read like a drift
result (``rel_err`` is the relative L2 error of the final logits).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import numpy as np
import torch
import xarray as xr

from precisionlab.engine import BACKENDS, EngineError, resolve_backend
from precisionlab.kinds import ring_dtype_of
from precisionlab.metrics import final_sem, growth_exponent, traffic
from precisionlab.models import HybridModel, ModelError, open_model
from precisionlab.models.loading import dtype_of
from precisionlab.models.prompts import DEFAULT_PROMPT_TOKENS, prompt_ids
from precisionlab.models.runtime import DesignDecode, rel_l2
from precisionlab.models.synthetic import architecture_of

from .drift import (
    DEFAULT_BATCH,
    StudyError,
    _api_call,
    _as_list,
    build_designs,
    design_label,
    device_name,
    note_unflushed,
    read_formats,
    versions,
)

DEFAULT_MODEL_STEPS = 256


class ModelStudyError(StudyError, ModelError):
    """Bad input to a model-level study (both a StudyError and a ModelError)."""


def _step_metrics(ref: torch.Tensor, lp_ref: torch.Tensor, out: torch.Tensor,
                  token: torch.Tensor) -> dict:
    """Per-sequence metrics of logits ``out`` against ``ref`` (both (batch, vocab));
    ``lp_ref`` is the reference's fp64 log-softmax, ``token`` its greedy token."""
    lp = torch.log_softmax(out.double(), dim=-1)
    kl = (lp_ref.exp() * (lp_ref - lp)).sum(-1).clamp_min(0.0)
    dlogp = (lp.gather(-1, token[:, None]) - lp_ref.gather(-1, token[:, None])).abs()[:, 0]
    return {"kl": kl, "top1": (out.argmax(-1) == token).double(), "dlogp": dlogp,
            "rel": rel_l2(out.double() - ref.double(), ref.double())}


def model_drift(
    model: str | os.PathLike | HybridModel,
    formats: str | Sequence[str],
    designs: str | Sequence[str] = ("shared", "split"),
    windows: int | Sequence[int] = (16,),
    checkpoint_format: str | Sequence[str] = "fp32",
    steps: int | None = None,
    batch: int = DEFAULT_BATCH,
    seed: int = 0,
    ring_dtype: str = "bf16",
    device: str = "auto",
    backend: str = "auto",
    layers: int | None = None,
    prompt: str | os.PathLike | None = None,
    dtype: str = "fp32",
    progress: Callable[[int, int], None] | None = None,
    command: str | None = None,
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS,
) -> xr.Dataset:
    """Run the model-level drift study and return its Dataset.

    ``model``: a preset name (synthetic weights, ``layers`` SSM layers, default the
    preset's count), a local checkpoint directory (``layers`` keeps its first N SSM
    layers) or a :class:`~precisionlab.models.HybridModel`.  ``prompt``: None for
    ``prompt_tokens`` seeded token ids per sequence, or a text file tokenized with the
    checkpoint's tokenizer.  ``steps`` decode steps follow the prompt (default 256).
    ``backend``: ``"torch"`` runs the designs in emulation, ``"triton"`` on the fused
    kernels (CUDA only), ``"auto"`` picks the kernels on CUDA (as the layer-level study
    does); the reference is the fp64 torch step either way.

    Per step (dims design, format, window, step; batch means unless stated):
    ``rel_err`` / ``rel_err_max`` (relative L2 error of the logits, mean / max over
    the batch), ``kl`` (KL(reference || design) of the next-token distributions, nats),
    ``top1_agree`` (fraction of sequences whose argmax is the reference token),
    ``dlogp_mean`` / ``dlogp_p95`` (|delta log-prob| of the reference token, mean / 95th
    percentile over the batch), ``ssm_out_rel_err`` (SSM layer outputs against the
    reference model's, mean over layers) and ``state_rel_err`` (fresh fp32 state at
    flush steps against the reference state, mean over layers; NaN elsewhere).
    Per configuration: ``first_divergence`` (first step where a sequence's greedy
    token differs from the reference's, earliest over the batch; NaN if none),
    ``kl_run_mean``, ``top1_run_rate``, ``dlogp_run_mean``, ``dlogp_run_p95`` (over all
    steps and sequences), ``growth`` and ``final_sem`` (as in the drift study, from
    ``rel_err``) and
    ``bytes_per_step`` (modelled memory traffic per state element, as in the drift
    study).
    """
    designs, formats, windows = _as_list(designs), read_formats(formats), _as_list(windows)
    checkpoints = _as_list(checkpoint_format)
    n_steps = DEFAULT_MODEL_STEPS if steps is None else int(steps)
    try:
        if n_steps < 1:
            raise ModelStudyError(f"steps must be positive, got {steps}")
        if batch < 1:
            raise ModelStudyError(f"batch must be positive, got {batch}")
        if layers is not None and int(layers) < 1:
            raise ModelStudyError(f"layers must be a positive number of SSM layers, got {layers}")
        ring_dtype_of(ring_dtype)
        dtype_of(dtype)
        if backend not in BACKENDS:
            raise ModelStudyError(f"unknown backend {backend!r}; choose one of "
                                  f"{', '.join(BACKENDS)}")
        configs = build_designs(designs, formats, windows, checkpoints)
        hm = open_model(model, layers=layers, seed=seed, device=device, dtype=dtype)
        try:
            be = resolve_backend(backend, hm.device)
        except EngineError as exc:
            raise ModelStudyError(str(exc)) from None
        ids, prompt_desc = prompt_ids(hm, prompt, batch=batch, prompt_tokens=prompt_tokens,
                                      seed=seed)
    except ModelStudyError:
        raise
    except (ValueError, KeyError) as exc:
        raise ModelStudyError(str(exc).strip("'\"") if isinstance(exc, KeyError)
                              else str(exc)) from None

    config_labels = [design_label(d, len(checkpoints) > 1) for d in configs]
    labels = list(dict.fromkeys(config_labels))
    shape = (len(labels), len(formats), len(windows), n_steps)
    names = ("rel_err", "rel_err_max", "kl", "top1_agree", "dlogp_mean", "dlogp_p95",
             "ssm_out_rel_err", "state_rel_err")
    arr = {k: np.full(shape, np.nan) for k in names}
    cfg_shape = shape[:-1]
    first_div = np.full((len(configs), batch), np.nan)
    per_sequence = np.full((*shape, batch), np.nan)
    runs: dict[str, list[list[np.ndarray]]] = {k: [[] for _ in configs]
                                               for k in ("kl", "top1", "dlogp")}
    index = [(labels.index(name), formats.index(d.read_format), windows.index(d.window))
             for name, d in zip(config_labels, configs, strict=True)]
    b = batch
    with DesignDecode(hm, configs, batch=b, ring_dtype=ring_dtype, seed=seed,
                      backend=be) as dd:
        logits = dd.prefill(ids)
        token = logits[:b].argmax(-1)
        for t in range(n_steps):
            logits = dd.step(token)
            ref = logits[:b]
            nxt = ref.argmax(-1)
            lp_ref = torch.log_softmax(ref.double(), dim=-1)
            out_err, state_err = dd.ssm_out_err.numpy(), dd.state_err.numpy()
            for j, (a, f, w) in enumerate(index):
                m = {k: v.cpu().numpy() for k, v in
                     _step_metrics(ref, lp_ref, logits[(j + 1) * b:(j + 2) * b], nxt).items()}
                at = (a, f, w, t)
                per_sequence[at] = m["rel"]
                arr["kl"][at] = m["kl"].mean()
                arr["top1_agree"][at] = m["top1"].mean()
                arr["dlogp_mean"][at] = m["dlogp"].mean()
                arr["dlogp_p95"][at] = np.percentile(m["dlogp"], 95)
                arr["ssm_out_rel_err"][at] = out_err[j].mean()
                arr["state_rel_err"][at] = state_err[j].mean()
                new = np.isnan(first_div[j]) & (m["top1"] < 0.5)
                first_div[j][new] = t
                for k in runs:
                    runs[k][j].append(m[k])
            token = nxt
            if progress is not None:
                progress(t + 1, n_steps)

    dims = ("design", "format", "window", "step")
    cdims = dims[:-1]
    long = {
        "rel_err": "relative L2 error of the final logits (batch mean)",
        "rel_err_max": "relative L2 error of the final logits (batch max)",
        "kl": "KL(reference || design) of next-token distributions, nats (batch mean)",
        "top1_agree": "fraction of sequences whose greedy token is the reference's",
        "dlogp_mean": "|delta log-prob| of the reference token (batch mean)",
        "dlogp_p95": "|delta log-prob| of the reference token (batch 95th percentile)",
        "ssm_out_rel_err": "relative L2 error of the SSM layer outputs (mean over layers, batch)",
        "state_rel_err": "relative L2 state error at flush steps (mean over layers, batch)",
    }
    coords = {"design": labels, "format": formats, "window": [int(w) for w in windows],
              "step": np.arange(n_steps)}
    arr["rel_err"], arr["rel_err_max"] = per_sequence.mean(axis=-1), per_sequence.max(axis=-1)
    ds = xr.Dataset({k: (dims, arr[k], {"long_name": long[k]}) for k in names}, coords=coords)

    def per_config(values: list[float], long_name: str) -> xr.DataArray:
        out = np.full(cfg_shape, np.nan)
        for j, (a, f, w) in enumerate(index):
            out[a, f, w] = values[j]
        return xr.DataArray(out, dims=cdims, attrs={"long_name": long_name})

    def flat(k: str, j: int) -> np.ndarray:
        return np.concatenate(runs[k][j])

    first = [float(np.nanmin(r)) if np.isfinite(r).any() else np.nan for r in first_div]
    ds["first_divergence"] = per_config(
        first, "first step where a greedy token differs from the reference's (earliest over "
               "the batch; NaN: never)")
    ds["kl_run_mean"] = per_config([flat("kl", j).mean() for j in range(len(configs))],
                                   "mean KL over all steps and sequences, nats")
    ds["top1_run_rate"] = per_config([flat("top1", j).mean() for j in range(len(configs))],
                                     "top-1 agreement over all steps and sequences")
    ds["dlogp_run_mean"] = per_config([flat("dlogp", j).mean() for j in range(len(configs))],
                                      "mean |delta log-prob| of the reference token, all steps")
    ds["dlogp_run_p95"] = per_config(
        [float(np.percentile(flat("dlogp", j), 95)) for j in range(len(configs))],
        "95th percentile |delta log-prob| of the reference token, all steps")
    ds["growth"] = growth_exponent(ds)
    ds["final_sem"] = final_sem(ds, per_sequence)

    shape0 = hm.layer_shape(hm.ssm_layers[0])
    import transformers

    ds.attrs.update({
        "title": f"precisionlab model drift: {hm.name}",
        "study": "model_drift",
        "level": "model",
        "model": hm.name,
        "kind": hm.kind,
        "architecture": hm.architecture,
        "weights": hm.weights,
        **({"synthetic_dims": architecture_of(hm.preset).note} if hm.preset is not None else {}),
        "trace": f"whole-model decode ({hm.architecture}, {hm.weights})",
        **{f"dim_{k}": v for k, v in shape0.dims().items()},
        "ssm_layers": len(hm.ssm_layers),
        "ssm_layer_indices": ",".join(map(str, hm.ssm_layers)),
        "layers_total": hm.num_layers,
        "hidden_size": int(hm.config.hidden_size),
        "vocab_size": hm.vocab_size,
        "prompt": prompt_desc,
        "prompt_tokens": int(ids.shape[1]),
        "prefill": "exact for every configuration (transformers' chunked scan); designs "
                   "govern the decode steps",
        "reference": "fp64 SSM state on the ring-rounded inputs; greedy tokens teacher-forced "
                     "into every design",
        "rel_err_of": "final logits",
        "seed": seed,
        "batch": batch,
        "steps": n_steps,
        "checkpoint_format": ",".join(checkpoints),
        "ring_dtype": ring_dtype,
        "model_dtype": {torch.float32: "fp32", torch.bfloat16: "bf16"}.get(hm.dtype, str(hm.dtype)),
        "dynamics": "model",
        "backend": be,
        "device": device_name(hm.device),
        **{f"version_{k}": v for k, v in versions().items()},
        "version_transformers": transformers.__version__,
        "command": command or _api_call(
            "studies.model_drift.model_drift",
            model=hm.name if isinstance(model, HybridModel) else str(model),
            formats=formats, designs=designs, windows=windows,
            checkpoint_format=checkpoint_format, steps=steps, batch=batch, seed=seed,
            ring_dtype=ring_dtype, device=device, backend=backend, layers=layers,
            prompt=None if prompt is None else str(prompt), dtype=dtype,
            prompt_tokens=prompt_tokens),
    })
    ds["bytes_per_step"] = traffic(ds)
    note_unflushed(ds, [int(w) for w in windows], n_steps)
    return ds


__all__ = ["model_drift", "ModelStudyError", "DEFAULT_MODEL_STEPS"]

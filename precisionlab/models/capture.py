"""Trace capture: record the per-step SSM inputs of a real decode of a whole model,
one precisionlab trace file per SSM layer.

The model decodes greedily after the prompt with exact SSM state (fp64, inputs not
rounded: the reference path of :mod:`precisionlab.models.runtime`); every chosen
layer's raw step inputs are kept for the reference rows and written with
:func:`precisionlab.traces.save_trace` (schema ``precisionlab.trace/1``), together
with the layer's parameters and its state after the prompt as ``state0``.

File naming: a trace file holds one layer, so layer ``i`` (the decoder-layer
index, as in the model's ``layer_idx``) of ``OUT.safetensors`` is written to
``OUT.L{i}.safetensors``, always (one layer or many), and the trace's ``model``
metadata is ``<model>.L{i}``.  ``precisionlab drift --model OUT.L{i}.safetensors``
replays it.  Mamba-2 traces include the gate ``z`` (the model applies
``norm(y * silu(z))``), so layer-level replays measure the gated output.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from torch import nn

from ..atomic import write_problem
from ..presets import Preset
from ..traces import Trace, TraceError, save_trace
from .adapters import ModelError
from .loading import HybridModel, open_model
from .prompts import DEFAULT_PROMPT_TOKENS, prompt_ids
from .runtime import DesignDecode

DEFAULT_CAPTURE_BATCH = 2


class CaptureError(ModelError, TraceError):
    """Bad input to a trace capture (both a ModelError and a TraceError)."""


class CapturedTrace(Trace):
    """Steps recorded from a model decode (an in-memory :class:`Trace`)."""

    def __init__(self, preset: Preset, steps: list[dict[str, torch.Tensor]],
                 params: dict[str, torch.Tensor], state0: torch.Tensor | None, source: str):
        self.preset = preset
        self.data = steps
        self.steps = len(steps)
        self.batch = int(next(iter(steps[0].values())).shape[0])
        self.params = params
        self.state0 = state0
        self.source = source

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        yield from self.data


def layer_trace_path(out_path: str | os.PathLike, layer: int) -> Path:
    """``dir/name.safetensors`` -> ``dir/name.L{layer}.safetensors``."""
    p = Path(out_path)
    return p.with_name(f"{p.name[: -len('.safetensors')]}.L{int(layer)}.safetensors")


def capture_trace(
    model: str | os.PathLike | HybridModel | nn.Module,
    prompt: str | os.PathLike | None = None,
    steps: int = 256,
    out_path: str | os.PathLike = "trace.safetensors",
    layers: int | Sequence[int] | None = None,
    *,
    batch: int = DEFAULT_CAPTURE_BATCH,
    seed: int = 0,
    device: str = "auto",
    dtype: str = "fp32",
    model_layers: int | None = None,
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS,
) -> list[Path]:
    """Decode ``steps`` tokens and write one trace per chosen SSM layer.

    ``model``: preset (synthetic weights; ``model_layers`` SSM layers), checkpoint
    directory (``model_layers`` keeps its first N SSM layers) or model.  ``prompt``:
    None (seeded token ids) or a text file.  ``layers``: decoder-layer indices of SSM
    layers (default all).  Returns the written paths (see the module docstring).
    """
    out = Path(out_path)
    try:
        if not out.name.endswith(".safetensors") or out.name == ".safetensors":
            raise CaptureError(f"trace files end in .safetensors, got {str(out)!r}")
        problem = write_problem(out, folder_ok=True)  # out names the files
        if problem:
            raise CaptureError(problem)
        if int(steps) < 1:
            raise CaptureError(f"steps must be positive, got {steps}")
        hm = open_model(model, layers=model_layers, seed=seed, device=device, dtype=dtype)
        chosen = hm.ssm_layers if layers is None else (
            [int(layers)] if isinstance(layers, int) else [int(i) for i in layers])
        if not chosen:
            raise CaptureError("choose at least one SSM layer")
        bad = [i for i in chosen if i not in hm.mixers]
        if bad:
            raise CaptureError(f"layer {bad[0]} is not an SSM layer of {hm.name}; SSM layers: "
                               f"{', '.join(map(str, hm.ssm_layers))}")
        ids, prompt_desc = prompt_ids(hm, prompt, batch=batch, prompt_tokens=prompt_tokens,
                                      seed=seed)
    except CaptureError:
        raise
    except (ModelError, ValueError) as exc:
        raise CaptureError(str(exc)) from None

    with DesignDecode(hm, [], batch=batch, ring_dtype="fp32", seed=seed, record=chosen) as dd, \
            torch.inference_mode():
        token = dd.prefill(ids).argmax(-1)
        for _ in range(int(steps)):
            token = dd.step(token).argmax(-1)

    written = []
    for idx in chosen:
        run = dd.layers[idx]
        preset = hm.layer_shape(idx, name=f"{hm.name}.L{idx}")
        source = (f"captured from {hm.weights}, {hm.architecture} decoder layer {idx}: greedy "
                  f"decode of {int(steps)} steps after {prompt_desc}")
        trace = CapturedTrace(preset, dd.recorded[idx],
                              {k: v.cpu() for k, v in run.raw_params.items()},
                              run.state0.cpu(), source)
        written.append(save_trace(trace, layer_trace_path(out, idx)))
    return written

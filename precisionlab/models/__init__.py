"""Whole hybrid models (transformers) for model-level studies.

* :func:`open_model`: a preset built with synthetic weights, a local Hugging Face
  checkpoint directory (offline), or a model in memory -> :class:`HybridModel`.
* :class:`DesignDecode`: decode with every SSM layer's state kept under precision
  designs next to an exact reference (:mod:`precisionlab.models.runtime`).
* :func:`capture_trace`: per-layer SSM input traces from a real decode.

Needs ``transformers>=5`` (the ``models`` extra) when used; importing this package
does not import transformers.
"""

from __future__ import annotations

from .adapters import SUPPORTED_MIXERS, ModelError
from .capture import CaptureError, capture_trace, layer_trace_path
from .loading import (
    SUPPORTED_MODEL_TYPES,
    HybridModel,
    load_checkpoint,
    open_model,
    synthetic_model,
)
from .prompts import prompt_ids
from .runtime import DesignDecode

__all__ = ["CaptureError", "DesignDecode", "HybridModel", "ModelError", "SUPPORTED_MIXERS",
           "SUPPORTED_MODEL_TYPES", "capture_trace", "layer_trace_path", "load_checkpoint",
           "open_model", "prompt_ids", "synthetic_model"]

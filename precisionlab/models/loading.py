"""Open a whole hybrid model: a local Hugging Face checkpoint directory (loaded
offline, ``local_files_only=True``, never downloading), a preset built with
synthetic weights, or a transformers model already in memory."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..presets import PRESETS, Preset, get_preset
from .adapters import MixerAdapter, ModelError, adapter_for, find_ssm_mixers
from .kernel_routes import route_cpu_to_torch

DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16}
SUPPORTED_MODEL_TYPES = {
    "mamba2": "Mamba2ForCausalLM",
    "nemotron_h": "NemotronHForCausalLM",
    "qwen3_next": "Qwen3NextForCausalLM",
    "qwen3_5": "Qwen3_5ForCausalLM",
    "qwen3_5_text": "Qwen3_5ForCausalLM",
    "qwen3_5_moe": "Qwen3_5MoeForCausalLM",
    "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM",
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
MIN_TRANSFORMERS = (5, 17)  # oldest release tested (5.17, 5.24 and 5.25)


def require_transformers():
    """Import transformers (>= 5) or raise a ModelError saying how to install it."""
    try:
        import transformers
    except ImportError:
        raise ModelError("model-level studies need transformers: pip install "
                         "'precisionlab[models]'") from None
    version = tuple(int(p) for p in transformers.__version__.split(".")[:2] if p.isdigit())
    if version < MIN_TRANSFORMERS:
        raise ModelError(f"transformers {transformers.__version__} is too old; model-level "
                         f"studies need transformers>={'.'.join(map(str, MIN_TRANSFORMERS))}")
    return transformers


def dtype_of(name: str) -> torch.dtype:
    """torch dtype of a model dtype name (fp32, bf16)."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ModelError(f"unknown model dtype {name!r}; choose one of "
                         f"{', '.join(DTYPES)}") from None


@dataclass
class HybridModel:
    """A causal LM with SSM layers, ready for model-level studies.

    ``mixers`` maps decoder-layer index to SSM mixer; ``weights`` says where the
    weights come from ("synthetic weights (preset config)" or "checkpoint PATH").
    """

    model: nn.Module
    name: str
    weights: str
    device: torch.device
    dtype: torch.dtype
    path: Path | None = None
    preset: Preset | None = None
    mixers: dict[int, nn.Module] = field(default_factory=dict)
    _tokenizer: Any = None

    def __post_init__(self) -> None:
        if not self.mixers:
            self.mixers = find_ssm_mixers(self.model)
        if not self.mixers:
            raise ModelError(f"{self.architecture} has no supported SSM layer")
        # an installed kernel package (fla, mamba_ssm) cannot take the CPU's tensors
        route_cpu_to_torch(type(m).__module__ for m in self.mixers.values())

    @property
    def architecture(self) -> str:
        return type(self.model).__name__

    @property
    def config(self):
        return self.model.config.get_text_config()

    @property
    def ssm_layers(self) -> list[int]:
        """Decoder-layer indices of the SSM mixers."""
        return list(self.mixers)

    @property
    def kind(self) -> str:
        return self.adapter(self.ssm_layers[0]).kind

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    @property
    def num_layers(self) -> int:
        return int(self.config.num_hidden_layers)

    def adapter(self, idx: int) -> MixerAdapter:
        a = adapter_for(self.mixers[idx])
        assert a is not None
        return a

    def layer_shape(self, idx: int, name: str | None = None) -> Preset:
        """The SSM layer's shape as a :class:`Preset` (for traces and attrs)."""
        return self.adapter(idx).shape(self.mixers[idx], name or self.name, len(self.mixers),
                                       self.weights)

    def tokenizer(self):
        """The checkpoint's tokenizer (loaded offline) or a ModelError."""
        if self._tokenizer is not None:
            return self._tokenizer
        if self.path is None or not any((self.path / f).is_file() for f in TOKENIZER_FILES):
            where = f"checkpoint {self.path}" if self.path else self.weights
            raise ModelError(f"{where} has no tokenizer; use seeded token ids (prompt=None)")
        from transformers import AutoTokenizer

        try:
            self._tokenizer = AutoTokenizer.from_pretrained(str(self.path), local_files_only=True)
        except Exception as exc:  # noqa: BLE001 - any tokenizer failure is one bad-input line
            raise ModelError(f"cannot load the tokenizer of {self.path}: "
                             f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
                             ) from None
        return self._tokenizer


def _truncate_config(config, layers: int) -> None:
    """Keep the decoder layers up to the ``layers``-th SSM layer (and the FFN blocks
    right after it, for Nemotron-H)."""
    text = config.get_text_config()
    if text.model_type == "mamba2":
        if layers > text.num_hidden_layers:
            raise ModelError(f"the checkpoint has {text.num_hidden_layers} SSM layers, "
                             f"fewer than layers={layers}")
        text.num_hidden_layers = layers
        return
    types = list(text.layer_types)
    ssm = [i for i, t in enumerate(types) if t in ("linear_attention", "mamba")]
    if layers > len(ssm):
        raise ModelError(f"the checkpoint has {len(ssm)} SSM layers, fewer than layers={layers}")
    end = ssm[layers - 1] + 1
    if text.model_type == "nemotron_h":
        while end < len(types) and types[end] in ("mlp", "moe"):
            end += 1
        text.layers_block_type = types[:end]
        return
    text.layer_types = types[:end]
    text.num_hidden_layers = end
    if getattr(text, "mlp_only_layers", None):
        text.mlp_only_layers = [i for i in text.mlp_only_layers if i < end]


def load_checkpoint(
    path: str | os.PathLike, *, layers: int | None = None, device: str = "auto",
    dtype: str = "fp32",
) -> HybridModel:
    """Load a local Hugging Face checkpoint directory offline.

    ``layers=N`` keeps the first N SSM layers (and the layers before them); the
    result is then a truncated model, which ``weights`` records.
    """
    require_transformers()
    from transformers import AutoConfig, AutoModelForCausalLM

    from ..engine import EngineError, resolve_device

    path = Path(path)
    if not path.is_dir():
        raise ModelError(f"checkpoint directory not found: {path}")
    if not (path / "config.json").is_file():
        raise ModelError(f"{path} is not a Hugging Face checkpoint (no config.json)")
    try:
        dev = resolve_device(device)
    except EngineError as exc:
        raise ModelError(str(exc)) from None
    tdtype = dtype_of(dtype)
    try:
        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:  # noqa: BLE001
        raise ModelError(f"cannot read {path / 'config.json'}: "
                         f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
                         ) from None
    mtype = config.model_type
    if mtype not in SUPPORTED_MODEL_TYPES:
        archs = ", ".join(getattr(config, "architectures", None) or [mtype])
        raise ModelError(f"unsupported architecture {archs} (model_type {mtype!r}); supported: "
                         f"{', '.join(sorted(set(SUPPORTED_MODEL_TYPES.values())))}")
    if layers is not None:
        if int(layers) < 1:
            raise ModelError(f"layers must be a positive number of SSM layers, got {layers}")
        _truncate_config(config, int(layers))
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(path), config=config, local_files_only=True, dtype=tdtype)
    except Exception as exc:  # noqa: BLE001
        raise ModelError(f"cannot load the checkpoint {path}: "
                         f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
                         ) from None
    model = model.to(dev).eval()
    weights = f"checkpoint {path.resolve()}"
    if layers is not None:
        weights += f" (first {int(layers)} SSM layers)"
    return HybridModel(model, path.resolve().name, weights, dev, tdtype, path=path.resolve())


def synthetic_model(
    preset: str | Preset, *, layers: int | None = None, seed: int = 0, device: str = "auto",
    dtype: str = "fp32",
) -> HybridModel:
    """A preset's model with seeded synthetic weights (see
    :mod:`precisionlab.models.synthetic`)."""
    require_transformers()
    from ..engine import EngineError, resolve_device
    from .synthetic import SYNTHETIC_WEIGHTS, build_model

    try:
        preset = get_preset(preset) if isinstance(preset, str) else preset
    except KeyError as exc:
        raise ModelError(str(exc)) from None
    try:
        dev = resolve_device(device)
    except EngineError as exc:
        raise ModelError(str(exc)) from None
    tdtype = dtype_of(dtype)
    model = build_model(preset, layers, seed).to(device=dev, dtype=tdtype)
    return HybridModel(model, preset.name, SYNTHETIC_WEIGHTS, dev, tdtype, preset=preset)


def open_model(
    model: str | os.PathLike | HybridModel | nn.Module, *, layers: int | None = None,
    seed: int = 0, device: str = "auto", dtype: str = "fp32",
) -> HybridModel:
    """A preset name, a checkpoint directory, a :class:`HybridModel` (returned as is)
    or a transformers causal LM in memory."""
    if isinstance(model, HybridModel):
        return model
    if isinstance(model, nn.Module):
        require_transformers()
        p = next(model.parameters())
        return HybridModel(model.eval(), type(model).__name__,
                           f"in-memory model ({type(model).__name__})", p.device, p.dtype)
    s = str(model)
    if s in PRESETS:
        return synthetic_model(s, layers=layers, seed=seed, device=device, dtype=dtype)
    if Path(s).exists() or os.path.sep in s or s.startswith("."):
        return load_checkpoint(s, layers=layers, device=device, dtype=dtype)
    raise ModelError(f"unknown model {s!r}: give a preset ({', '.join(PRESETS)}) or a local "
                     "checkpoint directory")

"""Whole hybrid models built from a preset's configuration, with synthetic weights.

The SSM layers take the preset's exact shapes (heads, head dims, state dims,
groups).  The other dimensions (hidden size, FFN width, attention heads, vocabulary)
are the public model's where known and plausible otherwise (see
:data:`ARCHITECTURES`); mixture-of-experts FFNs are replaced by dense FFNs of about
the active width (routing is not modelled).  With ``layers=N`` the model has N SSM
layers and ``max(1, round(N * attn / ssm))`` attention layers spread evenly
(attention layer j follows SSM layer ``ceil(j N / n_attn)``), so a cut-down model
keeps the family's mix.  Pure Mamba-2 presets (``mamba2-*``) have no attention.

Weights (seeded): every SSM layer's per-head ``A_log`` / ``dt_bias`` are those of
:class:`precisionlab.traces.SyntheticTrace` with ``dynamics="trained"`` (|A| or
``exp(A_log)`` log-uniform over [1e-3, 1e4], ``dt0`` log-uniform over [1e-3, 0.1]),
seeded per layer; linear layers are N(0, 1/fan_in) so activations keep unit scale;
token embeddings N(0, 1); the LM head is scaled so logits have a standard deviation
of about :data:`LOGIT_STD` (peaked next-token distributions, as in trained models,
rather than near-uniform ones; a tied embedding takes the LM head's scale);
depthwise conv kernels N(0, 1/width), biases zero; norms, routers and rotary
buffers keep transformers' own initialisation (global RNG seeded with ``seed``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..presets import Preset, get_preset
from ..traces import SyntheticTrace
from .adapters import ModelError, adapter_for

LOGIT_STD = 4.0
SYNTHETIC_WEIGHTS = "synthetic weights (preset config)"


@dataclass(frozen=True)
class Architecture:
    """The non-SSM dimensions of a preset's model.

    ``attn_layers`` / ``ffn_layers`` are counts in the full model (whose SSM-layer
    count is the preset's); ``ffn`` is the dense FFN width."""

    family: str  # "nemotron_h" | "mamba2" | "qwen3_5" | "qwen3_next"
    hidden: int
    vocab: int
    ffn: int
    attn_layers: int
    ffn_layers: int
    attn_heads: int = 0
    kv_heads: int = 0
    head_dim: int = 0
    tie_embeddings: bool = False
    note: str = ""


ARCHITECTURES: dict[str, Architecture] = {
    "nemotron-3-nano-4b": Architecture(
        "nemotron_h", 3136, 131072, 12544, 4, 17, 32, 8, 128,
        note="42 layers: 21 Mamba-2, 4 attention, 17 FFN (squared ReLU); FFN width inferred"),
    "nemotron-h-8b": Architecture(
        "nemotron_h", 4096, 131072, 21504, 4, 24, 32, 8, 128,
        note="52 layers: 24 Mamba-2, 4 attention, 24 FFN"),
    "nemotron-3-super-120b": Architecture(
        "nemotron_h", 4096, 131072, 16384, 8, 40, 32, 2, 128,
        note="MoE FFNs replaced by dense FFNs; attention and FFN dims inferred"),
    "qwen3.5-4b": Architecture(
        "qwen3_5", 2560, 248320, 9216, 8, 32, 16, 4, 256, tie_embeddings=True,
        note="32 layers: 3 Gated DeltaNet per full-attention layer"),
    "qwen3-next-80b": Architecture(
        "qwen3_next", 2048, 151936, 5632, 12, 48, 16, 2, 256,
        note="48 layers: 3 Gated DeltaNet per full-attention layer; MoE FFNs replaced by dense "
             "FFNs of the active width"),
    "qwen3.5-122b": Architecture(
        "qwen3_5", 3072, 248320, 9216, 12, 48, 32, 2, 256,
        note="MoE FFNs replaced by dense FFNs; dims inferred"),
    "tiny-mamba2": Architecture("nemotron_h", 64, 512, 128, 1, 3, 4, 2, 16, note="test shape"),
    "tiny-gdn": Architecture("qwen3_5", 64, 512, 128, 1, 3, 4, 2, 16, note="test shape"),
}


def architecture_of(preset: Preset) -> Architecture:
    """The preset's architecture; ``mamba2-*`` and unknown presets get a generic one."""
    if preset.name in ARCHITECTURES:
        return ARCHITECTURES[preset.name]
    if preset.name.startswith("mamba2-") or (preset.kind == "mamba2" and preset.groups == 1):
        hidden = preset.heads * preset.head_dim // 2
        return Architecture("mamba2", hidden, 50288, 0, 0, 0, tie_embeddings=True,
                            note="pure Mamba-2 (expand 2)")
    if preset.kind == "mamba2":
        hidden = preset.heads * preset.head_dim // 2
        return Architecture("nemotron_h", hidden, 131072, 4 * hidden,
                            max(1, preset.ssm_layers // 5), preset.ssm_layers,
                            max(1, hidden // 128), 8, 128,
                            note="generic Nemotron-H-like dims")
    hidden = 2048
    return Architecture("qwen3_5", hidden, 248320, 4 * hidden, max(1, preset.ssm_layers // 3),
                        preset.ssm_layers * 4 // 3, 16, 2, 256, note="generic Qwen3.5-like dims")


def layer_plan(n_ssm: int, n_attn: int) -> list[str]:
    """``"ssm"``/``"attn"`` in order: attention layer j (1-based) follows SSM layer
    ``ceil(j * n_ssm / n_attn)``."""
    after = [math.ceil(j * n_ssm / n_attn) for j in range(1, n_attn + 1)] if n_attn else []
    plan: list[str] = []
    for i in range(1, n_ssm + 1):
        plan.append("ssm")
        plan.extend("attn" for a in after if a == i)
    return plan


def _counts(preset: Preset, arch: Architecture, layers: int | None) -> tuple[int, int, int]:
    """(SSM layers, attention layers, FFN layers) of the model to build."""
    n = preset.ssm_layers if layers is None else int(layers)
    if n < 1:
        raise ModelError(f"layers must be a positive number of SSM layers, got {layers}")
    if arch.family == "mamba2":
        return n, 0, 0
    scale = n / preset.ssm_layers
    n_attn = max(1, round(arch.attn_layers * scale))
    n_ffn = min(n + n_attn, max(1, round(arch.ffn_layers * scale)))
    return n, n_attn, n_ffn


def _nemotron_types(plan: list[str], n_ffn: int) -> list[str]:
    """Nemotron-H block list: each mixer block, followed by an FFN block for ``n_ffn``
    of them spread evenly."""
    mixers = len(plan)
    with_ffn = {math.ceil((j + 1) * mixers / n_ffn) - 1 for j in range(n_ffn)} if n_ffn else set()
    out: list[str] = []
    for i, p in enumerate(plan):
        out.append("linear_attention" if p == "ssm" else "full_attention")
        if i in with_ffn:
            out.append("mlp")
    return out


def build_config(preset: Preset | str, layers: int | None = None):
    """A transformers config of the preset's family with its SSM shapes."""
    import transformers

    preset = get_preset(preset) if isinstance(preset, str) else preset
    arch = architecture_of(preset)
    n, n_attn, n_ffn = _counts(preset, arch, layers)
    plan = layer_plan(n, n_attn)
    p = preset
    if arch.family == "mamba2":
        if p.heads * p.head_dim != 2 * arch.hidden:
            raise ModelError(f"{p.name}: heads x headdim must be twice the hidden size")
        return transformers.Mamba2Config(
            vocab_size=arch.vocab, hidden_size=arch.hidden, num_heads=p.heads, head_dim=p.head_dim,
            state_size=p.state_dim, n_groups=p.groups, num_hidden_layers=n, expand=2,
            tie_word_embeddings=arch.tie_embeddings)
    if arch.family == "nemotron_h":
        return transformers.NemotronHConfig(
            vocab_size=arch.vocab, hidden_size=arch.hidden,
            layers_block_type=_nemotron_types(plan, n_ffn), mamba_num_heads=p.heads,
            mamba_head_dim=p.head_dim, ssm_state_size=p.state_dim, n_groups=p.groups,
            num_attention_heads=arch.attn_heads, num_key_value_heads=arch.kv_heads,
            head_dim=arch.head_dim, intermediate_size=arch.ffn,
            tie_word_embeddings=arch.tie_embeddings)
    types = ["linear_attention" if x == "ssm" else "full_attention" for x in plan]
    common = dict(
        vocab_size=arch.vocab, hidden_size=arch.hidden, num_hidden_layers=len(types),
        layer_types=types, num_attention_heads=arch.attn_heads, num_key_value_heads=arch.kv_heads,
        head_dim=arch.head_dim, intermediate_size=arch.ffn, linear_num_key_heads=p.groups,
        linear_num_value_heads=p.heads, linear_key_head_dim=p.state_dim,
        linear_value_head_dim=p.head_dim, tie_word_embeddings=arch.tie_embeddings)
    if arch.family == "qwen3_next":
        return transformers.Qwen3NextConfig(mlp_only_layers=list(range(len(types))), **common)
    from transformers.models.qwen3_5 import Qwen3_5TextConfig

    return Qwen3_5TextConfig(**common)


def _model_class(config):
    import transformers

    if config.model_type == "qwen3_5_text":
        from transformers.models.qwen3_5 import Qwen3_5ForCausalLM

        return Qwen3_5ForCausalLM
    return {"mamba2": transformers.Mamba2ForCausalLM,
            "nemotron_h": transformers.NemotronHForCausalLM,
            "qwen3_next": transformers.Qwen3NextForCausalLM}[config.model_type]


@torch.no_grad()
def init_weights_(model: nn.Module, preset: Preset, seed: int = 0) -> None:
    """Overwrite ``model``'s linear, embedding, conv and SSM weights with seeded
    trained-like values (module docstring); each is flagged ``_is_hf_initialized`` so
    transformers' own initialisation leaves it alone."""
    gen = torch.Generator().manual_seed(seed)

    def set_(p: torch.Tensor, value: torch.Tensor | float) -> None:
        if isinstance(value, torch.Tensor):
            p.copy_(value)
        else:
            p.fill_(value)
        p._is_hf_initialized = True

    def normal_(p: torch.Tensor, std: float) -> None:
        p.normal_(0.0, std, generator=gen)
        p._is_hf_initialized = True

    ssm_count = 0
    out_emb = model.get_output_embeddings()
    in_emb = model.get_input_embeddings()
    tied = out_emb is not None and out_emb.weight is in_emb.weight
    for module in model.modules():
        adapter = adapter_for(module)
        if adapter is not None:
            ssm_count += 1
            layer_seed = seed * 1009 + int(module.layer_idx)
            params = SyntheticTrace(preset, steps=1, batch=1, seed=layer_seed,
                                    dynamics="trained").params
            if adapter.kind == "mamba2":
                set_(module.A_log, torch.log(-params["A"]).float())
                set_(module.D, 1.0)
            else:
                set_(module.A_log, params["A_log"].float())
            set_(module.dt_bias, params["dt_bias"].float())
            normal_(module.conv1d.weight, module.conv1d.weight.shape[-1] ** -0.5)
            if module.conv1d.bias is not None:
                set_(module.conv1d.bias, 0.0)
        if isinstance(module, nn.Linear) and module is not out_emb:
            normal_(module.weight, module.weight.shape[1] ** -0.5)
            if module.bias is not None:
                set_(module.bias, 0.0)
    if tied:
        normal_(in_emb.weight, LOGIT_STD * in_emb.weight.shape[1] ** -0.5)
    else:
        normal_(in_emb.weight, 1.0)
        if out_emb is not None:
            normal_(out_emb.weight, LOGIT_STD * out_emb.weight.shape[1] ** -0.5)
    if ssm_count == 0:
        raise ModelError(f"{preset.name}: the built model has no SSM layer")


def build_model(preset: Preset | str, layers: int | None = None, seed: int = 0) -> nn.Module:
    """The preset's model (fp32, CPU, eval mode) with seeded synthetic weights.

    Built without torch's default initialisation; :func:`init_weights_` sets the
    large weights, then transformers initialises the rest (norms, rotary buffers,
    routers) from the global RNG seeded with ``seed``."""
    from transformers.initialization import no_init_weights

    preset = get_preset(preset) if isinstance(preset, str) else preset
    config = build_config(preset, layers)
    torch_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        with no_init_weights():
            model = _model_class(config)(config)
        model.tie_weights()
        init_weights_(model, preset, seed)
        with torch.no_grad():
            for p in model.parameters():
                if not getattr(p, "_is_hf_initialized", False):
                    p.fill_(float("nan"))
        model.init_weights()
    finally:
        torch.random.set_rng_state(torch_state)
    bad = [n for n, p in model.named_parameters() if not bool(torch.isfinite(p).all())]
    if bad:
        raise ModelError(f"{preset.name}: parameter {bad[0]} was left uninitialised")
    return model.eval()

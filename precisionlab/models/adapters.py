"""Adapters between transformers' SSM mixers and precisionlab's layer kinds.

An adapter splits one mixer's single-token decode step into three parts:

* ``inputs``: the mixer's own projections and causal-conv update (the conv state in
  the transformers cache is advanced in place, with the modeling module's own
  ``causal_conv1d_update``) giving the SSM step inputs in the trace schema of
  :mod:`precisionlab.traces` (Mamba-2: ``x``, ``dt_raw``, ``B``, ``C``; GDN: ``q``,
  ``k``, ``v``, ``a``, ``b``) plus the gate the mixer applies afterwards;
* the recurrence itself, which the caller runs (precisionlab's engine);
* ``output``: the mixer's gated norm and output projection applied to the SSM
  output ``y`` (Mamba-2 ``(batch, heads, headdim)``, GDN ``(batch, v_heads, V)``).

Each step mirrors the torch path of the transformers mixer's ``forward`` (checked
by the tests against transformers' own decode); the mixer's weights and modules
are used as they are.  Supported mixers: ``Mamba2Mixer`` (Mamba2ForCausalLM),
``NemotronHMamba2Mixer`` (NemotronHForCausalLM), ``Qwen3NextGatedDeltaNet``
(Qwen3NextForCausalLM), ``Qwen3_5GatedDeltaNet`` and ``Qwen3_5MoeGatedDeltaNet``
(Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM).
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch import nn

from ..presets import Preset


class ModelError(ValueError):
    """A model that cannot be loaded, built or run (one-line message)."""


def _apply_mask(t: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """transformers' ``apply_mask_to_padding_states`` for a (batch, seq) 0/1 mask."""
    if mask is None or mask.dim() != 2 or mask.shape[:2] != t.shape[:2]:
        return t
    return (t * mask[:, :, None]).to(t.dtype)


def _conv_update(mixer: nn.Module, xbc: torch.Tensor, state: torch.Tensor,
                 cache: Any) -> torch.Tensor:
    """One causal-conv step (``xbc`` is (batch, channels, 1)); updates ``state`` in
    place.  Uses the modeling module's ``causal_conv1d_update`` (the function the
    mixer itself calls, including an installed fused kernel).  Where the modeling
    module's own decode step counts the token in the cache (transformers 5.25 and
    later: ``causal_conv1d_forward``), this one does too, or the model's next
    positions would lag."""
    module = sys.modules.get(type(mixer).__module__)
    fn = getattr(module, "causal_conv1d_update", None)
    if fn is None:
        raise ModelError(f"{type(mixer).__module__} has no causal_conv1d_update; "
                         "this transformers version is not supported")
    weight = mixer.conv1d.weight.squeeze(1)
    out = fn(xbc, state, weight, mixer.conv1d.bias, activation=mixer.activation)
    if hasattr(module, "causal_conv1d_forward") and hasattr(cache, "increase_count"):
        cache.increase_count(mixer.layer_idx, 0)
    return out


def conv_state(cache: Any, layer_idx: int) -> torch.Tensor | None:
    """The layer's conv state in a transformers cache (5.x APIs before and after
    ``Cache.get_conv_state``)."""
    get = getattr(cache, "get_conv_state", None)
    if get is not None:
        return get(layer_idx)
    return cache.layers[layer_idx].conv_states[0]


def recurrent_state(cache: Any, layer_idx: int) -> torch.Tensor | None:
    """The layer's recurrent (SSM) state in a transformers cache."""
    get = getattr(cache, "get_recurrent_state", None)
    if get is not None:
        return get(layer_idx)
    return cache.layers[layer_idx].recurrent_states[0]


class MixerAdapter:
    """Base adapter: one per family of transformers mixers."""

    kind = ""
    mixers: tuple[str, ...] = ()

    def shape(self, mixer: nn.Module, name: str, ssm_layers: int, source: str) -> Preset:
        raise NotImplementedError

    def params(self, mixer: nn.Module) -> dict[str, torch.Tensor]:
        """Per-head parameters in the trace schema, as float64."""
        raise NotImplementedError

    def inputs(
        self, mixer: nn.Module, hidden_states: torch.Tensor, cache: Any, mask: torch.Tensor | None
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Decode-step SSM inputs (trace schema, model dtype) and the gate."""
        raise NotImplementedError

    def output(self, mixer: nn.Module, y: torch.Tensor, gate: torch.Tensor,
               dtype: torch.dtype) -> torch.Tensor:
        """Mixer output (batch, 1, hidden) from the SSM output ``y`` and the gate."""
        raise NotImplementedError

    def trace_gate(self, mixer: nn.Module, gate: torch.Tensor) -> dict[str, torch.Tensor]:
        """Extra trace inputs from the gate (Mamba-2's ``z``); none for GDN."""
        return {}

    def state_to_engine(self, S: torch.Tensor) -> torch.Tensor:
        """Cache layout -> engine layout (batch, heads, head_dim, state_dim)."""
        return S

    def state_from_engine(self, S: torch.Tensor) -> torch.Tensor:
        return S


class Mamba2Adapter(MixerAdapter):
    """Mamba2Mixer / NemotronHMamba2Mixer: the gate ``z`` enters the grouped gated
    RMSNorm after the scan (``norm(y * silu(z))``), so the engine runs without ``z``
    and captured traces store it as the optional ``z`` input."""

    kind = "mamba2"
    mixers = ("Mamba2Mixer", "NemotronHMamba2Mixer")

    def shape(self, mixer, name, ssm_layers, source):
        return Preset(name, "mamba2", int(mixer.num_heads), int(mixer.head_dim),
                      int(mixer.ssm_state_size), int(mixer.n_groups), ssm_layers, source)

    def params(self, mixer):
        return {"A": -torch.exp(mixer.A_log.detach().float()).double(),
                "D": mixer.D.detach().double(),
                "dt_bias": mixer.dt_bias.detach().double()}

    def inputs(self, mixer, hidden_states, cache, mask):
        b = hidden_states.shape[0]
        H, P, N, G = mixer.num_heads, mixer.head_dim, mixer.ssm_state_size, mixer.n_groups
        proj = mixer.in_proj(_apply_mask(hidden_states, mask))
        gate, xbc, dt = proj.split([mixer.intermediate_size, mixer.conv_dim, H], dim=-1)
        state = conv_state(cache, mixer.layer_idx)
        xbc = _conv_update(mixer, xbc.transpose(1, 2), state, cache).transpose(1, 2)
        xbc = _apply_mask(xbc, mask)
        x, B, C = torch.split(xbc, [mixer.intermediate_size, G * N, G * N], dim=-1)
        raw = {"x": x.reshape(b, H, P), "dt_raw": dt.reshape(b, H),
               "B": B.reshape(b, G, N), "C": C.reshape(b, G, N)}
        return raw, gate

    def output(self, mixer, y, gate, dtype):
        scan = y.reshape(y.shape[0], 1, -1).to(dtype)
        return mixer.out_proj(mixer.norm(scan, gate).to(dtype))

    def trace_gate(self, mixer, gate):
        return {"z": gate.reshape(gate.shape[0], mixer.num_heads, mixer.head_dim)}


class GDNAdapter(MixerAdapter):
    """Qwen3.5 / Qwen3-Next Gated DeltaNet.  transformers keeps the state as
    (batch, v_heads, K, V); the engine as (batch, v_heads, V, K)."""

    kind = "gdn"
    mixers = ("Qwen3_5GatedDeltaNet", "Qwen3_5MoeGatedDeltaNet")

    def shape(self, mixer, name, ssm_layers, source):
        return Preset(name, "gdn", int(mixer.num_v_heads), int(mixer.head_v_dim),
                      int(mixer.head_k_dim), int(mixer.num_k_heads), ssm_layers, source)

    def params(self, mixer):
        return {"A_log": mixer.A_log.detach().double(), "dt_bias": mixer.dt_bias.detach().double()}

    def _projections(self, mixer, hs):
        """(mixed qkv (b, 1, conv_dim), z (b, 1, value_dim), b, a (b, 1, v_heads))."""
        return (mixer.in_proj_qkv(hs), mixer.in_proj_z(hs), mixer.in_proj_b(hs),
                mixer.in_proj_a(hs))

    def inputs(self, mixer, hidden_states, cache, mask):
        bsz = hidden_states.shape[0]
        qkv, z, b, a = self._projections(mixer, _apply_mask(hidden_states, mask))
        state = conv_state(cache, mixer.layer_idx)
        qkv = _conv_update(mixer, qkv.transpose(1, 2), state, cache).transpose(1, 2)
        q, k, v = torch.split(qkv, [mixer.key_dim, mixer.key_dim, mixer.value_dim], dim=-1)
        Hk, K, Hv, V = mixer.num_k_heads, mixer.head_k_dim, mixer.num_v_heads, mixer.head_v_dim
        raw = {"q": q.reshape(bsz, Hk, K), "k": k.reshape(bsz, Hk, K), "v": v.reshape(bsz, Hv, V),
               "a": a.reshape(bsz, Hv), "b": b.reshape(bsz, Hv)}
        return raw, z

    def output(self, mixer, y, gate, dtype):
        bsz, V = y.shape[0], mixer.head_v_dim
        core = mixer.norm(y.to(dtype).reshape(-1, V), gate.reshape(-1, V))
        return mixer.out_proj(core.reshape(bsz, 1, -1))

    def state_to_engine(self, S):
        return S.transpose(-1, -2)

    def state_from_engine(self, S):
        return S.transpose(-1, -2)


class Qwen3NextAdapter(GDNAdapter):
    """Qwen3-Next: fused ``in_proj_qkvz`` / ``in_proj_ba`` projections, re-ordered by the
    mixer's own ``fix_query_key_value_ordering``."""

    mixers = ("Qwen3NextGatedDeltaNet",)

    def _projections(self, mixer, hs):
        q, k, v, z, b, a = mixer.fix_query_key_value_ordering(mixer.in_proj_qkvz(hs),
                                                               mixer.in_proj_ba(hs))
        bsz, seq = hs.shape[:2]
        qkv = torch.cat([t.reshape(bsz, seq, -1) for t in (q, k, v)], dim=-1)
        return qkv, z, b, a


ADAPTERS: tuple[MixerAdapter, ...] = (Mamba2Adapter(), GDNAdapter(), Qwen3NextAdapter())
_BY_CLASS = {name: a for a in ADAPTERS for name in a.mixers}
SUPPORTED_MIXERS = tuple(_BY_CLASS)


def adapter_for(module: nn.Module) -> MixerAdapter | None:
    """The adapter of a supported SSM mixer module, else None."""
    return _BY_CLASS.get(type(module).__name__)


def find_ssm_mixers(model: nn.Module) -> dict[int, nn.Module]:
    """Decoder-layer index -> SSM mixer module, for every supported mixer in ``model``."""
    found: dict[int, nn.Module] = {}
    for module in model.modules():
        if adapter_for(module) is not None:
            idx = getattr(module, "layer_idx", None)
            if idx is None:
                raise ModelError(f"{type(module).__name__} has no layer_idx; cannot map its cache")
            found[int(idx)] = module
    return dict(sorted(found.items()))

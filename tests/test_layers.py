"""Replay and flush reproduce the conventional recurrence (both layer kinds)."""

from __future__ import annotations

import pytest
import torch

from precisionlab.kinds import kind_for
from precisionlab.presets import get_preset
from precisionlab.traces import SyntheticTrace


def _replay_vs_conventional(model: str, window: int, dtype: torch.dtype, steps: int, seed: int):
    trace = SyntheticTrace(model, steps=steps, batch=2, seed=seed, dynamics="init")
    kind = kind_for(trace.preset)
    params = kind.params({k: v.to(dtype) for k, v in trace.params.items()})
    S_conv = torch.zeros(kind.state_shape(2), dtype=dtype)
    S_ckpt = S_conv.clone()
    ring = kind.new_ring(2, window, dtype, torch.device("cpu"))
    worst_out, worst_state = 0.0, 0.0
    for raw in trace:
        inp = kind.prepare(raw, params.to(torch.float32), torch.float32).to(dtype)
        S_conv, y_conv = kind.conventional_step(S_conv, inp, params)
        if ring.count + 1 < window:
            y = kind.replay(S_ckpt, ring, inp, params)
        else:
            S_ckpt = kind.flush(S_ckpt, ring, inp, params)
            ring.reset()
            y = kind.read_output(S_ckpt, inp, params)
            worst_state = max(worst_state, float((S_ckpt - S_conv).norm() / S_conv.norm()))
        worst_out = max(worst_out, float((y - y_conv).norm() / y_conv.norm()))
    return worst_out, worst_state


@pytest.mark.parametrize("model", ["tiny-mamba2", "tiny-gdn"])
@pytest.mark.parametrize("window", [1, 2, 5, 16, 64])
def test_replay_matches_conventional_fp64(model, window):
    out, state = _replay_vs_conventional(model, window, torch.float64, steps=200, seed=window)
    assert out <= 1e-12
    assert state <= 1e-12


@pytest.mark.parametrize("model", ["tiny-mamba2", "tiny-gdn"])
@pytest.mark.parametrize("window", [1, 5, 16, 64])
def test_replay_matches_conventional_fp32(model, window):
    out, state = _replay_vs_conventional(model, window, torch.float32, steps=200, seed=7)
    assert out <= 1e-5
    assert state <= 1e-5


def test_replay_detects_a_wrong_ring():
    """The comparison above is sensitive: dropping one ring entry breaks it."""
    trace = SyntheticTrace("tiny-mamba2", steps=6, batch=1, seed=1)
    kind = kind_for(trace.preset)
    params = kind.params({k: v.double() for k, v in trace.params.items()})
    S = torch.zeros(kind.state_shape(1), dtype=torch.float64)
    ring = kind.new_ring(1, 8, torch.float64, torch.device("cpu"))
    for raw in trace:
        inp = kind.prepare(raw, params.to(torch.float32), torch.float32).to(torch.float64)
        S, y_conv = kind.conventional_step(S, inp, params)
        y = kind.replay(torch.zeros_like(S), ring, inp, params)
    ring.fields["x"][:, 0] = 0
    from precisionlab.layers import mamba2

    y_bad = mamba2.replay_output(torch.zeros_like(S), *ring.view("x", "B", "dt"), inp, params)
    assert float((y - y_conv).norm() / y_conv.norm()) < 1e-12
    assert float((y_bad - y_conv).norm() / y_conv.norm()) > 1e-6


@pytest.mark.parametrize("model", ["nemotron-3-nano-4b", "qwen3.5-4b"])
def test_real_shapes_replay_fp32(model):
    """One window at a real preset's shape (batch 1) still matches in fp32."""
    preset = get_preset(model)
    assert preset.state_elements > 500_000
    out, _ = _replay_vs_conventional(model, 8, torch.float32, steps=10, seed=3)
    assert out <= 1e-5

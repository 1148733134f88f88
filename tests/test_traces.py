"""Traces: synthetic streams, safetensors round trip, clear errors."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from precisionlab.presets import PRESETS, get_preset
from precisionlab.traces import SavedTrace, SyntheticTrace, TraceError, open_trace, save_trace


def test_synthetic_is_seeded_and_streamed():
    a = list(SyntheticTrace("tiny-mamba2", steps=5, batch=2, seed=3))
    b = list(SyntheticTrace("tiny-mamba2", steps=5, batch=2, seed=3))
    c = list(SyntheticTrace("tiny-mamba2", steps=5, batch=2, seed=4))
    assert len(a) == 5 and a[0]["x"].shape == (2, 4, 8) and a[0]["B"].shape == (2, 2, 32)
    assert all(torch.equal(x["x"], y["x"]) for x, y in zip(a, b, strict=False))
    assert not torch.equal(a[1]["x"], c[1]["x"])


def test_synthetic_inputs_are_autocorrelated():
    steps = list(SyntheticTrace("tiny-gdn", steps=400, batch=4, seed=0, rho=0.9))
    v = torch.stack([s["v"] for s in steps]).flatten(1)
    lag1 = float((v[1:] * v[:-1]).mean() / (v * v).mean())
    assert 0.8 < lag1 < 0.97


def test_trained_dynamics_have_near_accumulator_heads():
    trained = SyntheticTrace("nemotron-3-nano-4b", steps=1, seed=0).params["A"].abs()
    init = SyntheticTrace("nemotron-3-nano-4b", steps=1, seed=0, dynamics="init").params["A"].abs()
    assert float(trained.min()) < 1e-2 and float(trained.max()) > 1e2
    assert float(init.min()) >= 1.0 and float(init.max()) <= 16.0


@pytest.mark.parametrize("model", ["tiny-mamba2", "tiny-gdn"])
def test_save_and_load_round_trip(tmp_path, model):
    trace = SyntheticTrace(model, steps=7, batch=2, seed=1)
    path = save_trace(trace, tmp_path / "t.safetensors")
    loaded = open_trace(str(path))
    assert isinstance(loaded, SavedTrace)
    assert loaded.steps == 7 and loaded.batch == 2 and loaded.kind == trace.kind
    assert loaded.preset.state_shape == trace.preset.state_shape
    for a, b in zip(trace, loaded, strict=False):
        for k in a:
            torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)
    assert not list(tmp_path.glob(".*tmp"))


def test_bad_trace_files(tmp_path):
    with pytest.raises(TraceError, match="not found"):
        SavedTrace(tmp_path / "missing.safetensors")
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a safetensors file")
    with pytest.raises(TraceError, match="not a readable"):
        SavedTrace(junk)
    other = tmp_path / "other.safetensors"
    save_file({"a": torch.zeros(2)}, str(other))
    with pytest.raises(TraceError, match="not a precisionlab trace"):
        SavedTrace(other)
    good = save_trace(SyntheticTrace("tiny-mamba2", steps=3, batch=1), tmp_path / "g.safetensors")
    from safetensors.torch import load_file
    tensors = load_file(str(good))
    tensors["x"] = tensors["x"][:, :, :2].contiguous()
    with open(good, "rb") as fh:
        import json
        meta = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))["__metadata__"]
    bad = tmp_path / "bad.safetensors"
    save_file(tensors, str(bad), metadata=meta)
    with pytest.raises(TraceError, match="has shape"):
        SavedTrace(bad)


def test_presets_cover_the_required_models():
    required = ["nemotron-3-nano-4b", "nemotron-h-8b", "nemotron-3-super-120b", "qwen3.5-4b",
                "qwen3-next-80b", "qwen3.5-122b", "mamba2-130m", "mamba2-370m", "mamba2-2.7b",
                "tiny-mamba2", "tiny-gdn"]
    assert all(r in PRESETS for r in required)
    nano = get_preset("nemotron-3-nano-4b")
    assert nano.state_shape == (96, 80, 128) and nano.groups == 8 and nano.ssm_layers == 21
    assert get_preset("qwen3.5-122b").confidence == "low"
    with pytest.raises(KeyError, match="known presets"):
        get_preset("gpt-5")


def test_bad_synthetic_settings():
    with pytest.raises(TraceError, match="dynamics"):
        SyntheticTrace("tiny-gdn", steps=2, dynamics="wild")
    with pytest.raises(TraceError, match="positive"):
        SyntheticTrace("tiny-gdn", steps=0)

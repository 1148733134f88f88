"""Designs follow DESIGN.md §1 exactly: shared, split, windows, seeds."""

from __future__ import annotations

import pytest
import torch

from precisionlab import engine, formats
from precisionlab.designs import (
    DesignError,
    TorchDesignGroup,
    TorchDesignRunner,
    make_design,
    shared,
    split,
    store_state,
)
from precisionlab.kinds import kind_for, ring_dtype_of
from precisionlab.traces import SyntheticTrace

CPU = torch.device("cpu")


def _setup(model="tiny-mamba2", steps=64, batch=2, seed=0):
    trace = SyntheticTrace(model, steps=steps, batch=batch, seed=seed)
    kind = kind_for(trace.preset)
    params = kind.params({k: v.float() for k, v in trace.params.items()})
    return trace, kind, params


@pytest.mark.parametrize("model", ["tiny-mamba2", "tiny-gdn"])
@pytest.mark.parametrize("fmt", ["fp8-e4m3", "nvfp4", "bf16-sr"])
def test_shared_window_1_is_conventional_decode_with_state_in_format(model, fmt):
    trace, kind, params = _setup(model)
    F = formats.get(fmt)
    runner = TorchDesignRunner(shared(fmt, 1), kind, params, 2, CPU, torch.float32, seed=5)
    for t, raw in enumerate(trace):
        inp = kind.prepare(raw, params, torch.float32)
        S_new, y_conv = kind.conventional_step(runner.ckpt, inp, params)
        y, fresh = runner.step(inp, t)
        assert fresh is not None
        torch.testing.assert_close(y, y_conv, rtol=1e-5, atol=1e-6)
        # the stored copy is the format's rounding of the conventional update; the fold
        # may differ from it in the last fp32 bit, which can flip a rare rounding tie
        expected = F.quantize(S_new, seed=5, step=t)
        off = ~torch.isclose(runner.ckpt, expected, rtol=1e-5, atol=1e-7)
        assert float(off.float().mean()) < 1e-3
        assert not torch.equal(expected, S_new)  # the format really rounds


@pytest.mark.parametrize("model", ["tiny-mamba2", "tiny-gdn"])
def test_split_recursion_never_sees_the_read_copy(model):
    """split(fp32 -> F) carries exactly the fp32 recursion: its fresh states equal
    those of shared(fp32), whatever F is; only outputs differ."""
    trace, kind, params = _setup(model, steps=48)
    exact = TorchDesignRunner(shared("fp32", 8), kind, params, 2, CPU, torch.float32)
    lossy = TorchDesignRunner(split("fp32", "nvfp4", 8), kind, params, 2, CPU, torch.float32)
    differs = False
    for t, raw in enumerate(trace):
        inp = kind.prepare(raw, params, torch.float32)
        y_a, s_a = exact.step(inp, t)
        y_b, s_b = lossy.step(inp, t)
        if s_a is None:
            differs |= not torch.allclose(y_a, y_b, rtol=1e-4)
        elif model == "tiny-mamba2":
            torch.testing.assert_close(s_b, s_a, rtol=0, atol=0)
        else:  # GDN's flush recomputes d from the checkpoint: equal to fp32 rounding
            torch.testing.assert_close(s_b, s_a, rtol=1e-5, atol=1e-6)
    assert differs, "the nvfp4 read copy should change output-step outputs"


@pytest.mark.parametrize("model", ["tiny-mamba2", "tiny-gdn"])
def test_a_design_group_is_its_designs_run_one_by_one(model):
    """The engine batches designs of one window into a group: every design's outputs,
    fresh states and stored copies must be those of its own runner, bit for bit."""
    trace, kind, params = _setup(model, steps=20, batch=3)
    designs = [shared("fp8-e4m3", 4), split("fp16-sr", "nvfp4", 4), split("fp32", "mxfp4", 4)]
    S0 = torch.randn(kind.state_shape(3))
    group = TorchDesignGroup(designs, kind, params, 3, CPU, torch.bfloat16, seed=3, state0=S0)
    alone = [TorchDesignRunner(d, kind, params, 3, CPU, torch.bfloat16, seed=3, state0=S0)
             for d in designs]
    flushes = 0
    for t, raw in enumerate(trace):
        inp = kind.prepare(raw, params, torch.bfloat16)
        y, fresh = group.step(inp, t)
        for g, runner in enumerate(alone):
            y_g, fresh_g = runner.step(inp, t)
            assert torch.equal(y[g], y_g)
            assert (fresh is None) == (fresh_g is None)
            if fresh is not None:
                assert torch.equal(fresh[g], fresh_g)
                assert torch.equal(group.read[3 * g:3 * g + 3], runner.read)
                assert torch.equal(group.ckpt[3 * g:3 * g + 3], runner.ckpt)
        flushes += fresh is not None
    assert flushes == 5
    with pytest.raises(DesignError, match="one window"):
        TorchDesignGroup([shared("fp32", 4), shared("fp32", 8)], kind, params, 3, CPU,
                         torch.bfloat16)


def test_engine_keeps_the_callers_design_order_across_windows():
    """Designs of different windows run in different groups; metrics come back in
    the order the caller gave, equal to running each design on its own."""
    trace = SyntheticTrace("tiny-gdn", steps=24, batch=2, seed=4)
    designs = [shared("fp8-e4m3", 4), shared("nvfp4", 1), split("fp32", "fp8-e4m3", 4),
               shared("bf16-sr", 6)]
    together = torch.stack([m.rel_err for m in engine.run(trace, designs, device="cpu")])
    for i, d in enumerate(designs):
        alone = torch.stack([m.rel_err[0] for m in engine.run(trace, [d], device="cpu")])
        assert torch.equal(together[:, i], alone)


def test_shared_lossy_error_grows_but_split_stays_bounded():
    trace = SyntheticTrace("tiny-mamba2", steps=1024, batch=4, seed=2)
    designs = [shared("fp8-e4m3", 16), split("fp32", "fp8-e4m3", 16)]
    errs = torch.stack([m.rel_err.mean(1) for m in engine.run(trace, designs, device="cpu")])
    early, late = errs[32:128].mean(0), errs[-96:].mean(0)
    assert late[1] < 0.5 * late[0]  # split well below shared at the end
    assert late[1] < 2.0 * early[1]  # split bounded


def test_stochastic_rounding_is_seeded():
    trace, kind, params = _setup(steps=32)
    def run(seed):
        r = TorchDesignRunner(shared("fp16-sr", 4), kind, params, 2, CPU, torch.float32, seed)
        for t, raw in enumerate(trace):
            r.step(kind.prepare(raw, params, torch.float32), t)
        return r.ckpt
    assert torch.equal(run(1), run(1))
    assert not torch.equal(run(1), run(2))


def test_ring_dtype_rounds_ring_entries():
    trace, kind, params = _setup(steps=3)
    r = TorchDesignRunner(shared("fp32", 8), kind, params, 2, CPU, ring_dtype_of("bf16"))
    for t, raw in enumerate(trace):
        r.step(kind.prepare(raw, params, torch.bfloat16), t)
    assert r.ring.fields["x"].dtype == torch.bfloat16
    assert r.ring.fields["dt"].dtype == torch.float32
    with pytest.raises(ValueError, match="ring dtype"):
        ring_dtype_of("fp8")


@pytest.mark.parametrize(
    "args, match",
    [(("bogus", "fp8-e4m3", 16), "unknown design"), (("shared", "fp8-e4m3", 0), "window"),
     (("shared", "fp7", 16), "unknown format")],
)
def test_bad_designs_are_rejected(args, match):
    with pytest.raises((DesignError, KeyError), match=match):
        make_design(*args)


def test_engine_metrics_shapes_and_flush_steps():
    trace = SyntheticTrace("tiny-gdn", steps=20, batch=3)
    designs = [shared("fp32", 4), split("fp32", "fp8-e4m3", 5)]
    out = list(engine.run(trace, designs, device="cpu", ring_dtype="fp32"))
    assert len(out) == 20
    assert out[0].rel_err.shape == (2, 3) and out[0].abs_err_max.shape == (2,)
    flush0 = [m.step for m in out if not torch.isnan(m.state_rel_err[0]).any()]
    flush1 = [m.step for m in out if not torch.isnan(m.state_rel_err[1]).any()]
    assert flush0 == [3, 7, 11, 15, 19] and flush1 == [4, 9, 14, 19]
    assert max(float(m.rel_err[0].max()) for m in out) < 1e-5


def test_engine_rejects_bad_settings():
    trace = SyntheticTrace("tiny-gdn", steps=2)
    with pytest.raises(engine.EngineError, match="unknown device"):
        list(engine.run(trace, [shared("fp32", 1)], device="tpu"))
    with pytest.raises(engine.EngineError, match="needs a CUDA device"):
        list(engine.run(trace, [shared("fp32", 1)], device="cpu", backend="triton"))


def test_a_split_read_copy_encodes_the_stored_checkpoint() -> None:
    """The read copy is the read format's encoding (seed + 1) of the checkpoint's stored
    values, not of the fresh state: the same thing for an fp32 checkpoint, and for a
    stochastically rounded bf16 one a copy that differs from encoding the fresh state at
    the elements the checkpoint's rounding moves across a rounding boundary."""
    S = torch.randn(4, 8, 64, 128, generator=torch.Generator().manual_seed(3))
    for ck in ("fp32", "bf16-sr"):
        for rd in ("nvfp4", "fp8-e4m3"):
            ckpt, read = store_state(split(ck, rd, 4), S, seed=5, t=7)
            stored = formats.get(ck).quantize(S, seed=5, step=7)
            assert torch.equal(ckpt, stored)
            assert torch.equal(read, formats.get(rd).quantize(stored, seed=6, step=7))
            direct = formats.get(rd).quantize(S, seed=6, step=7)
            assert torch.equal(read, direct) == (ck == "fp32"), (ck, rd)


@pytest.mark.parametrize(("design", "matrix", "expected"), [
    (shared("fp32", 1), None, 8.0),                      # conventional decoding
    (shared("fp32", 16), None, 4 + 4 / 16),              # DESIGN: replay fp32
    (split("fp32", "fp8-e4m3", 16), None, (15 * 1 + 4 + 4 + 1) / 16 + 4 / 128),  # + row scale
    (split("fp16-sr", "nvfp4", 16), None, 0.5625 + 4 / 16 + 4 / (128 * 128)),
    (split("fp16-sr", "nvfp4", 16), (80, 128), 0.5625 + 4 / 16 + 4 / (80 * 128)),
    (shared("bf16-sr", 4), None, 2 * 5 / 4),
    (split("fp32", "mxfp4", 1), None, 0.5 + 1 / 32 + 8),  # every step a flush
])
def test_bytes_per_step_follows_the_performance_model(design, matrix, expected):
    assert design.bytes_per_step(matrix) == pytest.approx(expected, rel=1e-12)


def test_bytes_per_step_falls_with_the_window_and_the_read_format():
    assert shared("fp32", 1).bytes_per_step() == engine_conventional_bytes()
    by_window = [split("fp32", "fp8-e4m3", w).bytes_per_step() for w in (1, 4, 16, 64)]
    assert by_window == sorted(by_window, reverse=True)
    by_format = [split("fp32", f, 16).bytes_per_step() for f in ("fp32", "bf16", "fp8-e4m3",
                                                                   "nvfp4")]
    assert by_format == sorted(by_format, reverse=True)


def engine_conventional_bytes() -> float:
    from precisionlab.designs import CONVENTIONAL_FP32_BYTES

    return CONVENTIONAL_FP32_BYTES

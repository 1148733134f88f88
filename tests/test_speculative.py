"""Speculative decoding: accepted drafts give exactly plain decoding's outputs."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from precisionlab.designs import TorchDesignRunner, shared, split
from precisionlab.kinds import kind_for
from precisionlab.speculative import SpeculativeDecoder, acceptance_lengths
from precisionlab.traces import SyntheticTrace

BATCH = 3


def _select(mask: torch.Tensor, a, b):
    """Per-sequence choice between two prepared inputs."""
    out = {}
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if x is None:
            out[f.name] = None
            continue
        m = mask.view(-1, *[1] * (x.dim() - 1))
        out[f.name] = torch.where(m, x, y)
    return type(a)(**out)


def _gather(steps, pos: torch.Tensor):
    """Input k of each sequence b taken from step pos[b]."""
    first = steps[0]
    out = {}
    for f in dataclasses.fields(first):
        vals = [getattr(steps[int(p)], f.name) for p in pos]
        out[f.name] = None if vals[0] is None else torch.stack([v[b] for b, v in enumerate(vals)])
    return type(first)(**out)


@pytest.mark.parametrize("model", ["tiny-mamba2", "tiny-gdn"])
@pytest.mark.parametrize("make", [lambda: shared("fp32", 8), lambda: split("fp32", "fp32", 8)])
@pytest.mark.parametrize("drafts, p", [(4, 0.6), (2, 0.9), (8, 0.3)])
def test_accepted_outputs_equal_plain_decoding(model, make, drafts, p):
    design = make()
    trace = SyntheticTrace(model, steps=160, batch=BATCH, seed=1)
    kind = kind_for(trace.preset)
    p32 = kind.params({k: v.float() for k, v in trace.params.items()})
    p64 = kind.params({k: v.double() for k, v in trace.params.items()})
    steps = [kind.prepare(r, p32, torch.float32) for r in trace]
    S = torch.zeros(kind.state_shape(BATCH), dtype=torch.float64)
    plain = []
    for inp in steps:
        S, y = kind.conventional_step(S, inp.to(torch.float64), p64)
        plain.append(y)
    junk = iter(SyntheticTrace(model, steps=10_000, batch=BATCH, seed=99))
    dec = SpeculativeDecoder(design, kind, p32, BATCH, torch.device("cpu"), torch.float32)
    gen = torch.Generator().manual_seed(0)
    pos = torch.zeros(BATCH, dtype=torch.long)
    worst, checked = 0.0, 0
    while int(pos.max()) + drafts < len(steps):
        n = acceptance_lengths(BATCH, drafts, p, gen)
        batch_drafts = [
            _select(k < n, _gather(steps, pos + k), kind.prepare(next(junk), p32, torch.float32))
            for k in range(drafts)
        ]
        outs = dec.verify(batch_drafts)
        for k in range(drafts):
            for b in range(BATCH):
                if k < int(n[b]):
                    ref = plain[int(pos[b]) + k][b]
                    worst = max(worst, float((outs[k][b].double() - ref).norm() / ref.norm()))
                    checked += 1
        dec.commit(n)
        pos += n
    assert checked > 100
    assert worst <= 1e-5
    assert dec.flushes > 0


@pytest.mark.parametrize("model", ["tiny-mamba2", "tiny-gdn"])
def test_flush_rounds_stochastically_as_plain_decoding(model):
    """A verify flush rounds with the step of the last token it folds, per sequence,
    so with every draft accepted the stochastically rounded checkpoint is the one
    plain decoding stores at the same token (the kernels use the same step)."""
    trace = SyntheticTrace(model, steps=24, batch=2, seed=5)
    kind = kind_for(trace.preset)
    p32 = kind.params({k: v.float() for k, v in trace.params.items()})
    steps = [kind.prepare(r, p32, torch.float32) for r in trace]
    design, T, cpu = shared("fp16-sr", 4), 2, torch.device("cpu")
    plain = TorchDesignRunner(design, kind, p32, 2, cpu, torch.float32, seed=7)
    spec = SpeculativeDecoder(design, kind, p32, 2, cpu, torch.float32, seed=7)
    stored = {}
    for t, inp in enumerate(steps):
        if plain.step(inp, t)[1] is not None:
            stored[t] = plain.ckpt.clone()
    compared = 0
    for first in range(0, len(steps) - T + 1, T):
        flushes = spec.flushes
        spec.verify(steps[first:first + T])
        if spec.flushes > flushes:  # folded tokens 0 .. first - 1
            ref = stored[first - 1]
            differ = (spec.ckpt != ref).float().mean()
            assert float(differ) < 1e-3, f"flush after token {first - 1}: {float(differ):.3f}"
            compared += 1
        spec.commit(torch.full((2,), T))
    assert compared >= 4


def test_rejected_drafts_would_be_visible():
    """Committing a rejected draft changes later outputs (the test above can fail)."""
    trace = SyntheticTrace("tiny-mamba2", steps=4, batch=1, seed=1)
    kind = kind_for(trace.preset)
    p32 = kind.params({k: v.float() for k, v in trace.params.items()})
    steps = [kind.prepare(r, p32, torch.float32) for r in trace]
    outs = []
    for accept_bad in (False, True):
        dec = SpeculativeDecoder(shared("fp32", 8), kind, p32, 1, torch.device("cpu"),
                                 torch.float32)
        dec.verify([steps[0], steps[1]])
        dec.commit(torch.tensor([2 if accept_bad else 1]))
        outs.append(dec.verify([steps[2]])[0])
    assert not torch.allclose(outs[0], outs[1])


def test_acceptance_lengths_are_seeded_and_bounded():
    a = acceptance_lengths(1000, 4, 0.5, torch.Generator().manual_seed(3))
    b = acceptance_lengths(1000, 4, 0.5, torch.Generator().manual_seed(3))
    assert torch.equal(a, b)
    assert int(a.min()) >= 1 and int(a.max()) <= 4
    assert abs(float(a.float().mean()) - 1.875) < 0.1  # 1 + .5 + .25 + .125


def test_draft_longer_than_window_is_rejected():
    trace = SyntheticTrace("tiny-gdn", steps=1)
    kind = kind_for(trace.preset)
    p32 = kind.params({k: v.float() for k, v in trace.params.items()})
    dec = SpeculativeDecoder(shared("fp32", 2), kind, p32, 1, torch.device("cpu"), torch.float32)
    inp = kind.prepare(next(iter(trace)), p32, torch.float32)
    with pytest.raises(ValueError, match="draft length"):
        dec.verify([inp, inp, inp])

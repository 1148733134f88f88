"""The drift study through the fused Triton kernels (``backend="triton"``) gives the
Dataset the torch emulation gives, for both layer kinds (needs a CUDA GPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from precisionlab.studies import drift

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="the triton backend needs a CUDA GPU")


@pytest.mark.parametrize("model", ["nemotron-3-nano-4b", "qwen3.5-4b"])
@pytest.mark.parametrize("checkpoint", ["fp32", "fp16-sr"])
def test_drift_dataset_is_the_same_on_both_backends(model: str, checkpoint: str) -> None:
    kwargs = dict(windows=[1, 8], checkpoint_format=checkpoint, steps=40, batch=2,
                  device="cuda", seed=3)
    a = drift(model, ["fp8-e4m3", "nvfp4"], backend="torch", **kwargs)
    b = drift(model, ["fp8-e4m3", "nvfp4"], backend="triton", **kwargs)
    assert a["rel_err"].dims == b["rel_err"].dims
    assert a.attrs["backend"] == "torch" and b.attrs["backend"] == "triton"
    ra, rb = a["rel_err"].values, b["rel_err"].values
    assert np.isfinite(ra).all() and np.isfinite(rb).all()
    # The kernels' outputs agree with the torch engine's to ~1e-5 relative (tensor-core
    # flush products, other summation orders), which moves an error by at most about
    # that much: fp32-floor errors (flush steps, window 1 with an fp32 checkpoint) may
    # differ by several times, so those are compared absolutely.  A stochastically
    # rounded checkpoint can take another rounding where the fp32 states differ by an
    # ulp, so lossy errors are compared to a few percent.
    np.testing.assert_allclose(rb, ra, rtol=5e-2, atol=5e-5)
    sa, sb = a["state_rel_err"].values, b["state_rel_err"].values
    assert (np.isnan(sa) == np.isnan(sb)).all()
    np.testing.assert_allclose(sb[~np.isnan(sb)], sa[~np.isnan(sa)], rtol=5e-2, atol=5e-5)
    assert (ra > 1e-3).any(), "the study should contain lossy configurations"

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
    # same stored bits up to fp32 reassociation of the sums: errors agree closely
    np.testing.assert_allclose(rb, ra, rtol=2e-2, atol=1e-7)
    sa, sb = a["state_rel_err"].values, b["state_rel_err"].values
    assert (np.isnan(sa) == np.isnan(sb)).all()
    np.testing.assert_allclose(sb[~np.isnan(sb)], sa[~np.isnan(sa)], rtol=2e-2, atol=1e-7)

"""The drift study through the fused Triton kernels (``backend="triton"``) gives the
Dataset the torch emulation gives, for both layer kinds (needs a CUDA GPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from precisionlab.studies import drift

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(),
                               reason="the triton backend needs a CUDA GPU")


@needs_gpu
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


@pytest.mark.parametrize("model", ["nemotron-3-nano-4b", "qwen3.5-4b"])
def test_a_read_copy_beside_an_nvfp4_checkpoint_runs_in_torch(model: str) -> None:
    """The kernels keep no read copy beside an nvfp4 checkpoint (the copy encodes the
    checkpoint's values, whose scale needs the whole matrix): the caches refuse it, and
    the triton backend runs such a design in torch emulation with a warning."""
    from precisionlab.designs import TorchDesignRunner, split
    from precisionlab.kernels.backend import make_triton_runner
    from precisionlab.kernels.gdn_decode import GDNReplayCache
    from precisionlab.kernels.mamba2_step import Mamba2Cache
    from precisionlab.kinds import kind_for
    from precisionlab.presets import get_preset
    from precisionlab.traces import SyntheticTrace

    with pytest.raises(ValueError, match="no read copy beside an nvfp4 checkpoint"):
        GDNReplayCache(1, 1, 1, 16, 16, window=2, checkpoint="nvfp4", read="fp8-e4m3")
    with pytest.raises(ValueError, match="no read copy beside an nvfp4 checkpoint"):
        Mamba2Cache.allocate(1, 1, 16, 16, 1, checkpoint_format="nvfp4",
                             read_format="mxfp4", window=2)
    kind = kind_for(get_preset(model))
    params = kind.params(SyntheticTrace(get_preset(model), steps=1, batch=1, seed=0).params)
    with pytest.warns(UserWarning, match="no read copy beside an nvfp4 checkpoint"):
        runner = make_triton_runner(split("nvfp4", "fp8-e4m3", 4), kind, params, 1,
                                    torch.device("cpu"), torch.bfloat16)
    assert type(runner) is TorchDesignRunner

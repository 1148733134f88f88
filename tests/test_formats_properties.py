"""Property tests (hypothesis) that hold for every format whatever the data:
sign symmetry, power-of-two scale equivariance, idempotence where the format
guarantees it, and error bounds."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from precisionlab.formats import get

NAMES = ["bf16", "fp16", "bf16-sr", "fp16-sr", "fp8-e4m3", "fp8-e5m2", "mxfp8", "nvfp4", "mxfp4"]
SETTINGS = settings(max_examples=25, deadline=None, derandomize=True, database=None)

# moderate magnitudes: no overflow, no fp32 subnormals after scaling by 2**±8
finite = st.floats(-1e6, 1e6, width=32, allow_nan=False, allow_subnormal=False)
tensors = arrays(np.float32, st.tuples(st.integers(1, 3), st.just(64)), elements=finite).map(
    lambda a: torch.from_numpy(np.where(np.abs(a) < 1e-20, 0, a).astype(np.float32))
)


@pytest.mark.parametrize("name", NAMES)
@SETTINGS
@given(x=tensors, j=st.integers(-8, 8))
def test_sign_symmetry_and_power_of_two_equivariance(name, x, j):
    f = get(name)
    q = f.quantize(x, seed=3)
    assert torch.equal(f.quantize(-x, seed=3), -q)
    if name not in ("bf16-sr", "fp16-sr", "fp16"):  # fp16 has a fixed exponent range
        assert torch.equal(f.quantize(x * 2.0**j, seed=3), q * 2.0**j)


@pytest.mark.parametrize("name", ["bf16", "fp16", "mxfp8", "mxfp4", "bf16-sr", "fp16-sr"])
@SETTINGS
@given(x=tensors)
def test_idempotent(name, x):
    f = get(name)
    q = f.quantize(x, seed=1)
    assert torch.equal(f.quantize(q, seed=2), q)


# error bound: half an ulp (a full ulp for stochastic rounding) of the element
# format, relative to the value (IEEE formats, plus an absolute term for fp16
# subnormals) or to the block amax the scale covers (scaled formats)
REL = {"bf16": 2**-8, "fp16": 2**-11, "bf16-sr": 2**-7, "fp16-sr": 2**-10}
BLOCK_REL = {"fp8-e4m3": 2**-4, "fp8-e5m2": 2**-3, "mxfp8": 2**-3, "mxfp4": 2**-1}


@pytest.mark.parametrize("name", NAMES)
@SETTINGS
@given(x=tensors)
def test_error_bounds(name, x):
    if name.startswith("fp16"):
        x = x.clamp(-60000, 60000)  # inside fp16's range
    q = get(name).quantize(x, seed=5)
    err = (q - x).abs()
    if name in REL:
        assert (err <= REL[name] * x.abs() + 2.0**-24).all()
    elif name == "nvfp4":  # E2M1 half-ulp at the top, e4m3 scale rounding, 2**-9 floor
        amax = x.abs().reshape(-1, 16).amax(-1, keepdim=True)
        g = x.abs().amax() / 2688
        assert (err.reshape(-1, 16) <= 0.25 * amax + 2.0**-8 * g).all()
    else:
        block = {"mxfp8": 32, "mxfp4": 32}.get(name, 64)
        amax = x.abs().reshape(-1, block).amax(-1, keepdim=True)
        assert (err.reshape(-1, block) <= BLOCK_REL[name] * amax * 1.0001).all()

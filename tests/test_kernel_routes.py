"""A transformers function bound to an installed kernel package takes transformers'
torch path on CPU tensors once routed (precisionlab.models.kernel_routes), built with
transformers' own fallback decorator and a stand-in package that only takes GPU
tensors, as fla's kernels do."""

from __future__ import annotations

import sys
import types

import pytest
import torch

pytest.importorskip("transformers")
from transformers.integrations.hub_kernels import (  # noqa: E402
    use_kernel_func_from_hub_with_fallback,
)

from precisionlab.models.kernel_routes import (  # noqa: E402
    ROUTED_ATTR,
    package_bound_torch_function,
    route_cpu_to_torch,
)

PACKAGE = "precisionlab_test_gpu_only_kernels"
MODELING = "precisionlab_test_modeling"


@pytest.fixture
def modeling(monkeypatch):
    """A modeling module whose ``torch_scale`` transformers bound to the package's
    ``scale`` (which refuses CPU tensors, records each call's device), beside a
    function whose package is not installed and a plain one."""
    calls: list[str] = []
    pkg = types.ModuleType(PACKAGE)

    def scale(x, w=1.0, cu_seqlens=None):
        calls.append(x.device.type)
        if x.device.type == "cpu":
            raise ValueError("Pointer argument (at 0) cannot be accessed (cpu tensor?)")
        return x * w

    pkg.scale = scale
    monkeypatch.setitem(sys.modules, PACKAGE, pkg)
    mod = types.ModuleType(MODELING)
    monkeypatch.setitem(sys.modules, MODELING, mod)

    def torch_scale(x, w=1.0):
        return x * w + 0.5  # tells the torch path from the package's

    def torch_only(x):
        return x

    mod.torch_scale = use_kernel_func_from_hub_with_fallback("scale", PACKAGE)(torch_scale)
    mod.torch_only = use_kernel_func_from_hub_with_fallback(
        "scale", "precisionlab_test_no_such_package")(torch_only)
    mod.plain = torch_only
    return mod, calls


def test_cpu_calls_take_the_torch_path_once_routed(modeling):
    mod, calls = modeling
    x = torch.ones(3)
    with pytest.raises(ValueError, match="cpu tensor"):  # what a CPU model met before
        mod.torch_scale(x, w=2.0)
    assert route_cpu_to_torch([MODELING, "precisionlab_test_not_imported"]) == [
        f"{MODELING}.torch_scale"]
    assert torch.equal(mod.torch_scale(x, w=2.0), torch.full((3,), 2.5))
    # keywords the torch function does not take are dropped, as transformers drops them
    assert torch.equal(mod.torch_scale(x, 2.0, use_qk_l2norm_in_kernel=True),
                       torch.full((3,), 2.5))
    assert calls == ["cpu"]  # only the call before routing reached the package


def test_other_devices_and_packed_sequences_stay_with_the_package(modeling):
    mod, calls = modeling
    route_cpu_to_torch([MODELING])
    y = mod.torch_scale(torch.ones(3, device="meta"), w=2.0)
    assert y.device.type == "meta" and calls == ["meta"]
    with pytest.raises(ValueError, match="cpu tensor"):
        mod.torch_scale(torch.ones(3), cu_seqlens=torch.tensor([0, 3]))
    assert calls == ["meta", "cpu"]


def test_routing_is_idempotent_and_leaves_other_functions(modeling):
    mod, _ = modeling
    before = dict(vars(mod))
    route_cpu_to_torch([MODELING])
    routed = mod.torch_scale
    assert getattr(routed, ROUTED_ATTR) is before["torch_scale"]
    assert route_cpu_to_torch([MODELING]) == []
    assert mod.torch_scale is routed
    assert mod.torch_only is before["torch_only"] and mod.plain is before["plain"]
    assert package_bound_torch_function(before["torch_only"]) is None
    assert package_bound_torch_function(routed) is None

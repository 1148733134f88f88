"""The bandwidth probes (``kernels.bandwidth``) against their torch references, on
small shapes (the interpreter without a GPU)."""

import pytest
import torch

from precisionlab.kernels.testing import kernel_device


@pytest.mark.parametrize("numel", [1, 300, 512, 1000])
def test_copy_probe_copies_every_element(numel):
    from precisionlab.kernels.bandwidth import copy_launch

    dev = kernel_device()
    src = torch.randn(numel, device=dev)
    dst = torch.full_like(src, float("nan"))
    copy_launch(src, dst, block=64, iters=2)
    assert torch.equal(dst, src)


@pytest.mark.parametrize("numel", [1, 300, 512, 1000])
def test_read_probe_sums_each_span(numel):
    from precisionlab.kernels.bandwidth import programs, read_launch

    dev = kernel_device()
    src = torch.randn(numel, device=dev)
    n_prog = programs(numel, block=64, iters=2)
    part = torch.full((n_prog,), float("nan"), device=dev)
    read_launch(src, part, block=64, iters=2)
    padded = torch.zeros(n_prog * 128, device=dev)
    padded[:numel] = src
    want = padded.view(n_prog, 128).sum(dim=1)
    torch.testing.assert_close(part, want, rtol=1e-5, atol=1e-5)


def test_layer_count_check_shared_by_the_paired_study():
    from precisionlab.studies.paired import PairedError, check_paired

    for bad in (0, -1, True, 1.5, "2"):
        with pytest.raises(PairedError, match="layers must be an integer >= 1"):
            check_paired("qwen3.5-4b", None, 256, 16, 4, layers=bad)
    assert check_paired("qwen3.5-4b", None, 256, 16, 4, layers=3)[0] == "gdn"

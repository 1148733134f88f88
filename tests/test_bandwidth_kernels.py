"""The bandwidth probes (``kernels.bandwidth``) against their torch references, on
small shapes (the interpreter without a GPU), and the test suite's interpreter shims
(``kernels.testing.skip_repatching_device_calls``, ``cache_interpreter_types``)."""

import pytest
import torch
import triton
import triton.language as tl

from precisionlab.kernels.testing import kernel_device


@triton.jit
def _twice(x):
    return x * 2.0


@triton.jit
def _doublings_then_cumsum(x_ptr, y_ptr, N: tl.constexpr, REPS: tl.constexpr):
    x = tl.load(x_ptr + tl.arange(0, N))
    for _ in tl.static_range(REPS):
        x = _twice(x)
    tl.store(y_ptr + tl.arange(0, N), tl.cumsum(x, axis=0))


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


def test_device_calls_skip_only_redundant_repatching(monkeypatch):
    """Under the interpreter (Triton 3.6.0) a launch patches the language once per module
    set: a helper called many times from the kernel patches nothing again, Triton's own
    helper that sees ``core`` still gets it patched, and the results are right."""
    from triton.runtime import interpreter as itp

    from precisionlab.kernels.testing import skip_repatching_device_calls

    if kernel_device() != "cpu" or triton.__version__ != "3.6.0":
        pytest.skip("the interpreter shim applies to Triton 3.6.0's interpreter only")
    skip_repatching_device_calls()  # installed by conftest; a second call is a no-op
    assert itp._skips_device_repatch is True
    assert skip_repatching_device_calls() is False

    scans = []
    original = itp._patch_builtin
    monkeypatch.setattr(itp, "_patch_builtin",
                        lambda pkg, *a: (scans.append(pkg), original(pkg, *a))[1])
    x = torch.arange(8, dtype=torch.float32)
    counts = {}
    for reps in (0, 4, 0):
        y = torch.empty(8)
        scans.clear()
        _doublings_then_cumsum[(1,)](x, y, N=8, REPS=reps)
        assert torch.equal(y, torch.cumsum(x * 2.0**reps, dim=0))
        counts[reps] = scans.count(tl.tensor)  # the tensor class: once per patching
    # the launch patched, and cumsum (which sees core) patched too; the four calls of
    # the helper patched nothing more
    assert counts[4] == counts[0] >= 2


def test_interpreter_type_caches_keep_every_answer():
    """Under the interpreter (Triton 3.6.0) the cached numpy types equal the
    interpreter's own for scalars, blocks, pointers and blocks of pointers, asked twice;
    a tuple type's name is formatted as Triton formats it, and can still be set; block
    types of one shape share their shape tuples, which equal Triton's, and bad shapes
    are still refused; a tensor's shape and numel are its block type's, as constexprs."""
    from triton.language import core
    from triton.runtime import interpreter as itp

    from precisionlab.kernels.testing import cache_interpreter_types

    if kernel_device() != "cpu" or triton.__version__ != "3.6.0":
        pytest.skip("the interpreter shim applies to Triton 3.6.0's interpreter only")
    cache_interpreter_types()  # installed by conftest; a second call is a no-op
    assert itp._caches_types is True
    assert cache_interpreter_types() is False
    scalars = [tl.int1, tl.int8, tl.uint8, tl.int16, tl.uint16, tl.int32, tl.uint32,
               tl.int64, tl.uint64, tl.float16, tl.bfloat16, tl.float32, tl.float64,
               tl.float8e4nv, tl.float8e5]
    types = scalars + [core.block_type(t, [4, 2]) for t in scalars]
    types += [core.pointer_type(tl.float32), core.block_type(core.pointer_type(tl.int8), [8])]
    uncached = itp._get_np_dtype.__wrapped__
    for _ in range(2):
        assert [itp._get_np_dtype(t) for t in types] == [uncached(t) for t in types]
    with pytest.raises(KeyError):
        itp._get_np_dtype(tl.void)
    ty = core.tuple_type([tl.float32, core.constexpr_type(3)], ["a", "b"])
    assert ty.name == str(ty) == "[a:fp32,b:constexpr_type[3]]"
    assert str(core.tuple_type([tl.int32])) == "[:int32]"
    ty.name = "renamed"
    assert str(ty) == "renamed"
    a = core.block_type(tl.float32, [4, core.constexpr(2)])
    b = core.block_type(tl.int8, core.tuple([4, 2]))
    assert a.shape is b.shape and list(a.shape) == [4, 2] and a.numel == b.numel == 8
    assert a.name == str(a) == "<['4', '2'], fp32>" and a.get_block_shapes() == a.shape
    assert a != b and a == core.block_type(tl.float32, [4, 2])
    with pytest.raises(TypeError, match="0d block_type"):
        core.block_type(tl.float32, [])
    with pytest.raises(ValueError, match="power of 2"):
        core.block_type(tl.float32, [3])
    t = core.tensor(None, a)
    assert [type(d) for d in t.shape] == [core.constexpr] * 2
    assert [d.value for d in t.shape] == [4, 2] and t.numel.value == 8 and t.dtype == tl.float32
    scalar = core.tensor(None, tl.float32)
    assert len(scalar.shape) == 0 and scalar.numel.value == 1

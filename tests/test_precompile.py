"""A triton-backend run compiles its kernels in parallel first
(``precisionlab.kernels.precompile``), and that changes nothing it measures."""

from __future__ import annotations

import sys
from contextlib import contextmanager

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from precisionlab import engine
from precisionlab.kernels import precompile as pc
from precisionlab.studies import drift

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(),
                               reason="the triton backend needs a CUDA GPU")


@triton.jit
def _add_one(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    m = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=m) + 1.0, mask=m)


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("processes", [True, False], ids=["processes", "threads"])
def test_a_launch_inside_compile_only_runs_nothing_and_the_kernel_is_then_ready(
        processes: bool, monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(triton.knobs.cache, "dir", str(tmp_path))  # an empty disk cache
    compiled: list[str] = []
    monkeypatch.setattr(triton.knobs.runtime, "jit_post_compile_hook",
                        lambda *a, **k: compiled.append("x"))
    block = 8 if processes else 16  # a variant not compiled before in this process
    x = torch.zeros(8, device=_device())
    with pc.compile_only(workers=2, processes=processes) as report:
        _add_one[(1,)](x, 8, BLOCK=block)
    if pc.INTERPRETED.value:  # nothing to compile: the launch ran
        assert x.tolist() == [1.0] * 8
        return
    assert x.tolist() == [0.0] * 8, "a launch inside compile_only must not run"
    if processes:
        assert (report.kernels, report.in_workers, report.on_disk, report.worker_errors) == (
            1, 1, 0, [])
    n = len(compiled)
    _add_one[(1,)](x, 8, BLOCK=block)
    assert x.tolist() == [1.0] * 8
    assert len(compiled) == n == 1, "the launch after compile_only compiled again"


@pytest.mark.parametrize("processes", [True, False], ids=["processes", "threads"])
def test_compile_only_puts_the_launch_back_after_an_error(processes: bool) -> None:
    from triton.runtime.jit import JITFunction

    run, hook = JITFunction.run, triton.knobs.runtime.jit_cache_hook
    with pytest.raises(RuntimeError, match="boom"):
        with pc.compile_only(workers=1, processes=processes):
            raise RuntimeError("boom")
    assert JITFunction.run is run
    assert triton.knobs.runtime.jit_cache_hook is hook


def _double(x):
    return x * 2.0


_DOUBLE = None  # the Triton function of ``_double``, set by the test that uses it


def _doubling_kernel(x_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, _DOUBLE(tl.load(x_ptr + offs)))


def test_a_launch_in_the_walk_settles_its_kernels_cache_key_first(monkeypatch) -> None:
    """On threads or in workers, a kernel is compiled under a key that does not depend
    on what the process hashed before (``compile_worker.settle_cache_keys``)."""
    from triton.runtime.jit import JITFunction

    from precisionlab.kernels import compile_worker as cw

    helper = JITFunction(_double)  # real Triton functions, also under the interpreter
    monkeypatch.setattr(sys.modules[__name__], "_DOUBLE", helper)
    kernel = JITFunction(_doubling_kernel)
    launched: list[tuple[object, bool]] = []
    monkeypatch.setattr(JITFunction, "run", lambda fn, *a, grid, warmup, **k:
                        launched.append((fn, warmup)))
    with pc._launches_compile_only():
        JITFunction.run(kernel, grid=(1,), warmup=False)
    assert launched == [(kernel, True)], "a launch in the walk only requests a compile"
    assert cw._SETTLED.get(id(kernel)) is kernel and cw._SETTLED.get(id(helper)) is helper
    assert kernel.hash is not None and helper.hash is not None


def test_workers_follow_the_cores(monkeypatch) -> None:
    monkeypatch.delenv(pc.WORKERS_ENV, raising=False)
    monkeypatch.setattr(pc, "available_cpus", lambda: 64)
    assert pc.default_workers() == pc.MAX_WORKERS
    monkeypatch.setattr(pc, "available_cpus", lambda: 3)
    assert pc.default_workers() == 3


def test_the_environment_caps_the_workers(monkeypatch) -> None:
    monkeypatch.setattr(pc, "available_cpus", lambda: 64)
    monkeypatch.setenv(pc.WORKERS_ENV, "3")
    assert pc.default_workers() == 3
    monkeypatch.setenv(pc.WORKERS_ENV, "40")
    assert pc.default_workers() == 40, "the variable replaces the library's cap"
    monkeypatch.setattr(pc, "available_cpus", lambda: 6)
    assert pc.default_workers() == 6, "never more than the CPUs available"
    for bad in ("0", "-2", "many", "1.5"):
        monkeypatch.setenv(pc.WORKERS_ENV, bad)
        with pytest.raises(ValueError, match=f"{pc.WORKERS_ENV} must be a positive integer"):
            pc.default_workers()


def test_a_bad_worker_cap_is_refused_when_the_backend_is_chosen(monkeypatch) -> None:
    """The CLI's guard turns the EngineError into one line and exit 2, before any run."""
    from precisionlab.engine import EngineError, resolve_backend

    monkeypatch.setenv(pc.WORKERS_ENV, "none")
    with pytest.raises(EngineError, match="PRECISIONLAB_COMPILE_WORKERS must be a positive"):
        resolve_backend("triton", torch.device("cuda"))
    assert resolve_backend("torch", torch.device("cpu")) == "torch", "emulation never asks"
    monkeypatch.setenv(pc.WORKERS_ENV, "4")
    assert resolve_backend("triton", torch.device("cuda")) == "triton"


def test_available_cpus_follow_the_affinity_and_the_cgroup_quota(monkeypatch,
                                                                 tmp_path) -> None:
    monkeypatch.setattr(pc.os, "sched_getaffinity", lambda pid: set(range(12)), raising=False)
    quota, v1 = tmp_path / "cpu.max", tmp_path / "v1"
    v1.mkdir()

    def cpus() -> int:
        return pc.available_cpus(str(quota), str(v1))

    assert cpus() == 12  # no quota file
    quota.write_text("max 100000\n")
    assert cpus() == 12
    quota.write_text("250000 100000\n")  # 2.5 CPUs
    assert cpus() == 3
    quota.write_text("50000 100000\n")
    assert cpus() == 1
    quota.unlink()  # cgroup v1
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    assert cpus() == 12
    (v1 / "cpu.cfs_quota_us").write_text("400000\n")
    assert cpus() == 4
    monkeypatch.delattr(pc.os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(pc.os, "cpu_count", lambda: None)
    assert pc.available_cpus(str(tmp_path / "none"), str(tmp_path / "none")) == 1


def test_the_walk_takes_the_longest_windows_first(monkeypatch) -> None:
    from precisionlab.designs import Design
    from precisionlab.kernels import backend as kb

    class Runner:
        def __init__(self, design, *args) -> None:
            self.window = design.window

    walked: list[tuple[int, int]] = []
    monkeypatch.setattr(kb, "make_triton_runner", Runner)
    monkeypatch.setattr(pc, "precompile", lambda make, inputs, raw: walked.extend(
        (r.window, n) for r, n in make()))
    designs = [Design("shared", "fp8-e4m3", L, "fp8-e4m3") for L in (4, 64, 16, 32)]
    kb.precompile_designs(designs, None, None, 2, torch.device("cpu"), torch.float32, 0,
                          None, None, None, steps=20)
    assert walked == [(64, 20), (32, 20), (16, 17), (4, 5)]


def _ours(hook_kwargs: dict) -> bool:
    """Whether a compile hook's call is for one of the project's kernels (a model's own
    layers may compile Triton kernels of other libraries)."""
    return hook_kwargs["fn"].module.startswith("precisionlab.")


def _forget_compiled_kernels() -> None:
    """Empty every project kernel's in-memory cache (the next launch compiles it again,
    from Triton's disk cache where it is there)."""
    from precisionlab.kernels.compile_worker import as_jit_function

    cleared = []
    for name, module in list(sys.modules.items()):
        if not name.startswith("precisionlab.kernels") or module is None:
            continue
        for value in vars(module).values():
            if (fn := as_jit_function(value)) is not None:
                fn.device_caches.clear()
                cleared.append(fn)
    assert cleared, "no kernel found to forget"


@needs_gpu
@pytest.mark.parametrize("processes", [True, False], ids=["processes", "threads"])
@pytest.mark.parametrize("model", ["nemotron-3-nano-4b", "qwen3.5-4b"])
def test_a_precompiled_run_compiles_nothing_itself(model: str, processes: bool,
                                                   monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(triton.knobs.cache, "dir", str(tmp_path))  # an empty disk cache
    phase = ["run"]
    compiled: list[str] = []
    hooks: list[tuple[str, str]] = []  # (phase, module) of every compile, for a failure
    walks: list[int] = []
    reports: list[pc.CompileReport] = []
    walk, only = pc.precompile, pc.compile_only

    def watched(*args, **kwargs):
        walks.append(1)
        phase[0] = "precompile"
        try:
            return walk(*args, **{**kwargs, "processes": processes})
        finally:
            phase[0] = "run"

    @contextmanager
    def reported(*args, **kwargs):
        with only(*args, **kwargs) as report:
            yield report
        reports.append(report)

    monkeypatch.setattr(pc, "precompile", watched)
    monkeypatch.setattr(pc, "compile_only", reported)

    def hook(*a, **k):
        hooks.append((phase[0], k["fn"].module))
        if _ours(k):
            compiled.append(phase[0])

    monkeypatch.setattr(triton.knobs.runtime, "jit_post_compile_hook", hook)
    _forget_compiled_kernels()
    drift(model, ["fp8-e4m3", "nvfp4"], designs=["shared", "split"], windows=[4, 8],
          checkpoint_format=["fp32", "fp16-sr"], steps=12, batch=2, device="cuda",
          backend="triton")
    assert compiled.count("precompile") > 0, (
        f"walks {len(walks)}, reports {reports}, compiles {sorted(set(hooks))} x {len(hooks)}")
    assert compiled.count("run") == 0, f"{compiled.count('run')} kernels compiled in the run"
    if processes:
        [report] = reports
        assert report.worker_errors == [] and report.on_disk == 0
        assert report.in_workers == report.kernels == compiled.count("precompile")
        assert report.compiled_here == 0, "kernels the workers compiled were compiled again"
        phases = report.phases
        assert 0 < phases["walk"] <= phases["workers"] <= phases["load"]
        assert 1 <= len(report.worker_exits) <= pc.default_workers()
        assert max(report.worker_exits) <= phases["workers"] + 1e-3  # rounded to 1 ms


@needs_gpu
@pytest.mark.parametrize("model", ["nemotron-3-nano-4b", "qwen3.5-4b"])
def test_precompiling_changes_no_result(model: str, monkeypatch) -> None:
    kwargs = dict(designs=["shared", "split"], windows=[4], checkpoint_format="fp16-sr",
                  steps=10, batch=2, device="cuda", backend="triton", seed=5)
    with_it = drift(model, ["fp8-e4m3", "nvfp4"], **kwargs)
    monkeypatch.setattr(engine, "_precompile", lambda *a, **k: None)
    _forget_compiled_kernels()
    without = drift(model, ["fp8-e4m3", "nvfp4"], **kwargs)
    for name in ("rel_err", "state_rel_err", "abs_err_max"):
        np.testing.assert_array_equal(with_it[name].values, without[name].values)


@needs_gpu
@pytest.mark.parametrize("preset", ["tiny-mamba2", "tiny-gdn"])
def test_a_whole_model_on_the_kernels_compiles_them_first_once_per_layer_shape(
        preset: str, monkeypatch) -> None:
    from precisionlab.kernels import backend as kb
    from precisionlab.studies.model_drift import model_drift

    phase = ["run"]
    compiled: list[str] = []
    walks: list[int] = []
    walk = kb.precompile_designs

    def watched(designs, *args, **kwargs):
        phase[0] = "precompile"
        walks.append(len(designs))
        try:
            return walk(designs, *args, **kwargs)
        finally:
            phase[0] = "run"

    monkeypatch.setattr(kb, "precompile_designs", watched)
    monkeypatch.setattr(triton.knobs.runtime, "jit_post_compile_hook",
                        lambda *a, **k: compiled.append(phase[0]) if _ours(k) else None)
    _forget_compiled_kernels()
    model_drift(preset, ["fp8-e4m3", "nvfp4"], windows=(2, 4), checkpoint_format="fp16-sr",
                steps=8, layers=2, batch=2, seed=3, device="cuda", backend="triton")
    assert len(walks) == 1, "one walk, for the model's one SSM layer shape"
    assert walks[0] >= 8, "over every configuration (2 formats, 2 designs, 2 windows)"
    assert compiled.count("precompile") > 0
    assert compiled.count("run") == 0, f"{compiled.count('run')} kernels compiled in the run"


@needs_gpu
def test_kernels_already_on_disk_are_loaded_not_compiled(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(triton.knobs.cache, "dir", str(tmp_path))
    x = torch.zeros(8, device="cuda")
    reports = []
    for _ in range(2):
        _forget_compiled_kernels()
        _add_one.device_caches.clear()
        with pc.compile_only(workers=2) as report:
            _add_one[(1,)](x, 8, BLOCK=32)
        reports.append((report.kernels, report.in_workers, report.on_disk))
    assert reports == [(1, 1, 0), (1, 0, 1)]
    _add_one[(1,)](x, 8, BLOCK=32)
    assert x.tolist() == [1.0] * 8


@needs_gpu
def test_a_run_on_the_kernels_compiles_nothing_with_torch_compile() -> None:
    """A stochastically rounded checkpoint's initial state is encoded by the Triton codec
    on CUDA, so a run on the kernels never loads torch's compiler (seconds per process)."""
    import subprocess

    code = ("import sys; from precisionlab.studies import drift; "
            "drift('nemotron-3-nano-4b', ['nvfp4'], designs=['split'], windows=[4], "
            "checkpoint_format='fp16-sr', steps=6, batch=2, device='cuda', backend='triton'); "
            "print('torch._inductor.compile_fx' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False"

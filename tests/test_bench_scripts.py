"""The benchmark scripts' argument checks: one usage line and exit 2, before any GPU
work or output file (they run on a CPU-only machine too)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(script: str, *args: str, tmp: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args],
                          capture_output=True, text=True, cwd=tmp, timeout=300)


@pytest.mark.parametrize("script,args,msg", [
    ("bench_phases.py", ["--batch", "4"], "--batch must be >= 16"),
    ("bench_phases.py", ["--gdn", "nemotron-3-nano-4b"], "is a mamba2 model"),
    ("bench_phases.py", ["--mamba2", "no-such-model"], "unknown model"),
    ("profile_steps.py", ["--window", "1"], "--window >= 2"),
    ("profile_steps.py", ["--design", "fp64"], "invalid choice"),
    ("profile_steps.py", ["--kind", "gdn", "--model", "nemotron-3-nano-4b"], "is a mamba2"),
    ("profile_steps.py", ["--model", "no-such-model"], "unknown model"),
    ("profile_steps.py", ["--split", "maxnreg"], "FIELD=VALUE"),
    ("profile_steps.py", ["--split", "no_such_field=1"], "SplitConfig field"),
    ("profile_steps.py", ["--kind", "gdn", "--split", "maxnreg=96"], "for Mamba-2"),
    ("profile_steps.py", ["--kind", "gdn", "--design", "peer"], "is for Mamba-2"),
    ("profile_steps.py", ["--design", "conventional", "--split", "maxnreg=96"],
     "--split applies to the replay designs"),
    ("profile_steps.py", ["--design", "peer", "--mamba-ssm-path", "no/such/dir"],
     "no directory"),
    ("profile_steps.py", ["--split", "flush_prefetch=-1"],
     "flush_prefetch must be an integer >= 0"),
    ("profile_steps.py", ["--split", "out_loads_first=1", "block_p=16"],
     "out_loads_first takes at most 2 tiles"),
    ("time_split_configs.py", ["--config", "maxnreg"], "FIELD=VALUE"),
    ("time_split_configs.py", ["--config", "", "--config", "no_such_field=1"],
     "SplitConfig field"),
    ("time_split_configs.py", ["--config", "flush_prefetch=-1"],
     "flush_prefetch must be an integer >= 0"),
    ("time_split_configs.py", ["--config", "out_ahead=soon"], "out_ahead must be an integer"),
    ("time_split_configs.py", ["--config", "out_ahead=3"], "out_ahead takes 1 or 2"),
    ("time_split_configs.py", ["--config", "out_ahead=1 out_pairs=false"],
     "out_ahead needs out_pairs"),
    ("time_split_configs.py", ["--config", "flush_tma=maybe"], "flush_tma must be true"),
    ("time_split_configs.py", ["--config", "flush_tma=true flush_rows=32"],
     "flush_tma needs a dense checkpoint"),
    ("time_split_configs.py", ["--model", "qwen3.5-4b", "--config", "out_evict=maybe"],
     "out_evict must be true or false"),
    ("time_split_configs.py", ["--model", "qwen3.5-4b", "--config", "out_block_v=wide"],
     "out_block_v must be an integer"),
    ("time_split_configs.py", ["--model", "qwen3.5-4b", "--config", "nosuch=1"],
     "GDNReplayCache launch keyword"),
    ("time_split_configs.py", ["--model", "qwen3.5-4b", "--config", "flush_grid=bogus"],
     "flush_grid must be one of"),
    ("time_split_configs.py", ["--model", "qwen3.5-4b", "--config", "window=4"],
     "GDNReplayCache launch keyword"),
    ("time_split_configs.py", ["--launch", "fused", "--config", "maxnreg=96"],
     "--launch fused takes num_warps only"),
    ("time_split_configs.py", ["--launch", "fused", "--model", "qwen3.5-4b"],
     "--launch fused is for Mamba-2 models"),
    ("time_split_configs.py", ["--launch", "both"], "invalid choice"),
    ("time_split_configs.py", ["--model", "qwen3.5-4b", "--layers", "0"],
     "--layers must be >= 1"),
    ("time_split_configs.py", ["--layers", "0"], "--layers must be >= 1"),
    ("time_split_configs.py", ["--model", "no-such-model"], "unknown model"),
    ("time_split_configs.py", ["--window", "1"], "--window >= 2"),
    ("time_split_configs.py", ["--design", "fp64"], "invalid choice"),
    ("time_encode_launch.py", ["--setting", "rows"], "KEY=INT"),
    ("time_encode_launch.py", ["--setting", "", "--setting", "warps=3"], "warps 1, 2, 4"),
    ("time_encode_launch.py", ["--setting", "rows=24"], "multiple of 16"),
    ("time_encode_launch.py", ["--setting", "ctas=x"], "ctas must be an integer"),
    ("time_encode_launch.py", ["--setting", "at=later"], "at must be one of launch, flush"),
    ("time_encode_launch.py", ["--setting", "regs=8"], "regs 0 or 24-255"),
    ("time_encode_launch.py", ["--setting", "amax_bits=2"], "amax_bits 0 or 1"),
    ("time_encode_launch.py", ["--design", "split-fp32-fp8"], "encoded in the flush"),
    ("time_encode_launch.py", ["--model", "no-such-model"], "unknown model"),
    ("paired_bench.py", ["--model", "no-such-model"], "unknown model"),
    ("paired_bench.py", ["--model", "qwen3.5-4b", "--kernels", "mamba_ssm"],
     "unknown gdn kernel(s) mamba_ssm"),
    ("paired_bench.py", ["--kernels", "verify-T4"], "unknown mamba2 kernel(s) verify-T4"),
    ("paired_bench.py", ["--rounds", "1"], "rounds >= 2"),
    ("paired_bench.py", ["--model", "qwen3.5-4b", "--layers", "0"],
     "layers must be an integer >= 1"),
    ("paired_bench.py", ["--layers", "0"], "layers must be an integer >= 1"),
    ("paired_bench.py", ["--out", "no/such/dir/x.json"], "no directory for --out"),
    ("paired_bench.py", ["--nc", "x.csv"], "--nc takes a .nc or .zarr path"),
    ("bench_gdn.py", ["--phase", "warm,diagnose"], "unknown phase(s) diagnose"),
    ("bench_gdn.py", ["--phase", "diag", "--device", "cpu"], "--phase diag times launches"),
    ("probe_nvfp4_encode.py", [], "--out is required unless --check-only"),
    ("probe_nvfp4_encode.py", ["--sources", "fp8"], "invalid choice"),
    ("probe_nvfp4_encode.py", ["--out", "no/such/dir/x.json"], "no directory"),
    ("probe_nvfp4_mma.py", ["--batches", "0"], "--batches must be >= 1"),
    ("probe_nvfp4_mma.py", ["--out", "no/such/dir/x.json"], "no directory"),
    ("probe_nvfp4_mma.py", ["--models", "tiny"], "invalid choice"),
    ("probe_nvfp4_mma.py", ["--kinds", "mma-fast"], "unknown form 'mma-fast'"),
    ("probe_nvfp4_mma.py", ["--kinds", "fma/2"], "unknown form 'fma/2'"),
    ("probe_nvfp4_mma.py", ["--kinds", "mma-prefetch/2", "--models", "nemotron-3-nano-4b"],
     "15 tiles per group do not split 2 ways"),
    ("probe_nvfp4_mma.py", ["--kinds", "mma-128", "--models", "nemotron-3-nano-4b"],
     "15 tiles per group do not split 2 ways"),
    ("time_model_drift.py", ["--steps", "1"], "--steps must be >= 2"),
    ("time_model_drift.py", ["--layers", "0"], "--layers must be >= 1"),
    ("time_model_drift.py", ["--out", "x.nc"], "use one of .json"),
    ("time_model_drift.py", ["--model", "no-such-model", "--backends", "torch"],
     "unknown model"),
    ("time_model_drift.py", ["--model", "tiny-gdn", "--backends", "triton", "--device", "cpu"],
     "needs a CUDA device"),
    ("time_first_run.py", ["--steps", "0"], "--steps must be at least 1"),
    ("time_first_run.py", ["--model", "no-such-model"], "unknown model"),
    ("time_first_run.py", ["--out", "no/such/dir/x.json"], "a .json path in an existing folder"),
    ("time_first_run.py", ["--out", "x.nc"], "a .json path in an existing folder"),
    ("time_first_run.py", ["--modes", "cold"], "invalid choice"),
    ("time_first_run.py", ["--limit", "0"], "--limit must be a positive number"),
    ("time_first_run.py", ["--workers", "0"], "--workers must be at least 1"),
    ("time_first_run.py", ["--modes", "warm-cache", "precompile"], "needs a precompile run"),
    ("compile_times.py", ["--windows", "0"], "--windows must be at least 1"),
    ("compile_times.py", ["--batch", "0"], "--batch must be at least 1"),
    ("compile_times.py", ["--arch", "9"], "--arch takes a CUDA compute capability"),
    ("compile_times.py", ["--model", "no-such-model"], "unknown model"),
    ("compile_times.py", ["--formats", "fp7"], "unknown format"),
    ("compile_times.py", ["--designs", "both"], "invalid choice"),
    ("compile_times.py", ["--out", "x.nc"], "a .json path in an existing folder"),
])
def test_bad_arguments_exit_2(script: str, args: list[str], msg: str, tmp_path: Path) -> None:
    r = run(script, *args, tmp=tmp_path)
    assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("script,args", [
    ("bench_phases.py", []),
    ("time_split_configs.py", ["--config", "", "--config", "maxnreg=96 tail_tile=true"]),
    ("time_split_configs.py", ["--launch", "fused", "--batch", "1", "--design",
                               "replay-fp32", "--config", "", "--config", "num_warps=4"]),
    ("time_split_configs.py", ["--model", "qwen3.5-4b", "--design", "split-fp16sr-nvfp4",
                               "--config", "num_warps=2 maxnreg=128 flush_grid=dynamic"]),
    ("probe_nvfp4_encode.py", []),
    ("probe_nvfp4_mma.py", []),
    ("time_encode_launch.py", ["--model", "nemotron-3-nano-4b", "--setting", "rows=32"]),
    ("time_first_run.py", ["--steps", "8"]),
])
def test_timing_scripts_without_gpu_exit_2(script: str, args: list[str], tmp_path: Path) -> None:
    if __import__("torch").cuda.is_available():
        pytest.skip("a GPU is present")
    out = tmp_path / "timings.json"
    r = run(script, *args, "--out", str(out), tmp=tmp_path)
    assert r.returncode == 2 and "needs a CUDA GPU" in r.stderr and not out.exists()


def test_probe_nvfp4_encode_bits_equal_formats(tmp_path: Path) -> None:
    """The probe's standalone encode launch writes formats.nvfp4's bits (interpreter on
    the CPU, compiled on a GPU)."""
    env = dict(os.environ)
    if not __import__("torch").cuda.is_available():
        env["TRITON_INTERPRET"] = "1"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "probe_nvfp4_encode.py"),
                        "--check-only"], capture_output=True, text=True, cwd=tmp_path,
                       timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "bits equal formats.nvfp4: True" in r.stdout


def test_probe_nvfp4_mma_compiles_without_a_layout_conversion(tmp_path: Path) -> None:
    """``probe_nvfp4_mma.py --sass``: the tensor-core probe compiles offline for sm_90
    with its operand built in registers (no shared memory, HMMA in the code), in 64- and
    (super-120b) 128-row tiles and with the block scales after the product, and its
    operand rows name every state column once."""
    r = run("probe_nvfp4_mma.py", "--sass", tmp=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    for kind in ("mma", "mma-block-cols"):
        line = next(x for x in r.stdout.splitlines() if x.startswith(kind + " "))
        assert "SHARED:0 " in line and "'HMMA'" in line
    assert "operand rows name every column once: True" in r.stdout
    r = run("probe_nvfp4_mma.py", "--sass", "--models", "nemotron-3-super-120b", tmp=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    two_m = next(line for line in r.stdout.splitlines() if line.startswith("mma-128 "))
    assert "SHARED:0 " in two_m and "'HMMA'" in two_m


def test_split_fields_parse_ints_and_flags() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from profile_steps import _split_config
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    cfg = _split_config(["maxnreg=96", "tail_tile=true", "evict_first=False",
                         "out_weights=program"])
    assert (cfg.maxnreg, cfg.tail_tile, cfg.evict_first, cfg.out_weights) == (
        96, True, False, "program")


def test_gdn_configs_parse_ints_flags_and_names() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from time_split_configs import gdn_fields
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert gdn_fields(["num_warps=2", "flush_tma=false", "flush_grid=dynamic"]) == {
        "num_warps": 2, "flush_tma": False, "flush_grid": "dynamic"}


def test_encode_settings_parse_ints_and_where_the_copy_is_encoded() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from time_encode_launch import parse_setting
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert parse_setting("rows=32 at=flush") == {"rows": 32, "at": "flush"}
    assert parse_setting("regs=64 amax_bits=0") == {"regs": 64, "amax_bits": 0}
    assert parse_setting("") == {}


@pytest.mark.parametrize("model,v_heads", [("qwen3.5-4b", 32), ("qwen3.5-122b", 64)])
def test_gdn_bench_batch1_replay_takes_the_library_warps(model, v_heads) -> None:
    """The benchmark's batch-1 replay configurations are the library's programs and
    leave the warps to it, which picks them by the grid's size (qwen3.5-4b's 256
    programs: fp32 8, fp8 copy 4; qwen3.5-122b's 512: 2, 1; nvfp4 copies 4 warps in
    16-row programs on both, capped at 128 registers on the larger grid)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from bench_gdn import SMALL
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    from precisionlab.kernels.gdn_decode import replay_defaults

    four_b = v_heads == 32
    for variant, ckpt, read, warps, rows in (
            ("replay-fp32", "fp32", None, 8 if four_b else 2, 16),
            ("split-fp32-fp8", "fp32", "fp8-e4m3", 4 if four_b else 1, 16),
            ("split-fp16sr-nvfp4", "fp16-sr", "nvfp4", 4, 16)):
        assert "num_warps" not in SMALL[variant]
        assert SMALL[variant].get("block_v", rows) == rows
        lib = replay_defaults(1, 16, v_heads, 128, 128, ckpt, read)
        assert (lib["launch"], lib["num_warps"], lib["block_v"]) == ("fused", warps, rows)
        # 4-warp programs on qwen3.5-122b's 512-program grid: 128 registers, 4 per SM
        assert lib["maxnreg"] == (128 if warps == 4 and not four_b else None)


@pytest.mark.parametrize("variant,checkpoint,read", [
    ("replay-fp32", "fp32", None), ("split-fp32-fp8", "fp32", "fp8-e4m3"),
    ("split-fp16sr-nvfp4", "fp16-sr", "nvfp4")])
def test_gdn_bench_large_configs_are_the_library_defaults(variant, checkpoint, read) -> None:
    """The GDN benchmark's batch-256 configurations name the library's own defaults, so
    its tables time what users get."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from bench_gdn import LARGE
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    from precisionlab.kernels.gdn_decode import GDNReplayCache, replay_defaults

    for v_heads in (32, 64):  # qwen3.5-4b, qwen3.5-122b
        lib = replay_defaults(256, 16, v_heads, 128, 128, checkpoint, read)
        named = {k: v for k, v in LARGE[variant].items() if k in lib}
        assert named == {k: lib[k] for k in named}
        # ... and the cache they build resolves to the defaults' (naming one key can
        # change another's default, e.g. out_block_v alone means one tile per program)
        caches = [GDNReplayCache(1, 16, v_heads, 128, 128, window=16, checkpoint=checkpoint,
                                 read=read, device="cpu", batch_hint=256, **kw)
                  for kw in (LARGE[variant], {})]
        assert caches[0].config == caches[1].config


def test_sass_count_compiles_the_mamba2_batch1_kernel(tmp_path: Path) -> None:
    """``sass_count.py --only batch1``: the one-launch kernel of each design at batch 1,
    compiled offline for sm_90, with its registers (no GPU needed)."""
    import json

    out = tmp_path / "b1.json"
    r = run("sass_count.py", "--only", "batch1", "--json", str(out), tmp=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [row["variant"] for row in rows] == [
        "batch1 replay-fp32", "batch1 fp8", "batch1 nvfp4"]
    assert all(row["kernel"] == "mamba2_kernel" and row["sass"] > 1000 and row["regs"] > 0
               for row in rows)


def test_prep_release_compiles_to_l2_demotions(tmp_path: Path) -> None:
    """The GDN prep launch with ``prep_release``, compiled offline for sm_90: a flushing
    row's kept lines get L2 demotions (``CCTL.E.DML2``, from ``applypriority``); without
    it there are none."""
    code = """
import sys
sys.path.insert(0, sys.argv[1])
import sass_count_gdn as S
from sass_count import compile_call, sass_of
for rel in (False, True):
    for fn, args, kw in S.step_calls("qwen3.5-4b", "fp32", "fp8-e4m3", {"prep_release": rel}):
        if S._name(fn) == "_prep_kernel":
            print(rel, sass_of(compile_call(fn, args, {**kw, "RELEASE": rel})).count("DML2"))
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", code, str(ROOT / "benchmarks")],
                       capture_output=True, text=True, cwd=tmp_path, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    counts = dict(line.split() for line in r.stdout.split("\n") if line)
    assert counts["False"] == "0" and int(counts["True"]) >= 5, r.stdout


def test_time_model_drift_writes_its_timings(tmp_path: Path) -> None:
    import json

    out = tmp_path / "t.json"
    r = run("time_model_drift.py", "--model", "tiny-mamba2", "--layers", "1", "--steps", "3",
            "--window", "2", "--backends", "torch", "--device", "cpu", "--out", str(out),
            tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())["runs"]["torch"]
    for run_ in (res["cold"], res["warm"]):
        assert run_["backend"] == "torch" and run_["step_ms"] > 0
        assert run_["total_s"] >= run_["before_first_step_s"] > 0
        assert set(run_["final_rel_err"]) == {"shared/nvfp4/L2", "split/nvfp4/L2"}
        assert all(v > 0 for v in run_["final_rel_err"].values())


@pytest.mark.parametrize("metrics", ["0", "1"])
def test_ncu_window_runs_the_profiler_once_per_design(metrics: str, tmp_path: Path) -> None:
    """``ncu_window.sh`` (sections, or ``NCU_METRICS=1``: a metric list as a raw CSV in
    base units) calls the profiler once per kind:design with that kind's kernel filter;
    stand-ins for ``ncu`` and ``python3`` record the calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ncu").write_text('#!/bin/sh\necho "$@"\n')
    (bin_dir / "python3").write_text("#!/bin/sh\nexit 0\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "NCU_METRICS": metrics}
    out = tmp_path / "out"
    r = subprocess.run(["bash", str(ROOT / "benchmarks" / "ncu_window.sh"), str(out),
                        "mamba2:replay-fp32", "gdn:split-fp32-fp8"], capture_output=True,
                       text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    tag = "metrics" if metrics == "1" else "ncu"
    m2 = (out / f"{tag}_mamba2_replay-fp32.csv").read_text()
    gdn = (out / f"{tag}_gdn_split-fp32-fp8.csv").read_text()
    assert "regex:^(m2_|mamba2_kernel)" in m2 and "--design replay-fp32" in m2
    assert "regex:^_(out|prep|flush)_kernel" in gdn and "--kind gdn" in gdn
    for text in (m2, gdn):
        if metrics == "1":
            assert "smsp__inst_executed.sum" in text and "--print-units base" in text
            assert "--section" not in text
        else:
            assert "--section WarpStateStats" in text and "--metrics" not in text

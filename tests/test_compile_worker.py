"""Worker processes compile kernels into Triton's disk cache under the key a launch in
this process looks up (``precisionlab.kernels.compile_worker``).  The compiles are for
an sm_90 target, which needs no GPU, only the ``ptxas`` that Triton ships; they run in
a child process without ``TRITON_INTERPRET`` (which the CPU test session sets)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import triton

from precisionlab.kernels.testing import compiling_env, ptxas_available

pytestmark = pytest.mark.skipif(not ptxas_available(),
                                reason="compiles for a GPU target with Triton's ptxas")

KERNEL = '''
import triton
import triton.language as tl


@triton.jit
def add_const(x_ptr, n, C: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    m = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=m) + C, mask=m)


G = tl.constexpr(3.0)


@triton.jit
def scaled(x):
    return x * G


@triton.jit
def scale_a(x_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, scaled(tl.load(x_ptr + offs)))


@triton.jit
def scale_b(x_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, scaled(tl.load(x_ptr + offs)) + 1.0)
'''


def _spec(fn, c: float, block: int) -> str:
    """The specialization data of one launch of ``add_const`` (as Triton writes it)."""
    from triton.compiler import make_backend
    from triton.runtime.jit import serialize_specialization_data

    signature = {"x_ptr": "*fp32", "n": "i32", "C": "constexpr", "BLOCK": "constexpr"}
    constants = {(2,): c, (3,): block}
    attrs = {(0,): [["tt.divisibility", 16]]}
    options = make_backend(_target()).parse_options({"num_warps": 1})
    return serialize_specialization_data(fn._fn_name, signature, constants, attrs, options,
                                         f"key-{c}-{block}")


def _spec_scale(fn, block: int) -> str:
    """The specialization data of one launch of ``scale_a`` or ``scale_b``."""
    from triton.compiler import make_backend
    from triton.runtime.jit import serialize_specialization_data

    options = make_backend(_target()).parse_options({"num_warps": 1})
    return serialize_specialization_data(fn._fn_name, {"x_ptr": "*fp32", "BLOCK": "constexpr"},
                                         {(1,): block}, {(0,): [["tt.divisibility", 16]]},
                                         options, f"key-{block}")


def _target():
    from triton.backends.compiler import GPUTarget

    return GPUTarget("cuda", 90, 32)


def _compiled_here(fn, spec: str) -> bool:
    """Compile ``spec`` in this process; whether it came from the disk cache."""
    from triton.compiler import make_backend

    from precisionlab.kernels import compile_worker as cw

    hits: list[bool] = []
    src, raw = cw.source_of(fn, spec)
    options = make_backend(_target()).parse_options(raw)
    saved = triton.knobs.compilation.listener
    triton.knobs.compilation.listener = lambda **kw: hits.append(kw["cache_hit"])
    try:
        triton.compile(src, target=_target(), options=options.__dict__)
    finally:
        triton.knobs.compilation.listener = saved
    return hits == [True]


def scenario(name: str) -> dict:
    """Run in the child: one scenario against the kernel module ``pl_worker_kernel``."""
    import importlib

    from precisionlab.kernels import compile_worker as cw
    from precisionlab.kernels import precompile as pc

    mod = importlib.import_module("pl_worker_kernel")
    fn, target = mod.add_const, _target()
    if name == "fill":
        specs = {_spec(fn, c, 16): (mod.__name__, "add_const") for c in (1.0, 2.5)}
        before = [cw.on_disk(fn, s, target) for s in specs]
        served, errors = pc.compile_in_processes(specs, workers=2, target=target)
        other = _spec(fn, 1.0, 32)
        return {"errors": errors, "served_all": served == set(specs), "before": before,
                "after": [cw.on_disk(fn, s, target) for s in specs],
                "other_on_disk": cw.on_disk(fn, other, target),
                "hits": [_compiled_here(fn, s) for s in specs],
                "other_variant_hit": _compiled_here(fn, other)}
    if name == "history":
        # This process hashes scale_a (and so the helper both kernels call) before
        # scale_b; the worker hashes scale_b first.
        a, b = mod.scale_a, mod.scale_b
        spec_a, spec_b = _spec_scale(a, 16), _spec_scale(b, 16)
        cw.on_disk(a, spec_a, target)
        served, errors = pc.compile_in_processes({spec_b: (mod.__name__, "scale_b")},
                                                  workers=1, target=target)
        return {"errors": errors, "served": len(served), "b_on_disk": cw.on_disk(b, spec_b, target),
                "b_hit": _compiled_here(b, spec_b)}
    if name == "unservable":
        good = _spec(fn, 1.0, 16)
        requests = {good: (mod.__name__, "add_const"),
                    _spec(fn, 3.0, 16): ("no_such_module_here", "add_const")}
        served, errors = pc.compile_in_processes(requests, workers=1, target=target)
        return {"served_good_only": served == {good}, "errors": errors}
    if name == "timeline":
        pool = pc.WorkerPool(1, target)
        for c in (1.0, 2.0):
            pool.submit(_spec(fn, c, 16), mod.__name__, "add_const")
        served, errors = pool.close()
        return {"served": len(served), "errors": errors, "timeline": pool.timeline,
                "exits": pool.exits}
    if name == "cancel":
        pool = pc.WorkerPool(1, target)
        for c in (1.0, 2.0, 3.0):
            pool.submit(_spec(fn, c, 64), mod.__name__, "add_const")
        pool.cancel()
        served, errors = pool.close()
        return {"served": len(served), "errors": errors}
    spec = _spec(fn, 1.0, 16).replace("add_const", "other_kernel")
    try:
        cw.source_of(fn, spec)
    except ValueError as exc:
        return {"refused": str(exc)}
    return {"refused": None}


def _run(tmp_path: Path, name: str) -> dict:
    (tmp_path / "pl_worker_kernel.py").write_text(textwrap.dedent(KERNEL))
    env = compiling_env()
    env.update(TRITON_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=os.pathsep.join(
        [str(tmp_path), str(Path(__file__).parent), *sys.path]))
    code = ("import json, test_compile_worker as t; "
            f"print(json.dumps(t.scenario({name!r})))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_workers_fill_the_cache_that_a_launch_here_reads(tmp_path) -> None:
    r = _run(tmp_path, "fill")
    assert r["errors"] == [] and r["served_all"]
    assert r["before"] == [False, False] and r["after"] == [True, True]
    assert r["other_on_disk"] is False
    assert r["hits"] == [True, True]
    assert r["other_variant_hit"] is False, "a variant no worker compiled came from disk"


def test_a_kernel_a_worker_compiles_is_found_whatever_this_process_hashed_before(tmp_path
                                                                                 ) -> None:
    r = _run(tmp_path, "history")
    assert r["errors"] == [] and r["served"] == 1
    assert r["b_on_disk"], "the worker filled the cache under a key this process does not use"
    assert r["b_hit"]


def test_a_request_a_worker_cannot_serve_is_reported_not_raised(tmp_path) -> None:
    r = _run(tmp_path, "unservable")
    assert r["served_good_only"]
    assert len(r["errors"]) == 1 and "no_such_module_here" in r["errors"][0]


def test_specialization_data_of_another_kernel_is_refused(tmp_path) -> None:
    assert "other_kernel" in (_run(tmp_path, "refused")["refused"] or "")


def test_the_timeline_says_when_each_request_was_queued_sent_and_answered(tmp_path) -> None:
    r = _run(tmp_path, "timeline")
    assert r["errors"] == [] and r["served"] == 2
    (n1, q1, s1, a1), (n2, q2, s2, a2) = r["timeline"]
    assert n1 == n2 == "add_const"
    assert 0 <= q1 <= s1 < a1 and 0 <= q2 <= s2 < a2
    assert s2 >= a1, "one worker takes its next request once it has answered"
    [exited] = r["exits"]
    assert exited >= a2, "the one worker exits after its last answer"


def test_cancelled_requests_are_dropped_not_compiled(tmp_path) -> None:
    r = _run(tmp_path, "cancel")
    assert r["errors"] == [] and r["served"] <= 1, "at most the request a worker had taken"


KEY_OF_REPLAY = """
import sys
from precisionlab.kernels import codec, gdn_step, mamba2_kernel
from precisionlab.kernels import compile_worker as cw
first = [codec._encode_kernel, mamba2_kernel.mamba2_kernel] if sys.argv[1] == "others" else []
for kernel in first:
    cw.as_jit_function(kernel).cache_key  # hashed in this process's own way first
for kernel in first:
    cw.settle_cache_keys(cw.as_jit_function(kernel))
replay = cw.as_jit_function(gdn_step._replay_kernel)
cw.settle_cache_keys(replay)
print(replay.cache_key)
"""


def test_the_project_kernels_hash_alike_in_every_process() -> None:
    """The GDN replay kernel's key does not depend on which kernels a process hashed
    before (the worker and the process that launches it hash them in different orders)."""
    keys = []
    for history in ("others", "none"):
        out = subprocess.run([sys.executable, "-c", KEY_OF_REPLAY, history], env=compiling_env(),
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        keys.append(out.stdout.strip().splitlines()[-1])
    assert keys[0] == keys[1]


KEY_OF_REPLAY_UNSETTLED = """
import sys
from precisionlab.kernels import codec, gdn_step, mamba2_kernel
from precisionlab.kernels import compile_worker as cw
first = [codec._encode_kernel, mamba2_kernel.mamba2_kernel] if sys.argv[1] == "others" else []
for kernel in first:
    cw.as_jit_function(kernel).cache_key  # as a launch of these would, before the replay's
print(cw.as_jit_function(gdn_step._replay_kernel).cache_key)
"""


def test_a_launch_finds_the_same_key_whatever_was_launched_before() -> None:
    """Without any call to settle it, the GDN replay kernel's key is the same in a
    process that hashed other kernels first (a benchmark after a study, say): the
    kernel modules settle their keys as they are imported."""
    keys = []
    for history in ("others", "none"):
        out = subprocess.run([sys.executable, "-c", KEY_OF_REPLAY_UNSETTLED, history],
                             env=compiling_env(), capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        keys.append(out.stdout.strip().splitlines()[-1])
    assert keys[0] == keys[1]

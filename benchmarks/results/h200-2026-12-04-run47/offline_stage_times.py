"""Compile one configuration's kernels for sm_90 on a CPU-only machine and time each
compile stage (Triton's compile listener).  A stand-in driver reports an sm_90 target,
so the precompile walk's launches reach Triton's compile hook without a GPU.

    TRITON_CACHE_DIR=$(mktemp -d) \
        python offline_stage_times.py MODEL L FORMAT CHECKPOINT [DESIGN [BATCH]]
    e.g. qwen3.5-4b 64 fp8-e4m3 fp32 split
"""

import os
import sys
import time
from contextlib import contextmanager

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)


class StandInDriver:
    """Just enough of a driver for a launch to reach the compile hook."""

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return TARGET

    def get_active_torch_device(self):
        return torch.device("cpu")


triton.runtime.driver.set_active(StandInDriver())

from precisionlab import engine  # noqa: E402
from precisionlab.kernels import compile_worker as cw  # noqa: E402
from precisionlab.kernels import precompile as pc  # noqa: E402
from precisionlab.studies import drift  # noqa: E402


class Walked(Exception):
    """Raised after the walk: the run itself is not wanted."""


def main() -> None:
    model, window, fmt, ck = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    design = sys.argv[5] if len(sys.argv) > 5 else "split"
    batch = int(sys.argv[6]) if len(sys.argv) > 6 else 2
    specs: dict[str, tuple[str, str]] = {}

    def collect(*, fn, compile, **_):
        specs.setdefault(compile["specialization_data"], (fn.module, fn.name))
        return True

    @contextmanager
    def only(workers=None, processes=True):
        with pc._launches_compile_only():
            yield pc.CompileReport()

    walk = engine._precompile

    def walk_then_stop(*args, **kwargs):
        triton.knobs.runtime.jit_cache_hook = collect
        pc.compile_only = only
        try:
            walk(*args, **kwargs)
        finally:
            triton.knobs.runtime.jit_cache_hook = None
        raise Walked

    engine.resolve_backend = lambda backend, device: "triton"
    engine._precompile = walk_then_stop
    try:
        drift(model, [fmt], designs=[design], windows=[window], checkpoint_format=ck,
              steps=window + 2, batch=batch, device="cpu", backend="triton")
    except Walked:
        pass
    times: dict = {}
    triton.knobs.compilation.listener = lambda **kw: times.update(vars(kw["times"]))
    for spec, (module, name) in specs.items():
        times.clear()
        t = time.perf_counter()
        cw.compile_task({"module": module, "name": name, "spec": spec,
                         "target": [TARGET.backend, TARGET.arch, TARGET.warp_size]})
        stages = {k: round(v / 1e6, 1) for k, v in times.get("lowering_stages", [])}
        print(f"{name}: {time.perf_counter() - t:.1f} s, stages (s): {stages}", flush=True)


if __name__ == "__main__":
    main()

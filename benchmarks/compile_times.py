"""Compile times of a study's kernels for a GPU target, on any machine: no GPU needed.

The kernels a drift / advise sweep launches are found by the walk the triton backend
makes before a study (``precisionlab.kernels.precompile``), run on CPU tensors under a
stand-in Triton driver that reports the target.  Each distinct kernel is then compiled
here, one at a time, into an empty cache folder, with Triton's own ``ptxas``, and timed
per compile stage.  Its PTX size shows how much code a configuration unrolls (the GDN
flush's window inverse did, past L = 32, before it became a loop).

    python benchmarks/compile_times.py --model qwen3.5-4b --windows 32 64 --out compile.json

Defaults: the default ``advise`` grid (fp8-e4m3 and nvfp4; shared and split; fp32 and
fp16-sr checkpoints; L = 4, 16, 64) at batch 2, for sm_90 (H100 / H200).  Exit 2 with
one line on bad arguments or under ``TRITON_INTERPRET=1``; the JSON is written whole or
not at all.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # after the installed packages: kernels/ must not shadow one


class StandInDriver:
    """Just enough of a Triton driver for a launch to reach the compile hook."""

    def __init__(self, target) -> None:
        self.target = target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device=None) -> int:
        return 0

    def get_current_target(self):
        return self.target

    def get_active_torch_device(self):
        import torch

        return torch.device("cpu")


class _Walked(Exception):
    """Raised once the walk has seen every launch: the study itself is not run."""


def kernel_requests(model: str, formats, designs, checkpoints, windows, batch: int
                    ) -> dict[str, dict]:
    """Every distinct kernel launch of the sweep's walk, as Triton's specialization data
    -> ``{"module", "name", "configs"}`` (the configurations that launch it)."""
    from contextlib import contextmanager

    import triton

    from precisionlab import engine
    from precisionlab.kernels import backend as kernel_backend
    from precisionlab.kernels import precompile as pc
    from precisionlab.studies import drift

    found: dict[str, dict] = {}
    current = [""]

    def collect(*, fn, compile, **_) -> bool:
        row = found.setdefault(compile["specialization_data"],
                               {"module": fn.module, "name": fn.name, "configs": []})
        if current[0] not in row["configs"]:
            row["configs"].append(current[0])
        return True  # not compiled here

    @contextmanager
    def launches_only(workers=None, processes=True):
        with pc._launches_compile_only():
            yield pc.CompileReport()

    def walk(designs_, kind, params32, batch_, dev, rdt, seed, state0, first, steps):
        raw = dict(first.items())
        inp = kind.prepare(raw, params32, rdt)
        for d in designs_:
            current[0] = d.label
            kernel_backend.precompile_designs([d], kind, params32, batch_, dev, rdt, seed,
                                              state0, inp, raw, steps)
        raise _Walked

    saved = (engine.resolve_backend, engine._precompile, pc.compile_only,
             triton.knobs.runtime.jit_cache_hook)
    engine.resolve_backend = lambda backend, device: "triton"
    engine._precompile, pc.compile_only = walk, launches_only
    triton.knobs.runtime.jit_cache_hook = collect
    try:
        drift(model, list(formats), designs=list(designs), windows=list(windows),
              checkpoint_format=list(checkpoints), steps=max(windows) + 1, batch=batch,
              device="cpu", backend="triton")
    except _Walked:
        pass
    finally:
        (engine.resolve_backend, engine._precompile, pc.compile_only,
         triton.knobs.runtime.jit_cache_hook) = saved
    return found


def compile_all(found: dict[str, dict], target) -> list[dict]:
    """Compile each kernel into an empty cache folder; seconds per stage, PTX lines and
    cubin bytes."""
    import triton

    from precisionlab.kernels.compile_worker import compile_task

    stages: dict = {}
    rows = []
    saved_dir, saved_listener = triton.knobs.cache.dir, triton.knobs.compilation.listener
    with tempfile.TemporaryDirectory() as cache:
        triton.knobs.cache.dir = cache
        triton.knobs.compilation.listener = lambda **kw: stages.update(vars(kw["times"]))
        try:
            for spec, req in found.items():
                stages.clear()
                t0 = time.perf_counter()
                kernel = compile_task({"module": req["module"], "name": req["name"],
                                       "spec": spec, "target": [target.backend, target.arch,
                                                                target.warp_size]})
                rows.append({
                    "kernel": req["name"], "configs": req["configs"],
                    "seconds": round(time.perf_counter() - t0, 2),
                    "stages_s": {k: round(v / 1e6, 2)
                                 for k, v in stages.get("lowering_stages", [])},
                    "ptx_lines": kernel.asm["ptx"].count("\n"),
                    "cubin_bytes": len(kernel.asm["cubin"]),
                })
                print(f"{time.perf_counter() - t0:7.1f} s  {rows[-1]['ptx_lines']:8d} PTX "
                      f"lines  {req['name']}  ({', '.join(req['configs'])})", flush=True)
        finally:
            triton.knobs.cache.dir = saved_dir
            triton.knobs.compilation.listener = saved_listener
    return rows


def main(argv: list[str] | None = None) -> int:
    from precisionlab.atomic import json_out_error
    from precisionlab.studies.advise import (
        DEFAULT_CHECKPOINTS,
        DEFAULT_FORMATS,
        DEFAULT_WINDOWS,
    )

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3.5-4b")
    ap.add_argument("--formats", nargs="+", default=list(DEFAULT_FORMATS))
    ap.add_argument("--designs", nargs="+", choices=("shared", "split"),
                    default=["shared", "split"])
    ap.add_argument("--checkpoint-format", nargs="+", default=list(DEFAULT_CHECKPOINTS))
    ap.add_argument("--windows", nargs="+", type=int, default=list(DEFAULT_WINDOWS))
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--arch", type=int, default=90, help="CUDA compute capability, e.g. 90")
    ap.add_argument("--out", default=None, help="JSON file for the compile times")
    a = ap.parse_args(argv)
    if min(a.windows) < 1:
        print("error: --windows must be at least 1", file=sys.stderr)
        return 2
    if a.batch < 1:
        print("error: --batch must be at least 1", file=sys.stderr)
        return 2
    if not 75 <= a.arch < 1000:
        print("error: --arch takes a CUDA compute capability of 75 or more, e.g. 90",
              file=sys.stderr)
        return 2
    if why := json_out_error(a.out):
        print(f"error: {why}", file=sys.stderr)
        return 2
    from precisionlab.formats import get as get_format
    from precisionlab.presets import get_preset

    try:
        get_preset(a.model)
        for name in (*a.formats, *a.checkpoint_format):
            get_format(name)
    except KeyError as exc:
        print(f"error: {exc.args[0]}", file=sys.stderr)
        return 2
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("error: compile times are for a GPU target: unset TRITON_INTERPRET",
              file=sys.stderr)
        return 2
    import triton
    from triton.backends.compiler import GPUTarget

    from precisionlab.atomic import write_json

    target = GPUTarget("cuda", a.arch, 32)
    saved = triton.runtime.driver._active  # None until a driver is first asked for
    triton.runtime.driver.set_active(StandInDriver(target))
    try:
        found = kernel_requests(a.model, a.formats, a.designs, a.checkpoint_format, a.windows,
                                a.batch)
        rows = compile_all(found, target)
    except Exception as exc:  # a kernel the target's compiler refuses
        cause = exc  # Triton's CompilationErrors chain down to the reason
        while cause.__cause__ is not None:
            cause = cause.__cause__
        why = f"{type(cause).__name__}: {cause}".strip().splitlines()
        print(f"error: compiling for sm_{a.arch} failed: {why[0][:300]}", file=sys.stderr)
        return 1
    finally:
        triton.runtime.driver.set_active(saved)
    total = sum(r["seconds"] for r in rows)
    print(f"{len(rows)} kernels, {total:.1f} s compiled one after another "
          f"(sm_{a.arch}, triton {triton.__version__})")
    if a.out:
        write_json(Path(a.out), {"model": a.model, "batch": a.batch, "arch": a.arch,
                                 "triton": triton.__version__, "kernels": rows,
                                 "total_s": round(total, 2)}, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

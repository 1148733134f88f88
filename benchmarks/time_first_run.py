"""Wall time of a first ``advise`` sweep on the kernels, with Triton's disk cache empty,
with and without the parallel compile that precedes a triton-backend run
(``precisionlab.kernels.precompile``: on worker processes, or ``precompile-threads`` on
threads of the one process), then once more with the cache filled.

Each timed run is a fresh Python process with its own empty cache folder, so every run
but the last compiles everything it launches:

    python benchmarks/time_first_run.py --model nemotron-3-nano-4b --out first_run.json
    python benchmarks/time_first_run.py --model qwen3.5-4b --modes precompile warm-cache \
        --limit 240 --out first_run.json     # runs in the given order, each at most 240 s

The sweep is ``precisionlab advise``'s default one (fp8-e4m3 and nvfp4; shared, split
with an fp32 and an fp16-sr checkpoint; L = 4, 16, 64) over ``--steps`` steps at batch
2.  The runs' final errors must agree bit for bit; the JSON records whether they do.
Exit 2 with one line on bad arguments or without a GPU; the JSON is written whole or
not at all.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # after the installed packages: kernels/ must not shadow one

MODES = ("no-precompile", "precompile", "precompile-threads", "warm-cache")


def child(model: str, steps: int, mode: str) -> dict:
    """One sweep in this process: wall seconds, the final errors and, where the kernels
    were compiled first, how many and in how long."""
    from contextlib import contextmanager

    import triton

    from precisionlab import engine
    from precisionlab.kernels import precompile as pc
    from precisionlab.studies.advise import advise

    compiles: list[dict] = []
    compiling: list[bool] = []  # non-empty while the kernels are compiled first
    only = pc.compile_only

    @contextmanager
    def timed(workers=None, processes=True):
        t = time.perf_counter()
        compiling.append(True)
        try:
            with only(workers, processes and mode != "precompile-threads") as report:
                yield report
        finally:
            compiling.clear()
        row = {"seconds": time.perf_counter() - t, "kernels": report.kernels,
               "workers": pc.default_workers(),
               "phases": {k: round(v, 3) for k, v in report.phases.items()},
               "compiled_here": report.compiled_here, "worker_exits": report.worker_exits,
               "in_workers": report.in_workers, "on_disk": report.on_disk,
               "slowest": sorted(report.worker_seconds, key=lambda c: -c[1])[:5],
               "worker_errors": report.worker_errors[:5]}
        print(f"[{time.perf_counter() - t0:6.1f} s] kernels compiled: {row}", file=sys.stderr,
              flush=True)
        row["timeline"] = report.timeline
        compiles.append(row)

    pc.compile_only = timed
    if mode == "no-precompile":
        engine._precompile = lambda *args, **kwargs: None
    t0 = time.perf_counter()
    in_run: list[str] = []  # kernels compiled by the run itself, after any precompile

    def compiled(*args, **kwargs) -> None:
        info = kwargs["fn"]
        if info.module.startswith("precisionlab.") and not compiling:
            in_run.append(info.name)
            print(f"[{time.perf_counter() - t0:6.1f} s] compiled in the run: {info.name}",
                  file=sys.stderr, flush=True)

    triton.knobs.runtime.jit_post_compile_hook = compiled

    def progress(done: int, total: int) -> None:
        if done in (1, total) or done % max(1, total // 8) == 0:
            print(f"[{time.perf_counter() - t0:6.1f} s] step {done} of {total}",
                  file=sys.stderr, flush=True)

    ds = advise(model, max_value=0.05, steps=steps, batch=2, backend="triton", device="cuda",
                progress=progress)
    wall = time.perf_counter() - t0
    final = ds["rel_err"].isel(step=-1).values
    return {"wall_s": wall, "compile": compiles, "compiled_in_run": len(in_run),
            "final": [float(v) for v in final.ravel()]}


def run_child(model: str, steps: int, mode: str, cache: str, limit: float | None,
              quiet: bool = True, workers: int | None = None) -> dict:
    """One timed run in a fresh process; past ``limit`` seconds it is stopped and the row
    says so (``cut_off_s``) instead of giving times.  Unless ``quiet``, the run's
    progress lines (compile done, steps) pass through to stderr as they come.
    ``workers`` caps the run's compile workers (``PRECISIONLAB_COMPILE_WORKERS``)."""
    env = dict(os.environ, TRITON_CACHE_DIR=cache)
    if workers is not None:
        env["PRECISIONLAB_COMPILE_WORKERS"] = str(workers)
    cmd = [sys.executable, __file__, "--child", mode, "--model", model, "--steps", str(steps)]
    t0 = time.perf_counter()
    try:
        out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
                             if quiet else None, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return {"cut_off_s": limit, "final": None}
    if out.returncode != 0:
        why = out.stderr.strip()[-600:] if quiet else "see its output above"
        raise RuntimeError(f"{mode} run exited {out.returncode}: {why}")
    row = json.loads(out.stdout.strip().splitlines()[-1])
    row["process_s"] = time.perf_counter() - t0
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="nemotron-3-nano-4b")
    ap.add_argument("--steps", type=int, default=1024)
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES),
                    help="runs to time, in this order (warm-cache reuses the cache of a "
                         "precompile run before it)")
    ap.add_argument("--limit", type=float, default=None,
                    help="seconds a run may take before it is stopped and noted as cut off")
    ap.add_argument("--out", default=None, help="JSON file for the timings")
    ap.add_argument("--verbose", action="store_true",
                    help="show each run's progress (compile done, steps) as it comes")
    ap.add_argument("--workers", type=int, default=None,
                    help="compile workers at most (default: the library's cap, 16 or "
                         "PRECISIONLAB_COMPILE_WORKERS, or the CPUs available if fewer)")
    ap.add_argument("--child", choices=MODES, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    from precisionlab.atomic import json_out_error

    if a.steps < 1:
        print("error: --steps must be at least 1", file=sys.stderr)
        return 2
    if a.limit is not None and not a.limit > 0:
        print("error: --limit must be a positive number of seconds", file=sys.stderr)
        return 2
    if a.workers is not None and a.workers < 1:
        print("error: --workers must be at least 1", file=sys.stderr)
        return 2
    modes = list(dict.fromkeys(a.modes))
    if "warm-cache" in modes and "precompile" not in modes[:modes.index("warm-cache")]:
        print("error: --modes warm-cache needs a precompile run before it", file=sys.stderr)
        return 2
    if why := json_out_error(a.out):
        print(f"error: {why}", file=sys.stderr)
        return 2
    if a.child is not None:
        print(json.dumps(child(a.model, a.steps, a.child)))
        return 0
    import torch

    from precisionlab.atomic import write_json
    from precisionlab.kernels.precompile import available_cpus
    from precisionlab.presets import get_preset

    try:
        get_preset(a.model)
    except KeyError as exc:
        print(f"error: {exc.args[0]}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("error: timing the kernels' first run needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = {}
    with tempfile.TemporaryDirectory() as caches:
        for mode in modes:  # warm-cache reuses the precompile run's cache
            cache = os.path.join(caches, "precompile" if mode == "warm-cache" else mode)
            try:
                rows[mode] = r = run_child(a.model, a.steps, mode, cache, a.limit,
                                            quiet=not a.verbose, workers=a.workers)
            except RuntimeError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 1
            if "cut_off_s" in r:
                print(f"{mode:18s} cut off after {a.limit:.0f} s", flush=True)
            else:
                pre = "".join(f"   compile {c['seconds']:6.1f} s ({c['kernels']} kernels, "
                              f"{c['workers']} workers: "
                              f"{c['in_workers']} in workers, {c['on_disk']} on disk, "
                              f"{c['compiled_here']} compiled here)"
                              for c in r["compile"])
                print(f"{mode:18s} sweep {r['wall_s']:7.1f} s   process "
                      f"{r['process_s']:7.1f} s{pre}", flush=True)
    finals = [f for f in (r.pop("final") for r in rows.values()) if f is not None]
    result = {"model": a.model, "steps": a.steps, "batch": 2,
              "configurations": len(finals[0]) if finals else None,
              "cpu_count": os.cpu_count(), "cpus_available": available_cpus(),
              "device": torch.cuda.get_device_name(),
              "same_results": all(f == finals[0] for f in finals), "runs": rows}
    print(f"same results: {result['same_results']}")
    if a.out:
        write_json(Path(a.out), result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

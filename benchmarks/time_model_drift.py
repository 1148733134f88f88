"""Wall time of the model-level drift study per backend: the first run in a process
(model build, prompt, compiles and autotuning of whatever kernels the model binds) and
a second, warm run, whose decode steps are timed from the study's progress ticks.

    python benchmarks/time_model_drift.py --model qwen3.5-4b --layers 2 --format nvfp4 \\
        --steps 64 --backends torch triton --device cuda --out model_time.json

Each backend's final logit errors are reported too, so the backends' agreement is in
the same file.  Exit 2 with one line on bad arguments; the JSON is written whole or
not at all.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # after the installed packages: kernels/ must not shadow one

from precisionlab.engine import BACKENDS, DEVICES  # noqa: E402


def timed_run(kwargs: dict) -> dict:
    """One ``model_drift`` call (two steps or more): total seconds, seconds per decode
    step (ticks 1..N), and the final relative logit error of each configuration."""
    from precisionlab.studies.model_drift import model_drift

    ticks: list[float] = []
    t0 = time.perf_counter()
    ds = model_drift(progress=lambda done, n: ticks.append(time.perf_counter()), **kwargs)
    total = time.perf_counter() - t0
    per_step = (ticks[-1] - ticks[0]) / (len(ticks) - 1)
    final = ds["rel_err"].isel(step=-1)
    errors = {f"{d}/{f}/L{w}": float(final.sel(design=d, format=f, window=w))
              for d in ds.design.values for f in ds.format.values for w in ds.window.values}
    return {"total_s": total, "step_ms": 1e3 * per_step,
            "before_first_step_s": ticks[0] - t0,
            "backend": ds.attrs["backend"], "device": ds.attrs["device"],
            "final_rel_err": errors}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3.5-4b")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--format", dest="formats", action="append", default=None)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--backends", nargs="+", default=["torch", "triton"], choices=BACKENDS)
    ap.add_argument("--device", default="auto", choices=DEVICES)
    ap.add_argument("--out", default=None, help="JSON summary")
    args = ap.parse_args(argv)
    for name in ("layers", "window", "batch"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1")
    if args.steps < 2:
        ap.error("--steps must be >= 2 (a step time needs two progress ticks)")
    from precisionlab.export import ResultError, check_writable

    try:
        if args.out:
            check_writable(args.out, (".json",))
    except ResultError as e:
        ap.error(str(e))
    from precisionlab.studies.drift import StudyError

    kwargs = dict(model=args.model, formats=args.formats or ["nvfp4"], windows=args.window,
                  steps=args.steps, layers=args.layers, batch=args.batch, device=args.device)
    runs = {}
    try:
        for backend in args.backends:
            cold = timed_run({**kwargs, "backend": backend})
            warm = timed_run({**kwargs, "backend": backend})
            runs[backend] = {"cold": cold, "warm": warm}
            print(f"{backend:>6}: cold {cold['total_s']:.1f} s, warm {warm['total_s']:.1f} s "
                  f"({warm['before_first_step_s']:.1f} s before the first step, "
                  f"{warm['step_ms']:.1f} ms per step)")
    except StudyError as e:
        print(f"time_model_drift.py: {e}", file=sys.stderr)
        return 2
    if args.out:
        from precisionlab.atomic import write_json
        from precisionlab.studies.drift import versions

        write_json(args.out, {
            "command": " ".join(["python", "benchmarks/time_model_drift.py", *sys.argv[1:]]),
            "settings": kwargs, "versions": versions(), "runs": runs}, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

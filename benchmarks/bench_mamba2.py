"""Mamba-2 kernel benchmark (script wrapper of precisionlab.studies.bench_mamba2).

    python benchmarks/bench_mamba2.py --mamba-ssm-path /path/to/mamba --out bench.json

Needs a CUDA GPU.  ``--mamba-ssm-path`` points at a state-spaces/mamba checkout;
only its Triton ``selective_state_update`` is loaded (the peer), nothing is copied.
Writes the JSON summary (cells, attrs, targets) and, with ``--nc``, the Dataset.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time


def _table(res: dict) -> str:
    rows = ["model | batch | L | kernel | us/step | out us (first..last) | flush us | "
            "TB/s | out %read | flush %copy | x peer",
            "---|---|---|---|---|---|---|---|---|---|---"]

    def f(v, fmt="{:.1f}"):
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)

    for c in res["cells"]:
        first, last = c.get("us_output_first"), c.get("us_output_last")
        outs = f"{f(c.get('us_output'))} ({f(first)}..{f(last)})" if first else "-"
        rows.append(" | ".join([
            str(c["model"]), str(c["batch"]), str(c["window"]), str(c["kernel"]),
            f(c["us_step"]), outs, f(c.get("us_flush")), f(c.get("TBps_step"), "{:.2f}"),
            f(c.get("frac_read_output"), "{:.0%}"), f(c.get("frac_copy_flush"), "{:.0%}"),
            f(c.get("speedup_vs_peer"), "{:.2f}")]))
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+",
                    default=["nemotron-3-nano-4b", "nemotron-3-super-120b"])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 64, 256])
    ap.add_argument("--windows", nargs="+", type=int, default=[16])
    ap.add_argument("--extra-windows", nargs="*", type=int, default=[4, 8, 32])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-tune", action="store_true")
    ap.add_argument("--mamba-ssm-path", default=None)
    ap.add_argument("--kernels", nargs="+", default=None,
                    help="subset of conventional mamba_ssm replay-fp32 split-fp32-fp8 "
                         "split-fp16sr-nvfp4 verify-T4")
    ap.add_argument("--tune-batch", type=int, default=256)
    ap.add_argument("--phase", choices=["bench", "warm"], default="bench",
                    help="warm: only compile the tuning candidates (Triton's disk cache); "
                         "run several with --shard i --shards n side by side first")
    ap.add_argument("--shard", type=int, default=0)
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--out", default="bench_mamba2.json")
    ap.add_argument("--nc", default=None, help="also write the Dataset (.nc / .zarr)")
    args = ap.parse_args(argv)

    from precisionlab.studies.bench_mamba2 import (
        KERNELS,
        bench_mamba2,
        bench_mamba2_results,
        warm_mamba2,
    )

    t0 = time.time()
    kernels = tuple(args.kernels or KERNELS)
    bad = [k for k in kernels if k not in KERNELS]
    if bad:
        ap.error(f"unknown kernel(s) {', '.join(bad)}; known: {', '.join(KERNELS)}")
    import torch

    if not torch.cuda.is_available():
        ap.error("the Mamba-2 kernel benchmark needs a CUDA GPU")
    if args.phase == "warm":
        n = warm_mamba2(args.models, batches=[args.tune_batch], window=args.windows[0],
                        kernels=kernels, shard=args.shard, shards=args.shards)
        print(f"warm shard {args.shard}/{args.shards}: {n} jobs, {time.time() - t0:.1f} s")
        return 0
    ds = bench_mamba2(args.models, args.batches, args.windows,
                      extra_windows=args.extra_windows, rounds=args.rounds,
                      tune=not args.no_tune, tune_batch=args.tune_batch, kernels=kernels,
                      mamba_ssm_path=args.mamba_ssm_path)
    res = bench_mamba2_results(ds)
    res["attrs"]["command"] = " ".join(sys.argv)
    res["attrs"]["wall_s"] = round(time.time() - t0, 1)
    from precisionlab.atomic import write_json

    write_json(args.out, res, indent=1, default=float)
    if args.nc:
        from precisionlab.export import save_result

        save_result(ds, args.nc)
    print(_table(res))
    print(json.dumps(res["targets"], indent=1))
    print(f"configs: {json.dumps(res['attrs'].get('configs_json'))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

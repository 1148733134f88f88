"""GPU benchmark of the fused Gated DeltaNet decode kernels against fla.

Usage:
  python benchmarks/bench_gdn.py [--phase sweep,bench] [--out DIR] [--models M ...]
      [--batches 1 64 256] [--windows 16] [--extra-windows 4 8 32]

``sweep`` times launch configurations (block of V rows, warps, fused vs split
launch) at batch 256 and batch 1 of the first model and keeps the fastest per
variant; ``bench`` runs ``precisionlab.studies.bench_gdn.bench_gdn`` with them and
prints the table (us per step, effective TB/s, fraction of the bandwidth roofline,
speed-up over fla).  JSON results go to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

SWEEP_256 = {
    "conventional": [{"block_v": 8, "num_warps": 1}, {"block_v": 16, "num_warps": 2},
                     {"block_v": 32, "num_warps": 4}, {"block_v": 64, "num_warps": 8}],
    "replay-fp32": [{"launch": "fused", "block_v": 64, "num_warps": 8},
                    {"launch": "split", "out_block_v": 64, "out_num_warps": 8},
                    {"launch": "split", "out_block_v": 64, "out_num_warps": 4},
                    {"launch": "split", "out_block_v": 128, "out_num_warps": 8}],
    "split-fp32-fp8": [{"launch": "fused", "block_v": 64, "num_warps": 8},
                       {"launch": "split", "out_block_v": 64, "out_num_warps": 4},
                       {"launch": "split", "out_block_v": 128, "out_num_warps": 8},
                       {"launch": "split", "out_block_v": 128, "out_num_warps": 4}],
    "split-fp16sr-nvfp4": [{"launch": "fused"},
                           {"launch": "split", "out_block_v": 128, "out_num_warps": 8},
                           {"launch": "split", "out_block_v": 128, "out_num_warps": 4},
                           {"launch": "split", "out_block_v": 64, "out_num_warps": 4}],
    "verify-T4": [{"block_v": 64, "num_warps": 8}, {"block_v": 32, "num_warps": 4}],
}
SWEEP_1 = {
    "conventional": [{"block_v": 8, "num_warps": 1}, {"block_v": 16, "num_warps": 1},
                     {"block_v": 16, "num_warps": 2}],
    "replay-fp32": [{"launch": "fused", "block_v": 16, "num_warps": 2},
                    {"launch": "split", "out_block_v": 8, "out_num_warps": 1},
                    {"launch": "split", "out_block_v": 16, "out_num_warps": 2}],
}
TUNABLE = ("block_v", "num_warps", "out_block_v", "out_num_warps", "launch")


def best(rows: list[dict]) -> dict:
    ok = [r for r in rows if "error" not in r and math.isfinite(r["us_per_step"])]
    if not ok:
        return {}
    r = min(ok, key=lambda r: r["us_per_step"])
    return {k: v for k, v in r.items() if k in TUNABLE}


def sweep(model: str, out: str, window: int) -> dict:
    from precisionlab.studies.bench_gdn import sweep_configs

    configs: dict = {}
    log = {}
    for batch, table in ((256, SWEEP_256), (1, SWEEP_1)):
        for variant, cands in table.items():
            t0 = time.time()
            rows = sweep_configs(model, batch, window, variant, cands)
            log[f"{variant}@{batch}"] = rows
            pick = best(rows)
            print(f"sweep {variant:20s} b={batch:<4d} {time.time() - t0:5.1f}s best {pick}")
            for r in rows:
                print("   ", {k: round(v, 2) if isinstance(v, float) else v
                              for k, v in r.items()})
            configs[(variant, batch)] = pick
    for variant in ("split-fp32-fp8", "split-fp16sr-nvfp4", "verify-T4"):
        small = dict(configs.get(("replay-fp32", 1), {}))
        if variant == "verify-T4":
            small = {}
        elif small.get("launch") == "fused":
            small = {}
        configs[(variant, 1)] = small
    for (variant, batch), cfg in list(configs.items()):
        if batch == 256:
            configs[(variant, 64)] = cfg
    with open(os.path.join(out, "gdn_sweep.json"), "w") as f:
        json.dump({"rows": log, "configs": {f"{v}@{b}": c for (v, b), c in configs.items()}},
                  f, indent=1)
    return configs


def table(ds) -> str:
    lines = []
    hdr = (f"{'model':14s} {'B':>4s} {'L':>3s} {'variant':20s} {'us/step':>9s} {'out':>8s} "
           f"{'flush':>8s} {'pos0':>7s} {'posL-2':>7s} {'TB/s':>6s} {'roof':>5s} {'xfla':>6s}")
    lines.append(hdr)
    for m in ds.model.values:
        for b in ds.batch.values:
            for w in ds.window.values:
                for v in ds.variant.values:
                    r = ds.sel(model=m, batch=b, window=w, variant=v)
                    us = float(r.us_per_step)
                    if not math.isfinite(us):
                        continue

                    def f(x, p=1):
                        x = float(x)
                        return f"{x:.{p}f}" if math.isfinite(x) else "-"

                    lines.append(
                        f"{m:14s} {b:4d} {w:3d} {v:20s} {us:9.1f} {f(r.us_output):>8s} "
                        f"{f(r.us_flush):>8s} {f(r.us_output_first):>7s} "
                        f"{f(r.us_output_last):>7s} {f(r.eff_TBps, 2):>6s} "
                        f"{f(r.frac_roofline, 2):>5s} {f(r.speedup_vs_fla, 2):>6s}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--phase", default="sweep,bench")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--models", nargs="+", default=["qwen3.5-4b", "qwen3.5-122b"])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 64, 256])
    ap.add_argument("--windows", nargs="+", type=int, default=[16])
    ap.add_argument("--extra-windows", nargs="+", type=int, default=[4, 8, 32])
    ap.add_argument("--configs", default=None, help="JSON file of configs (from a sweep)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--extra-models", nargs="*", default=None,
                    help="models that also run the extra windows (default: all)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    phases = args.phase.split(",")
    configs: dict = {}
    if args.configs:
        with open(args.configs) as f:
            raw = json.load(f)["configs"]
        configs = {(k.split("@")[0], int(k.split("@")[1])): v for k, v in raw.items()}
    if "sweep" in phases:
        configs = sweep(args.models[0], args.out, args.windows[0])
    if "bench" in phases:
        from precisionlab.studies.bench_gdn import bench_gdn

        t0 = time.time()
        stream = open(os.path.join(args.out, "gdn_bench_rows.jsonl"), "w")

        def on_result(row: dict) -> None:
            stream.write(json.dumps(row) + "\n")
            stream.flush()

        ds = bench_gdn(args.models, args.batches, args.windows,
                       extra_windows=args.extra_windows, extra_models=args.extra_models,
                       configs=configs, on_result=on_result,
                       device=args.device)
        stream.close()
        print(f"bench: {time.time() - t0:.1f}s", dict(ds.attrs))
        print(table(ds))
        with open(os.path.join(args.out, "gdn_bench.json"), "w") as f:
            json.dump(ds.to_dict(data="list"), f, default=float)
    sys.stdout.flush()


if __name__ == "__main__":
    main()

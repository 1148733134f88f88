"""GPU benchmark of the fused Gated DeltaNet decode kernels against fla.

Usage:
  python benchmarks/bench_gdn.py [--phase warm,sweep,bench] [--out DIR] [--models M ...]
      [--batches 1 64 256] [--windows 16] [--extra-windows 4 8 32]

``warm`` compiles the kernels in parallel processes (Triton's disk cache): before the
sweep its alternatives, after it the bench phase's configurations; ``sweep`` times a
few launch-configuration alternatives at batch 256 of the first model and keeps the
fastest per variant; ``bench`` runs
``precisionlab.studies.bench_gdn.bench_gdn`` with them and prints the table (us per
step, effective TB/s, fraction of the bandwidth roofline, speed-up over fla).  JSON
results go to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the package from this checkout, installed or not
    sys.path.append(str(ROOT))  # after the installed packages: kernels/ must not shadow one

# Launch configurations (keywords of kernels.gdn_decode.GDNReplayCache).  Batch 1: one
# fused launch per step (16-row programs; an nvfp4 copy's flush needs whole matrices:
# on small grids a head's programs each fold their rows and the last of them to post
# its amax encodes the copy, on larger ones the programs own whole matrices -- rows
# and warps left to the library; ring tiles loaded
# eagerly, before the clock).  Large
# batches: "staged" -- a persistent flush launch over whole-head units (16-row chunks,
# 2-stage pipeline, tf32x2 products), a prep launch (one program per sequence and
# k-head: ring products, coefficients) and an output launch of small tiles
# (out_block_v rows, out_num_warps) that reads only its rows of the copy and of the
# ring's d; register caps give 3 (flush) programs per SM without spilling; split designs
# encode by integer rounding, an nvfp4 flush's second pass reads an fp32 scratch.
# Verify: "staged-dot" (a prep launch for the drafts' products, then one read of each
# tile, all drafts' reductions as one tensor-core product).  These equal the library's
# defaults (kernels.gdn_decode.replay_defaults).
SMALL = {"conventional": {"block_v": 8, "num_warps": 1},
         "replay-fp32": {"launch": "fused", "block_v": 16},
         "split-fp32-fp8": {"launch": "fused", "block_v": 16, "fast_encode": True},
         "split-fp16sr-nvfp4": {"launch": "fused", "flush_chunk": 16, "fast_encode": True},
         "verify-T4": {"verify_block_v": 16, "verify_num_warps": 4, "verify_stages": 1,
                       "verify_launch": "single"}}
_FLUSH = {"block_v": 128, "num_warps": 4, "flush_chunk": 16, "flush_stages": 2,
          "maxnreg": 128, "flush_ctas_per_sm": 4}
# dense checkpoints (fp32 here): TMA loads of the chunks (tenth H200 run, qwen3.5-4b,
# batch 256, flush us: 4-warp programs at 168 registers, 3 per SM: fp8 1096 -> 999 with
# 3 stages, fp32 802 -> 780 with 2); then fewer warps per program: 1 warp, 255
# registers, 8 per SM, one stage: fp32 467, fp8 743 (in 2 warps, 4 per SM, 3 stages 845);
# the fp8 copy by the hardware conversion (eleventh run: 749 -> 609)
_TMA = {"flush_tma": True, "maxnreg": 255}
_ONE = {"out_tiles_per_program": 1, "out_stages": 1}
LARGE = {"conventional": {"block_v": 8, "num_warps": 1},
         "replay-fp32": {"launch": "staged", **_FLUSH, **_TMA, "num_warps": 1,
                         "flush_ctas_per_sm": 8, "flush_stages": 1, "out_block_v": 32,
                         "out_num_warps": 2, **_ONE},
         "split-fp32-fp8": {"launch": "staged", **_FLUSH, **_TMA, "num_warps": 1,
                            "flush_ctas_per_sm": 8, "flush_stages": 1, "out_block_v": 128,
                            "out_num_warps": 2, "out_tiles_per_program": 2, "out_stages": 2,
                            "out_mma": True, "fast_encode": True, "hw_fp8": True},
         # the output launch left to the library (128-row tensor-core tiles of 2 warps,
         # 4 per program but at most a k-head group's: 2 for qwen3.5-4b; naming
         # out_block_v alone would mean one tile per program), and so is the flush's
         # programs (1-warp TMA ones for qwen3.5-4b, 4-warp plain ones for qwen3.5-122b)
         "split-fp16sr-nvfp4": {"launch": "staged", "block_v": 128, "flush_chunk": 16,
                                "flush_pass": "scratch", "fast_encode": True},
         "verify-T4": {"verify_block_v": 16, "verify_num_warps": 1, "verify_stages": 2,
                       "verify_maxnreg": 0, "verify_launch": "staged-dot"}}
# keys of the output launch and of the flush launch: the sweep picks each group from
# the candidate with the fastest output step / flush (all candidates but the v2
# reference share the staged launch, so the flush kernels are the same)
OUT_KEYS = ("launch", "out_block_v", "out_num_warps", "out_tiles_per_program", "out_stages",
            "out_maxnreg", "eager", "prep_num_warps", "out_mma")
FLUSH_KEYS = ("block_v", "num_warps", "flush_chunk", "flush_stages", "maxnreg",
              "flush_ctas_per_sm", "dot_precision", "flush_licm", "flush_grid", "flush_pass",
              "fast_encode", "flush_prefetch", "flush_tma", "hw_fp8", "flush_ring_ahead")
# fp32 copies: the 16-row 1-warp tiles (the default before the thirty-sixth H200 run) or
# 32-row tiles over 4 warps; 32-row tiles over 2 warps hold fewer registers than the
# defaults (offline sm_90, qwen3.5-4b: nvfp4 96 against 128); an fp8 copy: 64-row tiles
# alone, or the 16-row 1-warp tiles with CUDA-core row sums (the default before the
# thirteenth H200 run)
_OUT_ALTS = {"replay-fp32": [{"out_block_v": 16, "out_num_warps": 1},
                             {"out_block_v": 32, "out_num_warps": 4}],
             "split-fp32-fp8": [{"out_block_v": 64, "out_num_warps": 2, **_ONE},
                                {"out_block_v": 16, "out_num_warps": 1, **_ONE,
                                 "out_mma": False}],
             "split-fp16sr-nvfp4": [{"out_block_v": 64, "out_num_warps": 2, **_ONE,
                                     "out_mma": False},
                                    {"out_block_v": 32, "out_num_warps": 1, **_ONE}]}
# (loop-invariant code motion in the flush's chunk loop is on by default for fp32 and
# 1-byte copies since the fourth H200 run; off is the alternative)
_FLUSH_ALTS = [{"flush_chunk": 32}, {"flush_licm": False}]
# flush alternatives of the split designs (measured on the H200, qwen3.5-4b, batch 256:
# one program per unit ("units") flushes faster -- nvfp4 1233 against 1356 us -- and its
# empty launch, ~9-14 us on the main stream, runs beside the output step since the
# flush has its own stream (nvfp4 161.4 against 164.3 us per step in the fourth run),
# but with nvfp4 its scratch is a full fp32 copy of the state, so it stays opt-in; 168
# registers and 3 programs per SM were the defaults before the 128 / 4 of the third)
_UNITS = {"flush_grid": "units"}
# plain loads in 4-warp programs at 128 registers, 4 per SM (the default before the
# tenth run)
_NO_TMA = {"flush_tma": False, "num_warps": 4, "maxnreg": 128, "flush_ctas_per_sm": 4,
           "flush_stages": 2}
_FLUSH_SPLIT = [_NO_TMA, {"fast_encode": False}]
# flush programs of 1-2 warps ("num_warps" is the flush launch's in the staged launch)
# with plain loads did not help (sixth H200 run, qwen3.5-4b, batch 256, flush us with 4
# / 2 (168 registers, 6 per SM) / 1 warps (255, 8 per SM): fp32 797 / 846 / 799, fp8
# 1075 / 1205 / 1286, nvfp4 1256 / 1456 / 2078); with TMA loads they do (the defaults
# above).  Alternatives: fp32 in 1-warp programs, 6 per SM, 2 stages (501 us), fp8 in
# 2-warp programs with 2 stages (865) or in 1-warp ones (6 per SM, 2 stages: 886)
_ONE_WARP = {"num_warps": 1, "flush_ctas_per_sm": 6, "flush_stages": 2}
# alternatives tried at (first model, batch 256, first window).  Tile counts per program
# assume 2 v-heads per k-head (qwen3.5).
# L2 prefetch in the flush's chunk loop (the default: one chunk ahead for fp32 and
# 1-byte copies; eighth H200 run, qwen3.5-4b, flush us with none / one / two ahead:
# fp32 805 / 784 / 790, fp8 1090 / 1055 / 1055, nvfp4 1256 / 1264 / 1266)
_PREFETCH = [{"flush_prefetch": 0}, {"flush_prefetch": 2}]
SWEEP = {
    "replay-fp32": _PREFETCH + _OUT_ALTS["replay-fp32"][:2] + _FLUSH_ALTS
    + [_UNITS, _ONE_WARP, _NO_TMA],
    # prep launch (11.7 us of a ~95 us output step, 1.7 waves of 2-warp programs on an
    # H200, Nsight Compute): 1 warp (the default since the fourth run: 156.8 -> 155.0
    # us per step), 2 or 4
    "split-fp32-fp8": _PREFETCH + _OUT_ALTS["split-fp32-fp8"][:2] + [
        # the fp8 copy by the integer-rounding encoder instead of the hardware
        # conversion (the default since the eleventh H200 run: flush 749 -> 609 us)
        {"hw_fp8": False},
        {"num_warps": 2, "flush_ctas_per_sm": 4, "flush_stages": 3},
        {"num_warps": 1, "flush_ctas_per_sm": 6, "flush_stages": 2},
        {"prep_num_warps": 2},
                                                         {"prep_num_warps": 4}]
    + _FLUSH_ALTS[:2] + _FLUSH_SPLIT + [{**_UNITS, "flush_ctas_per_sm": 3}],
    # TMA loads of the fp16-sr checkpoint in 1- or 2-warp programs of one stage (offline
    # sm_90, warp-instructions per chunk over both passes: 8372 with the default, 5889
    # with 1 warp (240 bytes of spill), 6428 with 2; eleventh H200 run, flush us:
    # 1353 / 1324 against 1312 with the default; 2 warps with plain loads: 1614)
    "split-fp16sr-nvfp4": _PREFETCH + _OUT_ALTS["split-fp16sr-nvfp4"][:2]
    + [{"flush_licm": True}, {"flush_pass": "recompute"}, {**_UNITS, "flush_ctas_per_sm": 3},
       {"maxnreg": 168, "flush_ctas_per_sm": 3}, {"fast_encode": False},
       {"flush_tma": True, "num_warps": 1, "maxnreg": 255, "flush_ctas_per_sm": 8,
        "flush_stages": 1},
       {"flush_tma": True, "num_warps": 2, "maxnreg": 255, "flush_ctas_per_sm": 4,
        "flush_stages": 1},
       # the copy encoded by a launch of its own, the flush writes the 16-bit checkpoint
       # alone: more warps per SM for its stochastic rounding, or a second TMA stage
       {"num_warps": 2, "maxnreg": 128, "flush_ctas_per_sm": 8, "flush_stages": 1},
       {"num_warps": 1, "maxnreg": 255, "flush_ctas_per_sm": 8, "flush_stages": 2},
       {"num_warps": 4, "maxnreg": 128, "flush_ctas_per_sm": 4, "flush_stages": 2}],
    # staged-dot: all drafts' reductions of a state tile as one tensor-core product
    # (593 -> 328 us against "staged" in the first timed sweep)
    "verify-T4": [{"verify_launch": "staged", "verify_block_v": 32, "verify_num_warps": 2},
                  {"verify_block_v": 32, "verify_num_warps": 2},
                  {"verify_stages": 1}, {"verify_block_v": 16, "verify_num_warps": 2},
                  {"verify_block_v": 64, "verify_num_warps": 2}],
}

# batch-1 alternatives (the fused launch; picked whole, by window mean)
SWEEP_SMALL = {"replay-fp32": [{"num_warps": 2}, {"num_warps": 4}, {"eager": False}],
               "verify-T4": [{"verify_launch": "staged-dot", "verify_num_warps": 1,
                              "verify_stages": 2}, {"verify_num_warps": 2}]}


# per-launch diagnosis (``--phase diag``): (variant, batch, overrides of LARGE / SMALL)
DIAG = [("split-fp32-fp8", 256, {}), ("split-fp16sr-nvfp4", 256, {}), ("replay-fp32", 1, {})]


def diag_jobs(model: str, window: int) -> list[tuple]:
    return [("diag", model, b, window, v, {**(LARGE if b >= 16 else SMALL)[v], **o})
            for v, b, o in DIAG]


def diagnose(jobs: list[tuple], out: str, deadline: float | None) -> None:
    """Per-launch times and registers of the DIAG configurations (OUT/gdn_diag.jsonl)."""
    import torch

    from precisionlab.studies import bench_gdn as bg

    clock = bg.Clock(torch.device("cuda"), reps=10)
    with open(os.path.join(out, "gdn_diag.jsonl"), "w") as f:
        for _, model, batch, window, variant, cfg in jobs:
            if deadline is not None and time.time() > deadline:
                break
            try:
                ckpt, read = bg.DESIGNS[variant]
                row = bg.diag_replay(bg.shape_of(model, batch), clock, ckpt, read, window, cfg,
                                     window // 2)
            except Exception as e:  # noqa: BLE001 - reported in the row
                row = {"error": f"{type(e).__name__}: {e}"[:300]}
            row = {"variant": variant, "batch": batch, **cfg, **row}
            f.write(json.dumps(row, default=str) + "\n")
            f.flush()
            print("diag", {k: round(v, 1) if isinstance(v, float) else v
                           for k, v in row.items()}, flush=True)


def pick(variant: str, rows: list[dict]) -> dict:
    """Overrides of ``variant`` from sweep rows: the output keys of the fastest output
    step and the flush keys of the fastest flush (replay designs), or the whole fastest
    configuration."""
    ok = [r for r in rows if "error" not in r]
    if not ok:
        return {}
    drop = ("us_per_step", "us_output", "us_flush", "us_commit")
    best = min(ok, key=lambda r: r["us_per_step"])
    if "us_output" not in best:
        return {k: v for k, v in best.items() if k not in drop}
    bo = min(ok, key=lambda r: r["us_output"])
    # flush keys: among the rows with the first (base) row's output keys -- the flush
    # alternatives -- the fastest window mean, since a flush launch also runs (and
    # returns at once) on every output step, which costs a one-program-per-unit grid more
    base = {k: rows[0].get(k) for k in OUT_KEYS}
    flush_rows = [r for r in ok if all(r.get(k) == v for k, v in base.items())]
    if flush_rows:
        bf = min(flush_rows, key=lambda r: r["us_per_step"])
    else:
        same = [r for r in ok if r.get("launch") == bo.get("launch")] or ok
        bf = min(same, key=lambda r: r["us_flush"])
    cfg = {k: v for k, v in best.items() if k not in drop}
    cfg.update({k: bo[k] for k in OUT_KEYS if k in bo})
    cfg.update({k: bf[k] for k in FLUSH_KEYS if k in bf})
    return cfg


def configs_for(batches, overrides=None) -> dict:
    """``{(variant, batch): config}`` from SMALL / LARGE and sweep overrides."""
    out = {}
    for b in batches:
        for v in LARGE:
            base = SMALL[v] if b < 16 else LARGE[v]
            key = v if b >= 16 else f"{v}@small"
            out[(v, b)] = {**base, **(overrides or {}).get(key, {})}
    return out


def _job(job: tuple) -> str:
    """Warm-up worker: run one benchmark configuration once (compiles its kernels)."""
    import torch

    from precisionlab.studies import bench_gdn as bg

    kind, model, batch, window, variant, cfg = job
    try:
        clock = bg.Clock(torch.device("cuda"), reps=1)
        s = bg.shape_of(model, batch)
        if variant == "fla":
            bg.time_fla(s, clock)
        elif variant == "conventional":
            bg.time_conventional(s, clock, cfg)
        elif kind == "diag":
            ckpt, read = bg.DESIGNS[variant]
            bg.diag_replay(s, clock, ckpt, read, window, cfg, window // 2)
        elif variant.startswith("verify-T"):
            bg.time_verify(s, clock, int(variant[8:]), window, cfg)
        else:
            ckpt, read = bg.DESIGNS[variant]
            bg.time_replay(s, clock, ckpt, read, window, 1, cfg)
        return "ok"
    except Exception as e:  # noqa: BLE001 - reported, the timed run will fail loudly
        return f"{job}: {type(e).__name__}: {e}"[:300]


def warm(jobs: list[tuple], workers: int) -> None:
    """Compile every kernel the run needs in parallel processes (shared disk cache)."""
    import multiprocessing as mp

    t0 = time.time()
    with mp.get_context("spawn").Pool(workers) as pool:
        res = pool.map(_job, jobs, chunksize=1)
    bad = [r for r in res if r != "ok"]
    print(f"warm: {len(jobs)} jobs, {workers} workers, {time.time() - t0:.1f}s, "
          f"{len(bad)} failed", *bad[:5], sep="\n  ")


def plan(models, batches, windows, extra_windows, extra_models, configs=None) -> list[tuple]:
    """Warm-up jobs of the bench phase: every (model, batch, window, variant) with its
    configuration (``configs`` from :func:`configs_for`; SMALL / LARGE by default)."""
    configs = configs or configs_for(batches)
    jobs = []
    for m in models:
        for b in batches:
            wins = list(windows)
            if b == 256 and (extra_models is None or m in extra_models):
                wins += [w for w in extra_windows if w not in wins]
            jobs.append(("fla", m, b, 16, "fla", {}))
            for v in LARGE:
                for w in (wins if v != "conventional" else wins[:1]):
                    if v.startswith("verify") and w not in windows:
                        continue
                    jobs.append(("bench", m, b, w, v, configs[(v, b)]))
    return jobs


def plan_sweep(model: str, window: int) -> list[tuple]:
    """Warm-up jobs of the sweep phase: the LARGE configurations and their SWEEP
    alternatives at (model, batch 256, window)."""
    jobs = []
    for v, alts in SWEEP.items():
        for cfg in [LARGE[v]] + [{**LARGE[v], **o} for o in alts]:
            jobs.append(("bench", model, 256, window, v, cfg))
    for v, alts in SWEEP_SMALL.items():
        for cfg in [SMALL[v]] + [{**SMALL[v], **o} for o in alts]:
            jobs.append(("bench", model, 1, window, v, cfg))
    return jobs


def _report(key: str, rows: list[dict], log: dict, over: dict, out: str) -> None:
    """Print a sweep's pick and rows; (re)write OUT/gdn_sweep.json with all so far."""
    from precisionlab.atomic import write_json

    print(f"sweep {key}: picked {over[key]}")
    for r in rows:
        print("   ", {k: round(v, 1) if isinstance(v, float) else v for k, v in r.items()},
              flush=True)
    write_json(os.path.join(out, "gdn_sweep.json"), {"rows": log, "picked": over}, indent=1)


def sweep(model: str, window: int, out: str, deadline: float | None = None) -> dict:
    """Time the SWEEP alternatives at batch 256; returns per-variant overrides."""
    from precisionlab.studies.bench_gdn import sweep_configs

    over, log = {}, {}
    for variant, alts in SWEEP.items():
        base = LARGE[variant]
        cands = [base] + [{**base, **o} for o in alts]
        rows = sweep_configs(model, 256, window, variant, cands, rounds=2, reps=10,
                             deadline=deadline)
        log[variant] = rows
        over[variant] = pick(variant, rows)
        _report(variant, rows, log, over, out)
    for variant, alts in SWEEP_SMALL.items():  # batch 1: the fastest whole configuration
        base = SMALL[variant]
        rows = sweep_configs(model, 1, window, variant, [base] + [{**base, **o} for o in alts],
                             rounds=2, reps=10, deadline=deadline)
        key = f"{variant}@small"
        log[key] = rows
        ok = [r for r in rows if "error" not in r]
        best = min(ok, key=lambda r: r["us_per_step"]) if ok else {}
        over[key] = {k: v for k, v in best.items() if k not in base or base[k] != v} \
            if best else {}
        for k in ("us_per_step", "us_output", "us_flush", "us_commit"):
            over[key].pop(k, None)
        _report(key, rows, log, over, out)
    return over


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


def _start_tests(out: str, workers: int):
    """The GDN kernel tests in a subprocess (log: OUT/gdn_tests.log)."""
    import subprocess

    log = open(os.path.join(out, "gdn_tests.log"), "w")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           "tests/test_kernels_gdn.py"] + (["-n", str(workers)] if workers > 1 else [])
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


def _wait_tests(proc, out: str) -> None:
    if proc is None:
        return
    rc = proc.wait()
    with open(os.path.join(out, "gdn_tests.log")) as f:
        tail = f.read().strip().splitlines()[-3:]
    print(f"tests: exit {rc}", *tail, sep="\n  ", flush=True)


PHASES = ("warm", "diag", "sweep", "bench")


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--phase", default="warm,sweep,bench")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--models", nargs="+", default=["qwen3.5-4b", "qwen3.5-122b"])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 64, 256])
    ap.add_argument("--windows", nargs="+", type=int, default=[16])
    ap.add_argument("--extra-windows", nargs="+", type=int, default=[4, 8, 32])
    ap.add_argument("--extra-models", nargs="*", default=None,
                    help="models that also run the extra windows (default: all)")
    ap.add_argument("--workers", type=int, default=10)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--sweep-variants", nargs="*", default=None,
                    help="variants the sweep phase tunes (default: all in SWEEP)")
    ap.add_argument("--tests", type=int, default=0, metavar="N",
                    help="also run tests/test_kernels_gdn.py (N xdist workers) while the "
                    "kernels compile; timing starts after they finish")
    ap.add_argument("--budget", type=float, default=0.0,
                    help="seconds from the start after which no new timing starts (0: none)")
    args = ap.parse_args()
    phases = args.phase.split(",")
    bad = [p for p in phases if p not in PHASES]
    if bad:
        ap.error(f"unknown phase(s) {', '.join(bad)}; known: {', '.join(PHASES)}")
    bad = [v for v in args.sweep_variants or () if v not in LARGE]
    if bad:
        ap.error(f"unknown variant(s) {', '.join(bad)}; known: {', '.join(LARGE)}")
    if "diag" in phases and args.device != "cuda":
        ap.error("--phase diag times launches on a CUDA GPU (--device cuda)")
    if args.device == "cuda" and not _has_cuda():
        ap.error("no CUDA GPU here: the GDN kernel benchmark needs one (--device cuda)")
    os.makedirs(args.out, exist_ok=True)
    deadline = time.time() + args.budget if args.budget else None
    tests = _start_tests(args.out, args.tests) if args.tests else None
    if args.sweep_variants is not None:
        for v in list(SWEEP):
            if v not in args.sweep_variants:
                del SWEEP[v]
        for v in list(SWEEP_SMALL):
            if v not in args.sweep_variants:
                del SWEEP_SMALL[v]
    over = {}
    warmed = set()
    djobs = diag_jobs(args.models[0], args.windows[0]) if "diag" in phases else []
    if "warm" in phases:  # every kernel any phase may use, in one pool
        jobs = plan(args.models, args.batches, args.windows, args.extra_windows,
                    args.extra_models)
        if "sweep" in phases:
            jobs = plan_sweep(args.models[0], args.windows[0]) + jobs
        jobs = djobs + jobs
        warm(jobs, args.workers)
        warmed = {repr(j) for j in jobs}
    _wait_tests(tests, args.out)
    tests = None
    if djobs:
        diagnose(djobs, args.out, deadline)
    if "sweep" in phases:
        over = sweep(args.models[0], args.windows[0], args.out, deadline)
    configs = configs_for(args.batches, over)
    if "warm" in phases:  # the picked combinations not compiled yet
        jobs = [j for j in plan(args.models, args.batches, args.windows, args.extra_windows,
                                args.extra_models, configs) if repr(j) not in warmed]
        if jobs:
            warm(jobs, args.workers)
    if "bench" in phases:
        from precisionlab.studies.bench_gdn import bench_gdn

        t0 = time.time()
        stream = open(os.path.join(args.out, "gdn_bench_rows.jsonl"), "w")

        def on_result(row: dict) -> None:
            stream.write(json.dumps(row) + "\n")
            stream.flush()

        ds = bench_gdn(args.models, args.batches, args.windows,
                       extra_windows=args.extra_windows, extra_models=args.extra_models,
                       configs=configs, on_result=on_result, device=args.device,
                       deadline=deadline)
        stream.close()
        print(f"bench: {time.time() - t0:.1f}s", dict(ds.attrs))
        print(table(ds))
        from precisionlab.atomic import write_json

        write_json(os.path.join(args.out, "gdn_bench.json"), ds.to_dict(data="list"),
                   default=float)
    sys.stdout.flush()


if __name__ == "__main__":
    main()

"""The same drift study through the torch emulation and the Triton kernels on one
GPU: how closely the two backends' Datasets agree, and how long each takes.

Usage: python benchmarks/compare_backends.py [--steps N] [--batch B] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from precisionlab.atomic import write_json
from precisionlab.studies import drift

FORMATS = ["fp8-e4m3", "nvfp4"]
RTOL, ATOL = 5e-2, 5e-5  # tests/test_backends.py


def compare(model: str, steps: int, batch: int, checkpoint: str) -> dict:
    runs = {}
    for backend in ("torch", "triton"):
        t0 = time.perf_counter()
        ds = drift(model, FORMATS, windows=[16], checkpoint_format=checkpoint, steps=steps,
                   batch=batch, device="cuda", backend=backend)
        runs[backend] = (ds, time.perf_counter() - t0)
    a, b = runs["torch"][0]["rel_err"].values, runs["triton"][0]["rel_err"].values
    ok = np.isfinite(a) & np.isfinite(b)
    a, b = a[ok], b[ok]
    # relative to the torch figure plus the fp32 floor (ATOL): near a flush both
    # backends' errors fall to ~1e-7, where their last-bit differences are relative noise
    rel = np.abs(a - b) / (np.abs(a) + ATOL)
    return {
        "model": model, "steps": steps, "batch": batch, "checkpoint_format": checkpoint,
        "seconds_torch": runs["torch"][1], "seconds_triton": runs["triton"][1],
        "rel_err_final_torch": runs["torch"][0]["rel_err"].isel(step=-2).values.tolist(),
        "rel_err_final_triton": runs["triton"][0]["rel_err"].isel(step=-2).values.tolist(),
        "rel_err_relative_difference_median": float(np.median(rel)),
        "rel_err_relative_difference_max": float(rel.max()),
        "rel_err_abs_difference_max": float(np.abs(a - b).max()),
        "fraction_within_test_tolerance": float(np.mean(np.abs(a - b) <= ATOL + RTOL * np.abs(a))),
        "device": runs["triton"][0].attrs["device"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", nargs="+", default=["nemotron-3-nano-4b", "qwen3.5-4b"])
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--checkpoint-format", default="fp32")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    results = [compare(m, args.steps, args.batch, args.checkpoint_format) for m in args.models]
    print(json.dumps(results, indent=2))
    if args.out:
        write_json(args.out, results, indent=2)


if __name__ == "__main__":
    main()

"""Emulated decode steps per second of the drift engine.

Usage: python benchmarks/bench_engine.py [--model M] [--batch B] [--steps N] [--device D]
                                         [--backend torch|triton|auto]
The same as `precisionlab bench --what engine`.
"""

from __future__ import annotations

import argparse
import json

from precisionlab.studies.bench_engine import bench_engine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="nemotron-3-nano-4b")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--backend", default="torch", choices=("torch", "triton", "auto"))
    args = ap.parse_args()
    ds = bench_engine(args.model, args.batch, args.steps, device=args.device,
                      backend=args.backend)
    print(json.dumps({**{k: float(v) for k, v in ds.data_vars.items()}, **ds.attrs}, indent=2))


if __name__ == "__main__":
    main()

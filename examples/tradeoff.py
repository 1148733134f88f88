"""Drift against memory traffic: a window sweep of shared and split designs (fp32
and fp16-sr checkpoints) for fp8 and nvfp4 read copies, drawn as the error / traffic
trade-off with its frontier.

    python examples/tradeoff.py --model nemotron-3-nano-4b --steps 1024 --out examples/figures
"""

from __future__ import annotations

import argparse
from pathlib import Path

import precisionlab


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="nemotron-3-nano-4b")
    ap.add_argument("--steps", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--windows", type=int, nargs="+", default=[1, 4, 8, 16, 32, 64])
    ap.add_argument("--formats", nargs="+", default=["fp8-e4m3", "nvfp4"])
    ap.add_argument("--checkpoints", nargs="+", default=["fp32", "fp16-sr"])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--out", type=Path, default=Path("examples/figures"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    ds = precisionlab.window_sweep(args.model, args.formats, windows=args.windows,
                                   checkpoint_format=args.checkpoints, steps=args.steps,
                                   batch=args.batch, device=args.device)
    precisionlab.save_result(ds, args.out / f"{args.model}-tradeoff.nc")
    precisionlab.plot(ds, args.out / f"{args.model}-tradeoff.png", "tradeoff")
    table = precisionlab.summary(ds)
    print(table[table["frontier"]].sort_values("bytes_per_step")[
        ["bytes_per_step", "final", "growth"]].to_string())


if __name__ == "__main__":
    main()

"""Paired speedups against the peer (script wrapper of precisionlab.studies.paired):
our kernels and the peer timed in turn, round after round, in one process.

    python benchmarks/paired_bench.py --model nemotron-3-nano-4b --batch 1 --rounds 60 \\
        --mamba-ssm-path /path/to/mamba --out paired_nano_b1.json
    python benchmarks/paired_bench.py --model qwen3.5-4b --batch 1 --out paired_q4b_b1.json
    python benchmarks/paired_bench.py --model qwen3.5-4b --batch 256 --layers 8 --rounds 20

Each round replays every kernel's CUDA graph with a cold L2 -- a replay design's whole
window (flush included), else one step -- in an order rotated per round; the speedup
is the median over rounds of the within-round ratio (peer / ours) with a 95% bootstrap
interval.  Needs a CUDA GPU and the peer (mamba_ssm from a checkout or installed; fla
from the fla-core package).  Exit 2 with one line on bad arguments or without a GPU;
the JSON (and ``--nc`` Dataset) are written whole or not at all.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # after the installed packages: kernels/ must not shadow one

from precisionlab.studies.paired import (  # noqa: E402
    PairedError,
    check_paired,
    paired_bench,
    paired_summary,
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="nemotron-3-nano-4b")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--kernels", nargs="+", default=None,
                    help="conventional replay-fp32 split-fp32-fp8 split-fp16sr-nvfp4 "
                         "(default: all)")
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--layers", type=int, default=1,
                    help="layers each timed graph (the peer's too) runs in turn, each "
                         "with its own state; times per layer")
    ap.add_argument("--mamba-ssm-path", default=None,
                    help="a state-spaces/mamba checkout (Mamba-2 peer)")
    ap.add_argument("--out", default=None, help="JSON summary")
    ap.add_argument("--nc", default=None, help="also the Dataset (.nc / .zarr)")
    args = ap.parse_args(argv)
    try:
        check_paired(args.model, args.kernels, args.batch, args.window, args.rounds,
                     args.layers)
    except PairedError as e:
        ap.error(str(e))
    from precisionlab.export import ResultError, check_writable

    if args.out and not Path(args.out).resolve().parent.is_dir():
        ap.error(f"no directory for --out {args.out}")
    try:
        if args.nc:
            check_writable(args.nc)
    except ResultError as e:
        ap.error(str(e))
    if args.nc and Path(args.nc).suffix.lower() not in (".nc", ".zarr"):
        ap.error(f"--nc takes a .nc or .zarr path, got {args.nc}")

    import torch

    if not torch.cuda.is_available():
        print("paired_bench.py: needs a CUDA GPU", file=sys.stderr)
        return 2
    try:
        ds = paired_bench(args.model, batch=args.batch, window=args.window,
                          kernels=args.kernels, rounds=args.rounds,
                          mamba_ssm_path=args.mamba_ssm_path, layers=args.layers)
    except PairedError as e:  # the peer is missing
        print(f"paired_bench.py: {e}", file=sys.stderr)
        return 2
    summary = paired_summary(ds)
    summary["command"] = " ".join(["python", "benchmarks/paired_bench.py", *sys.argv[1:]])
    if args.out:
        from precisionlab.atomic import write_json

        write_json(args.out, summary, indent=2)
    if args.nc:
        from precisionlab.export import save_result

        save_result(ds, args.nc)
    return 0


if __name__ == "__main__":
    sys.exit(main())

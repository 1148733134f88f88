"""The headline comparison: shared vs split state for fp8 and nvfp4 over a long
generation, on a Mamba-2 preset (nemotron-3-nano-4b) and a GDN preset (qwen3.5-4b).

Writes one result file and two figures per model into the output folder:

    python examples/headline.py --steps 16384 --out examples/figures
"""

from __future__ import annotations

import argparse
from pathlib import Path

import precisionlab
from precisionlab.metrics import summarise

MODELS = ("nemotron-3-nano-4b", "qwen3.5-4b")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=16384)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--out", type=Path, default=Path("examples/figures"))
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for model in args.models:
        ds = precisionlab.compare(model, ["fp8-e4m3", "nvfp4"], windows=[args.window],
                                  steps=args.steps, batch=args.batch, device=args.device,
                                  backend="torch")
        precisionlab.save_result(ds, args.out / f"{model}.nc")
        precisionlab.plot(ds, args.out / f"{model}-curves.png", "curves")
        final = summarise(ds, "final")
        for fmt in ds["format"].values:
            s = final.sel(design="shared", format=fmt).item()
            p = final.sel(design="split", format=fmt).item()
            g = ds["growth"].sel(format=fmt)
            print(f"{model} {fmt} L={args.window}: final shared {s:.3e} split {p:.3e} "
                  f"(ratio {s / p:.1f}); growth shared {g.sel(design='shared').item():+.2f} "
                  f"split {g.sel(design='split').item():+.2f}")


if __name__ == "__main__":
    main()

"""Replay designs under two phase mixes: every sequence at the same ring position
("aligned": the whole batch flushes together every L steps, the benchmarks' default)
and sequences admitted on different steps ("staggered": sequence b starts at ring
position b mod L, so every step flushes about 1/L of the batch).  GDN designs are also
timed with the staged flush launch on the main stream (``concurrent_flush=False``)
next to the default second stream.  Per-step microseconds (window mean) to a JSON
file and a table.

    python benchmarks/bench_phases.py --out phases.json
    python benchmarks/bench_phases.py --mamba2 nemotron-3-super-120b --gdn --batch 64

Exit 2 with one line on bad arguments or without a GPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # after the installed packages: kernels/ must not shadow one

from precisionlab.atomic import write_json  # noqa: E402
from precisionlab.presets import get_preset  # noqa: E402

DESIGNS = ("replay-fp32", "split-fp32-fp8", "split-fp16sr-nvfp4")
PHASES = ("aligned", "staggered")


def _gdn_rows(model: str, batch: int, window: int, rounds: int) -> list[dict]:
    from precisionlab.studies import bench_gdn as bg

    clock = bg.Clock(torch.device("cuda"), 10)
    s = bg.shape_of(model, batch)
    rows = []
    for design in DESIGNS:
        ck, rd = bg.DESIGNS[design]
        for phases in PHASES:
            for conc in (True, False):
                cfg = {"phases": phases, "concurrent_flush": conc, "launch": "staged"}
                pos = bg.time_replay(s, clock, ck, rd, window, rounds, cfg)
                rows.append({"kind": "gdn", "model": model, "design": design,
                             "phases": phases, "concurrent_flush": conc,
                             "us_step": statistics.fmean(pos), "us_per_position": pos})
                _print(rows[-1])
    return rows


def _mamba2_rows(model: str, batch: int, window: int, rounds: int) -> list[dict]:
    from precisionlab.studies import bench_mamba2 as bm
    from precisionlab.timing import ColdL2Timer

    runner = bm._Runner(ColdL2Timer(torch.device("cuda")), rounds, lambda s: None)
    prob = bm._Problem(model, batch, torch.device("cuda"))
    rows = []
    for design in DESIGNS:
        ck, rd = bm.DESIGNS[design]
        for phases in PHASES:
            pos = runner.replay(prob, ck, rd, window, {"launch": "split", "phases": phases})
            rows.append({"kind": "mamba2", "model": model, "design": design,
                         "phases": phases, "us_step": statistics.fmean(pos),
                         "us_per_position": pos})
            _print(rows[-1])
    return rows


def _print(row: dict) -> None:
    extra = "" if "concurrent_flush" not in row else \
        f" concurrent_flush={row['concurrent_flush']}"
    print(f"{row['model']:22s} {row['design']:20s} {row['phases']:9s} "
          f"{row['us_step']:8.1f} us/step{extra}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mamba2", nargs="*", default=["nemotron-3-nano-4b"],
                    help="Mamba-2 presets (none: skip)")
    ap.add_argument("--gdn", nargs="*", default=["qwen3.5-4b"], help="GDN presets (none: skip)")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None, help="JSON file of every row")
    args = ap.parse_args(argv)
    if args.batch < 16 or args.window < 2 or args.rounds < 1:
        ap.error("--batch must be >= 16 (the split launches), --window >= 2, --rounds >= 1")
    for kind, models in (("mamba2", args.mamba2), ("gdn", args.gdn)):
        for m in models:
            try:
                p = get_preset(m)
            except (KeyError, ValueError) as e:
                ap.error(f"--{kind}: {e}")
            if p.kind != kind:
                ap.error(f"--{kind}: {m} is a {p.kind} model")
    if not torch.cuda.is_available():
        print("bench_phases: needs a CUDA GPU", file=sys.stderr)
        return 2
    rows: list[dict] = []
    for m in args.mamba2:
        rows += _mamba2_rows(m, args.batch, args.window, args.rounds)
    for m in args.gdn:
        rows += _gdn_rows(m, args.batch, args.window, args.rounds)
    if args.out:
        meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                "batch": args.batch, "window": args.window, "rounds": args.rounds}
        write_json(args.out, {"meta": meta, "rows": rows}, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Time Mamba-2 split launch configurations side by side: for each ``--config`` (a
list of ``SplitConfig`` fields; empty = the defaults) one replay window of CUDA-graph
steps with a cold L2, as ``bench_mamba2.py`` times them, reporting the mean output
step, the flush and the window mean in microseconds.  The configurations run in one
process, in the order given, so they share the device's state and clocks; give the
defaults twice (first and last) to see the run's noise.

    python benchmarks/time_split_configs.py --model nemotron-3-nano-4b \\
        --design split-fp32-fp8 --config "" --config "maxnreg=96 out_weights=program" \\
        --out configs.json

Exit 2 with one line on bad arguments (every configuration is checked as the step
checks it before any GPU work) or without a GPU; the JSON is written whole or not at
all.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, Path(__file__).resolve().parent):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from profile_steps import DESIGNS, _check_split, _split_fields  # noqa: E402
from window_cli import (  # noqa: E402
    add_window_args,
    checked_preset,
    run_timed,
    window_row,
)

from precisionlab.kernels.mamba2_step import SplitConfig  # noqa: E402


def time_configs(model: str, design: str, configs: list[dict], batch: int, window: int,
                 rounds: int, log=print) -> list[dict]:
    """Output-step mean, flush and window mean (us) of each split configuration."""
    from precisionlab.studies.bench_mamba2 import _Problem, _Runner
    from precisionlab.timing import ColdL2Timer

    device = torch.device("cuda")
    runner = _Runner(ColdL2Timer(device), rounds, log)
    prob = _Problem(model, batch, device)
    ck, rd = DESIGNS[design]
    rows = []
    for fields in configs:
        times = runner.replay(prob, ck, rd, window, {"launch": "split", **fields})
        rows.append(window_row("config", fields, times, log))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="nemotron-3-nano-4b", help="a Mamba-2 preset")
    ap.add_argument("--design", choices=sorted(DESIGNS), default="split-fp32-fp8")
    ap.add_argument("--config", action="append", default=None, metavar='"F=V ..."',
                    help="SplitConfig fields (repeat for each configuration; \"\" = the "
                    "defaults)")
    add_window_args(ap)
    args = ap.parse_args(argv)
    preset = checked_preset(ap, args, ("mamba2",))
    ck, rd = DESIGNS[args.design]
    configs = []
    for text in args.config or [""]:
        try:
            fields = _split_fields(text.split())
            _check_split(SplitConfig(**fields), preset, ck, rd)
        except (ValueError, TypeError) as e:
            ap.error(f"--config {text!r}: {e}")
        configs.append(fields)
    return run_timed("time_split_configs", args, "configuration", lambda: time_configs(
        args.model, args.design, configs, args.batch, args.window, args.rounds))


if __name__ == "__main__":
    sys.exit(main())

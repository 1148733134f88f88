"""Time a replay design's window with the flush launches of a captured concurrent step in
a conditional graph node (``kernels/clocks.py``: they do not run at steps where no row
flushes) against plain launches whose programs start and exit: for each ``--setting``
one replay window of CUDA-graph steps with a cold L2, as the benchmarks time them,
reporting the mean output step, the flush step and the window mean in microseconds.
A setting is ``conditional=1`` or ``0`` and any launch settings (GDN cache keywords,
Mamba-2 ``SplitConfig`` fields); the settings run in one process, in the order given.

    python benchmarks/time_conditional_flush.py --model qwen3.5-4b --design split-fp32-fp8 \\
        --setting "conditional=1" --setting "conditional=0" \\
        --setting "conditional=1 flush_grid=units" --out cond.json

Exit 2 with one line on bad arguments or without a GPU; the JSON is written whole or
not at all.
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

from profile_steps import DESIGNS  # noqa: E402
from window_cli import (  # noqa: E402
    HEADER,
    add_window_args,
    checked_preset,
    time_window,
    window_row,
    write_rows,
)

from precisionlab.kernels import clocks  # noqa: E402
from precisionlab.presets import get_preset  # noqa: E402


def parse_setting(text: str) -> dict:
    """``{"conditional": True, "flush_grid": "units", ...}`` from ``"conditional=1
    flush_grid=units"``: integers, true / false, else strings; ``conditional`` (0 or 1)
    is required."""
    out: dict = {}
    for pair in text.split():
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"expected KEY=VALUE, got {pair!r}")
        if value.lower() in ("true", "false"):
            out[key] = value.lower() == "true"
        else:
            try:
                out[key] = int(value)
            except ValueError:
                out[key] = value
    if out.get("conditional") not in (0, 1):
        raise ValueError(f"conditional=0 or conditional=1 is required, got {text!r}")
    out["conditional"] = bool(out["conditional"])
    return out


def time_settings(model: str, design: str, settings: list[dict], batch: int, window: int,
                  rounds: int, log=print) -> list[dict]:
    """Output-step mean, flush step and window mean (us) under each setting; the
    module setting is restored afterwards."""
    kind = get_preset(model).kind
    ck, rd = DESIGNS[design]
    saved = clocks.CONDITIONAL_FLUSH
    rows = []
    try:
        for setting in settings:
            cfg = dict(setting)
            clocks.CONDITIONAL_FLUSH = cfg.pop("conditional")
            times = time_window(kind, model, ck, rd, batch, window, rounds, cfg)
            rows.append(window_row("setting", setting, times, log))
    finally:
        clocks.CONDITIONAL_FLUSH = saved
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3.5-4b", help="a GDN or Mamba-2 preset")
    ap.add_argument("--design", choices=sorted(DESIGNS), default="split-fp32-fp8")
    ap.add_argument("--setting", action="append", default=None, metavar='"K=V ..."',
                    help="conditional=0|1 and launch settings (repeat for each)")
    add_window_args(ap)
    args = ap.parse_args(argv)
    checked_preset(ap, args, ("gdn", "mamba2"))
    try:
        settings = [parse_setting(t) for t in args.setting or ["conditional=1",
                                                               "conditional=0"]]
    except ValueError as e:
        ap.error(f"--setting: {e}")
    if not torch.cuda.is_available():
        print("time_conditional_flush: needs a CUDA GPU", file=sys.stderr)
        return 2
    print(f"{HEADER}  setting ({args.model}, {args.design}, batch {args.batch}, "
          f"L = {args.window})")
    write_rows(args, time_settings(args.model, args.design, settings, args.batch,
                                   args.window, args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())

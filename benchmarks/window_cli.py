"""Shared pieces of the scripts that time one replay window per variant side by side
(``time_split_configs.py``, ``time_encode_launch.py``): the window arguments and their
checks, the preset lookup, the timing of a window, a result row per variant and the
JSON they write (whole or not at all)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import numpy as np
import torch

from precisionlab.atomic import write_json
from precisionlab.presets import get_preset

HEADER = f"{'output us':>9} {'flush us':>9} {'step us':>9}"
"""The columns of :func:`window_row`'s log line."""


def add_window_args(ap: argparse.ArgumentParser) -> None:
    """``--batch``, ``--window``, ``--rounds`` and ``--out``."""
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2, help="timed passes of the window")
    ap.add_argument("--out", default=None, help="JSON file of the results")


def checked_preset(ap: argparse.ArgumentParser, args: argparse.Namespace, kinds: tuple[str, ...]):
    """The preset of ``args.model`` after the window arguments' checks; a usage error
    (exit 2) where any fails or the model is of none of ``kinds``."""
    if args.batch < 1 or args.window < 2 or args.rounds < 1:
        ap.error("--batch and --rounds must be >= 1 and --window >= 2")
    try:
        preset = get_preset(args.model)
    except KeyError as e:
        ap.error(str(e).strip("'\""))
    if preset.kind not in kinds:
        ap.error(f"--model {args.model} is a {preset.kind} model, not {' or '.join(kinds)}")
    return preset


def time_window(kind: str, model: str, ck: str, rd: str | None, batch: int, window: int,
                rounds: int, cfg: dict | None = None) -> list[float]:
    """Per-ring-position times (us; the flush last) of one replay window of a design
    (checkpoint ``ck``, read copy ``rd``) as the benchmarks time it, CUDA-graph steps
    with a cold L2; ``cfg``: GDN cache keywords, or Mamba-2 ``SplitConfig`` fields of
    the split launch."""
    dev = torch.device("cuda")
    if kind == "gdn":
        from precisionlab.studies.bench_gdn import Clock, shape_of, time_replay

        return time_replay(shape_of(model, batch), Clock(dev), ck, rd, window, rounds,
                           dict(cfg or {}))
    from precisionlab.studies.bench_mamba2 import _Problem, _Runner
    from precisionlab.timing import ColdL2Timer

    runner = _Runner(ColdL2Timer(dev), rounds, lambda _: None)
    return runner.replay(_Problem(model, batch, dev), ck, rd, window,
                         {"launch": "split", **(cfg or {})})


def window_row(key: str, variant: dict, times: list[float], log=print) -> dict:
    """The row of one variant (``{key: variant}``) from a window's per-position times:
    mean output step, flush step and window mean (us); logs one line."""
    row = {key: variant, "us_output": round(float(np.mean(times[:-1])), 2),
           "us_flush": round(float(times[-1]), 1), "us_step": round(float(np.mean(times)), 2)}
    log(f"{row['us_output']:9.2f} {row['us_flush']:9.1f} {row['us_step']:9.2f}  "
        f"{variant or 'defaults'}")
    return row


def run_timed(script: str, args: argparse.Namespace, label: str,
              time_all: Callable[[], list[dict]]) -> int:
    """Exit status of a script that times its variants: 2 with one line without a GPU;
    else the header line (``label`` names the variants), the rows ``time_all`` logs and
    returns, and their JSON (:func:`write_rows`)."""
    if not torch.cuda.is_available():
        print(f"{script}: needs a CUDA GPU", file=sys.stderr)
        return 2
    print(f"{HEADER}  {label} ({args.model}, {args.design}, batch {args.batch}, "
          f"L = {args.window})")
    write_rows(args, time_all())
    return 0


def write_rows(args: argparse.Namespace, rows: list[dict]) -> None:
    """The results as JSON at ``args.out`` (if given), with the model, design, launch
    (where the script takes one), layers (where more than one), batch, window, device
    and torch version."""
    if args.out:
        extra = {"launch": args.launch} if hasattr(args, "launch") else {}
        if getattr(args, "layers", 1) > 1:
            extra["layers"] = args.layers
        write_json(args.out, {"model": args.model, "design": args.design, **extra,
                              "batch": args.batch, "window": args.window,
                              "device": torch.cuda.get_device_name(),
                              "torch": torch.__version__, "results": rows})

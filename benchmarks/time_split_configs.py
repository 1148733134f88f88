"""Time launch configurations of a replay design side by side: for each ``--config``
(Mamba-2: ``SplitConfig`` fields of the split launch; GDN: ``GDNReplayCache`` launch
keywords; empty = the defaults) one replay window of CUDA-graph steps with a cold L2,
as the benchmarks time them, reporting the mean output step, the flush and the window
mean in microseconds.  The configurations run in one process, in the order given, so
they share the device's state and clocks; give the defaults twice (first and last) to
see the run's noise.

    python benchmarks/time_split_configs.py --model nemotron-3-nano-4b \\
        --design split-fp32-fp8 --config "" --config "maxnreg=96 out_weights=program" \\
        --out configs.json
    python benchmarks/time_split_configs.py --model qwen3.5-4b \\
        --design split-fp16sr-nvfp4 --config "" --config "num_warps=2 maxnreg=128"
    python benchmarks/time_split_configs.py --launch fused --batch 1 \\
        --design replay-fp32 --config "" --config "num_warps=4"

``--launch fused`` (Mamba-2) times the one-launch kernel of small batches instead of
the split launch; its configurations take ``num_warps`` only.  ``--layers N``
times steps that run N layers of the design in turn, each with its own cache, so a
layer's L2 policies meet the other layers' traffic, as in a model's decode step; the
times are per layer:

    python benchmarks/time_split_configs.py --model qwen3.5-122b --layers 4 \
        --design split-fp32-fp8 --config "" --config "prep_keep=false"

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
        sys.path.append(str(p))  # after the installed packages (see bench_gdn.py)

from profile_steps import DESIGNS, _check_split, _split_fields, field_value  # noqa: E402
from window_cli import (  # noqa: E402
    add_window_args,
    checked_preset,
    run_timed,
    time_window,
    window_row,
)

from precisionlab.kernels.gdn_decode import GDNReplayCache  # noqa: E402
from precisionlab.kernels.mamba2_step import SplitConfig  # noqa: E402

GDN_FIXED = ("window", "checkpoint", "read", "ring_dtype", "drafts", "seed", "device",
             "batch_hint", "keep_fresh")
"""``GDNReplayCache`` keywords that the design and the timing fix (not ``--config``)."""


def gdn_keywords() -> dict:
    """The ``GDNReplayCache`` launch keywords a ``--config`` may set, by name (their
    ``inspect.Parameter``)."""
    import inspect

    params = inspect.signature(GDNReplayCache.__init__).parameters.values()
    return {q.name: q for q in params if q.kind == q.KEYWORD_ONLY and q.name not in GDN_FIXED}


def gdn_fields(pairs: list[str]) -> dict:
    """``GDNReplayCache`` keywords from ``key=value`` pairs (ints and true / false where
    they parse; a keyword annotated bool or int must parse as one)."""
    keys = gdn_keywords()
    fields = {}
    for p in pairs:
        key, sep, val = p.partition("=")
        if not sep or key not in keys:
            raise ValueError(f"want KEY=VALUE with a GDNReplayCache launch keyword, got {p!r}")
        value = field_value(val)
        kind = str(keys[key].annotation).split("|")[0].strip()
        if kind == "bool" and not isinstance(value, bool):
            raise ValueError(f"{key} must be true or false, got {val!r}")
        if kind == "int" and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"{key} must be an integer, got {val!r}")
        fields[key] = value
    return fields


def check_gdn(fields: dict, preset, ck: str, rd: str | None, batch: int, window: int) -> None:
    """Raise ValueError where a GDN cache of this design would refuse ``fields`` (a
    one-slot cache on the CPU with the batch's launch defaults)."""
    GDNReplayCache(1, preset.groups, preset.heads, preset.state_dim, preset.head_dim,
                   window=window, checkpoint=ck, read=rd, device="cpu", batch_hint=batch,
                   **fields)


FUSED_FIELDS = ("num_warps",)
"""The ``--config`` fields of a Mamba-2 ``--launch fused`` run."""


def time_configs(model: str, design: str, configs: list[dict], batch: int, window: int,
                 rounds: int, log=print, launch: str = "split", layers: int = 1) -> list[dict]:
    """Output-step mean, flush and window mean (us) of each configuration (Mamba-2:
    of the ``launch`` it names), per layer of ``layers`` stepped in turn."""
    from precisionlab.presets import get_preset
    from precisionlab.studies.bench_mamba2 import _Problem, _Runner

    if get_preset(model).kind == "gdn":
        ck, rd = DESIGNS[design]
        return [window_row("config", fields,
                           time_window("gdn", model, ck, rd, batch, window, rounds,
                                       {**fields, "layers": layers}),
                           log) for fields in configs]
    from precisionlab.timing import ColdL2Timer

    device = torch.device("cuda")
    runner = _Runner(ColdL2Timer(device), rounds, log, layers)
    prob = _Problem(model, batch, device)
    ck, rd = DESIGNS[design]
    rows = []
    for fields in configs:
        times = runner.replay(prob, ck, rd, window, {"launch": launch, **fields})
        rows.append(window_row("config", fields, times, log))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="nemotron-3-nano-4b", help="a Mamba-2 or GDN preset")
    ap.add_argument("--design", choices=sorted(DESIGNS), default="split-fp32-fp8")
    ap.add_argument("--config", action="append", default=None, metavar='"F=V ..."',
                    help="SplitConfig fields (Mamba-2) or GDNReplayCache launch keywords "
                    "(GDN); repeat for each configuration; \"\" = the defaults")
    ap.add_argument("--launch", choices=("split", "fused"), default="split",
                    help="Mamba-2: the split launch or the one-launch kernel of small "
                    "batches (field " + ", ".join(FUSED_FIELDS) + ")")
    ap.add_argument("--layers", type=int, default=1,
                    help="layers of the design that each timed step runs in turn, each "
                    "with its own cache (as a model's decode step; times per layer)")
    add_window_args(ap)
    args = ap.parse_args(argv)
    preset = checked_preset(ap, args, ("mamba2", "gdn"))
    if args.layers < 1:
        ap.error("--layers must be >= 1")
    if args.launch == "fused" and preset.kind == "gdn":
        ap.error("--launch fused is for Mamba-2 models")
    ck, rd = DESIGNS[args.design]
    configs = []
    for text in args.config or [""]:
        try:
            if preset.kind == "gdn":
                fields = gdn_fields(text.split())
                check_gdn(fields, preset, ck, rd, args.batch, args.window)
            else:
                fields = _split_fields(text.split())
                if args.launch == "fused" and set(fields) - set(FUSED_FIELDS):
                    raise ValueError(f"--launch fused takes {', '.join(FUSED_FIELDS)} only")
                _check_split(SplitConfig(**fields), preset, ck, rd)
        except (ValueError, TypeError) as e:
            ap.error(f"--config {text!r}: {e}")
        configs.append(fields)
    label = "configuration" if args.launch == "split" else "fused-launch configuration"
    return run_timed("time_split_configs", args, label, lambda: time_configs(
        args.model, args.design, configs, args.batch, args.window, args.rounds,
        launch=args.launch, layers=args.layers))


if __name__ == "__main__":
    sys.exit(main())

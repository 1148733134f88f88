"""Time the read-copy encode launch's program settings (``kernels/read_encode.py``: rows
per tile, warps per program, programs per SM) on a split design of either family: for
each ``--setting`` one replay window of CUDA-graph steps with a cold L2, as the
benchmarks time them, reporting the mean output step, the flush step (flush launch and
encode launch) and the window mean in microseconds.  The settings run in one process,
in the order given; give the defaults twice (first and last) to see the run's noise.
``at=flush`` times the flush encoding the copy itself instead (``read_encode="flush"``).

    python benchmarks/time_encode_launch.py --model qwen3.5-4b \\
        --setting "" --setting "rows=128 warps=8" --setting "regs=64 ctas=8" \\
        --setting "amax_bits=0" --setting "at=flush" --out encode.json

Exit 2 with one line on bad arguments or without a GPU; the JSON is written whole or
not at all.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, Path(__file__).resolve().parent):
    if str(p) not in sys.path:
        sys.path.append(str(p))  # after the installed packages (see bench_gdn.py)

from profile_steps import DESIGNS  # noqa: E402
from window_cli import (  # noqa: E402
    add_window_args,
    checked_preset,
    run_timed,
    time_window,
    window_row,
)

from precisionlab.kernels import read_encode  # noqa: E402
from precisionlab.kernels.read_encode import encodes_apart  # noqa: E402
from precisionlab.presets import get_preset  # noqa: E402

SETTINGS = {"rows": "ENCODE_ROWS", "warps": "ENCODE_WARPS", "ctas": "ENCODE_CTAS_PER_SM",
            "regs": "ENCODE_MAXNREG", "amax_bits": "ENCODE_AMAX_BITS"}
"""``--setting`` keys and the ``read_encode`` module settings they set."""
AT = ("launch", "flush")
"""Values of the ``at`` key: where the copy is encoded (the design's ``read_encode``)."""


def parse_setting(text: str) -> dict[str, int | str]:
    """``{"rows": 128, ...}`` from ``"rows=128 warps=8"`` (empty: the defaults)."""
    out = {}
    for pair in text.split():
        key, sep, value = pair.partition("=")
        if sep and key == "at":
            if value not in AT:
                raise ValueError(f"at must be one of {', '.join(AT)}, got {value!r}")
            out[key] = value
            continue
        if not sep or key not in SETTINGS:
            raise ValueError(f"expected KEY=INT with KEY one of {', '.join(SETTINGS)} (or "
                             f"at=launch|flush), got {pair!r}")
        try:
            out[key] = int(value)
        except ValueError:
            raise ValueError(f"{key} must be an integer, got {value!r}") from None
    if out.get("rows", 0) < 0 or out.get("rows", 16) % 16 or out.get("warps", 1) not in (
            1, 2, 4, 8, 16) or out.get("ctas", 1) < 1 or not (
            out.get("regs", 0) == 0 or 24 <= out.get("regs", 0) <= 255) or out.get(
            "amax_bits", 0) not in (0, 1):
        raise ValueError("rows must be 0 or a multiple of 16, warps 1, 2, 4, 8 or 16, "
                         "ctas >= 1, regs 0 or 24-255, amax_bits 0 or 1")
    return out


def time_settings(model: str, design: str, settings: list[dict], batch: int, window: int,
                  rounds: int, log=print) -> list[dict]:
    """Output-step mean, flush step and window mean (us) under each setting; the module
    settings are restored afterwards."""
    kind = get_preset(model).kind
    ck, rd = DESIGNS[design]
    saved = {name: getattr(read_encode, name) for name in SETTINGS.values()}
    rows = []
    try:
        for setting in settings:
            for key, name in SETTINGS.items():
                setattr(read_encode, name, setting.get(key, saved[name]))
            cfg = {"read_encode": setting["at"]} if "at" in setting else None
            times = time_window(kind, model, ck, rd, batch, window, rounds, cfg)
            rows.append(window_row("setting", setting, times, log))
    finally:
        for name, value in saved.items():
            setattr(read_encode, name, value)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3.5-4b", help="a GDN or Mamba-2 preset")
    ap.add_argument("--design", choices=sorted(DESIGNS), default="split-fp16sr-nvfp4")
    ap.add_argument("--setting", action="append", default=None, metavar='"K=V ..."',
                    help=f"encode-launch settings, keys {', '.join(SETTINGS)} and at "
                    "(launch or flush; repeat for each; \"\" = the defaults)")
    add_window_args(ap)
    args = ap.parse_args(argv)
    checked_preset(ap, args, ("gdn", "mamba2"))
    ck, rd = DESIGNS[args.design]
    if not encodes_apart(ck, rd):
        ap.error(f"--design {args.design}: its read copy is encoded in the flush")
    try:
        settings = [parse_setting(text) for text in args.setting or [""]]
    except ValueError as e:
        ap.error(f"--setting: {e}")
    return run_timed("time_encode_launch", args, "setting", lambda: time_settings(
        args.model, args.design, settings, args.batch, args.window, args.rounds))


if __name__ == "__main__":
    sys.exit(main())

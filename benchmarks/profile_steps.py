"""One window of replay steps under a profiler: the driver for hardware-counter runs
(Nsight Compute) of the Mamba-2 and GDN replay kernels.

The design's kernels are compiled in a first, unprofiled window; the profiled window
that follows runs ``--window`` plain launches (L - 1 output steps, then the flush)
between ``cudaProfilerStart`` / ``cudaProfilerStop``, so a profiler started with
``--profile-from-start off`` sees exactly one window.  Pick kernels and launches with
the profiler's own filters, e.g. the flush of a Mamba-2 fp8 split design:

    ncu --profile-from-start off --clock-control none -k regex:m2_flush \\
        --launch-skip 15 --launch-count 1 --section SpeedOfLight \\
        python benchmarks/profile_steps.py --kind mamba2 --design split-fp32-fp8

``--split FIELD=VALUE ...`` profiles a Mamba-2 launch configuration other than the
defaults (``SplitConfig`` fields, e.g. ``--split maxnreg=96 out_weights=program``).
``--design conventional`` and ``--design peer`` (Mamba-2) run ``--window`` steps of the
conventional fp32 kernel or of mamba_ssm's ``selective_state_update`` (loaded from
``--mamba-ssm-path``) the same way, for the same counters of the baselines.

Exit 2 with one line on bad arguments or without a GPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # after the installed packages: kernels/ must not shadow one

from precisionlab.presets import get_preset  # noqa: E402

DESIGNS = {"replay-fp32": ("fp32", None), "split-fp32-fp8": ("fp32", "fp8-e4m3"),
           "split-fp16sr-nvfp4": ("fp16-sr", "nvfp4")}
BASELINES = ("conventional", "peer")
"""Mamba-2 only: the conventional fp32 step, and mamba_ssm's ``selective_state_update``
(``--mamba-ssm-path``), ``--window`` steps of each."""
MODELS = {"mamba2": "nemotron-3-nano-4b", "gdn": "qwen3.5-4b"}


def _split_fields(pairs: list[str]) -> dict:
    """``SplitConfig`` fields from ``field=value`` pairs (ints and true / false where
    they parse)."""
    from precisionlab.kernels.mamba2_step import SplitConfig

    fields = {}
    for p in pairs:
        key, sep, val = p.partition("=")
        if not sep or key not in SplitConfig.__dataclass_fields__:
            raise ValueError(f"want FIELD=VALUE with a SplitConfig field, got {p!r}")
        fields[key] = field_value(val)
    return fields


def field_value(val: str) -> int | bool | str:
    """A ``--split`` / ``--config`` value: an int or true / false where it parses, else
    the text."""
    return int(val) if val.lstrip("-").isdigit() else {"true": True, "false": False}.get(
        val.lower(), val)


def _split_config(pairs: list[str]):
    """``SplitConfig`` from ``field=value`` pairs (:func:`_split_fields`)."""
    from precisionlab.kernels.mamba2_step import SplitConfig

    return SplitConfig(**_split_fields(pairs))


def _check_split(cfg, preset, ck: str, rd: str | None) -> None:
    """Raise ValueError where the split step would refuse ``cfg`` at these shapes."""
    from precisionlab.kernels.mamba2_step import _split_defaults
    from precisionlab.kernels.state import DENSE_FORMATS
    from precisionlab.kernels.tl_formats import format_id

    _split_defaults(cfg, preset.head_dim, preset.state_dim, preset.heads, preset.groups,
                    format_id(rd or ck), "nvfp4" in (ck, rd), ck in DENSE_FORMATS)


def _mamba2_step(model: str, batch: int, ck: str, rd: str | None, L: int, device,
                 split_config):
    from precisionlab.kernels.mamba2_step import HeadParams, Mamba2Cache, mamba2_step
    from precisionlab.studies.bench_mamba2 import _Problem

    prob = _Problem(model, batch, device)
    cache = Mamba2Cache.allocate(batch, prob.H, prob.P, prob.N, prob.G, checkpoint_format=ck,
                                 read_format=rd, window=L, device=device, seed=1,
                                 split_config=split_config)
    cache.load_state(prob.state())
    inp = prob.step_inputs()
    head = HeadParams(prob.A, prob.D, prob.dt_bias)
    out = torch.empty_like(inp["x"])
    return lambda: mamba2_step(cache, inp["x"], inp["dt"], inp["B"], inp["C"], head,
                               z=inp["z"], dt_softplus=True, out=out)


def _mamba2_baseline(model: str, batch: int, design: str, device, mamba_ssm_path: str | None):
    """One step of the conventional kernel (its defaults at this shape) or of the peer,
    built as ``bench_mamba2`` builds them for its timings."""
    from precisionlab.studies.bench_mamba2 import (
        _Problem,
        conventional_layer,
        load_mamba_ssm,
        peer_layer,
    )

    prob = _Problem(model, batch, device)
    if design == "conventional":
        return conventional_layer(prob)
    return peer_layer(prob, load_mamba_ssm(mamba_ssm_path or "."))


def _gdn_step(model: str, batch: int, ck: str, rd: str | None, L: int, device):
    from precisionlab.kernels.gdn_decode import GDNReplayCache
    from precisionlab.studies.bench_gdn import _inputs, _state0, shape_of

    s = shape_of(model, batch)
    x = _inputs(s, device)
    cache = GDNReplayCache(s.batch, s.HK, s.HV, s.K, s.V, window=L, checkpoint=ck, read=rd,
                           device=device)
    cache.reset(_state0(s, device))
    idx = torch.arange(s.batch, dtype=torch.int32, device=device)
    out = torch.empty(s.batch, s.HV, s.V, device=device)
    return lambda: cache.step(x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"],
                              x["dt_bias"], idx, out=out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", choices=sorted(MODELS), default="mamba2")
    ap.add_argument("--model", default=None, help="preset (default: nano-4b / qwen3.5-4b)")
    ap.add_argument("--design", choices=sorted(DESIGNS) + list(BASELINES),
                    default="split-fp32-fp8",
                    help="a replay design, or (Mamba-2) the conventional step or the peer")
    ap.add_argument("--mamba-ssm-path", default=None,
                    help="a mamba_ssm checkout for --design peer (else the installed one)")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--split", nargs="*", default=[], metavar="FIELD=VALUE",
                    help="Mamba-2 SplitConfig fields, e.g. maxnreg=96 out_weights=program")
    args = ap.parse_args(argv)
    if args.batch < 1 or args.window < 2:
        ap.error("--batch must be >= 1 and --window >= 2")
    model = args.model or MODELS[args.kind]
    try:
        kind = get_preset(model).kind
    except KeyError as e:
        ap.error(str(e).strip("'\""))
    if kind != args.kind:
        ap.error(f"--model {model} is a {kind} model, not {args.kind}")
    if args.split and args.kind != "mamba2":
        ap.error("--split is for Mamba-2 designs")
    if args.design in BASELINES and args.kind != "mamba2":
        ap.error(f"--design {args.design} is for Mamba-2 (--kind mamba2)")
    if args.design in BASELINES and args.split:
        ap.error(f"--split applies to the replay designs, not --design {args.design}")
    if args.mamba_ssm_path and not Path(args.mamba_ssm_path).is_dir():
        ap.error(f"--mamba-ssm-path: no directory {args.mamba_ssm_path}")
    ck, rd = DESIGNS.get(args.design, ("fp32", None))
    try:
        split_config = _split_config(args.split)
        if args.kind == "mamba2":  # the values, checked as the step will check them
            _check_split(split_config, get_preset(model), ck, rd)
    except (ValueError, TypeError) as e:
        ap.error(str(e))
    if not torch.cuda.is_available():
        print("profile_steps: needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    if args.design in BASELINES:
        try:
            step = _mamba2_baseline(model, args.batch, args.design, device,
                                    args.mamba_ssm_path)
        except (ImportError, FileNotFoundError) as e:
            print(f"profile_steps: no mamba_ssm to load ({e}); pass --mamba-ssm-path",
                  file=sys.stderr)
            return 2
    elif args.kind == "mamba2":
        step = _mamba2_step(model, args.batch, ck, rd, args.window, device, split_config)
    else:
        step = _gdn_step(model, args.batch, ck, rd, args.window, device)
    for _ in range(args.window):  # compile every branch; back at ring position 0
        step()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for _ in range(args.window):
        step()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

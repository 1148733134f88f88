"""Offline sm_90 compile of the GDN replay / verify kernels: SASS instructions,
registers and spills per launch configuration, without a GPU.

Each variant is one real ``GDNReplayCache.step`` / ``.verify`` call on CPU tensors
whose launches are intercepted and compiled for ``GPUTarget("cuda", 90, 64)`` (the
compile, disassembly and ptxas helpers of ``benchmarks/sass_count.py``).  Counts are
static instructions of the whole kernel (every branch, both passes of an nvfp4 flush;
NOPs excluded): compare variants of one kernel, not kernels with each other.  The
flush kernel's two copies (persistent / one program per unit) are compiled with the
other grid's branch left out, so their counts compare.

    python benchmarks/sass_count_gdn.py                    # qwen3.5-4b shape, all variants
    python benchmarks/sass_count_gdn.py --only flush --json out.json
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.append(str(p))  # after the installed packages (see bench_gdn.py)

from sass_count import _INSN, _Recorder, _stats, compile_call, sass_of  # noqa: E402

_ADDR = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/")
_BRA = re.compile(r"\bBRA\s+(?:!?U?P\w+,\s*)?0x([0-9a-f]+)")


def loop_bodies(text: str) -> list[int]:
    """Instructions (NOPs excluded) between each backward branch and its target, in
    address order: the bodies of the kernel's loops (an outer loop's count includes
    its inner ones).  With the trip counts (a flush unit's chunk loop runs
    ``block_v / flush_chunk`` times per pass) they turn static counts into per-unit
    work."""
    insns = []
    for line in text.splitlines():
        m = _ADDR.match(line)
        if m and _INSN.match(line) and " NOP" not in line:
            insns.append((int(m.group(1), 16), line))
    out = []
    for addr, line in insns:
        b = _BRA.search(line)
        if b and int(b.group(1), 16) < addr:
            lo = int(b.group(1), 16)
            out.append(sum(1 for a, _ in insns if lo <= a <= addr))
    return out

# (design name, checkpoint, read copy) as the GDN benchmark names them
DESIGNS = {"replay-fp32": ("fp32", None), "split-fp32-fp8": ("fp32", "fp8-e4m3"),
           "split-fp16sr-nvfp4": ("fp16-sr", "nvfp4")}
# flush variants: (label, GDNReplayCache keywords over the large-batch defaults, which
# are the integer-rounding encoders, the nvfp4 scratch pass, the dynamic grid where there
# is a read copy (else the persistent one), the ring v rows a chunk ahead and,
# for fp32 checkpoints, TMA loads into 1-warp programs; an fp8 copy by the hardware
# conversion)
FLUSH = [("default", {}), ("reference encoders", {"fast_encode": False}),
         ("units", {"flush_grid": "units"}),
         ("persistent grid", {"flush_grid": "persistent"}),
         ("dynamic grid", {"flush_grid": "dynamic"}),
         ("no ring ahead", {"flush_ring_ahead": False}),
         ("168 registers, 3 per SM", {"maxnreg": 168, "flush_ctas_per_sm": 3}),
         ("4 warps, plain loads", {"num_warps": 4, "maxnreg": 128, "flush_ctas_per_sm": 4,
                                   "flush_stages": 2, "flush_tma": False}),
         ("4 warps, tma", {"num_warps": 4, "maxnreg": 168, "flush_ctas_per_sm": 3,
                           "flush_stages": 2, "flush_tma": True}),
         ("integer fp8", {"hw_fp8": False}),
         ("168 registers, 12 per SM", {"maxnreg": 168, "flush_ctas_per_sm": 12}),
         ("128 registers, 16 per SM", {"maxnreg": 128, "flush_ctas_per_sm": 16})]
FLUSH_NVFP4 = [("recompute", {"flush_pass": "recompute"}),
               ("recompute+reference", {"flush_pass": "recompute", "fast_encode": False})]

# the output launch's alternative to its defaults: tensor-core row sums for fp32 tiles;
# for fp8 / nvfp4 copies the CUDA-core row sums in the tiles that were their defaults
OUT_ALT = {"replay-fp32": ("mma", {"out_mma": True}),
           "split-fp32-fp8": ("cuda-core 16x1", {"out_mma": False, "out_block_v": 16,
                                                 "out_num_warps": 1}),
           "split-fp16sr-nvfp4": ("cuda-core 64x2", {"out_mma": False, "out_block_v": 64,
                                                     "out_num_warps": 2})}

VERIFY = [("staged-dot", {}), ("staged", {"verify_launch": "staged", "verify_block_v": 32,
                                          "verify_num_warps": 2}),
          ("staged-dot bv64 w4", {"verify_block_v": 64, "verify_num_warps": 4})]


def _shape(model: str) -> tuple[int, int, int, int]:
    from precisionlab.presets import get_preset

    p = get_preset(model)
    return p.groups, p.heads, p.state_dim, p.head_dim  # HK, HV, K, V


def step_calls(model: str, ck: str, rd: str | None, cfg: dict, L: int = 16, batch: int = 256,
               T: int = 0):
    """Recorded launches of one replay step (T = 0) or one verify of T drafts."""
    from precisionlab.kernels.gdn_decode import GDNReplayCache

    HK, HV, K, V = _shape(model)
    b = 8
    cache = GDNReplayCache(b, HK, HV, K, V, window=L, checkpoint=ck, read=rd, device="cpu",
                           batch_hint=batch, drafts=T, **cfg)
    bf = dict(dtype=torch.bfloat16)
    lead = (b, T) if T else (b,)
    q, k = torch.zeros(*lead, HK, K, **bf), torch.zeros(*lead, HK, K, **bf)
    v = torch.zeros(*lead, HV, V, **bf)
    a, bb = torch.zeros(*lead, HV, **bf), torch.zeros(*lead, HV, **bf)
    A_log, dt_bias = torch.zeros(HV), torch.zeros(HV)
    idx = torch.arange(b, dtype=torch.int32)
    with _Recorder() as rec:
        if T:
            cache.verify(q, k, v, a, bb, A_log, dt_bias, idx)
        else:
            cache.step(q, k, v, a, bb, A_log, dt_bias, idx, out=torch.empty(b, HV, V))
    return rec.calls


def _name(fn) -> str:
    return getattr(fn, "__name__", None) or fn.fn.__name__


def variants(model: str, only: str | None) -> list[tuple[str, object, tuple, dict]]:
    out = []
    for d, (ck, rd) in DESIGNS.items():
        vs = FLUSH + (FLUSH_NVFP4 if rd == "nvfp4" else [])
        for label, cfg in vs:
            for fn, args, kw in step_calls(model, ck, rd, cfg):
                nm = _name(fn)
                if nm == "_flush_kernel" and only in (None, "flush"):
                    if cfg.get("hw_fp8", rd == "fp8-e4m3"):  # compiled code only: the
                        # CPU call leaves it off
                        kw = {**kw, "HW": True}
                    out.append((f"{d} flush {label}", fn, args, kw))
                elif nm != "_flush_kernel" and label == "default" and only in (None, "output"):
                    out.append((f"{d} {nm.strip('_')}", fn, args, kw))
        if only in (None, "output"):  # the output launch's other row sums
            label, cfg = OUT_ALT[d]
            for fn, args, kw in step_calls(model, ck, rd, cfg):
                if _name(fn) in ("_out_kernel", "_prep_kernel"):
                    out.append((f"{d} {_name(fn).strip('_')} {label}", fn, args, kw))
        if only in (None, "output") and rd is None:
            for label, cfg in (("eager", {"eager": True}), ("64 registers", {"prep_maxnreg": 64}),
                               ("80 registers", {"prep_maxnreg": 80})):
                for fn, args, kw in step_calls(model, ck, rd, cfg):
                    if _name(fn) == "_prep_kernel":
                        out.append((f"{d} prep_kernel {label}", fn, args, kw))
    if only in (None, "batch1"):  # the small-batch fused launch (one launch per step)
        for d, (ck, rd) in DESIGNS.items():
            for label, cfg in (("default", {}), ("fast", {"fast_encode": True})):
                for fn, args, kw in step_calls(model, ck, rd, cfg, batch=1):
                    out.append((f"batch1 {d} {_name(fn).strip('_')} {label}", fn, args, kw))
    if only in (None, "verify"):
        for ck, rd in (("fp32", None), ("fp32", "fp8-e4m3")):
            for label, cfg in VERIFY:
                for fn, args, kw in step_calls(model, ck, rd, cfg, T=4):
                    nm = _name(fn).strip("_")
                    if nm.startswith("vout") or label in ("staged", "staged-dot"):
                        out.append((f"verify-T4 {rd or ck} {nm} {label}", fn, args, kw))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3.5-4b")
    ap.add_argument("--only", choices=("flush", "output", "verify", "batch1"), default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--dump", default=None, help="folder for the SASS text of each variant")
    a = ap.parse_args(argv)
    rows = []
    for name, fn, args, kw in variants(a.model, a.only):
        try:
            k = compile_call(fn, args, kw)
            sass = sass_of(k)
            row = {"variant": name, **_stats(k, sass), "loops": loop_bodies(sass)}
            if a.dump:
                os.makedirs(a.dump, exist_ok=True)
                Path(a.dump, name.replace(" ", "_").replace("+", "-") + ".sass").write_text(sass)
        except Exception as e:  # noqa: BLE001 - report and go on
            row = {"variant": name, "error": f"{type(e).__name__}: {e}"[:300]}
        rows.append(row)
        if "error" in row:
            print(f"{name:44s} ERROR {row['error']}", flush=True)
        else:
            print(f"{name:44s} sass {row['sass']:6d}  regs {row['regs']!s:>4s}  spills "
                  f"{row['spills']!s:>5s}  loops {row['loops']}", flush=True)
    if a.json:
        from precisionlab.atomic import write_json

        write_json(a.json, {"model": a.model, "rows": rows}, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

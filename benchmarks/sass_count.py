"""Offline sm_90 compile of the Mamba-2 split-launch, verify and batch-1 (one-launch)
kernels: SASS instructions, registers and spills per kernel variant, without a GPU.

Each variant is one real host call (``launch_split_step`` / ``mamba2_verify`` /
``mamba2_step`` of a batch-1 cache with the library's defaults) on
CPU tensors with the launches intercepted: the exact arguments, constexprs and
options of every launch are turned into an ``ASTSource`` and compiled with
``triton.compile(..., target=GPUTarget("cuda", 90, 64))``; the cubin is
disassembled with the ``cuobjdump`` that Triton ships.  Pointers are taken as
16-byte aligned and integer arguments divisible by 16 as such (as a launch on the
device specialises them); ``HW_CVT`` is forced on (compiled code).

Counts are static instructions of the whole kernel (all branches, both passes of an
nvfp4 flush; NOPs excluded) and of every loop (backward-branch range; the innermost
ones are the per-chunk / per-tile bodies, per thread): compare variants of the same
kernel, and multiply a body by its trips and warps for per-head work.

    python benchmarks/sass_count.py                       # all variants, nano-4b shape
    python benchmarks/sass_count.py --model nemotron-3-super-120b --only flush
    python benchmarks/sass_count.py --only batch1       # one-launch kernels, batch 1
    python benchmarks/sass_count.py --json out.json --dump /tmp/sass   # keep the SASS
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia.compiler import get_ptxas  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # after the installed packages: kernels/ must not shadow one

_PTR = {torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16",
        torch.int16: "*i16", torch.int32: "*i32", torch.int64: "*i64", torch.uint8: "*u8",
        torch.int8: "*i8"}


def _tools() -> tuple[str, str]:
    base = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    return str(base / "cuobjdump"), str(base / "nvdisasm")


class _Recorder:
    """Intercepts ``JITFunction.run``: records (fn, args, kwargs) instead of launching."""

    def __init__(self):
        self.calls: list[tuple[JITFunction, tuple, dict]] = []
        self._orig = None

    def __enter__(self):
        self._orig = JITFunction.run
        rec = self

        def run(fn, *args, grid, warmup, **kwargs):
            rec.calls.append((fn, args, kwargs))

        JITFunction.run = run
        return self

    def __exit__(self, *exc):
        JITFunction.run = self._orig


_OPTION_KEYS = ("num_warps", "num_stages", "maxnreg", "num_ctas")


def compile_call(fn: JITFunction, args: tuple, kwargs: dict, overrides: dict | None = None):
    """Compile one recorded launch for sm_90; returns the CompiledKernel."""
    kwargs = dict(kwargs)
    opts = {k: kwargs.pop(k) for k in _OPTION_KEYS if k in kwargs}
    bound = dict(zip(fn.arg_names, args, strict=False))
    bound.update(kwargs)
    for p in fn.params:  # defaults of constexprs left out at the call
        if p.name not in bound and p.default is not None:
            bound[p.name] = p.default
    bound.update(overrides or {})
    sig, consts, attrs = {}, {}, {}
    for i, p in enumerate(fn.params):
        v = bound[p.name]
        if p.is_constexpr:
            sig[p.name] = "constexpr"
            consts[p.name] = v
        elif isinstance(v, torch.Tensor):
            sig[p.name] = _PTR[v.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(v, bool):
            sig[p.name] = "i1"
        elif isinstance(v, int):
            if not p.do_not_specialize and v == 1:
                sig[p.name] = "constexpr"
                consts[p.name] = 1
                continue
            sig[p.name] = "i64" if abs(v) >= 2**31 else "i32"
            if not p.do_not_specialize and v % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(v, float):
            sig[p.name] = "fp32"
        elif v is None:
            sig[p.name] = "constexpr"
            consts[p.name] = None
        elif isinstance(v, TensorDescriptor):  # a host-side descriptor (TMA)
            sig[p.name] = f"tensordesc<{_PTR[v.base.dtype][1:]}{list(v.block_shape)}>"
        else:
            raise TypeError(f"{p.name}: {type(v)}")
    src = ASTSource(fn, sig, consts, attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 64), options=opts)


def sass_of(kernel) -> str:
    cuobjdump, _ = _tools()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "k.cubin"
        path.write_bytes(kernel.asm["cubin"])
        return subprocess.run([cuobjdump, "-sass", str(path)], check=True, capture_output=True,
                              text=True).stdout


_INSN = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")


def count_sass(text: str) -> tuple[int, collections.Counter]:
    """Static instruction count (NOP and the trailing BRA-to-self excluded) and opcodes."""
    ops = collections.Counter()
    for line in text.splitlines():
        m = _INSN.match(line)
        if m:
            op = m.group(2).split(".")[0]
            if op != "NOP":
                ops[op] += 1
    return sum(ops.values()), ops


_LINE = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?);")


def loop_bodies(text: str) -> list[int]:
    """Instructions (NOPs excluded) of every backward branch's range, in address order:
    the innermost ranges are the per-chunk / per-tile loop bodies."""
    ins = [(int(m.group(1), 16), m.group(2)) for m in map(_LINE.match, text.splitlines()) if m]
    out = []
    for a, t in ins:
        if "BRA" in t.split(" ")[0] or re.match(r"^@!?U?P\w+\s+BRA", t):
            tgt = re.search(r"0x([0-9a-f]+)", t)
            if tgt and int(tgt.group(1), 16) < a:
                lo = int(tgt.group(1), 16)
                out.append((lo, sum(1 for x, tt in ins if lo <= x <= a
                                    and not tt.startswith("NOP"))))
    return [n for _, n in sorted(out)]


def _stats(kernel, sass: str) -> dict:
    total, ops = count_sass(sass)
    md = kernel.metadata
    regs, spills = ptxas_usage(kernel)
    return {"sass": total, "loops": loop_bodies(sass), "regs": regs, "spills": spills,
            "shared": md_get(md, "shared"),
            "top": dict(ops.most_common(8))}


def md_get(md, key):
    try:
        return getattr(md, key)
    except AttributeError:
        return md.get(key) if isinstance(md, dict) else None


def ptxas_usage(kernel) -> tuple[int, int | None]:
    """Registers and spill-store bytes as ``ptxas -v`` reports them for the kernel's PTX
    (its ``.maxnreg`` directive included), by the ptxas Triton compiled it with (the PTX
    version Triton writes follows that tool's)."""
    ptxas = get_ptxas(90).path
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "k.ptx"
        path.write_text(kernel.asm["ptx"])
        out = subprocess.run([ptxas, "-arch=sm_90a", "-v", str(path), "-o", str(Path(d) / "o")],
                             capture_output=True, text=True)
    text = out.stdout + out.stderr
    if out.returncode != 0:
        raise RuntimeError(f"ptxas exited {out.returncode}: {text.strip()[-800:]}")
    r = re.search(r"Used (\d+) registers", text)
    if r is None:
        raise RuntimeError(f"ptxas reported no register count: {text.strip()[-800:]}")
    s = re.search(r"(\d+) bytes spill stores", text)
    return int(r.group(1)), (int(s.group(1)) if s else None)


# ------------------------------------------------------------------ variants


def _problem(model: str, batch: int):
    from precisionlab.presets import get_preset

    p = get_preset(model)
    return p.heads, p.head_dim, p.state_dim, p.groups, batch


def _step_inputs(H: int, P: int, N: int, G: int, lead: tuple[int, ...]):
    """Zero bf16 inputs ``(x, z, dt, B, C)`` with leading axes ``lead`` (batch, or batch
    and drafts) and the heads' parameters, as a step or a verify takes them."""
    from precisionlab.kernels.mamba2_step import HeadParams

    bf = dict(dtype=torch.bfloat16)
    x, z = torch.zeros(*lead, H, P, **bf), torch.zeros(*lead, H, P, **bf)
    B, C = torch.zeros(*lead, G, N, **bf), torch.zeros(*lead, G, N, **bf)
    dt = torch.zeros(*lead, H, **bf)
    return x, z, dt, B, C, HeadParams(-torch.ones(H), torch.ones(H), torch.zeros(H))


def split_calls(model: str, ck: str, rd: str | None, cfg, L: int = 16, batch: int = 8):
    """Recorded launches of one split replay step (flush launch, output launch)."""
    from precisionlab.kernels.mamba2_step import Mamba2Cache, launch_split_step, slot_indices

    H, P, N, G, b = _problem(model, batch)
    cache = Mamba2Cache.allocate(b, H, P, N, G, checkpoint_format=ck, read_format=rd,
                                 window=L, device="cpu", launch="split", split_config=cfg)
    x, z, dt, B, C, head = _step_inputs(H, P, N, G, (b,))
    out = torch.empty(b, H, P)
    with _Recorder() as rec:
        launch_split_step(cache, x, dt, B, C, head, z=z, out=out,
                          state_indices=slot_indices(b, x.device), dt_softplus=True)
    return rec.calls


def fused_calls(model: str, ck: str, rd: str | None, L: int = 16, batch: int = 1):
    """Recorded launch of one replay step of a cache with the library's defaults at a
    small batch (the one-launch kernel)."""
    from precisionlab.kernels.mamba2_step import Mamba2Cache, mamba2_step

    H, P, N, G, b = _problem(model, batch)
    cache = Mamba2Cache.allocate(b, H, P, N, G, checkpoint_format=ck, read_format=rd,
                                 window=L, device="cpu")
    x, z, dt, B, C, head = _step_inputs(H, P, N, G, (b,))
    with _Recorder() as rec:
        mamba2_step(cache, x, dt, B, C, head, z=z, dt_softplus=True)
    return rec.calls


def verify_calls(model: str, ck: str, rd: str | None, launch: str, T: int = 4, L: int = 16,
                 batch: int = 8, block_p: int | None = None, num_warps: int | None = None):
    from precisionlab.kernels.mamba2_spec import mamba2_verify
    from precisionlab.kernels.mamba2_step import Mamba2Cache

    H, P, N, G, b = _problem(model, batch)
    cache = Mamba2Cache.allocate(b, H, P, N, G, checkpoint_format=ck, read_format=rd,
                                 window=L, device="cpu", speculative=True)
    x, z, dt, B, C, head = _step_inputs(H, P, N, G, (b, T))
    kw = {} if launch == "single" else {"verify_launch": launch}
    with _Recorder() as rec:
        mamba2_verify(cache, x, dt, B, C, head, z=z, dt_softplus=True, block_p=block_p,
                      num_warps=num_warps, **kw)
    return rec.calls


def variants(model: str) -> list[tuple[str, str, list]]:
    """(name, kind, recorded calls) of every variant worth comparing."""
    from precisionlab.kernels.mamba2_step import SplitConfig

    out = []
    for d, (ck, rd) in {"replay-fp32": ("fp32", None), "fp8": ("fp32", "fp8-e4m3"),
                        "nvfp4": ("fp16-sr", "nvfp4")}.items():
        out.append((f"batch1 {d}", "batch1", fused_calls(model, ck, rd)))
    designs = {"fp8": ("fp32", "fp8-e4m3"), "nvfp4": ("fp16-sr", "nvfp4"),
               "shared-nvfp4": ("nvfp4", None)}
    _, P, _, _, _ = _problem(model, 1)
    whole = triton.next_power_of_2(P)
    encs = {"ref": {}}
    if "flush_encoder" in SplitConfig.__dataclass_fields__:
        encs["fast"] = {"flush_encoder": "fast"}
        for w in (4, 8):
            encs[f"fast-1pass rows={whole} warps={w}"] = {
                "flush_encoder": "fast", "flush_rows": whole, "flush_warps": w,
                "flush_maxnreg": 0}
    for d, (ck, rd) in designs.items():
        for enc, kw in encs.items():
            if d == "fp8" and enc.startswith("fast-1pass"):
                continue
            calls = split_calls(model, ck, rd, SplitConfig(**kw))
            out.append((f"split-{d} flush {enc}", "flush", calls[:1]))
            if enc == "ref":
                out.append((f"split-{d} output", "output", calls[1:]))
                if rd is not None:  # the defaults' two heads per program against one
                    one = split_calls(model, ck, rd, SplitConfig(**kw, heads_per_program=1))
                    out.append((f"split-{d} output one head", "output", one[-1:]))
    out.append(("verify-T4 fp32 single", "verify", verify_calls(model, "fp32", None, "single")))
    reads = {"fp32": ("fp32", None), "fp8": ("fp32", "fp8-e4m3"), "nvfp4": ("fp16-sr", "nvfp4")}
    prep = True
    for d, (ck, rd) in reads.items():
        for launch in ("staged", "staged-dot"):
            for bp, nw in VERIFY_CFGS if d == "fp32" else VERIFY_CFGS[:1]:
                calls = verify_calls(model, ck, rd, launch, block_p=bp, num_warps=nw)
                out.append((f"verify-T4 {d} {launch} {bp}x{nw}", "verify",
                            calls if prep else calls[1:]))  # the prep launch once
                prep = False
    return out


VERIFY_CFGS = ((32, 1), (16, 1), (32, 2), (64, 4))
"""(block_p, num_warps) of the staged verify's output launch: every one for an fp32
copy, the first for the lossy read copies."""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="nemotron-3-nano-4b")
    ap.add_argument("--only", choices=("flush", "output", "verify", "batch1"), default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--dump", default=None, help="folder for the SASS text of every kernel")
    a = ap.parse_args(argv)
    rows = []
    for name, kind, calls in variants(a.model):
        if a.only and kind != a.only:
            continue
        for fn, args, kwargs in calls:
            over = {"HW_CVT": True} if "HW_CVT" in fn.arg_names else {}
            k = compile_call(fn, args, kwargs, over)
            sass = sass_of(k)
            st = _stats(k, sass)
            row = {"variant": name, "kernel": fn.__name__, **st}
            rows.append(row)
            print(f"{name:52s} {fn.__name__:22s} sass {st['sass']:6d}  regs {st['regs']}  "
                  f"spills {st['spills']}  smem {st['shared']}  loops {st['loops']}", flush=True)
            if a.dump:
                d = Path(a.dump)
                d.mkdir(parents=True, exist_ok=True)
                fname = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{name}_{fn.__name__}") + ".sass"
                (d / fname).write_text(sass)
    if a.json:
        from precisionlab.atomic import write_json

        write_json(a.json, {"model": a.model, "rows": rows}, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

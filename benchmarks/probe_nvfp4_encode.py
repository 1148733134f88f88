"""Time an nvfp4 read copy encoded by a launch of its own, from a stored fp16 or fp32
state, for the benchmark models' state shapes at batch 256.

The split designs' flushes encode an nvfp4 read copy inside the flush, in programs
sized for the fold (one warp, 255 registers, 8 per SM on an H200); this probe asks
what the same encode costs as a separate launch of whole-matrix programs (one per
state matrix: a pass for the matrix amax, then a pass that encodes, both through the
flushes' device functions ``tl_formats.matrix_amax`` / ``nvfp4_encode_fast`` /
``store_codes``).  Every run first checks the launch's bits against
``formats.nvfp4`` on a few matrices.

    python benchmarks/probe_nvfp4_encode.py --out encode.json
    TRITON_INTERPRET=1 python benchmarks/probe_nvfp4_encode.py --check-only

Exit 2 with one line on bad arguments or (timing) without a GPU; exit 1 if the bits
differ; the JSON is written whole or not at all.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # after the installed packages: kernels/ must not shadow one

from precisionlab.formats.nvfp4 import NVFP4  # noqa: E402
from precisionlab.kernels.tl_formats import (  # noqa: E402
    K_NVFP4,
    matrix_amax,
    nvfp4_encode_fast,
    store_codes,
)

SHAPES = {  # model -> (state matrices at batch 256, rows V, columns K)
    "qwen3.5-4b": (256 * 32, 128, 128),
    "qwen3.5-122b": (256 * 64, 128, 128),
    "nemotron-3-nano-4b": (256 * 96, 80, 128),
    "nemotron-3-super-120b": (256 * 128, 64, 128),
}
SOURCES = {"fp16": torch.float16, "fp32": torch.float32}
CONFIGS = ((16, 4), (32, 4), (32, 8), (0, 8), (0, 16))  # (rows per chunk (0: all), warps)


@triton.jit
def _encode_kernel(x_ptr, codes, s1, s2, V: tl.constexpr, K: tl.constexpr,
                   FB: tl.constexpr):
    """The nvfp4 copy of state matrix ``program_id(0)`` (V x K, row-major): one read
    where one chunk is the whole matrix, else a pass for the amax and one to encode."""
    mat = tl.program_id(0).to(tl.int64)
    base = x_ptr + mat * (V * K)
    offs_k = tl.arange(0, K)
    if FB == V:
        offs_v = tl.arange(0, FB)
        S = tl.load(base + offs_v[:, None] * K + offs_k[None, :]).to(tl.float32)
        cd, sc, g = nvfp4_encode_fast(S, matrix_amax(S), False, FB, K)
        store_codes(codes, s1, s2, cd, sc, g, mat, offs_v, offs_v < V, V, K_NVFP4, FB, K)
    else:
        amax = 0.0
        for c in tl.range(0, V // FB):
            offs_v = c * FB + tl.arange(0, FB)
            S = tl.load(base + offs_v[:, None] * K + offs_k[None, :]).to(tl.float32)
            amax = tl.maximum(amax, matrix_amax(S))
        for c in tl.range(0, V // FB):
            offs_v = c * FB + tl.arange(0, FB)
            S = tl.load(base + offs_v[:, None] * K + offs_k[None, :]).to(tl.float32)
            cd, sc, g = nvfp4_encode_fast(S, amax, False, FB, K)
            store_codes(codes, s1, s2, cd, sc, g, mat, offs_v, offs_v < V, V, K_NVFP4, FB, K)


def encoder(x: torch.Tensor, rows: int, warps: int):
    """``(launch, (codes, block scales, matrix scales))`` for states ``x`` (M, V, K)."""
    M, V, K = x.shape
    rows = rows or V
    codes = torch.empty(M, V, K // 2, dtype=torch.uint8, device=x.device)
    s1 = torch.empty(M, V, K // 16, dtype=torch.uint8, device=x.device)
    s2 = torch.empty(M, dtype=torch.float32, device=x.device)

    def launch() -> None:
        _encode_kernel[(M,)](x, codes, s1, s2, V, K, rows, num_warps=warps)

    return launch, (codes, s1, s2)


def bits_match(device: str) -> bool:
    """The launch's codes and scales equal ``formats.nvfp4`` on matrices whose rows span
    four decades (fp16 source), in 16-row chunks and as one tile."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 64, 128, generator=gen) * torch.logspace(-3, 1, 64)[:, None]
    x = x.half().to(device)
    ref = NVFP4().encode(x.float())
    for rows in (16, 0):
        launch, (codes, s1, s2) = encoder(x, rows, 4)
        launch()
        if not (torch.equal(codes, ref.codes) and torch.equal(s1, ref.scales["block"])
                and torch.equal(s2, ref.scales["matrix"].reshape(-1))):
            return False
    return True


def time_all(models: list[str], sources: list[str]) -> list[dict]:
    from precisionlab.timing import ColdL2Timer, capture

    timer = ColdL2Timer("cuda")
    rows_out = []
    for model in models:
        M, V, K = SHAPES[model]
        for src in sources:
            x = (0.1 * torch.randn(M, V, K, device="cuda")).to(SOURCES[src])
            moved = x.numel() * (x.element_size() + 0.5 + 1 / 16) + 4 * M
            for rows, warps in CONFIGS:
                launch, _ = encoder(x, rows, warps)
                us = timer.median(capture(launch), 10)
                rows_out.append(dict(model=model, source=src, rows=rows or V, warps=warps,
                                     us=round(us, 1), tb_s=round(moved / us / 1e6, 2)))
                print(json.dumps(rows_out[-1]), flush=True)
            del x
    return rows_out


def write_json(path: Path, payload: dict) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(payload, f, indent=1)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="JSON file for the timings")
    ap.add_argument("--models", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--sources", nargs="+", default=list(SOURCES), choices=list(SOURCES))
    ap.add_argument("--check-only", action="store_true",
                    help="only compare the bits with formats (the CPU interpreter works)")
    args = ap.parse_args(argv)
    if not args.check_only:
        if args.out is None:
            ap.error("--out is required unless --check-only")
        if not args.out.parent.is_dir():
            ap.error(f"--out: no directory {args.out.parent}")
        if not torch.cuda.is_available():
            print("probe_nvfp4_encode.py: timing needs a CUDA GPU (use --check-only here)",
                  file=sys.stderr)
            return 2
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ok = bits_match(device)
    print(f"bits equal formats.nvfp4: {ok}", flush=True)
    if not ok:
        return 1
    if args.check_only:
        return 0
    rows = time_all(args.models, args.sources)
    write_json(args.out, dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                              triton=triton.__version__, bits_match=ok, rows=rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

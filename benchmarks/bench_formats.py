"""Throughput of every format's encode, decode and quantize on a state-shaped
float32 tensor (default 16 x 64 x 128 x 128 = 16M elements), on CPU and, when
CUDA is available, on the GPU.

Each timing is the median of ``--reps`` runs after ``--warmup`` runs, with the
device synchronised around every run.  Effective bandwidth counts the bytes an
ideal kernel would move:

- encode:   4 bytes read + bits_per_element / 8 bytes written per element
- decode:   bits_per_element / 8 bytes read + 4 bytes written
- quantize: 4 bytes read + 4 bytes written (fp32 in, fp32 out)

Usage: python benchmarks/bench_formats.py [--device cpu|cuda|all] [--json FILE]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from precisionlab.formats import get, names


def _timed(fn, device: torch.device, warmup: int, reps: int) -> float:
    """Median seconds of ``fn()``."""

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_device(
    device: torch.device, shape: tuple[int, ...], formats: list[str], warmup: int, reps: int
) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen).to(device)
    n = x.numel()
    rows = []
    for name in formats:
        fmt = get(name)
        bpe = fmt.bits_per_element(shape)
        packed = fmt.encode(x, seed=1)
        enc = _timed(lambda fmt=fmt: fmt.encode(x, seed=1), device, warmup, reps)
        dec = _timed(lambda fmt=fmt, p=packed: fmt.decode(p), device, warmup, reps)
        qua = _timed(lambda fmt=fmt: fmt.quantize(x, seed=1), device, warmup, reps)
        rows.append(
            {
                "format": name,
                "device": device.type,
                "bits_per_element": bpe,
                "encode_ms": enc * 1e3,
                "decode_ms": dec * 1e3,
                "quantize_ms": qua * 1e3,
                "encode_GBps": n * (4 + bpe / 8) / enc / 1e9,
                "decode_GBps": n * (bpe / 8 + 4) / dec / 1e9,
                "quantize_GBps": n * 8 / qua / 1e9,
                "quantize_Melem_per_s": n / qua / 1e6,
            }
        )
        print(_fmt_row(rows[-1]), flush=True)
    return rows


HEADER = (
    f"{'format':10s} {'dev':4s} {'bits':>6s} {'enc ms':>9s} {'enc GB/s':>9s} "
    f"{'dec ms':>9s} {'dec GB/s':>9s} {'quant ms':>9s} {'quant GB/s':>10s} {'Melem/s':>9s}"
)


def _fmt_row(r: dict) -> str:
    return (
        f"{r['format']:10s} {r['device']:4s} {r['bits_per_element']:6.3f} "
        f"{r['encode_ms']:9.2f} {r['encode_GBps']:9.2f} {r['decode_ms']:9.2f} "
        f"{r['decode_GBps']:9.2f} {r['quantize_ms']:9.2f} {r['quantize_GBps']:10.2f} "
        f"{r['quantize_Melem_per_s']:9.1f}"
    )


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="all", choices=["all", "cpu", "cuda"])
    ap.add_argument("--shape", default="16,64,128,128", help="comma-separated; last axis 128")
    ap.add_argument("--formats", default=None, help="comma-separated (default: all registered)")
    ap.add_argument("--warmup", type=int, default=None, help="default 1 on CPU, 5 on CUDA")
    ap.add_argument("--reps", type=int, default=None, help="default 3 on CPU, 20 on CUDA")
    ap.add_argument("--json", default=None, metavar="FILE", help="also write results as JSON")
    args = ap.parse_args(argv)

    try:
        shape = tuple(int(s) for s in args.shape.split(","))
    except ValueError:
        ap.error(f"--shape must be comma-separated integers, got {args.shape!r}")
    formats = args.formats.split(",") if args.formats else names()
    unknown = [f for f in formats if f not in names()]
    if unknown:
        ap.error(f"unknown format(s) {', '.join(unknown)}; known: {', '.join(names())}")
    devices = []
    if args.device in ("all", "cpu"):
        devices.append(torch.device("cpu"))
    if args.device in ("all", "cuda"):
        if torch.cuda.is_available():
            devices.append(torch.device("cuda"))
        elif args.device == "cuda":
            raise SystemExit("CUDA is not available")

    numel = 1
    for s in shape:
        numel *= s
    meta = {
        "shape": list(shape),
        "numel": numel,
        "torch": torch.__version__,
        "cpu_threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }
    print(
        f"shape {shape} ({numel / 2**20:.0f}M elements), torch {meta['torch']}, "
        f"{meta['cpu_threads']} CPU threads, GPU: {meta['gpu']}"
    )
    print(HEADER)
    results = []
    for dev in devices:
        gpu = dev.type == "cuda"
        warmup = args.warmup if args.warmup is not None else (5 if gpu else 1)
        reps = args.reps if args.reps is not None else (20 if gpu else 3)
        results += bench_device(dev, shape, formats, warmup, reps)
    out = {"meta": meta, "results": results}
    if args.json:
        from precisionlab.atomic import write_json

        write_json(args.json, out, indent=2)
    return out


if __name__ == "__main__":
    main()

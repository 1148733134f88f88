"""Offline sm_90 SASS of the fp16 stochastic rounding alone (a 1024-element kernel, 8
elements per thread): the library's rounding with its random bits loaded, drawn by the
library's generator (two hashes), or drawn by one hash of the index and the stream key.
Run from the checkout's root: ``python benchmarks/results/h200-2026-12-03-run46/sr_sass.py``."""

import os
import sys

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, "benchmarks")
sys.path.append(".")
import sass_count as sc  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from precisionlab.kernels.tl_formats import (  # noqa: E402
    copysign,
    exponent_of,
    fp16_rne_bits,
    lowbias32,
    sr_bits,
    sr_key,
    sr_round_fast,
)


@triton.jit
def pow2n(k):
    return ((k + 127) << 23).to(tl.float32, bitcast=True)

@triton.jit
def sr16_b(x, bits):
    a = tl.abs(x)
    e = tl.minimum(tl.maximum(exponent_of(a), -14), 137)
    ulp = pow2n(e - 10)
    v = a * pow2n(10 - e)
    lo = tl.floor(v)
    u = (bits >> 8).to(tl.float32) * 5.9604644775390625e-08
    q = (lo + tl.where(u < v - lo, 1.0, 0.0)) * ulp
    q = copysign(tl.minimum(q, 65504.0), x)
    return tl.where(a < float("inf"), q, x)

@triton.jit
def kern(x_ptr, o_ptr, seed, step, VAR: tl.constexpr, HASH: tl.constexpr):
    offs = tl.program_id(0) * 1024 + tl.arange(0, 1024)
    x = tl.load(x_ptr + offs)
    if HASH == 2:
        bits = lowbias32(offs.to(tl.uint32) ^ sr_key(seed, step))
    elif HASH:
        bits = sr_bits(offs.to(tl.uint32), sr_key(seed, step))
    else:
        bits = tl.load(o_ptr + offs).to(tl.uint32, bitcast=True)
    if VAR == 0:
        q = sr_round_fast(x, bits, 10, -14, 65504.0)
    else:
        q = sr16_b(x, bits)
    tl.store(o_ptr + offs, fp16_rne_bits(q).to(tl.int32))

for hash_ in (0, 1, 2):
    for var in (0, 1):
        sig = {"x_ptr": "*fp32", "o_ptr": "*i32", "seed": "i32", "step": "i32",
               "VAR": "constexpr", "HASH": "constexpr"}
        aligned = {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]}
        src = ASTSource(kern, sig, {"VAR": var, "HASH": hash_}, aligned)
        k = triton.compile(src, target=GPUTarget("cuda", 90, 64), options={"num_warps": 4})
        n, ops = sc.count_sass(sc.sass_of(k))
        print("hash", hash_, "var", var, "sass", n, "per elt", round(n / 8, 1),
              dict(ops.most_common(10)))

# ruff: noqa: B023, E501
"""Trial (timing only, not part of the library): the staged GDN output step's prep work
done by programs of the output launch itself.  Each batch row gets HK prep programs,
placed D rows ahead of that row's tile programs in launch order; a tile program reads
its row's clock, issues its loads, spins on a per-(row, k-head) count that the row's
prep program sets (release) and each consumer decrements, so the counts are zero again
at the end of the launch.  Programs only wait on lower program ids, which the hardware
dispatches first.

    TRITON_INTERPRET=1 python benchmarks/trial_fused_prep.py check   # bits vs staged
    python benchmarks/trial_fused_prep.py time --out fused.json      # H200 timing
"""
import argparse
import json
import os
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from precisionlab.kernels.gdn_decode import GDNReplayCache  # noqa: E402
from precisionlab.kernels.gdn_device import _prep_qk, _staged_rows
from precisionlab.kernels.gdn_extra import load_tile
from precisionlab.kernels.gdn_step import _group_append, _group_coefs, _group_gates, _kq_parts
from precisionlab.kernels.tl_common import ring_load, ring_round, ring_store
from precisionlab.kernels.tl_dots import nvfp4_word_order
from precisionlab.kernels.tl_formats import K_NVFP4


@triton.jit
def _prep_unit(q_ptr, k_ptr, a_ptr, b_ptr, A_log, dt_bias, state_idx, ring_k, ring_g, ring_b,
               ring_kk, tickets, pqk, pco, flags, hk, bidx, NCONS,
               HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, L: tl.constexpr,
               R: tl.constexpr, RP: tl.constexpr, CW: tl.constexpr, GP: tl.constexpr,
               RING: tl.constexpr, MMA: tl.constexpr):
    GRP: tl.constexpr = HV // HK
    offs_k = tl.arange(0, K)
    offs_r = tl.arange(0, RP)
    offs_j = tl.arange(0, GP)
    slot = tl.load(state_idx + bidx)
    live = slot >= 0
    slot64 = tl.maximum(slot, 0).to(tl.int64)
    rbase = slot64 * R
    mj = offs_j < GRP
    hs = hk * GRP + offs_j
    kptr = ring_k + (rbase * HK + hk) * K + offs_r[:, None] * (HK * K) + offs_k[None, :]
    gptr = ring_g + rbase * HV + hs[:, None] + offs_r[None, :] * HV
    g, beta = _group_gates(a_ptr, b_ptr, A_log, dt_bias, bidx, hs, mj, HV)
    clock = tl.load(tickets + slot64, mask=live, other=0, cache_modifier=".cg")
    q, k, qn, kn = _prep_qk(q_ptr + (bidx * HK + hk) * K, k_ptr + (bidx * HK + hk) * K, K, RING)
    n = (clock // HK) % L
    valid = offs_r < n
    Kr = ring_load(kptr, valid[:, None] & live, RING)
    gr = tl.load(gptr, mask=mj[:, None] & valid[None, :] & live, other=0.0)
    kk, kq, kqs, w, Gs = _group_coefs(Kr, gr, q, k, valid)
    ok = live & (n != L - 1)
    pos = rbase + n
    _group_append(ring_k, ring_kk, ring_g, ring_b, pos, hk, hs, mj, k, kk, g, beta, valid, ok,
                  HK, HV, K, RP, RING)
    if MMA != 0:
        qb = pqk + (bidx * HK + hk) * (4 * K)
        k_hi, k_lo, q_hi, q_lo = _kq_parts(k, q, MMA)
        tl.store(qb + offs_k, k_hi, mask=ok)
        tl.store(qb + K + offs_k, k_lo, mask=ok)
        tl.store(qb + 2 * K + offs_k, q_hi, mask=ok)
        tl.store(qb + 3 * K + offs_k, q_lo, mask=ok)
    else:
        qb = pqk + (bidx * HK + hk) * (2 * K)
        tl.store(qb + offs_k, q, mask=ok)
        tl.store(qb + K + offs_k, k, mask=ok)
    cb = pco + (bidx * HV + hs) * CW
    m2 = mj[:, None] & ok
    tl.store(cb[:, None] + offs_r[None, :], w * kk[None, :], mask=m2)
    tl.store(cb[:, None] + RP + offs_r[None, :], w * kq[None, :], mask=m2)
    mo = mj & ok
    tl.store(cb + 2 * RP, tl.exp(Gs), mask=mo)
    tl.store(cb + 2 * RP + 1, tl.exp(g), mask=mo)
    tl.store(cb + 2 * RP + 2, beta, mask=mo)
    tl.store(cb + 2 * RP + 3, tl.zeros_like(beta) + kqs, mask=mo)
    tl.debug_barrier()
    if ok:
        tl.atomic_xchg(flags + bidx * HK + hk, NCONS, sem="release", scope="gpu")


@triton.jit
def _fused_out_kernel(
    q_ptr, k_ptr, a_ptr, b_ptr, A_log, dt_bias, ring_k, ring_g, ring_b, ring_kk, tickets, flags,
    v_ptr, state_idx, out, r_data, r_s1, r_s2, ring_v, ring_d, pqk, pco, B,
    HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
    TPP: tl.constexpr, NS: tl.constexpr, L: tl.constexpr, R: tl.constexpr, RP: tl.constexpr,
    CW: tl.constexpr, GP: tl.constexpr, FMT: tl.constexpr, RING: tl.constexpr,
    MMA: tl.constexpr, EVICT: tl.constexpr, D: tl.constexpr, SPIN: tl.constexpr = True,
):
    NVB: tl.constexpr = V // BV
    GRP: tl.constexpr = HV // HK
    T: tl.constexpr = HV * NVB // TPP
    NCONS: tl.constexpr = T // HK
    pid = tl.program_id(0)
    blk = pid // (HK + T)
    r = pid % (HK + T)
    if r < HK:
        if blk < B:
            _prep_unit(q_ptr, k_ptr, a_ptr, b_ptr, A_log, dt_bias, state_idx, ring_k, ring_g,
                       ring_b, ring_kk, tickets, pqk, pco, flags, r, blk, NCONS, HK, HV, K, L,
                       R, RP, CW, GP, RING, MMA)
    else:
        bidx = blk - D
        if bidx >= 0:
            tau0 = (r - HK) * TPP
            hk = tau0 // (GRP * NVB)
            slot = tl.load(state_idx + bidx)
            clock = tl.load(tickets + tl.maximum(slot, 0), cache_modifier=".cg")
            n = (clock // HK) % L
            if (slot >= 0) & (n != L - 1):
                slot64 = tl.maximum(slot, 0).to(tl.int64)
                rbase = slot64 * R
                offs_r = tl.arange(0, RP)
                offs_k = tl.arange(0, K)
                valid = offs_r < n
                fl = flags + bidx * HK + hk
                if SPIN:
                    it = 0
                    while (tl.atomic_add(fl, 0, sem="acquire", scope="gpu") == 0) & (it < 4000000):
                        it += 1
                if MMA != 0:
                    offs_c = tl.arange(0, 16)
                    rows_kq = offs_k
                    if FMT == K_NVFP4:
                        rows_kq = nvfp4_word_order(offs_k)
                    KQ = tl.load(pqk + (bidx * HK + hk) * (4 * K) + offs_c[None, :] * K
                                 + rows_kq[:, None], mask=(offs_c < 4)[None, :], other=0.0)
                    q = 0.0
                    k = 0.0
                else:
                    qb = pqk + (bidx * HK + hk) * (2 * K)
                    q = tl.load(qb + offs_k)
                    k = tl.load(qb + K + offs_k)
                    KQ = None
                pos = rbase + n
                for i in tl.range(0, TPP, num_stages=NS):
                    tau = tau0 + i
                    h = tau // NVB
                    offs_v = (tau % NVB) * BV + tl.arange(0, BV)
                    mrow = offs_v < V
                    codes, sc, s2v = load_tile(r_data, r_s1, r_s2, slot64 * HV + h, offs_v, mrow,
                                               V, K, FMT, MMA != 0, EVICT)
                    Dr = ring_load(ring_d + (rbase * HV + h) * V + offs_r[:, None] * (HV * V)
                                   + offs_v[None, :], valid[:, None] & mrow[None, :], RING)
                    v = ring_round(tl.load(v_ptr + (bidx * HV + h) * V + offs_v, mask=mrow,
                                           other=0.0).to(tl.float32), RING)
                    o, d = _staged_rows(codes, sc, s2v, k, q, Dr, pco + (bidx * HV + h) * CW, v,
                                        K, BV, RP, FMT, RING, KQ)
                    tl.store(out + (bidx * HV + h) * V + offs_v, o, mask=mrow)
                    ring_store(ring_d + (pos * HV + h) * V + offs_v, ring_round(d, RING), mrow,
                               RING)
                    ring_store(ring_v + (pos * HV + h) * V + offs_v, v, mrow, RING)
                if SPIN:
                    tl.atomic_add(fl, -1, sem="relaxed", scope="gpu")


def fused_launch(cache, q, k, v, a, b, A_log, dt_bias, idx, out, flags, D=4, spin=True):
    B = q.shape[0]
    pqk, pco, pn = cache._scratch
    if cache._mma == 1:
        pqk = pqk.view(torch.float16)
    r = cache.read if cache.read is not None else cache.ckpt
    bv, tpp = cache.out_BV, cache.out_TPP
    T = cache.HV * (cache.V // bv) // tpp
    GP = triton.next_power_of_2(max(1, cache.HV // cache.HK))
    return _fused_out_kernel[((B + D) * (cache.HK + T),)](
        q, k, a, b, A_log, dt_bias, cache.ring_k, cache.ring_g, cache.ring_beta, cache.ring_kk,
        cache.counters.tickets, flags, v, idx, out, *r.kernel_args(), cache.ring_v,
        cache.ring_d, pqk, pco, B, cache.HK, cache.HV, cache.K, cache.V, bv, tpp,
        cache.out_stages, cache.L, cache.R, cache.RP, cache.CW, GP, r.fmt_id, cache.ring_id,
        cache._mma, cache.out_evict, D, spin, num_warps=cache.out_num_warps)


def run_check(dev, HK, HV, K, V, B, L, ck, rd, pos, D, cfg):
    g = torch.Generator().manual_seed(0)
    cache = GDNReplayCache(B, HK, HV, K, V, window=L, checkpoint=ck, read=rd, device=dev, launch="staged", **cfg)
    cache.reset(torch.randn(B, HV, V, K, generator=g).to(dev) * 0.1)
    bf = torch.bfloat16
    def inputs(s):
        gg = torch.Generator().manual_seed(s)
        return dict(q=torch.randn(B, HK, K, generator=gg).to(bf).to(dev), k=torch.randn(B, HK, K, generator=gg).to(bf).to(dev),
                    v=torch.randn(B, HV, V, generator=gg).to(bf).to(dev), a=torch.randn(B, HV, generator=gg).to(bf).to(dev),
                    b=torch.randn(B, HV, generator=gg).to(bf).to(dev), A_log=torch.randn(HV, generator=gg).to(dev) * 0.1,
                    dt_bias=torch.randn(HV, generator=gg).to(dev) * 0.1)
    idx = torch.randperm(B, generator=g).to(torch.int32).to(dev)
    out = torch.empty(B, HV, V, device=dev)
    for s in range(pos):
        x = inputs(s)
        cache.step(x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"], idx, out=out)
    x = inputs(100)
    bufs = ["ring_k", "ring_v", "ring_d", "ring_g", "ring_beta", "ring_kk"]
    snap = {n: getattr(cache, n).clone() for n in bufs}
    tick = cache.counters.tickets.clone()
    outa = torch.full_like(out, float("nan"))
    cache._staged(x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"], idx, outa, concurrent=True)
    after_a = {n: getattr(cache, n).clone() for n in bufs}
    for n in bufs:
        getattr(cache, n).copy_(snap[n])
    cache.counters.tickets.copy_(tick)
    flags = torch.zeros(B * HK, dtype=torch.int32, device=dev)
    outb = torch.full_like(out, float("nan"))
    fused_launch(cache, x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"], idx, outb, flags, D=D)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    same = torch.equal(outa.nan_to_num(7.0), outb.nan_to_num(7.0))
    diff = (outa - outb).abs().nan_to_num(0).max().item()
    rings = all(torch.equal(after_a[n], getattr(cache, n)) for n in bufs)
    print(ck, rd, "pos", pos, "D", D, "out same", same, "maxdiff", diff, "rings same", rings,
          "flags zero", int(flags.abs().sum()), "nan", int(outb.isnan().sum()), int(outa.isnan().sum()))
    return same and rings and int(flags.abs().sum()) == 0


def check() -> int:
    dev = torch.device("cuda" if torch.cuda.is_available()
                       and os.environ.get("TRITON_INTERPRET") != "1" else "cpu")
    ok = True
    for ck, rd in (("fp32", None), ("fp32", "fp8-e4m3")):
        for pos in (0, 3, 7):
            cfg = dict(out_block_v=16, out_tiles_per_program=1 if rd is None else 2,
                       out_mma=rd is not None, out_num_warps=2 if rd else 1)
            ok &= run_check(dev, 2, 4, 32, 32, 3, 8, ck, rd, pos, 2, cfg)
    print("ALL OK" if ok else "MISMATCH")
    return 0 if ok else 1


def time_trial(out_path: str, depths: list[int], positions: list[int], designs: list[str],
               nospin: bool, plus_launch: bool) -> int:
    from precisionlab.kernels.clocks import advance_clocks_kernel
    from precisionlab.studies.bench_gdn import Clock, _inputs, _state0, shape_of
    from precisionlab.timing import capture

    dev = torch.device("cuda")
    clock = Clock(dev, reps=40)
    L = 16
    res = {}
    for spec in designs:
        model, ck, rd = spec.split(":")
        rd = None if rd == "none" else rd
        s = shape_of(model, 256)
        idx = torch.arange(s.batch, dtype=torch.int32, device=dev)
        x = _inputs(s, dev)
        cache = GDNReplayCache(s.batch, s.HK, s.HV, s.K, s.V, window=L, checkpoint=ck,
                               read=rd, device=dev)
        cache.reset(_state0(s, dev))
        out = torch.empty(s.batch, s.HV, s.V, device=dev)
        q, k, v, a, b, A, dt = (x[n] for n in ("q", "k", "v", "a", "b", "A_log", "dt_bias"))
        gstep = capture(lambda: cache.step(q, k, v, a, b, A, dt, idx, out=out))
        flags = torch.zeros(s.batch * s.HK, dtype=torch.int32, device=dev)
        graphs = {"prep_out": capture(lambda: cache._staged(q, k, v, a, b, A, dt, idx, out,
                                                             concurrent=True)),
                  "out": capture(lambda: cache._out_launch(v, idx, out))}
        for D in depths:
            graphs[f"fused_D{D}"] = capture(lambda D=D: fused_launch(
                cache, q, k, v, a, b, A, dt, idx, out, flags, D=D))
        if nospin:
            graphs[f"fused_D{depths[0]}_nospin"] = capture(lambda: fused_launch(
                cache, q, k, v, a, b, A, dt, idx, out, flags, D=depths[0], spin=False))
        if plus_launch:  # an advance's launch ordered after the fused one (no-op rows)
            none = torch.full((1,), -1, dtype=torch.int32, device=dev)

            def plus() -> None:
                fused_launch(cache, q, k, v, a, b, A, dt, idx, out, flags, D=depths[0])
                advance_clocks_kernel[(1,)](cache.counters.tickets, none, 1, s.HK, 256,
                                            num_warps=4)
            graphs[f"fused_D{depths[0]}_plus_launch"] = capture(plus)
        row = {}
        for pos in positions:
            cache.counters.reset()
            clock.run(gstep, pos)
            torch.cuda.synchronize()
            outa, outb = torch.empty_like(out), torch.empty_like(out)
            cache._staged(q, k, v, a, b, A, dt, idx, outa, concurrent=True)
            fused_launch(cache, q, k, v, a, b, A, dt, idx, outb, flags, D=depths[0])
            torch.cuda.synchronize()
            t = {name: clock.median(g) for name, g in graphs.items()}
            t["rel_diff"] = ((outa - outb).abs().max() / outa.abs().max()).item()
            t["flags_nonzero"] = int(flags.ne(0).sum())
            row[pos] = t
            print(spec, pos, {kk: round(vv, 2) if isinstance(vv, float) else vv
                              for kk, vv in t.items()}, flush=True)
        res[spec] = row
        graphs.clear()
        torch.cuda.empty_cache()
    Path(out_path).write_text(json.dumps(res, indent=1))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("check", "time"))
    ap.add_argument("--out", default="fused_prep.json")
    ap.add_argument("--depths", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--positions", type=int, nargs="+", default=[3, 8, 13])
    ap.add_argument("--designs", nargs="+", default=[
        "qwen3.5-4b:fp32:none", "qwen3.5-4b:fp32:fp8-e4m3", "qwen3.5-122b:fp32:fp8-e4m3",
        "qwen3.5-122b:fp32:none", "qwen3.5-4b:fp16-sr:nvfp4"])
    ap.add_argument("--nospin", action="store_true")
    ap.add_argument("--plus-launch", action="store_true")
    a = ap.parse_args()
    if a.what == "check":
        return check()
    return time_trial(a.out, a.depths, a.positions, a.designs, a.nospin, a.plus_launch)


if __name__ == "__main__":
    sys.exit(main())

# ruff: noqa: E501
"""Trial (timing only): Where an output step's time goes: prep, out, prep+out, the empty flush launch alone,
and output-step means of the full step with and without the flush launch (timing only)."""
import json
import statistics
import sys

import torch

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
from precisionlab.kernels.gdn_decode import GDNReplayCache
from precisionlab.studies.bench_gdn import Clock, _inputs, _state0, shape_of
from precisionlab.timing import capture

L = 16
dev = torch.device("cuda")
clock = Clock(dev, reps=30)
res = {}
for model, ck, rd in [("qwen3.5-4b", "fp32", None), ("qwen3.5-4b", "fp32", "fp8-e4m3"),
                      ("qwen3.5-122b", "fp32", "fp8-e4m3"), ("qwen3.5-122b", "fp32", None)]:
    s = shape_of(model, 256)
    idx = torch.arange(s.batch, dtype=torch.int32, device=dev)
    row = {}
    for variant in ("default", "noflush", "default2"):
        x = _inputs(s, dev)
        cache = GDNReplayCache(s.batch, s.HK, s.HV, s.K, s.V, window=L, checkpoint=ck, read=rd,
                               device=dev)
        cache.reset(_state0(s, dev))
        out = torch.empty(s.batch, s.HV, s.V, device=dev)
        args = (x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"], idx)
        if variant == "noflush":
            cache._flush = lambda *a, **k: None
        g = capture(lambda: cache.step(*args, out=out))
        cache.counters.reset()
        times = clock.cycle(g, L, 3)
        row[variant] = {"out_mean": statistics.mean(times[:L - 1]), "flush": times[L - 1],
                        "step": statistics.mean(times)}
        if variant == "default":
            q, k, v, a, b, A, dt = args[:7]
            gp = capture(lambda: cache._prep_launch(q, k, a, b, A, dt, idx, concurrent=True))
            go = capture(lambda: cache._out_launch(v, idx, out))
            gpo = capture(lambda: cache._staged(q, k, v, a, b, A, dt, idx, out, concurrent=True))
            gf = capture(lambda: cache._flush(q, k, v, a, b, A, dt, idx, idx, out, commit=False))
            cache.counters.reset()
            clock.run(g, 7)  # position 7
            for name, gg in (("prep", gp), ("out", go), ("prep_out", gpo), ("flush_empty", gf)):
                row[name] = clock.median(gg)
            cache.counters.reset()
        print(model, ck, rd, variant, row, flush=True)
        del cache, g
        torch.cuda.empty_cache()
    res[f"{model} {ck} {rd}"] = row
import os

json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "r", "probe_gate.json"), "w"), indent=1)

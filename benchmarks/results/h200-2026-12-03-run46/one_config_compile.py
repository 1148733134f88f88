"""One drift configuration on the kernels (split, fp16-sr checkpoint, nvfp4 copy) with
every kernel compile logged: ``python one_config_compile.py MODEL PRECOMPILE STEPS L``
(PRECOMPILE 1 or 0).  Prints the wall time, the compiles and the progress ticks."""

import collections
import sys
import time

import triton

from precisionlab import engine
from precisionlab.studies import drift

model, pre, steps, window = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3]), int(sys.argv[4])
events = []
t0 = time.perf_counter()


def hook(*args, **kwargs):
    fn = kwargs.get("fn")
    name = getattr(getattr(fn, "jit_function", None), "__name__", None) or str(
        kwargs.get("repr", ""))[:40]
    events.append((round(time.perf_counter() - t0, 2), name))


triton.knobs.runtime.jit_post_compile_hook = hook
if not pre:
    engine._precompile = lambda *a, **k: None
ticks = []
drift(model, ["nvfp4"], designs=["split"], windows=[window], checkpoint_format="fp16-sr",
      steps=steps, batch=2, device="cuda", backend="triton",
      progress=lambda d, n: ticks.append(round(time.perf_counter() - t0, 2)))
print("pre", pre, "total", round(time.perf_counter() - t0, 1), "compiles", len(events))
print("ticks", ticks[:12], ticks[-3:])
print(collections.Counter(n for _, n in events).most_common(12))
print(events[:30])

"""Test session set-up.  Without a GPU the Triton kernels run in the interpreter.
Triton reads ``TRITON_INTERPRET`` when it decorates a function, its own library's
included (``tl.cumsum``'s combine function), so the switch is made here, before any
test module imports Triton; ``kernels.testing.kernel_device`` makes the same choice.
In the interpreter, device-function calls inside a running kernel skip their
redundant re-patching of ``triton.language``
(``kernels.testing.skip_repatching_device_calls``), and its bookkeeping of every
operation is cheaper (``kernels.testing.cache_interpreter_types``)."""

import os
import sys
from pathlib import Path

import torch

# The checkout's top-level folders (kernels/, formats/, studies/) are importable as
# top-level packages while the checkout is on sys.path (``python -m pytest`` puts the
# working directory first).  Keep it last, so that they never shadow an installed
# package of the same name: transformers imports the ``kernels`` distribution.
ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT] + [str(ROOT)]

# Parallel test processes share the machine's cores: each study's kernel compiles get a
# share of them instead of one worker process per core each.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    os.environ.setdefault("PRECISIONLAB_COMPILE_WORKERS", str(max(
        2, (os.cpu_count() or 2) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
    from precisionlab.kernels.testing import (
        cache_interpreter_types,
        skip_repatching_device_calls,
    )

    skip_repatching_device_calls()
    cache_interpreter_types()

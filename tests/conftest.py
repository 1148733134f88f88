"""Test session set-up.  Without a GPU the Triton kernels run in the interpreter.
Triton reads ``TRITON_INTERPRET`` when it decorates a function, its own library's
included (``tl.cumsum``'s combine function), so the switch is made here, before any
test module imports Triton; ``kernels.testing.kernel_device`` makes the same choice."""

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

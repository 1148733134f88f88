"""Clock advance of a replay step whose flush launch runs on a second CUDA stream.

The launches of such a step touch disjoint rows, so either stream may run first; a
launch that read a clock another launch of the same step had already advanced would
flush, or skip, the wrong rows.  So no launch of the step advances a clock: this
one-program launch does, enqueued on the flush's stream behind the flush launch and
behind an event recorded after the main stream's clock-reading launch (the GDN prep
launch, the Mamba-2 ring-weights launch), so it runs once both have read their clocks
(:class:`FlushStream` runs such a step).  Used by the GDN staged step
(``gdn_decode.GDNReplayCache``) and the Mamba-2 split step (``mamba2_step``).  Torch
reference: a clock is a step count, ``+= STEP`` per step.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from .compile_worker import settle_module_keys


@triton.jit
def advance_clocks_kernel(tickets, state_idx, B, STEP: tl.constexpr, BP: tl.constexpr):
    """Advance the clock of every live row (``state_idx >= 0``) by ``STEP``."""
    offs = tl.arange(0, BP)
    sl = tl.load(state_idx + offs, mask=offs < B, other=-1)
    tl.atomic_add(tickets + tl.maximum(sl, 0), STEP, mask=sl >= 0, sem="relaxed")


class FlushStream:
    """The second stream of a concurrent replay step and the event that orders its
    clock advance after the main stream's clock-reading launch (created on first use)."""

    def __init__(self) -> None:
        self.stream: torch.cuda.Stream | None = None
        self.clocks_read: torch.cuda.Event | None = None

    def step(self, device: torch.device, read_clocks: Callable[[], None],
             rest: Callable[[], None], flush: Callable[[], None],
             advance: Callable[[], None]) -> None:
        """One step as a fork and a join (CUDA-graph capturable): ``read_clocks`` then
        ``rest`` on the current stream; ``flush`` on this stream beside them, then
        ``advance`` once the flush and ``read_clocks`` are done."""
        main = torch.cuda.current_stream(device)
        if self.stream is None:
            self.stream = torch.cuda.Stream(device=device)
            self.clocks_read = torch.cuda.Event()
        self.stream.wait_stream(main)
        read_clocks()
        self.clocks_read.record(main)
        rest()
        with torch.cuda.stream(self.stream):
            flush()
            self.stream.wait_event(self.clocks_read)
            advance()
        main.wait_stream(self.stream)


settle_module_keys(__name__)  # every process looks its kernels up under one key

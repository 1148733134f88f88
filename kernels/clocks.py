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

Captured in a CUDA graph, the flush's stream puts its flush launches (the flush and,
where there is one, the read-copy encode) in a conditional node whose condition a
one-program launch (:func:`flushes_kernel`) sets from the clocks: at a step where no
row flushes, those launches are not run at all, where otherwise their programs would
start, find nothing to do and exit beside the main stream's output launches
(:data:`CONDITIONAL_FLUSH`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl


@triton.jit
def advance_clocks_kernel(tickets, state_idx, B, STEP: tl.constexpr, BP: tl.constexpr):
    """Advance the clock of every live row (``state_idx >= 0``) by ``STEP``."""
    offs = tl.arange(0, BP)
    sl = tl.load(state_idx + offs, mask=offs < B, other=-1)
    tl.atomic_add(tickets + tl.maximum(sl, 0), STEP, mask=sl >= 0, sem="relaxed")


CONDITIONAL_FLUSH = True
"""Whether a captured concurrent step runs its flush launches in a conditional graph
node (where the installed torch can capture one)."""


@triton.jit
def flushes_kernel(tickets, state_idx, B, pred, L, PCLK, BP: tl.constexpr):
    """``pred[0]`` (bool): whether any live row's clock (``tickets // PCLK`` steps) is at
    ring position ``L - 1``, so that the step flushes it."""
    offs = tl.arange(0, BP)
    sl = tl.load(state_idx + offs, mask=offs < B, other=-1)
    t = tl.load(tickets + tl.maximum(sl, 0), mask=sl >= 0, other=0) // PCLK
    hit = (sl >= 0) & (t % L == L - 1)
    tl.store(pred, tl.max(hit.to(tl.int32), axis=0) > 0)


def _capturing_graph(device: torch.device):
    """The CUDA graph being captured on the current stream, where this torch can put a
    conditional node in it; else None."""
    if not (CONDITIONAL_FLUSH and torch.cuda.is_current_stream_capturing()):
        return None
    get = getattr(torch.cuda.CUDAGraph, "get_currently_capturing_graph", None)
    g = get() if get is not None else None
    return g if hasattr(g, "begin_capture_to_if_node") else None


class FlushStream:
    """The second stream of a concurrent replay step and the event that orders its
    clock advance after the main stream's clock-reading launch (created on first use)."""

    def __init__(self) -> None:
        self.stream: torch.cuda.Stream | None = None
        self.clocks_read: torch.cuda.Event | None = None
        self.pred: torch.Tensor | None = None

    def step(self, device: torch.device, read_clocks: Callable[[], None],
             rest: Callable[[], None], flush: Callable[[], None],
             advance: Callable[[], None], when: tuple | None = None) -> None:
        """One step as a fork and a join (CUDA-graph capturable): ``read_clocks`` then
        ``rest`` on the current stream; ``flush`` on this stream beside them, then
        ``advance`` once the flush and ``read_clocks`` are done.  ``when``: ``(tickets,
        state_indices, window, clock units per step)``; in a captured graph ``flush``
        then runs only at steps where a row flushes (a conditional node)."""
        main = torch.cuda.current_stream(device)
        if self.stream is None:
            self.stream = torch.cuda.Stream(device=device)
            self.clocks_read = torch.cuda.Event()
            self.pred = torch.zeros(1, dtype=torch.bool, device=device)
        self.stream.wait_stream(main)
        read_clocks()
        self.clocks_read.record(main)
        rest()
        with torch.cuda.stream(self.stream):
            graph = _capturing_graph(device) if when is not None else None
            if graph is None:
                flush()
            else:
                tickets, state_indices, window, per_step = when
                B = state_indices.shape[0]
                flushes_kernel[(1,)](tickets, state_indices, B, self.pred, window, per_step,
                                     BP=max(16, triton.next_power_of_2(B)), num_warps=4)
                graph.begin_capture_to_if_node(self.pred)
                try:
                    flush()
                finally:
                    graph.end_capture_to_conditional_node()
            self.stream.wait_event(self.clocks_read)
            advance()
        main.wait_stream(self.stream)

"""Clock advance of a replay step whose flush launch runs on a second CUDA stream.

The launches of such a step touch disjoint rows, so either stream may run first; a
launch that read a clock another launch of the same step had already advanced would
flush, or skip, the wrong rows.  So no launch of the step advances a clock: this
one-program launch does, enqueued on the flush's stream behind the flush launch and
behind an event recorded after the main stream's clock-reading launch (the GDN prep
launch, the Mamba-2 ring-weights launch), so it runs once both have read their clocks.
Used by the GDN staged step (``gdn_decode.GDNReplayCache``) and the Mamba-2 split step
(``mamba2_step``).  Torch reference: a clock is a step count, ``+= STEP`` per step.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def advance_clocks_kernel(tickets, state_idx, B, STEP: tl.constexpr, BP: tl.constexpr):
    """Advance the clock of every live row (``state_idx >= 0``) by ``STEP``."""
    offs = tl.arange(0, BP)
    sl = tl.load(state_idx + offs, mask=offs < B, other=-1)
    tl.atomic_add(tickets + tl.maximum(sl, 0), STEP, mask=sl >= 0, sem="relaxed")

"""Clock advance of a replay step whose flush launch runs on a second CUDA stream.

The launches of such a step touch disjoint rows, so either stream may run first; a
launch that read a clock another launch of the same step had already advanced would
flush, or skip, the wrong rows.  So the launches beside the flush only *post* that
they have read their clocks (a fire-and-forget atomic add), and this one-program
launch, enqueued after the flush launch on its stream, waits for every post, takes
them back and advances the clocks.  Used by the GDN staged step
(``gdn_decode.GDNReplayCache``) and the Mamba-2 split step (``mamba2_step``).
Torch reference: a clock is a step count, ``+= STEP`` per step.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def advance_clocks_kernel(posted, tickets, state_idx, B, POSTS: tl.constexpr,
                          STEP: tl.constexpr, BP: tl.constexpr):
    """Wait until ``POSTS * B`` programs have posted at ``posted``, take those posts back
    and advance the clock of every live row (``state_idx >= 0``) by ``STEP``."""
    while tl.atomic_add(posted, 0, sem="acquire") < POSTS * B:
        pass
    tl.atomic_add(posted, -POSTS * B, sem="relaxed")
    offs = tl.arange(0, BP)
    sl = tl.load(state_idx + offs, mask=offs < B, other=-1)
    tl.atomic_add(tickets + tl.maximum(sl, 0), STEP, mask=sl >= 0, sem="relaxed")

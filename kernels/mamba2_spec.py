"""Speculative decoding on a replay design: verify T draft tokens from the stored
copy plus the ring without writing state, then commit the accepted ones by
moving the per-slot commit pointer.

Torch reference: ``precisionlab.speculative.SpeculativeDecoder`` (``verify`` ->
``kinds.Mamba2Kind.replay_at``, its overflow flush -> ``fold_valid``).

Semantics (per slot, ``c`` = committed ring entries):

* ``verify``: if ``c + T > L`` the committed entries are first folded into a new
  checkpoint (and read copy), in the same launch, and the drafts are replayed
  from the freshly written copy (decoded in registers); the drafts go to ring
  entries ``[c, c + T)`` behind the commit pointer.  Outputs of draft k use the
  entries before it and itself, exactly as plain decoding would.
* Speculative caches have two ring halves: a flushing verify reads the
  committed entries from one half and writes its drafts to the other.  Verify
  writes no counters; ``commit(n, T)`` applies the flush's bookkeeping.
* ``commit(n)``: ``c += n`` and the slot's step counter advances by ``n``;
  rejected entries are overwritten by the next verify.
* The stochastic-rounding step of a verify flush is ``steps[slot] - 1`` (the
  last folded token's step), as in the torch decoder.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .compile_worker import settle_module_keys
from .mamba2_kernel import MODE_VERIFY
from .mamba2_step import HeadParams, Mamba2Cache, launch_replay, slot_indices
from .mamba2_verify import launch_staged_verify


def mamba2_verify(
    cache: Mamba2Cache,
    x: torch.Tensor,
    dt: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    params: HeadParams,
    *,
    z: torch.Tensor | None = None,
    state_indices: torch.Tensor | None = None,
    dt_softplus: bool = False,
    out: torch.Tensor | None = None,
    block_p: int | None = None,
    num_warps: int | None = None,
    verify_launch: str = "staged-dot",
) -> torch.Tensor:
    """Outputs of ``T`` draft tokens per row.

    ``x, z``: (batch, T, heads, P); ``dt``: (batch, T, heads); ``B, C``:
    (batch, T, groups, N).  Returns (batch, T, heads, P) float32.  ``T`` must not
    exceed the window.  ``verify_launch``: "staged-dot" (default, ``mamba2_verify``: a
    flush launch where drafts would overrun the window, a prep launch for the drafts'
    coefficients, then an output launch that reads each state tile once and computes
    all drafts' reductions as tensor-core products; 16-row tiles, 1 warp), "staged"
    (the same with CUDA-core reductions) or "single" (one launch of ``mamba2_kernel``).
    On an H200 at batch 256, T = 4 and L = 16 (every fourth verify flushes), nano-4b /
    super-120b shapes: 509 / 550 us per verify, 0.98 / 0.99x a conventional step (628 /
    714 when the flush and the coefficients shared one launch of a program per head;
    then 836 / 861 staged and 1270 / 1304 single); at batch 1 26.7 / 24.8 us (24.6 /
    22.3 then, one launch fewer; 32.0 / 27.4 single).
    """
    T = x.shape[1]
    if not cache.speculative:
        raise ValueError("verify needs a cache allocated with speculative=True")
    if not 1 <= T <= cache.window:
        raise ValueError(f"draft length must be in [1, window={cache.window}], got {T}")
    idx = state_indices if state_indices is not None else slot_indices(x.shape[0], x.device)
    if out is None:
        out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    if verify_launch in ("staged", "staged-dot"):
        dot = verify_launch == "staged-dot"
        launch_staged_verify(cache, x, dt, B, C, params, z=z, out=out, state_indices=idx,
                             dt_softplus=dt_softplus, block_p=block_p or (16 if dot else None),
                             num_warps=num_warps or (1 if dot else None), dot=dot)
    elif verify_launch == "single":
        launch_replay(MODE_VERIFY, cache, x, dt, B, C, params, z=z, out=out,
                      state_indices=idx, T=T, dt_softplus=dt_softplus, block_p=block_p or 16,
                      num_warps=num_warps)
    else:
        raise ValueError("verify_launch must be 'single', 'staged' or 'staged-dot', got "
                         f"{verify_launch!r}")
    return out


@triton.jit
def _commit_kernel(ring_len, steps, state_idx, accepted, batch, T, L, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < batch
    slot = tl.load(state_idx + offs, mask=m, other=-1)
    ok = m & (slot >= 0)
    n = tl.load(accepted + offs, mask=ok, other=0).to(tl.int32)
    s = tl.where(ok, slot, 0)
    rl = tl.load(ring_len + s, mask=ok, other=0)
    c = rl & 0xFFFF
    half = rl >> 16
    # a verify that found c + T > L flushed and put its drafts in the other half
    new = tl.where(c + T > L, ((1 - half) << 16) | n, rl + n)
    tl.store(ring_len + s, new, mask=ok)
    tl.store(steps + s, tl.load(steps + s, mask=ok, other=0) + n, mask=ok)


def mamba2_commit(
    cache: Mamba2Cache, accepted: torch.Tensor, drafts: int,
    state_indices: torch.Tensor | None = None,
) -> None:
    """Accept the first ``accepted[b]`` of the ``drafts`` tokens the last
    :func:`mamba2_verify` checked for row b (integer tensor (batch,))."""
    batch = accepted.shape[0]
    idx = state_indices if state_indices is not None else slot_indices(batch, accepted.device)
    block = 128
    _commit_kernel[(triton.cdiv(batch, block),)](cache.ring_len, cache.steps, idx, accepted,
                                                 batch, drafts, cache.window, BLOCK=block)


settle_module_keys(__name__)  # every process looks its kernels up under one key

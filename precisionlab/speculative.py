"""Speculative decoding on a replay design (torch emulation).

Draft tokens are appended to the ring behind a per-sequence commit pointer;
``verify`` computes every draft's output from the stored copy and the ring
without writing state; ``commit(n)`` advances the pointer by the accepted count;
rejected entries are simply overwritten by later drafts.  Before a verify that
would overflow the window, the committed entries are flushed into the
checkpoint (per sequence), so a window never overflows and no state snapshot is
ever taken per draft token.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .designs import Design, TorchDesignRunner, store_state
from .kinds import LayerKind


class SpeculativeDecoder(TorchDesignRunner):
    """A design runner with ``verify``/``commit`` instead of ``step``."""

    def __init__(
        self,
        design: Design,
        kind: LayerKind,
        params,
        batch: int,
        device: torch.device,
        ring_dtype: torch.dtype,
        seed: int = 0,
        state0: torch.Tensor | None = None,
    ):
        super().__init__(design, kind, params, batch, device, ring_dtype, seed, state0)
        self.committed = torch.zeros(batch, dtype=torch.long, device=device)
        self.steps = torch.zeros(batch, dtype=torch.long, device=device)
        """Tokens each sequence has committed so far (its decode step counter)."""
        self.flushes = 0

    def verify(self, drafts: Sequence) -> list[torch.Tensor]:
        """Outputs of ``len(drafts)`` draft steps (prepared inputs), from the stored
        copy plus the committed ring entries and the drafts before each one."""
        T = len(drafts)
        if not 1 <= T <= self.design.window:
            raise ValueError(f"draft length must be in [1, window={self.design.window}], got {T}")
        overflow = self.committed + T > self.design.window
        if bool(overflow.any()):
            self._flush(overflow)
        return [
            self.kind.replay_at(self.read, self.ring, inp, self.params, self.committed + k)
            for k, inp in enumerate(drafts)
        ]

    def commit(self, accepted: torch.Tensor) -> None:
        """Accept the first ``accepted[b]`` drafts of sequence b."""
        self.committed = self.committed + accepted.to(self.committed)
        self.steps = self.steps + accepted.to(self.steps)

    def _flush(self, which: torch.Tensor) -> None:
        """Fold the committed entries of the sequences in ``which`` into a new checkpoint."""
        capacity = self.design.window
        valid = torch.arange(capacity, device=which.device)[None] < self.committed[:, None]
        S_new = self.kind.fold_valid(self.ckpt, self.ring, self.params, valid)
        # stochastic rounding takes the step of the last folded token, per sequence
        # (as plain decoding's flush at step t does, and as the kernels do)
        sr_step = (self.steps - 1).clamp_min(0)
        ckpt, read = self.ckpt.clone(), self.read.clone()
        for step in sr_step[which].unique().tolist():
            new_ckpt, new_read = store_state(self.design, S_new, self.seed, int(step))
            rows = (which & (sr_step == step))[:, None, None, None]
            ckpt = torch.where(rows, new_ckpt, ckpt)
            read = torch.where(rows, new_read, read)
        self.ckpt = ckpt
        self.read = ckpt if self.design.kind == "shared" else read
        self.flushes += 1
        self.committed = torch.where(which, torch.zeros_like(self.committed), self.committed)


def acceptance_lengths(
    batch: int, drafts: int, p: float, generator: torch.Generator
) -> torch.Tensor:
    """Accepted tokens per sequence for one verify of ``drafts`` tokens: the first
    is always kept (the target model's own token), each later one is accepted with
    probability ``p`` while all before it were."""
    ok = torch.rand(batch, max(drafts - 1, 0), generator=generator) < p
    leading = torch.cumprod(ok.long(), dim=1).sum(dim=1) if drafts > 1 else torch.zeros(batch)
    return 1 + leading.long()

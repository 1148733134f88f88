"""Precision designs: how a layer's state is stored between decode steps.

* ``shared(F, L)``: one copy in format F serves outputs and the recursion; each
  flush recomputes the state in fp32 from the decoded copy and rounds it back to F.
  ``shared(F, 1)`` is conventional decoding with the state stored in F.
* ``split(C, F, L)``: a checkpoint in C carries the recursion, a read copy in F
  serves the output steps; each flush recurses from the checkpoint and writes both.
* ``reference``: the fp64 recurrence, never rounded (run by the engine).

Step ``t`` (0-based) appends its inputs to the ring; when the ring then holds L
entries the step is a flush: its output comes from the fresh fp32 state.
Stochastic rounding of a flush at step t uses the design's seed and ``step=t``
for the checkpoint and ``seed + 1`` for a split read copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import formats
from .kinds import LayerKind


class DesignError(ValueError):
    """A design that cannot be built (unknown name, bad window, bad format)."""


@dataclass(frozen=True)
class Design:
    """A storage design for one layer's state.

    ``kind`` is "shared" or "split"; ``read_format`` is the copy outputs read;
    ``checkpoint_format`` is the recursion's copy (equal to ``read_format`` for shared).
    """

    kind: str
    read_format: str
    window: int
    checkpoint_format: str

    @property
    def label(self) -> str:
        if self.kind == "shared":
            return f"shared({self.read_format}, L={self.window})"
        return f"split({self.checkpoint_format}->{self.read_format}, L={self.window})"


def shared(fmt: str, window: int) -> Design:
    """One copy in ``fmt``, flushed every ``window`` steps."""
    return make_design("shared", fmt, window)


def split(checkpoint_format: str, read_format: str, window: int) -> Design:
    """Checkpoint in ``checkpoint_format``, read copy in ``read_format``."""
    return make_design("split", read_format, window, checkpoint_format)


DESIGN_KINDS = ("shared", "split")


def make_design(kind: str, fmt: str, window: int, checkpoint_format: str = "fp32") -> Design:
    """Validated constructor used by the API and the CLI."""
    if kind not in DESIGN_KINDS:
        raise DesignError(f"unknown design {kind!r}; choose one of {', '.join(DESIGN_KINDS)}")
    if int(window) < 1:
        raise DesignError(f"window must be a positive integer, got {window}")
    formats.get(fmt)
    if kind == "shared":
        checkpoint_format = fmt
    else:
        formats.get(checkpoint_format)
    return Design(kind, fmt, int(window), checkpoint_format)


class TorchDesignRunner:
    """Runs one design over a batch in torch emulation (fp32 arithmetic).

    ``step(inp, t)`` returns ``(y, fresh_state)`` where ``fresh_state`` is the fp32
    state computed at a flush step and ``None`` on output steps.
    """

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
        self.design, self.kind, self.params, self.seed = design, kind, params, seed
        self.ckpt_format = formats.get(design.checkpoint_format)
        self.read_format = formats.get(design.read_format)
        S0 = state0 if state0 is not None else torch.zeros(kind.state_shape(batch), device=device)
        self._store(S0.to(torch.float32), t=-1)
        self.ring = kind.new_ring(batch, design.window, ring_dtype, device)

    def _store(self, S: torch.Tensor, t: int) -> None:
        """Round a fresh fp32 state into the checkpoint (and read copy)."""
        step = max(t, 0)
        self.ckpt = self.ckpt_format.quantize(S, seed=self.seed, step=step)
        if self.design.kind == "shared":
            self.read = self.ckpt
        else:
            self.read = self.read_format.quantize(S, seed=self.seed + 1, step=step)

    def step(
        self, inp, t: int, raw: dict[str, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Advance one decode step. ``inp`` is the kind's prepared inputs (fp32, ring
        quantities already rounded to the ring dtype); ``raw`` the trace's step dict
        (unused here; kernel backends that recompute gates take it)."""
        if self.ring.count + 1 < self.design.window:
            return self.kind.replay(self.read, self.ring, inp, self.params), None
        S_new = self.kind.flush(self.ckpt, self.ring, inp, self.params)
        self.ring.reset()
        self._store(S_new, t)
        return self.kind.read_output(S_new, inp, self.params), S_new

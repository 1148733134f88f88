"""Precision designs: how a layer's state is stored between decode steps.

* ``shared(F, L)``: one copy in format F serves outputs and the recursion; each
  flush recomputes the state in fp32 from the decoded copy and rounds it back to F.
  ``shared(F, 1)`` is conventional decoding with the state stored in F.
* ``split(C, F, L)``: a checkpoint in C carries the recursion, a read copy in F
  serves the output steps; each flush recurses from the checkpoint, stores it, and
  encodes the read copy from the stored checkpoint (so the copy is a function of the
  checkpoint alone and can be rebuilt from it at any time).
* ``reference``: the fp64 recurrence, never rounded (run by the engine).

Step ``t`` (0-based) appends its inputs to the ring; when the ring then holds L
entries the step is a flush: its output comes from the fresh fp32 state.
Stochastic rounding of a flush at step t uses the design's seed and ``step=t``
for the checkpoint and ``seed + 1`` for a split read copy.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from . import formats
from .kinds import LayerKind

CONVENTIONAL_FP32_BYTES = 8.0  # an fp32 state read and written every step


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

    def bytes_per_step(self, matrix: tuple[int, int] | None = None) -> float:
        """Modelled memory traffic: bytes moved per state element per decode step,
        averaged over the window.  Output steps read the read copy; a flush reads and
        writes the checkpoint (and writes a split read copy), so shared moves
        ``f (L + 1) / L`` and split ``r + 2 c / L``, with the formats' bytes per element
        (scales included, for a ``matrix`` of (rows, cols); default 128 x 128).  The
        ring's few percent are left out.  Conventional fp32 decoding moves
        :data:`CONVENTIONAL_FP32_BYTES`."""
        L = self.window
        r = formats.get(self.read_format).bits_per_element(matrix) / 8
        if self.kind == "shared":
            return r * (L + 1) / L
        return r + 2 * formats.get(self.checkpoint_format).bits_per_element(matrix) / 8 / L

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
    try:
        window = operator.index(window)
    except TypeError:
        raise DesignError(f"window must be a positive integer, got {window!r}") from None
    if window < 1:
        raise DesignError(f"window must be a positive integer, got {window}")
    formats.get(fmt)
    if kind == "shared":
        checkpoint_format = fmt
    else:
        formats.get(checkpoint_format)
    return Design(kind, fmt, window, checkpoint_format)


def store_state(
    design: Design, S: torch.Tensor, seed: int, t: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The checkpoint and read copy a flush at step ``t`` stores from the fresh fp32
    state ``S`` (decoded to fp32; one tensor for both when the design is shared).  A
    split read copy encodes the stored checkpoint, not ``S``: with an fp32 checkpoint
    that is the same thing; a 16-bit checkpoint's step (2**-7 relative or finer) sits
    well under an fp8 or 4-bit read format's (2**-3 or coarser)."""
    step = max(t, 0)
    ckpt = formats.get(design.checkpoint_format).quantize(S, seed=seed, step=step)
    if design.kind == "shared":
        return ckpt, ckpt
    return ckpt, formats.get(design.read_format).quantize(ckpt, seed=seed + 1, step=step)


def _repeat_batch(inp, copies: int):
    """The kind's step inputs with the batch axis repeated ``copies`` times."""
    if copies == 1:
        return inp

    def rep(t):
        return None if t is None else t.repeat(copies, *([1] * (t.dim() - 1)))

    return dataclasses.replace(
        inp, **{f.name: rep(getattr(inp, f.name)) for f in dataclasses.fields(inp)}
    )


class TorchDesignGroup:
    """Several designs with one window run as a single batch of ``designs x batch``
    sequences: the same per-step math as :class:`TorchDesignRunner` on each design's
    slice, launched once for the whole group (only flushes round per design).

    ``step(inp, t)`` returns ``(y, fresh_state)`` with a leading design axis:
    ``y`` is (designs, batch, ...); ``fresh_state`` is (designs, batch, ...) at a
    flush step and ``None`` otherwise.
    """

    def __init__(
        self,
        designs: Sequence[Design],
        kind: LayerKind,
        params,
        batch: int,
        device: torch.device,
        ring_dtype: torch.dtype,
        seed: int = 0,
        state0: torch.Tensor | None = None,
    ):
        windows = {d.window for d in designs}
        if len(windows) != 1:
            raise DesignError(f"a design group needs one window, got {sorted(windows)}")
        self.designs, self.kind, self.params, self.seed = list(designs), kind, params, seed
        self.batch, self.window = batch, windows.pop()
        shape = kind.state_shape(batch)
        S0 = state0 if state0 is not None else torch.zeros(shape, device=device)
        self._store_all(S0.to(torch.float32).expand(len(self.designs), *shape), t=-1)
        self.ring = kind.new_ring(len(self.designs) * batch, self.window, ring_dtype, device)

    def _store_all(self, S: torch.Tensor, t: int) -> None:
        """Round each design's fresh state (designs, batch, ...) into new stored copies
        (never into the tensors ``ckpt`` / ``read`` held before: callers may share them)."""
        ckpt, read = zip(*(store_state(d, S[g], self.seed, t) for g, d in enumerate(self.designs)),
                         strict=True)
        self.ckpt, self.read = torch.cat(ckpt), torch.cat(read)

    def step(
        self, inp, t: int, raw: dict[str, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Advance every design of the group one decode step."""
        n = len(self.designs)
        inp = _repeat_batch(inp, n)
        if self.ring.count + 1 < self.window:
            y = self.kind.replay(self.read, self.ring, inp, self.params)
            return y.view(n, self.batch, *y.shape[1:]), None
        S_new = self.kind.flush(self.ckpt, self.ring, inp, self.params)
        self.ring.reset()
        S_new = S_new.view(n, self.batch, *S_new.shape[1:])
        self._store_all(S_new, t)
        y = self.kind.read_output(S_new.flatten(0, 1), inp, self.params)
        return y.view(n, self.batch, *y.shape[1:]), S_new


class TorchDesignRunner(TorchDesignGroup):
    """Runs one design over a batch in torch emulation (fp32 arithmetic): a group of
    one design.

    ``step(inp, t)`` returns ``(y, fresh_state)`` where ``fresh_state`` is the fp32
    state computed at a flush step and ``None`` on output steps.  ``ckpt`` and
    ``read`` are the stored copies decoded to fp32, ``ring`` the ring.
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
        super().__init__([design], kind, params, batch, device, ring_dtype, seed, state0)
        self.design = design

    def step(
        self, inp, t: int, raw: dict[str, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Advance one decode step. ``inp`` is the kind's prepared inputs (fp32, ring
        quantities already rounded to the ring dtype); ``raw`` the trace's step dict
        (unused here; kernel backends that recompute gates take it)."""
        y, S_new = super().step(inp, t, raw)
        return y[0], None if S_new is None else S_new[0]

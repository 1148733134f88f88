"""Mamba-2 decode recurrence: conventional step, replay from a checkpoint plus a
ring of step inputs, and the flush that folds the ring into a new checkpoint.

Shapes (batch first, one state slot per sequence):

    state S   (batch, heads, headdim P, dstate N)
    x, z      (batch, heads, P)            dt (batch, heads), after softplus
    B, C      (batch, groups, N)           heads of a group share B and C
    ring      x (batch, L, heads, P), B (batch, L, groups, N), dt (batch, L, heads)

Every function is dtype-generic (fp64 for the reference, fp32 for designs) and
works on CPU and CUDA tensors.  These are also the torch references of the
Triton kernels in ``precisionlab.kernels``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Mamba2Params:
    """Per-head constants of one layer."""

    A: torch.Tensor  # (heads,), negative
    D: torch.Tensor  # (heads,)
    dt_bias: torch.Tensor  # (heads,)
    ngroups: int

    def to(self, dtype: torch.dtype, device: torch.device | str | None = None) -> Mamba2Params:
        def cast(t: torch.Tensor) -> torch.Tensor:
            return t.to(device=device or t.device, dtype=dtype)

        return Mamba2Params(cast(self.A), cast(self.D), cast(self.dt_bias), self.ngroups)


@dataclass
class Mamba2Inputs:
    """One decode step's inputs, as the layer sees them (dt already softplus'd)."""

    x: torch.Tensor
    dt: torch.Tensor
    B: torch.Tensor
    C: torch.Tensor
    z: torch.Tensor | None = None

    def to(self, dtype: torch.dtype) -> Mamba2Inputs:
        z = None if self.z is None else self.z.to(dtype)
        return Mamba2Inputs(self.x.to(dtype), self.dt.to(dtype), self.B.to(dtype),
                            self.C.to(dtype), z)


def softplus_dt(dt_raw: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:
    """``softplus(dt_raw + dt_bias)``, passed through unchanged above 20."""
    return F.softplus(dt_raw + dt_bias, threshold=20.0)


def heads_of_groups(t: torch.Tensor, heads: int, group_dim: int = 1) -> torch.Tensor:
    """Repeat a per-group tensor so each head sees its group's row."""
    groups = t.shape[group_dim]
    return t.repeat_interleave(heads // groups, dim=group_dim)


def _finish_output(y: torch.Tensor, inp: Mamba2Inputs, p: Mamba2Params) -> torch.Tensor:
    y = y + p.D[:, None] * inp.x
    if inp.z is not None:
        y = y * F.silu(inp.z)
    return y


def state_times(S: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    """``S C`` per head, with ``C`` given per group (no per-head copy of C)."""
    b, h, P, N = S.shape
    g = C.shape[1]
    out = torch.einsum("bgjpn,bgn->bgjp", S.view(b, g, h // g, P, N), C.to(S.dtype))
    return out.reshape(b, h, P)


def read_output(S: torch.Tensor, inp: Mamba2Inputs, p: Mamba2Params) -> torch.Tensor:
    """``y = S C + D x`` (times ``silu(z)``) from an already-updated state."""
    return _finish_output(state_times(S, inp.C), inp, p)


def update_state_(S: torch.Tensor, inp: Mamba2Inputs, p: Mamba2Params) -> torch.Tensor:
    """In place: ``S <- exp(dt A) S + dt x B^T`` (one pass over S); returns ``S``."""
    b, h, P, N = S.shape
    g = inp.B.shape[1]
    a = torch.exp(inp.dt * p.A)
    Sg = S.view(b, g, h // g, P, N)
    Sg.mul_(a.view(b, g, h // g, 1, 1))
    dtx = (inp.dt[..., None] * inp.x).view(b, g, h // g, P, 1)
    Sg.addcmul_(dtx, inp.B.to(S.dtype).view(b, g, 1, 1, N))
    return S


def conventional_step(
    S: torch.Tensor, inp: Mamba2Inputs, p: Mamba2Params
) -> tuple[torch.Tensor, torch.Tensor]:
    """Read the state, update it, return ``(new_state, y)`` (``S`` is not modified)."""
    S_new = update_state_(S.clone(), inp, p)
    return S_new, read_output(S_new, inp, p)


def _window_decay(dt: torch.Tensor, A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cumulative log-decay ``Lambda_i = A sum_{j<=i} dt_j`` over ring entries and its
    last value.  ``dt`` is (batch, n, heads) with excluded entries zeroed."""
    cum = torch.cumsum(dt * A, dim=1)
    return cum, cum[:, -1]


def _masked_dt(dt: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    return dt if valid is None else dt * valid[..., None].to(dt.dtype)


def replay_output(
    S_c: torch.Tensor,
    ring_x: torch.Tensor,
    ring_B: torch.Tensor,
    ring_dt: torch.Tensor,
    inp: Mamba2Inputs,
    p: Mamba2Params,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """Output of the step whose inputs are the last valid ring entry, from the
    checkpoint ``S_c`` and the ring, without materialising the state.

    ``ring_*`` hold the entries since the checkpoint (current step included);
    ``valid`` (batch, n) masks entries out per sequence (speculative drafts).
    """
    heads = S_c.shape[1]
    dt = _masked_dt(ring_dt.to(S_c.dtype), valid)
    cum, last = _window_decay(dt, p.A)
    y = torch.exp(last)[..., None] * state_times(S_c, inp.C)
    BC = heads_of_groups(torch.einsum("blgn,bgn->blg", ring_B.to(S_c.dtype), inp.C), heads, 2)
    w = dt * torch.exp(last[:, None] - cum) * BC
    y = y + torch.einsum("blh,blhp->bhp", w, ring_x.to(S_c.dtype))
    return _finish_output(y, inp, p)


def fold(
    S_c: torch.Tensor,
    ring_x: torch.Tensor,
    ring_B: torch.Tensor,
    ring_dt: torch.Tensor,
    p: Mamba2Params,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """Flush: fold the ring into the checkpoint (a rank-n update), return the new state."""
    heads = S_c.shape[1]
    dt = _masked_dt(ring_dt.to(S_c.dtype), valid)
    cum, last = _window_decay(dt, p.A)
    w = dt * torch.exp(last[:, None] - cum)
    B = heads_of_groups(ring_B.to(S_c.dtype), heads, 2)
    update = torch.einsum("blhp,blhn->bhpn", w[..., None] * ring_x.to(S_c.dtype), B)
    return torch.exp(last)[..., None, None] * S_c + update

"""Gated DeltaNet decode recurrence: conventional step, replay from a checkpoint
plus a ring, and the flush that re-runs the delta rule from the checkpoint.

Shapes (batch first):

    state S   (batch, v_heads, V, K)
    q, k      (batch, k_heads, K)   L2-normalised (q also scaled by K**-0.5)
    v         (batch, v_heads, V)   g, beta (batch, v_heads)
    ring      k (batch, L, k_heads, K), v, d (batch, L, v_heads, V),
              g, beta (batch, L, v_heads)

    S_t = alpha_t S_{t-1} + d_t k_t^T,   d_t = beta_t (v_t - alpha_t S_{t-1} k_t)
    o_t = S_t q_t

Output steps use the ring's ``d`` entries (computed from the stored copy they
read).  The flush recomputes every ``d`` from the checkpoint it folds into, so in
a split design the read copy's rounding never enters the recursion.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class GDNParams:
    """Per-value-head constants of one layer."""

    A_log: torch.Tensor  # (v_heads,)
    dt_bias: torch.Tensor  # (v_heads,)
    k_heads: int

    def to(self, dtype: torch.dtype, device: torch.device | str | None = None) -> GDNParams:
        def cast(t: torch.Tensor) -> torch.Tensor:
            return t.to(device=device or t.device, dtype=dtype)

        return GDNParams(cast(self.A_log), cast(self.dt_bias), self.k_heads)


@dataclass
class GDNInputs:
    """One decode step's inputs as the layer sees them: q, k normalised, g and beta
    computed."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor

    def to(self, dtype: torch.dtype) -> GDNInputs:
        return GDNInputs(*(t.to(dtype) for t in (self.q, self.k, self.v, self.g, self.beta)))


def gates(a: torch.Tensor, b: torch.Tensor, p: GDNParams) -> tuple[torch.Tensor, torch.Tensor]:
    """``g = -exp(A_log) softplus(a + dt_bias)`` and ``beta = sigmoid(b)``."""
    g = -torch.exp(p.A_log) * F.softplus(a + p.dt_bias, threshold=20.0)
    return g, torch.sigmoid(b)


def normalise_qk(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """L2-normalise q and k over the last axis; scale q by ``K**-0.5``."""
    K = q.shape[-1]
    q = F.normalize(q, dim=-1, eps=1e-6) * K**-0.5
    return q, F.normalize(k, dim=-1, eps=1e-6)


def to_value_heads(t: torch.Tensor, v_heads: int, head_dim: int = 1) -> torch.Tensor:
    """Repeat per-k-head tensors so each value head sees its k head."""
    return t.repeat_interleave(v_heads // t.shape[head_dim], dim=head_dim)


def update_state_(S: torch.Tensor, inp: GDNInputs, p: GDNParams) -> torch.Tensor:
    """In place: ``S <- alpha S + d k^T`` with ``d = beta (v - alpha S k)``; returns ``S``."""
    hv = S.shape[1]
    k = to_value_heads(inp.k, hv).to(S.dtype)
    alpha = torch.exp(inp.g)
    Sk = torch.einsum("bhvk,bhk->bhv", S, k)
    d = inp.beta[..., None] * (inp.v - alpha[..., None] * Sk)
    S.mul_(alpha[..., None, None]).addcmul_(d[..., None], k[:, :, None, :])
    return S


def conventional_step(
    S: torch.Tensor, inp: GDNInputs, p: GDNParams
) -> tuple[torch.Tensor, torch.Tensor]:
    """Read the state, apply the gated delta rule, return ``(new_state, o)`` (``S`` is
    not modified)."""
    S_new = update_state_(S.clone(), inp, p)
    return S_new, read_output(S_new, inp)


def read_output(S: torch.Tensor, inp: GDNInputs) -> torch.Tensor:
    """``o = S q`` from an already-updated state."""
    q = to_value_heads(inp.q, S.shape[1])
    return torch.einsum("bhvk,bhk->bhv", S, q)


def _prior_decay(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cumulative log-decay G_i over ring entries (batch, n, heads) and its last value."""
    cum = torch.cumsum(g, dim=1)
    if cum.shape[1] == 0:
        return cum, torch.zeros(g.shape[0], g.shape[2], dtype=g.dtype, device=g.device)
    return cum, cum[:, -1]


def _masked(t: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    return t if valid is None else t * valid[..., None].to(t.dtype)


def replay_step(
    S_c: torch.Tensor,
    ring_k: torch.Tensor,
    ring_g: torch.Tensor,
    ring_d: torch.Tensor,
    inp: GDNInputs,
    valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Output step from the checkpoint and the ring entries *before* this step.

    Returns ``(o_t, d_t)``; the caller appends ``d_t`` (with k, v, g, beta) to the
    ring.  ``valid`` (batch, n) masks prior entries out per sequence.
    """
    hv = S_c.shape[1]
    dtype = S_c.dtype
    q, k = to_value_heads(inp.q, hv), to_value_heads(inp.k, hv)
    g_prior = _masked(ring_g.to(dtype), valid)
    cum, G = _prior_decay(g_prior)
    rk = to_value_heads(ring_k.to(dtype), hv, 2)
    rd = ring_d.to(dtype)
    w = torch.exp(G[:, None] - cum)  # (b, n, h)
    if valid is not None:
        w = w * valid[..., None].to(dtype)
    eG = torch.exp(G)[..., None]
    Skq = torch.einsum("bhvk,bhkj->bhvj", S_c, torch.stack((k, q), dim=-1))
    ring_dots = torch.einsum("blhk,bhkj->blhj", rk, torch.stack((k, q), dim=-1))
    ring_part = torch.einsum("blh,blhv,blhj->bhvj", w, rd, ring_dots)
    Sk_prev = eG * Skq[..., 0] + ring_part[..., 0]
    Sq_prev = eG * Skq[..., 1] + ring_part[..., 1]
    alpha = torch.exp(inp.g)[..., None]
    d = inp.beta[..., None] * (inp.v - alpha * Sk_prev)
    o = alpha * Sq_prev + d * (k * q).sum(-1, keepdim=True)
    return o, d


def fold(
    S_c: torch.Tensor,
    ring_k: torch.Tensor,
    ring_v: torch.Tensor,
    ring_g: torch.Tensor,
    ring_beta: torch.Tensor,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """Flush: re-run the delta rule over the ring from ``S_c`` (in S_c's dtype) and
    return the new state.  Entries masked out by ``valid`` are skipped."""
    hv = S_c.shape[1]
    dtype = S_c.dtype
    n = ring_k.shape[1]
    rk = to_value_heads(ring_k.to(dtype), hv, 2)  # (b, n, h, K)
    rv = ring_v.to(dtype)
    g = _masked(ring_g.to(dtype), valid)
    beta = _masked(ring_beta.to(dtype), valid)
    cum = torch.cumsum(g, dim=1)
    P = torch.einsum("bhvk,blhk->blhv", S_c, rk)  # S_c k_i for every entry
    KK = torch.einsum("blhk,bmhk->bhlm", rk, rk)  # k_j . k_i
    ds: list[torch.Tensor] = []
    for i in range(n):
        G_prev = cum[:, i] - g[:, i]  # decay accumulated before entry i
        Sk = torch.exp(G_prev)[..., None] * P[:, i]
        for j, d_j in enumerate(ds):
            Sk = Sk + (torch.exp(G_prev - cum[:, j]) * KK[:, :, j, i])[..., None] * d_j
        alpha = torch.exp(g[:, i])[..., None]
        ds.append(beta[:, i, :, None] * (rv[:, i] - alpha * Sk))
    last = cum[:, -1] if n else torch.zeros_like(S_c[:, :, 0, 0])
    d = torch.stack(ds, dim=1) if n else rv[:, :0]
    w = torch.exp(last[:, None] - cum)
    update = torch.einsum("blhv,blhk->bhvk", w[..., None] * d, rk)
    return torch.exp(last)[..., None, None] * S_c + update

"""Layer kinds: one adapter per SSM layer type (mamba2, gdn) that gives designs
and the engine a common vocabulary — prepare a step's inputs, run the
conventional step, replay an output step from a stored copy plus the ring, and
flush the ring into a checkpoint."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .layers import gdn, mamba2
from .presets import Preset

RING_DTYPES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp32": torch.float32,
}


def ring_dtype_of(name: str) -> torch.dtype:
    """The torch dtype of a ring-dtype name (bf16, fp16, fp32)."""
    try:
        return RING_DTYPES[name]
    except KeyError:
        raise ValueError(
            f"unknown ring dtype {name!r}; choose one of {', '.join(RING_DTYPES)}"
        ) from None


@dataclass
class Ring:
    """Per-sequence ring buffer of step inputs since the last checkpoint.

    ``fields`` maps a name to a (batch, capacity, ...) tensor; ``count`` is the
    number of valid entries (all sequences advance in lock-step here).
    """

    fields: dict[str, torch.Tensor]
    count: int = 0

    def append(self, **values: torch.Tensor) -> None:
        for name, value in values.items():
            self.fields[name][:, self.count] = value
        self.count += 1

    def view(self, *names: str) -> list[torch.Tensor]:
        return [self.fields[n][:, : self.count] for n in names]

    def reset(self) -> None:
        self.count = 0


@dataclass
class LayerKind:
    """Base adapter; subclasses bind the layer's math."""

    preset: Preset
    ring_fields: dict[str, str] = field(default_factory=dict)
    """Ring field name -> 'ring' (stored in the ring dtype) or 'fp32'."""

    name = ""

    def state_shape(self, batch: int) -> tuple[int, int, int, int]:
        return (batch, *self.preset.state_shape)

    def new_ring(
        self, batch: int, capacity: int, ring_dtype: torch.dtype, device: torch.device
    ) -> Ring:
        shapes = self.ring_shapes()
        fields = {
            n: torch.zeros(
                (batch, capacity, *shapes[n]),
                dtype=ring_dtype if kind == "ring" else torch.float32,
                device=device,
            )
            for n, kind in self.ring_fields.items()
        }
        return Ring(fields)

    # --- per-kind methods -------------------------------------------------
    def ring_shapes(self) -> dict[str, tuple[int, ...]]:
        raise NotImplementedError

    def params(self, raw: dict[str, torch.Tensor]) -> Any:
        raise NotImplementedError

    def prepare(self, raw: dict[str, torch.Tensor], params: Any, ring_dtype: torch.dtype) -> Any:
        raise NotImplementedError

    def conventional_step(self, S: torch.Tensor, inp: Any, params: Any):
        raise NotImplementedError

    def reference_step_(self, S: torch.Tensor, inp: Any, params: Any) -> torch.Tensor:
        """Conventional step updating ``S`` in place; returns the output."""
        raise NotImplementedError

    def log_decay(self, inp: Any, params: Any) -> torch.Tensor:
        """Log of each head's state decay this step, (batch, heads): how fast the head
        forgets (and so how fast a rounding error in its state fades)."""
        raise NotImplementedError

    def read_output(self, S: torch.Tensor, inp: Any, params: Any) -> torch.Tensor:
        raise NotImplementedError

    def replay(self, S_read: torch.Tensor, ring: Ring, inp: Any, params: Any) -> torch.Tensor:
        """Output step: append this step to the ring and return its output."""
        raise NotImplementedError

    def flush(self, S_ckpt: torch.Tensor, ring: Ring, inp: Any, params: Any) -> torch.Tensor:
        """Flush step: append this step, fold the ring into ``S_ckpt``; return the new
        fp32 state (the caller resets the ring)."""
        raise NotImplementedError

    # --- per-sequence positions (speculative decoding) ---------------------
    def replay_at(
        self, S_read: torch.Tensor, ring: Ring, inp: Any, params: Any, pos: torch.Tensor
    ) -> torch.Tensor:
        """Write this step's entry at ring position ``pos[b]`` of each sequence and
        return its output from ``S_read`` and the entries before it."""
        raise NotImplementedError

    def fold_valid(
        self, S_ckpt: torch.Tensor, ring: Ring, params: Any, valid: torch.Tensor
    ) -> torch.Tensor:
        """Fold the ``valid`` (batch, capacity) entries of the ring into ``S_ckpt``."""
        raise NotImplementedError


def _write_at(ring: Ring, pos: torch.Tensor, **values: torch.Tensor) -> None:
    rows = torch.arange(pos.shape[0], device=pos.device)
    for name, value in values.items():
        ring.fields[name][rows, pos] = value.to(ring.fields[name].dtype)


def _positions_before(ring: Ring, pos: torch.Tensor, inclusive: bool) -> torch.Tensor:
    capacity = next(iter(ring.fields.values())).shape[1]
    idx = torch.arange(capacity, device=pos.device)[None]
    return idx <= pos[:, None] if inclusive else idx < pos[:, None]


def _as_ring(t: torch.Tensor, ring_dtype: torch.dtype) -> torch.Tensor:
    """Round to the ring dtype and back: the value the ring (and the reference) see."""
    return t.to(torch.float32).to(ring_dtype).to(torch.float32)


class Mamba2Kind(LayerKind):
    name = "mamba2"

    def __init__(self, preset: Preset):
        super().__init__(preset, {"x": "ring", "B": "ring", "dt": "fp32"})

    def ring_shapes(self) -> dict[str, tuple[int, ...]]:
        p = self.preset
        return {"x": (p.heads, p.head_dim), "B": (p.groups, p.state_dim), "dt": (p.heads,)}

    def params(self, raw: dict[str, torch.Tensor]) -> mamba2.Mamba2Params:
        return mamba2.Mamba2Params(raw["A"], raw["D"], raw["dt_bias"], self.preset.groups)

    def prepare(self, raw, params, ring_dtype):
        return mamba2.Mamba2Inputs(
            x=_as_ring(raw["x"], ring_dtype),
            dt=mamba2.softplus_dt(raw["dt_raw"].float(), params.dt_bias.float()),
            B=_as_ring(raw["B"], ring_dtype),
            C=raw["C"].float(),
            z=raw["z"].float() if raw.get("z") is not None else None,
        )

    def conventional_step(self, S, inp, params):
        return mamba2.conventional_step(S, inp, params)

    def reference_step_(self, S, inp, params):
        return mamba2.read_output(mamba2.update_state_(S, inp, params), inp, params)

    def read_output(self, S, inp, params):
        return mamba2.read_output(S, inp, params)

    def log_decay(self, inp, params):
        return inp.dt * params.A.to(inp.dt.dtype)  # log a_t = dt_t A

    def _append(self, ring: Ring, inp: mamba2.Mamba2Inputs) -> None:
        ring.append(x=inp.x, B=inp.B, dt=inp.dt)

    def replay(self, S_read, ring, inp, params):
        self._append(ring, inp)
        return mamba2.replay_output(S_read, *ring.view("x", "B", "dt"), inp, params)

    def flush(self, S_ckpt, ring, inp, params):
        self._append(ring, inp)
        return mamba2.fold(S_ckpt, *ring.view("x", "B", "dt"), params)

    def replay_at(self, S_read, ring, inp, params, pos):
        _write_at(ring, pos, x=inp.x, B=inp.B, dt=inp.dt)
        valid = _positions_before(ring, pos, inclusive=True)
        f = ring.fields
        return mamba2.replay_output(S_read, f["x"], f["B"], f["dt"], inp, params, valid)

    def fold_valid(self, S_ckpt, ring, params, valid):
        f = ring.fields
        return mamba2.fold(S_ckpt, f["x"], f["B"], f["dt"], params, valid)


class GDNKind(LayerKind):
    name = "gdn"

    def __init__(self, preset: Preset):
        super().__init__(
            preset, {"k": "ring", "v": "ring", "d": "ring", "g": "fp32", "beta": "fp32"}
        )

    def ring_shapes(self) -> dict[str, tuple[int, ...]]:
        p = self.preset
        return {
            "k": (p.groups, p.state_dim),
            "v": (p.heads, p.head_dim),
            "d": (p.heads, p.head_dim),
            "g": (p.heads,),
            "beta": (p.heads,),
        }

    def params(self, raw: dict[str, torch.Tensor]) -> gdn.GDNParams:
        return gdn.GDNParams(raw["A_log"], raw["dt_bias"], self.preset.groups)

    def prepare(self, raw, params, ring_dtype):
        q, k = gdn.normalise_qk(raw["q"].float(), raw["k"].float())
        g, beta = gdn.gates(raw["a"].float(), raw["b"].float(), params.to(torch.float32))
        return gdn.GDNInputs(q=q, k=_as_ring(k, ring_dtype), v=_as_ring(raw["v"], ring_dtype),
                             g=g, beta=beta)

    def conventional_step(self, S, inp, params):
        return gdn.conventional_step(S, inp, params)

    def reference_step_(self, S, inp, params):
        return gdn.read_output(gdn.update_state_(S, inp, params), inp)

    def read_output(self, S, inp, params):
        return gdn.read_output(S, inp)

    def log_decay(self, inp, params):
        return inp.g  # log alpha_t

    def replay(self, S_read, ring, inp, params):
        o, d = gdn.replay_step(S_read, *ring.view("k", "g", "d"), inp)
        ring.append(k=inp.k, v=inp.v, d=d, g=inp.g, beta=inp.beta)
        return o

    def flush(self, S_ckpt, ring, inp, params):
        ring.append(k=inp.k, v=inp.v, g=inp.g, beta=inp.beta)
        return gdn.fold(S_ckpt, *ring.view("k", "v", "g", "beta"))

    def replay_at(self, S_read, ring, inp, params, pos):
        f = ring.fields
        valid = _positions_before(ring, pos, inclusive=False)
        o, d = gdn.replay_step(S_read, f["k"], f["g"], f["d"], inp, valid)
        _write_at(ring, pos, k=inp.k, v=inp.v, d=d, g=inp.g, beta=inp.beta)
        return o

    def fold_valid(self, S_ckpt, ring, params, valid):
        f = ring.fields
        return gdn.fold(S_ckpt, f["k"], f["v"], f["g"], f["beta"], valid)


def kind_for(preset: Preset) -> LayerKind:
    """The adapter for a preset's layer kind."""
    if preset.kind == "mamba2":
        return Mamba2Kind(preset)
    if preset.kind == "gdn":
        return GDNKind(preset)
    raise ValueError(f"unknown layer kind {preset.kind!r}")

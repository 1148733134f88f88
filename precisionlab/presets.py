"""Model presets: the SSM-layer shapes of public hybrid models.

Shapes come from the models' published configurations (DESIGN.md §1 table for
the four anchor models).  ``confidence`` is "high" where the numbers were checked
against a published config and "low" where they are inferred.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Preset:
    """One SSM layer's shape.

    Mamba-2: ``heads`` x ``head_dim`` (P) x ``state_dim`` (N), ``groups`` B/C groups.
    GDN: ``heads`` value heads of ``head_dim`` (V) x ``state_dim`` (K), ``groups`` key heads.
    """

    name: str
    kind: str  # "mamba2" | "gdn"
    heads: int
    head_dim: int
    state_dim: int
    groups: int
    ssm_layers: int
    source: str
    confidence: str = "high"

    @property
    def state_shape(self) -> tuple[int, int, int]:
        """(heads, head_dim, state_dim) of one sequence's state."""
        return (self.heads, self.head_dim, self.state_dim)

    @property
    def state_elements(self) -> int:
        return self.heads * self.head_dim * self.state_dim

    def dims(self) -> dict[str, int]:
        """Named dimensions, in the layer kind's own words."""
        if self.kind == "mamba2":
            return {"heads": self.heads, "headdim": self.head_dim, "dstate": self.state_dim,
                    "ngroups": self.groups}
        return {"v_heads": self.heads, "k_heads": self.groups, "V": self.head_dim,
                "K": self.state_dim}

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


_DESIGN = "DESIGN.md model table (published config)"
PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        Preset("nemotron-3-nano-4b", "mamba2", 96, 80, 128, 8, 21, _DESIGN),
        Preset("nemotron-h-8b", "mamba2", 128, 64, 128, 8, 24,
               "Nemotron-H-8B config: 128 Mamba-2 heads x 64, d_state 128, 8 groups", "low"),
        Preset("nemotron-3-super-120b", "mamba2", 128, 64, 128, 8, 40, _DESIGN),
        Preset("qwen3.5-4b", "gdn", 32, 128, 128, 16, 24, _DESIGN),
        Preset("qwen3-next-80b", "gdn", 32, 128, 128, 16, 36,
               "Qwen3-Next-80B-A3B config: 16 k / 32 v linear-attention heads, 128 x 128, "
               "3 of every 4 of 48 layers", "low"),
        Preset("qwen3.5-122b", "gdn", 64, 128, 128, 16, 36,
               "DESIGN.md model table; head counts not confirmed against a config", "low"),
        Preset("mamba2-130m", "mamba2", 24, 64, 128, 1, 24,
               "mamba2-130m config: d_model 768, expand 2, headdim 64, d_state 128"),
        Preset("mamba2-370m", "mamba2", 32, 64, 128, 1, 48,
               "mamba2-370m config: d_model 1024, expand 2, headdim 64, d_state 128"),
        Preset("mamba2-2.7b", "mamba2", 80, 64, 128, 1, 64,
               "mamba2-2.7b config: d_model 2560, expand 2, headdim 64, d_state 128"),
        Preset("tiny-mamba2", "mamba2", 4, 8, 32, 2, 2, "test shape"),
        Preset("tiny-gdn", "gdn", 4, 32, 32, 2, 2, "test shape"),
    ]
}


class UnknownModelError(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


def get_preset(name: str) -> Preset:
    """The preset called ``name``; a clear error lists the known ones."""
    try:
        return PRESETS[name]
    except KeyError:
        raise UnknownModelError(
            f"unknown model {name!r}; known presets: {', '.join(PRESETS)}"
        ) from None

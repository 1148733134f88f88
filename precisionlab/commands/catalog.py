"""The catalogue commands: models and formats."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from .common import (
    out,
)


def models(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """List the model presets (SSM layer shapes)."""
    from precisionlab.presets import PRESETS

    if as_json:
        print(json.dumps([p.as_dict() for p in PRESETS.values()], indent=2))
        return
    table = Table(title="model presets (one SSM layer)", title_justify="left")
    for col in ("name", "kind", "heads", "head dim", "state dim", "groups / k-heads",
                "SSM layers", "state MiB (fp32)", "source"):
        table.add_column(col)
    for p in PRESETS.values():
        src = p.source + (" [yellow](lower confidence)[/]" if p.confidence == "low" else "")
        table.add_row(p.name, p.kind, str(p.heads), str(p.head_dim), str(p.state_dim),
                      str(p.groups), str(p.ssm_layers), f"{p.state_elements * 4 / 2**20:.2f}",
                      src)
    out.print(table)


def formats(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """List the state formats."""
    from precisionlab import formats as fmts
    from precisionlab.formats.info import describe

    rows = [describe(n) for n in fmts.names()]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table(title="state formats", title_justify="left")
    for col in ("name", "bits/element", "block", "scale", "rounding", "max normal",
                "min subnormal"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["name"], f"{r['bits_per_element']:.3f}", str(r["block"] or "-"),
                      r["scale"], r["rounding"], f"{r['max_normal']:.6g}",
                      f"{r['min_subnormal']:.6g}")
    out.print(table)

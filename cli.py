"""The ``precisionlab`` command line (typer + rich)."""

from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()

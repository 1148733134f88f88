"""precisionlab: how far does an SSM layer's decode output drift when its state is
stored in a low-precision format, as one shared copy or as a split checkpoint plus
read copy, replayed over a window L?

Notebook API: ``precisionlab.drift``, ``precisionlab.compare``,
``precisionlab.window_sweep``, ``precisionlab.model_drift`` (studies returning
``xarray.Dataset``), ``precisionlab.capture_trace``,
``precisionlab.save_result`` / ``load_result``, ``precisionlab.plot``,
``precisionlab.summary`` (a result's table as a DataFrame), ``precisionlab.advise`` /
``precisionlab.recommend`` (the least traffic within a drift budget).
"""

from __future__ import annotations

__version__ = "0.1.0"

_LAZY = {
    "drift": ("precisionlab.studies", "drift"),
    "compare": ("precisionlab.studies", "compare"),
    "window_sweep": ("precisionlab.studies", "window_sweep"),
    "save_result": ("precisionlab.export", "save_result"),
    "load_result": ("precisionlab.export", "load_result"),
    "plot": ("precisionlab.plots", "save_plot"),
    "summary": ("precisionlab.metrics", "summary"),
    "model_drift": ("precisionlab.studies.model_drift", "model_drift"),
    "capture_trace": ("precisionlab.models.capture", "capture_trace"),
    "advise": ("precisionlab.studies.advise", "advise"),
    "recommend": ("precisionlab.studies.advise", "recommend"),
    "recommendation": ("precisionlab.studies.advise", "recommendation"),
}


def __getattr__(name: str):
    """Import the notebook API on first use (keeps ``import precisionlab`` light)."""
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'precisionlab' has no attribute {name!r}")


__all__ = ["__version__", *_LAZY]

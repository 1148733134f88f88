"""Studies: experiments that return an ``xarray.Dataset``."""

from .compare import compare
from .drift import StudyError, drift
from .model_drift import model_drift
from .window import window_sweep

__all__ = ["StudyError", "compare", "drift", "model_drift", "window_sweep"]

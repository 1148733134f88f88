"""Studies: experiments that return an ``xarray.Dataset``."""

from .advise import advise, recommend, recommendation
from .compare import compare
from .drift import StudyError, StudyWarning, drift
from .model_drift import model_drift
from .window import window_sweep

__all__ = ["StudyError", "StudyWarning", "advise", "compare", "drift", "model_drift", "recommend",
           "recommendation", "window_sweep"]

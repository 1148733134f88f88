"""precisionlab: how far does an SSM layer's decode output drift when its state is
stored in a low-precision format, as one shared copy or as a split checkpoint plus
read copy, replayed over a window L?"""

from __future__ import annotations

__version__ = "0.1.0"

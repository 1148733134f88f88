"""Host-memory reuse for the CPU emulation.

glibc hands every allocation above its mmap threshold (at most 32 MB by default) its
own fresh pages and returns them to the system on free.  A study on the CPU allocates
and frees tensors of that size at every step (a group of designs' stored copies of a
nemotron-3-nano-4b state are 47 MB), so each step faulted all their pages in again.
:func:`reuse_freed_memory` keeps such blocks in the heap instead, where the next step's
tensors reuse them; the process's resident memory stays at its peak.  The command line
calls it at start; a notebook may too.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
LARGE = 2**31 - 1
"""Both thresholds' value (bytes): the largest ``mallopt`` takes."""


def glibc_mallopt():
    """glibc's ``mallopt`` as a ctypes function, or None on other systems or C libraries."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc
        return None
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return mallopt


def reuse_freed_memory() -> bool:
    """Keep freed large blocks for reuse (glibc's ``mallopt``: no separate mapping below
    2 GiB and no trimming of the heap).  Returns whether the setting took; without
    glibc it does nothing and returns False."""
    mallopt = glibc_mallopt()
    if mallopt is None:
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, LARGE)) and bool(mallopt(M_TRIM_THRESHOLD, LARGE))

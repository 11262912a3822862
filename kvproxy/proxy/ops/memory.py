"""Memory the proxy freed goes back to the operating system.

glibc serves allocations from its heap below a threshold and from `mmap` above it, and raises
the threshold to the size of every mmapped block it frees (up to 32 MiB). After a burst of large
requests, later buffers of a few MiB then come from the heap, and a heap fragmented by the small
objects allocated meanwhile is not given back: RSS stays at the burst's peak. A fixed threshold
turns the adjustment off, so every buffer above it is mapped and unmapped on its own.
"""

from __future__ import annotations

import ctypes
import ctypes.util

MMAP_THRESHOLD = 256 * 1024
"""Allocations above this are mmapped (frame buffers above 64 KiB reuse pooled buffers)."""
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number


def return_large_buffers_to_the_os() -> bool:
    """Fix glibc's mmap threshold; False where the C library is not glibc (nothing to do)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))

"""Give the heap memory a burst of connections used back to the system once the burst is over.

Packets, segments and buffers of a few KiB come from the C allocator (glibc malloc), which
keeps freed memory in its heap for reuse: after 500 busy connections close, the process
stays as large as at their peak. :class:`BurstTrimmer` watches the number of connections and,
when it falls to a quarter of the peak since the last trim (with a peak of at least
``min_peak``), calls glibc's ``malloc_trim(0)``, which returns the free pages of the heap.
Where the C library has no ``malloc_trim`` (musl, other systems) nothing happens.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

#: A burst worth trimming after: at least this many connections at once.
MIN_PEAK = 64


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def release_free_memory() -> bool:
    """Return the allocator's free heap pages to the system; False where that is not possible."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


class BurstTrimmer:
    """``observe(count)`` after the number of connections changed; True when it just trimmed."""

    __slots__ = ("peak", "min_peak", "trims", "_release")

    def __init__(self, *, min_peak: int = MIN_PEAK, release: Callable[[], bool] = release_free_memory) -> None:
        self.peak = 0
        self.min_peak = min_peak
        self.trims = 0
        self._release = release

    def observe(self, count: int) -> bool:
        if count > self.peak:
            self.peak = count
            return False
        if self.peak < self.min_peak or count * 4 > self.peak:
            return False
        self.peak = count
        self.trims += 1
        released = self._release()
        log.debug("netstack: the connection burst is over (%d left): free heap memory %s", count,
                  "returned to the system" if released else "kept (no malloc_trim here)")
        return True

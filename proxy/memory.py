"""Give memory a hostile input made us hold back to the operating system.

An upstream event cut at ``MAX_EVENT_BYTES`` leaves megabytes of freed read
buffers in the C heap; glibc keeps them (its mmap threshold rises after the
first large free), so the process's RSS stays at its peak although Python freed
everything. After such a cut, :func:`trim` asks glibc to release free heap pages
(``malloc_trim``), at most once a second. Elsewhere, and without glibc, it does
nothing: this is never on the path of an ordinary request.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time
from collections.abc import Callable

__all__ = ["trim"]

MIN_INTERVAL = 1.0


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn  # type: ignore[no-any-return]


_trim = _malloc_trim()
_last = [0.0]


def trim() -> None:
    """Release the C heap's free pages to the system, unless that was done less than a second ago."""
    now = time.monotonic()
    if _trim is None or now - _last[0] < MIN_INTERVAL:
        return
    _last[0] = now
    _trim(0)

"""Give memory a hostile input made us hold back to the operating system.

An upstream event cut at ``MAX_EVENT_BYTES`` leaves megabytes of freed read
buffers in the C heap; glibc keeps them (its mmap threshold rises after the
first large free), so the process's RSS stays at its peak although Python freed
everything. After such a cut, :func:`trim` asks glibc to release free heap pages
(``malloc_trim``), at most once a second. Elsewhere, and without glibc, it does
nothing: this is never on the path of an ordinary request.

A large event that is *not* cut (the bounds let 10 MB through) ratchets the same
way: glibc raises its mmap threshold to the size of every large block freed, so
from then on blocks up to that size come from the heap and their pages stay
after they are freed. :func:`hold_mmap_threshold`, called once at start, fixes the
threshold at ``MMAP_THRESHOLD``, glibc's own starting value (128 KiB): blocks that
large always come from ``mmap`` and go back to the system when freed. Held at
1 MiB instead, the blocks between (bodies, joined events, decompressed pieces) came
from the heap, and a small live block between two freed ones pins their pages: the
fault drill's soak kept 10-12 MB of free heap (RSS +11 to +17 MB a first round,
then flat, live memory flat at 13 MB); at 128 KiB, 5 MB (+5 MB). Ordinary reads
(64 KiB) stay below it; a large body costs one mmap and munmap.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time
from collections.abc import Callable

__all__ = ["MMAP_THRESHOLD", "hold_mmap_threshold", "trim"]

MIN_INTERVAL = 1.0
MMAP_THRESHOLD = 128 << 10  # glibc's default start, held: see the module doc
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)


def _libc(name: str, argtypes: list[type]) -> Callable[..., int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = getattr(libc, name)
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = argtypes, ctypes.c_int
    return fn  # type: ignore[no-any-return]


_trim = _libc("malloc_trim", [ctypes.c_size_t])
_mallopt = _libc("mallopt", [ctypes.c_int, ctypes.c_int])


def hold_mmap_threshold() -> bool:
    """Fix glibc's mmap threshold (see the module doc); False where there is no glibc to ask."""
    return _mallopt is not None and _mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
_last = [0.0]


def trim() -> None:
    """Release the C heap's free pages to the system, unless that was done less than a second ago."""
    now = time.monotonic()
    if _trim is None or now - _last[0] < MIN_INTERVAL:
        return
    _last[0] = now
    _trim(0)

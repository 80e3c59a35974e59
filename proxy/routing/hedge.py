"""When a hedge starts: the delay after which the next target races the leader. Pure.

``hedge.after`` is a fixed number of seconds, or ``pNN``: the NNth percentile of the leading
target's own time-to-first-token samples in the request's mode. A leader with fewer than
``MIN_SAMPLES`` samples has no percentile yet, so it is not hedged by time (an unmeasured leader
is raced from the start instead, when ``hedge.explore`` is on).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..config import Hedge

MIN_SAMPLES = 5
WINDOW = 100  # the newest samples a percentile is taken over


def hedge_delay(hedge: Hedge, samples: Sequence[float]) -> float | None:
    """Seconds after the leader's start at which the next target starts too, or None."""
    if hedge.after_secs is not None:
        return hedge.after_secs
    if hedge.after_percentile is None or len(samples) < MIN_SAMPLES:
        return None
    recent = sorted(samples[-WINDOW:])
    rank = math.ceil(hedge.after_percentile / 100 * len(recent)) - 1
    return recent[max(0, rank)]

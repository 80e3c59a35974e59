"""When a hedge starts: the delay after which the next target races the leader. Pure.

``hedge.after`` is a fixed number of seconds, or ``pNN``: the NNth percentile of the leading
target's own time-to-first-token samples in the request's mode. A leader with fewer than
``MIN_SAMPLES`` samples has no percentile yet, so it is not hedged by time (an unmeasured leader
is raced from the start instead, when ``hedge.explore`` is on).

``measure_cap`` is how long an explored (or measured) loser may run on after the answer committed,
counted from its own start: ``hedge.cap`` times the winner's time to first token, at least
``CAP_FLOOR`` and at most ``CAP_CEILING`` seconds (docs/adr/0008).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..config import Hedge

MIN_SAMPLES = 5
WINDOW = 100  # the newest samples a percentile is taken over
# A loser not answering by then is several times slower than the winner: its exact figure would
# not change the order. The floor keeps jitter and a busy machine from cutting a near-equal; the
# ceiling bounds what a stalled explored target holds (a connection, an in-flight count).
CAP_FLOOR = 0.5
CAP_CEILING = 5.0


def hedge_delay(hedge: Hedge, samples: Sequence[float]) -> float | None:
    """Seconds after the leader's start at which the next target starts too, or None."""
    if hedge.after_secs is not None:
        return hedge.after_secs
    if hedge.after_percentile is None or len(samples) < MIN_SAMPLES:
        return None
    recent = sorted(samples[-WINDOW:])
    rank = math.ceil(hedge.after_percentile / 100 * len(recent)) - 1
    return recent[max(0, rank)]


def measure_cap(hedge: Hedge, winner_ttfc: float | None) -> float:
    """Seconds from its own start an explored loser may take to its first token before it is cut.
    A winner without a time to first token (a client error returned as it is) gives the ceiling."""
    if winner_ttfc is None:
        return CAP_CEILING
    return min(CAP_CEILING, max(CAP_FLOOR, hedge.cap * winner_ttfc))

"""Time-to-first-chunk figures per (provider, upstream model).

Fed only by the walker with answered attempts; read by the planner. Pure: the
caller passes ``now``. EWMA is kept per smoothing factor a route asks for, so two
routes sharing a target with different ``alpha`` each get their own figure; the
p50 is taken over the newest ``window`` samples.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from itertools import islice

from ..config import Fastest, TargetKey

MAX_WINDOW = 10000


@dataclass(slots=True)
class Series:
    """The samples of one target: newest last."""

    samples: deque[float] = field(default_factory=lambda: deque(maxlen=MAX_WINDOW))
    count: int = 0
    newest_at: float | None = None
    ewma: dict[float, float] = field(default_factory=dict)

    def add(self, seconds: float, now: float, stale_after: float) -> None:
        if self.newest_at is not None and now - self.newest_at > stale_after:
            # An expired figure restarts: old samples describe another moment.
            self.samples.clear()
            self.ewma.clear()
        self.samples.append(seconds)
        self.count += 1
        self.newest_at = now
        for alpha, value in self.ewma.items():
            self.ewma[alpha] = alpha * seconds + (1 - alpha) * value

    def smoothed(self, alpha: float) -> float:
        value = self.ewma.get(alpha)
        if value is None:
            samples = iter(self.samples)
            value = next(samples)
            for s in samples:
                value = alpha * s + (1 - alpha) * value
            self.ewma[alpha] = value
        return value

    def p50(self, window: int) -> float:
        n = min(window, len(self.samples))
        recent = sorted(islice(reversed(self.samples), n))  # deque indexing is O(n) per item
        mid = n // 2
        return recent[mid] if n % 2 else (recent[mid - 1] + recent[mid]) / 2


class Tracker:
    """All figures; the one place time to first chunk is stamped."""

    def __init__(self, stale_after: float = 300.0) -> None:
        self.stale_after = stale_after
        self.series: dict[TargetKey, Series] = {}

    def record(self, key: TargetKey, seconds: float, now: float) -> None:
        series = self.series.get(key)
        if series is None:
            series = self.series[key] = Series()
        series.add(seconds, now, self.stale_after)

    def figure(self, key: TargetKey, policy: Fastest, now: float) -> float | None:
        """The target's figure under a route's policy, or None while it counts as unmeasured."""
        series = self.series.get(key)
        if series is None or series.newest_at is None:
            return None
        if now - series.newest_at > policy.max_age_secs:
            return None
        if min(len(series.samples), policy.window) < policy.min_samples:
            return None
        if policy.signal == "p50":
            return series.p50(policy.window)
        return series.smoothed(policy.alpha)

    def age(self, key: TargetKey, now: float) -> float | None:
        series = self.series.get(key)
        if series is None or series.newest_at is None:
            return None
        return now - series.newest_at

    def samples(self, key: TargetKey) -> int:
        series = self.series.get(key)
        return 0 if series is None else len(series.samples)

    def retain(self, keys: set[TargetKey]) -> None:
        """Forget targets a reloaded config no longer has."""
        for key in list(self.series):
            if key not in keys:
                del self.series[key]

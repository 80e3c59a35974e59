"""Time-to-first-token figures per (provider, upstream model), one series per mode.

Fed only by the walker with answered attempts; read by the planner. Pure: the
caller passes ``now``. EWMA is kept per smoothing factor a route asks for, so two
routes sharing a target with different ``alpha`` each get their own figure; the
p50 is taken over the newest ``window`` samples.

A streamed call's sample is its first token; a buffered call's is its whole
answer, which grows with the answer's length. The two clocks never share a
series: a target measured in one mode only is unmeasured in the other
(docs/adr/0007).

A censored sample is a lower bound of a first token: a measuring racer cut at its cap, or a racer
cancelled because another won before it had a token (a lost race, docs/adr/0022). One such bound is
held, not averaged: it dates the figure but moves nothing, since a leader that stalls on one call in
ten must keep its place and its hedge percentile. ``DEMOTE_AFTER`` bounds in a row (no faster answer
between them) say the old figure describes another moment: the series restarts from the bounds,
each lifted over ``behind`` (the figure of the target that won) by ``DEMOTE_MARGIN``, so the leader
ranks behind the target it lost to whatever that target's figure says on paper. An answer faster
than the smallest held bound clears them, and gives a figure they demoted back the history the
demotion set aside, with that answer (they were stalls: a box that stalled on two calls must not
restart a leader's figure, docs/adr/0023 "Not in the cold start"); a slower one confirms them,
leaves them held and lets that history go.

Samples stand in the order their calls *began*: a slow call that began before two fast ones and
ends after them (a look at a target taken just before it recovered) goes behind them, so it is not
read as the newest (the recovery rule and the fast EWMA read the newest, ``routing/ordering.py``).
A look tells of the moment it began (docs/adr/0023, amendment). Only the newest ``REORDER``
samples are kept in order; a call that began before all of them goes behind them.

A sample the walker took with the count of other attempts the target had in flight also feeds a
least-squares line of time against that load (exponentially weighted moments, ``FIT_ALPHA``): its
slope is what one more call in flight costs this target, the load-fitted figure's correction
(``fastest.load_fit``, docs/adr/0008). A target whose load barely varied has no slope.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import islice

from ..config import Fastest, TargetKey

MAX_WINDOW = 10000
MAX_HELD = 10  # a demoted figure restarts from at most this many bounds
STREAMED = "streamed"
BUFFERED = "buffered"
MODES = (STREAMED, BUFFERED)
FIT_ALPHA = 0.1  # the load fit forgets as the default figure does (fastest.alpha)
FIT_MIN_VARIANCE = 0.25  # in-flight counts varying less than this say nothing of a slope
DEMOTE_AFTER = 2  # lost races in a row that restart a figure from their bounds
DEMOTE_MARGIN = 1.05  # a demoted figure is at least this much over the figure of the target that won
FIT_CLIP = 3.0  # a sample over this many times the fit's mean is a tail event (a stall), not load
REORDER = 8  # the newest samples kept in the order their calls began (at least the calls in flight at once)
RECENT = 100  # the newest samples a hedge's percentile is taken over (routing/hedge.py), kept sorted


@dataclass(slots=True)
class Series:
    """The samples of one target: newest last."""

    samples: deque[float] = field(default_factory=lambda: deque(maxlen=MAX_WINDOW))
    count: int = 0
    newest_at: float | None = None
    ewma: dict[float, float] = field(default_factory=dict)
    moments: list[float] | None = None  # the load fit: weighted means of n, x, n*n, n*x (n in flight, x a sample)
    load_slope: float = 0.0  # the last slope the fit could see
    held: list[float] = field(default_factory=list)  # censored bounds since the last faster answer
    starts: deque[float] = field(default_factory=lambda: deque(maxlen=REORDER + 1))  # the newest samples' starts
    settled: dict[float, float | None] = field(default_factory=dict)  # each EWMA over all samples but those
    ranked: list[float] = field(default_factory=list)  # the newest RECENT samples, sorted (a hedge's pNN)
    before: Series | None = None  # the history a demotion set aside, until an answer confirms or refutes it

    def fit(self, load: int, seconds: float) -> None:
        m = self.moments
        if m is None:
            self.moments = [load, seconds, load * load, load * seconds]
            return
        a = FIT_ALPHA
        seconds = min(seconds, FIT_CLIP * m[1])  # one 1.5 s stall would read as half a second per call
        m[0] += a * (load - m[0])
        m[1] += a * (seconds - m[1])
        m[2] += a * (load * load - m[2])
        m[3] += a * (load * seconds - m[3])

    def slope(self) -> tuple[float, float] | None:
        """Seconds one more call in flight adds, and the mean load the samples saw. Never below 0:
        a target does not speed up with load, so a falling line is a shift in time, not load. While
        the load barely varies the last slope seen stands: a leader held at three calls in flight
        says nothing new of its slope, and forgetting it (0) sent a whole burst onto it at once."""
        m = self.moments
        if m is None:
            return None
        variance = m[2] - m[0] * m[0]
        if variance >= FIT_MIN_VARIANCE:
            self.load_slope = max(0.0, (m[3] - m[0] * m[1]) / variance)
        return self.load_slope, m[0]

    def add(self, seconds: float, now: float, stale_after: float, timed: bool = True) -> None:
        """One sample, behind the newest whose calls began after its own; ``timed=False``: a bound
        (lifted over a winner, so no call's time), put last and dated now."""
        if self.newest_at is not None and now - self.newest_at > stale_after:
            self.restart()  # an expired figure restarts: old samples describe another moment
        start, starts = (now - seconds if timed else now), self.starts
        later = 0  # the newest samples whose calls began after this one's
        while timed and later < len(starts) and starts[-1 - later] > start:
            later += 1
        samples = self.samples
        if len(samples) == samples.maxlen:
            samples.popleft()
        # The ranked window follows at the cost of two bisections, not a sort per request: the one that
        # leaves the newest RECENT is the RECENT-th newest now (this one goes in among the REORDER newest).
        ranked = self.ranked
        if len(samples) >= RECENT:
            del ranked[bisect_left(ranked, samples[-RECENT])]
        insort(ranked, seconds)
        samples.insert(len(samples) - later, seconds)
        starts.insert(len(starts) - later, start)
        self.count += 1
        self.dated(now)
        if len(starts) > REORDER:  # the oldest kept in order settles into each EWMA's settled part
            starts.popleft()
            oldest = samples[-REORDER - 1]
            for alpha, value in self.settled.items():
                self.settled[alpha] = oldest if value is None else alpha * oldest + (1 - alpha) * value
        for alpha, value in self.ewma.items():
            self.ewma[alpha] = alpha * seconds + (1 - alpha) * value if not later else self._replay(alpha)

    def _replay(self, alpha: float) -> float:
        """The EWMA of weight ``alpha``: its settled part, then the newest samples in their order. The
        newest are read from the deque's end: an ``islice`` from the front walked the whole window
        (10,000 samples: 150 µs a late sample), and in a fleet every peer's sample is late."""
        tail = len(self.starts)
        if alpha not in self.settled:
            older = list(islice(self.samples, len(self.samples) - tail))
            self.settled[alpha] = _ewma(older, alpha) if older else None
        value = self.settled[alpha]
        for s in reversed(list(islice(reversed(self.samples), tail))):
            value = s if value is None else alpha * s + (1 - alpha) * value
        assert value is not None
        return value

    def restart(self) -> None:
        self.before = None
        self.samples.clear()
        self.ewma.clear()
        self.moments = None
        self.load_slope = 0.0
        self.held.clear()
        self.newest_at = None
        self.starts.clear()
        self.settled.clear()
        self.ranked.clear()

    def dated(self, now: float) -> None:
        if self.newest_at is None or now > self.newest_at:  # a peer's sample may arrive after a newer one
            self.newest_at = now

    def censor(self, bound: float, now: float, stale_after: float) -> bool:
        """Hold a lower bound (already lifted over the winner); True when it demoted the figure."""
        if self.newest_at is not None and now - self.newest_at > stale_after:
            self.restart()
        if not self.samples:  # unmeasured: the bound is the only figure there is
            self.add(bound, now, stale_after, timed=False)
            self.held.append(bound)
            return False
        self.held.append(bound)
        del self.held[:-MAX_HELD]
        if len(self.held) < DEMOTE_AFTER:
            self.dated(now)  # a stall until the next says otherwise: the figure stands
            return False
        held, before = list(self.held), self.before if self.before is not None else self._set_aside()
        self.restart()
        self.held, self.before = held, before
        for value in held:
            self.add(value, now, stale_after, timed=False)
        return True

    def _set_aside(self) -> Series:
        """This history as a series of its own (its containers moved, not copied: a demotion may come
        on a full window), this one left empty for the bounds."""
        aside = Series(samples=self.samples, count=self.count, newest_at=self.newest_at, ewma=self.ewma,
                       moments=self.moments, load_slope=self.load_slope, starts=self.starts, settled=self.settled,
                       ranked=self.ranked)
        self.samples, self.ewma, self.settled, self.ranked = deque(maxlen=MAX_WINDOW), {}, {}, []
        self.starts = deque(maxlen=REORDER + 1)
        return aside

    def smoothed(self, alpha: float) -> float:
        value = self.ewma.get(alpha)
        if value is None:
            value = self.ewma[alpha] = _ewma(self.samples, alpha)
        return value

    def p50(self, window: int) -> float:
        n = min(window, len(self.samples))
        recent = sorted(islice(reversed(self.samples), n))  # deque indexing is O(n) per item
        mid = n // 2
        return recent[mid] if n % 2 else (recent[mid - 1] + recent[mid]) / 2


def _ewma(samples: Iterable[float], alpha: float) -> float:
    values = iter(samples)
    value = next(values)
    for s in values:
        value = alpha * s + (1 - alpha) * value
    return value


class Tracker:
    """All figures; the one place time to first token is stamped."""

    def __init__(self, stale_after: float = 300.0) -> None:
        self.stale_after = stale_after
        self.modes: dict[str, dict[TargetKey, Series]] = {mode: {} for mode in MODES}

    def record(self, key: TargetKey, seconds: float, now: float, mode: str = STREAMED,
               load: int | None = None) -> None:
        """One sample; ``load`` (the target's other attempts in flight when it started) also feeds
        the load fit. A censored lower bound comes without one: it is no point on the line."""
        by_key = self.modes[mode]
        series = by_key.get(key)
        if series is None:
            series = by_key[key] = Series()
        if series.held and seconds < min(series.held):
            if series.before is not None:  # they demoted it: the history they set aside stands again
                series = by_key[key] = series.before
            series.held.clear()  # faster than every lost race said: those were stalls
        elif series.held:
            series.before = None  # as slow as they said: the demotion stands
        series.add(seconds, now, self.stale_after)
        if load is not None:
            series.fit(load, seconds)

    def censor(self, key: TargetKey, seconds: float, now: float, mode: str = STREAMED,
               behind: float | None = None) -> bool:
        """A lower bound of the target's first token (a lost race, or a measure cut at its cap),
        ``behind`` the figure of the target that answered first, if known. True when it demoted
        the target's figure (``DEMOTE_AFTER`` bounds in a row)."""
        by_key = self.modes[mode]
        series = by_key.get(key)
        if series is None:
            series = by_key[key] = Series()
        bound = seconds if behind is None else max(seconds, behind * DEMOTE_MARGIN)
        return series.censor(bound, now, self.stale_after)

    def held(self, key: TargetKey, mode: str = STREAMED) -> int:
        """Lower bounds held against the target's figure since its last faster answer."""
        series = self.modes[mode].get(key)
        return 0 if series is None else len(series.held)

    def load_fit(self, key: TargetKey, mode: str = STREAMED) -> tuple[float, float] | None:
        """The target's load slope (seconds per call in flight) and the mean load of its samples."""
        series = self.modes[mode].get(key)
        return None if series is None else series.slope()

    def _measured(self, key: TargetKey, policy: Fastest, now: float, mode: str) -> Series | None:
        """The target's samples in ``mode`` when a route's policy counts them (fresh and enough)."""
        series = self.modes[mode].get(key)
        if series is None or series.newest_at is None:
            return None
        if now - series.newest_at > policy.max_age_secs:
            return None
        if min(len(series.samples), policy.window) < policy.min_samples:
            return None
        return series

    def figure(self, key: TargetKey, policy: Fastest, now: float, mode: str = STREAMED) -> float | None:
        """The target's figure in ``mode`` under a route's policy, or None while it counts as unmeasured."""
        series = self._measured(key, policy, now, mode)
        if series is None:
            return None
        return series.p50(policy.window) if policy.signal == "p50" else series.smoothed(policy.alpha)

    def figures(self, key: TargetKey, policy: Fastest, now: float, mode: str,
                fast_alpha: float) -> tuple[float | None, float | None]:
        """``figure`` and, over the same samples, their EWMA of weight ``fast_alpha``: what ``fastest``
        ranks by, in one look (it runs per target per request)."""
        series = self._measured(key, policy, now, mode)
        if series is None:
            return None, None
        figure = series.p50(policy.window) if policy.signal == "p50" else series.smoothed(policy.alpha)
        return figure, series.smoothed(fast_alpha)

    def age(self, key: TargetKey, now: float, mode: str = STREAMED) -> float | None:
        series = self.modes[mode].get(key)
        if series is None or series.newest_at is None:
            return None
        return now - series.newest_at

    def began(self, key: TargetKey, mode: str = STREAMED) -> float | None:
        """When the call of the newest sample (by start) began: what a look begun later tells more of."""
        series = self.modes[mode].get(key)
        return series.starts[-1] if series is not None and series.starts else None

    def recent(self, key: TargetKey, mode: str) -> list[float]:
        """The newest ``RECENT`` samples, oldest first."""
        series = self.modes[mode].get(key)
        return [] if series is None else list(islice(reversed(series.samples), RECENT))[::-1]

    def ranked(self, key: TargetKey, mode: str) -> Sequence[float]:
        """The newest ``RECENT`` samples, sorted: a hedge's percentile in one look (the series' own
        list, kept sorted as samples come: read it, never change it)."""
        series = self.modes[mode].get(key)
        return () if series is None else series.ranked

    def samples(self, key: TargetKey, mode: str = STREAMED) -> int:
        series = self.modes[mode].get(key)
        return 0 if series is None else len(series.samples)

    def forget(self, key: TargetKey) -> None:
        """Forget one target (a pinned one past ``UNLISTED_MAX``, state/__init__.py)."""
        for by_key in self.modes.values():
            by_key.pop(key, None)

    def retain(self, keys: set[TargetKey]) -> None:
        """Forget targets a reloaded config no longer has."""
        for by_key in self.modes.values():
            for key in list(by_key):
                if key not in keys:
                    del by_key[key]

"""Figures: EWMA per alpha, p50 over a window, min_samples, max_age, restart after staleness."""

from __future__ import annotations

import random
from collections import deque

import pytest

from proxy.config import Fastest
from proxy.state.tracker import MAX_WINDOW, RECENT, REORDER, Tracker

KEY = ("groq", "llama")


def tracker(*samples: float, at: float = 100.0) -> Tracker:
    tr = Tracker(stale_after=300)
    for s in samples:
        tr.record(KEY, s, at)
    return tr


@pytest.mark.parametrize(
    ("samples", "policy", "figure"),
    [
        pytest.param((), Fastest(), None, id="no-samples-unmeasured"),
        pytest.param((0.4,), Fastest(), 0.4, id="first-sample-is-the-figure"),
        pytest.param((1.0, 0.0), Fastest(alpha=0.5), 0.5, id="ewma-half"),
        pytest.param((1.0, 0.0, 0.0), Fastest(alpha=0.3), 0.49, id="ewma-alpha-0.3"),
        pytest.param((0.1, 0.3, 0.2), Fastest(signal="p50"), 0.2, id="p50-odd"),
        pytest.param((0.1, 0.3, 0.2, 0.9), Fastest(signal="p50"), 0.25, id="p50-even"),
        pytest.param((5.0, 5.0, 0.1, 0.3), Fastest(signal="p50", window=2), 0.2, id="p50-newest-window"),
        pytest.param((0.1, 0.2), Fastest(min_samples=3), None, id="below-min-samples"),
        pytest.param((0.1, 0.2, 0.3), Fastest(min_samples=3, window=2), None, id="window-caps-min-samples"),
    ],
)
def test_figure(samples: tuple[float, ...], policy: Fastest, figure: float | None) -> None:
    got = tracker(*samples).figure(KEY, policy, 100.0)
    assert got == (None if figure is None else pytest.approx(figure))


def test_each_alpha_gets_its_own_figure_from_the_same_samples() -> None:
    tr = tracker(1.0, 0.0)
    assert tr.figure(KEY, Fastest(alpha=0.5), 100) == pytest.approx(0.5)
    assert tr.figure(KEY, Fastest(alpha=1.0), 100) == 0.0
    tr.record(KEY, 1.0, 101)  # both cached figures move on with the new sample
    assert tr.figure(KEY, Fastest(alpha=0.5), 101) == pytest.approx(0.75)
    assert tr.figure(KEY, Fastest(alpha=1.0), 101) == 1.0


def test_figure_older_than_max_age_is_unmeasured() -> None:
    tr = tracker(0.2, at=100.0)
    policy = Fastest(max_age_secs=60)
    assert tr.figure(KEY, policy, 160.0) == 0.2
    assert tr.figure(KEY, policy, 160.5) is None
    assert tr.age(KEY, 160.5) == 60.5


def test_stale_series_restarts() -> None:
    tr = tracker(9.0, 9.0, at=100.0)
    tr.record(KEY, 0.1, 401.0)  # more than stale_after later: old samples describe another moment
    assert tr.samples(KEY) == 1
    assert tr.figure(KEY, Fastest(), 401.0) == 0.1


def test_samples_age_and_retain() -> None:
    tr = tracker(0.1, 0.2, at=50.0)
    assert (tr.samples(KEY), tr.age(KEY, 55.0)) == (2, 5.0)
    assert (tr.samples(("x", "y")), tr.age(("x", "y"), 55.0)) == (0, None)
    tr.retain({("other", "m")})
    assert tr.samples(KEY) == 0


def test_memory_is_bounded() -> None:
    tr = tracker(*([0.5] * (MAX_WINDOW + 10)))
    assert tr.samples(KEY) == MAX_WINDOW


@pytest.mark.parametrize(
    ("points", "fit"),
    [
        pytest.param((), None, id="no-samples-no-fit"),
        pytest.param(((0, 0.02), (4, 0.10)) * 20, (0.02, 2.0), id="time-grows-two-hundredths-a-call"),
        pytest.param(((0, 0.05), (4, 0.05)) * 20, (0.0, 2.0), id="time-that-does-not-grow-with-load-has-no-slope"),
        pytest.param(((0, 0.10), (4, 0.02)) * 20, (0.0, 2.0), id="a-falling-line-is-no-negative-slope"),
        pytest.param(((3, 0.02), (3, 0.10)) * 20, (0.0, 3.0), id="a-load-that-never-varied-says-nothing"),
    ],
)
def test_the_load_fit_is_a_line_of_time_against_calls_in_flight(points: tuple[tuple[int, float], ...],
                                                                  fit: tuple[float, float] | None) -> None:
    tr = Tracker(stale_after=300)
    for load, secs in points:
        tr.record(KEY, secs, 100.0, load=load)
    got = tr.load_fit(KEY)
    # Exponentially weighted: the newest alternation weighs a little more, so the mean load sits near 2.
    assert got == (None if fit is None else (pytest.approx(fit[0], abs=2e-3), pytest.approx(fit[1], abs=0.2)))


def test_a_censored_sample_without_a_load_is_no_point_on_the_line_and_an_expired_series_forgets_it() -> None:
    tr = Tracker(stale_after=300)
    tr.record(KEY, 0.02, 100.0, load=0)
    tr.record(KEY, 5.0, 100.0)  # a lower bound (race.py's cut): a figure's sample, not the fit's
    assert tr.load_fit(KEY) == (0.0, 0.0)
    tr.record(KEY, 0.5, 1000.0, load=6)  # 900 s later: the series restarts, the fit too
    assert tr.load_fit(KEY) == (0.0, 6.0)


def test_a_load_that_stops_varying_keeps_the_last_slope_seen() -> None:
    tr = Tracker(stale_after=300)
    for load, secs in ((0, 0.02), (4, 0.10)) * 20:
        tr.record(KEY, secs, 100.0, load=load)
    assert tr.load_fit(KEY)[0] == pytest.approx(0.02, abs=2e-3)  # type: ignore[index]
    for _ in range(100):  # held at three in flight: the variance fades, the slope does not
        tr.record(KEY, 0.08, 100.0, load=3)
    slope, mean = tr.load_fit(KEY)  # type: ignore[misc]
    assert slope == pytest.approx(0.02, abs=2e-3) and mean == pytest.approx(3.0, abs=0.01)


def test_a_stall_enters_the_load_fit_at_three_times_its_mean() -> None:
    tr = Tracker(stale_after=300)
    for i, (load, secs) in enumerate(((10, 0.02), (12, 0.02)) * 20):  # a flat 20 ms at any load
        tr.record(KEY, secs, 100.0 + i * 0.03, load=load)
    tr.record(KEY, 1.5, 103.0, load=12)  # a stall (the stall scenario's), begun after the rest: a tail event
    slope, _ = tr.load_fit(KEY)  # type: ignore[misc]
    assert slope < 0.01  # unclipped, this one sample reads as 0.13 s per call in flight
    assert tr.figure(KEY, Fastest(), 103.0) > 0.1  # the figure itself still sees the whole stall


@pytest.mark.parametrize(
    ("steps", "newest", "fast"),
    [
        pytest.param([(0.4, 10.0), (0.02, 10.45), (0.02, 10.5)], [0.4, 0.02, 0.02], 0.0352,
                     id="in-order-the-newest-began-last"),
        pytest.param([(0.02, 10.45), (0.02, 10.5), (0.4, 10.51)], [0.4, 0.02, 0.02], 0.0352,
                     id="a-slow-call-begun-first-and-ended-last-goes-behind-the-fast-ones"),
        pytest.param([(0.02, 10.45), (0.4, 10.51), (0.02, 10.5)], [0.4, 0.02, 0.02], 0.0352,
                     id="behind-as-many-as-began-after-it"),
        pytest.param([(0.02, 10.45), (0.4, 10.9)], [0.4, 0.02, 0.4], 0.3392,
                     id="a-slow-call-begun-after-the-fast-one-is-the-newest"),
    ],
)
def test_samples_stand_in_the_order_their_calls_began(steps: list[tuple[float, float]], newest: list[float],
                                                     fast: float) -> None:
    """(seconds, the time it ended): a look at a target that began before it recovered and ended after
    two fast answers does not read as its newest (docs/adr/0023, amendment)."""
    tr = Tracker(stale_after=300)
    tr.record(KEY, 0.4, 9.0)
    for secs, at in steps:
        tr.record(KEY, secs, at)
    assert tr.recent(KEY, "streamed")[-3:] == newest
    policy = Fastest(alpha=0.8)
    assert tr.figure(KEY, policy, 10.6) == pytest.approx(fast, abs=1e-4)


def test_a_late_sample_replays_every_ewma_asked_for() -> None:
    """Forty samples in order, then one that began before the newest three: each smoothing factor
    reads as if the samples had come in the order their calls began."""
    tr, steps = Tracker(stale_after=300), [(0.01 * (i % 7 + 1), 1.0 + i) for i in range(40)]
    for secs, at in steps:
        tr.record(KEY, secs, at)
        tr.figure(KEY, Fastest(alpha=0.1), at)  # one factor asked for as they come, the other only at the end
    tr.record(KEY, 3.5, 40.4)  # began at 36.9: after the 36th sample's call, before the 37th's
    ordered = Tracker(stale_after=300)
    for secs, at in [*steps[:37], (3.5, 40.4), *steps[37:]]:
        ordered.record(KEY, secs, at)
    for alpha in (0.1, 0.8):
        assert tr.figure(KEY, Fastest(alpha=alpha), 41.0) == pytest.approx(
            ordered.figure(KEY, Fastest(alpha=alpha), 41.0))
    assert tr.recent(KEY, "streamed") == ordered.recent(KEY, "streamed")


class _Counted(deque):
    """The series' own deque, counting the samples an iteration hands out (front or back): what a late
    sample's replay reads, a count rather than a clock."""

    read = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        for s in super().__iter__():
            _Counted.read += 1
            yield s

    def __reversed__(self):  # type: ignore[no-untyped-def]
        for s in super().__reversed__():
            _Counted.read += 1
            yield s


def _late_sample_reads(window: int) -> int:
    """Samples read by 20 late samples (begun before the newest calls: every peer's sample folded in a
    fleet) on a series of ``window`` samples, its EWMAs asked for as a route does."""
    tr, now = Tracker(stale_after=1e9), window * 0.001
    for i in range(window):
        tr.record(KEY, 0.02, i * 0.001)
    series = tr.modes["streamed"][KEY]
    series.samples = _Counted(series.samples, maxlen=MAX_WINDOW)
    tr.figures(KEY, Fastest(), now, "streamed", 0.8)
    tr.record(KEY, 0.5, now)  # the first settles each EWMA's older part once: a one-off, read whole
    _Counted.read = 0
    for _ in range(20):
        tr.record(KEY, 0.5, now)
    return _Counted.read


def test_a_late_sample_reads_the_newest_samples_not_the_window() -> None:
    """A late sample replays each EWMA over the newest samples only. The replay read them with an
    ``islice`` from the deque's front, walking the whole window (10,000 samples: 150 µs a late sample
    against 10 µs at 100), and a fleet folds every peer's sample late (it rides the next tick), in bursts
    of hundreds at each tick (docs/operations.md, "The cold start, call by call")."""
    full, short = _late_sample_reads(MAX_WINDOW), _late_sample_reads(100)
    assert full == short
    assert full <= 20 * 2 * (REORDER + 1)  # each of the route's EWMAs over at most the reordered tail


# -- censored samples: a lost race is a lower bound (docs/adr/0022) -----------------------------
# Each step: ("s", seconds) an answered first token, ("c", seconds) a censored bound, at 1 s apart
# on the injected clock; the policy is the default EWMA (alpha 0.1). The leader's samples are 40 ms.

WARM = (("s", 0.04),) * 20


@pytest.mark.parametrize(
    ("steps", "figure", "held"),
    [
        pytest.param(WARM, 0.04, 0, id="warm-leader"),
        pytest.param((*WARM, ("c", 0.14)), 0.04, 1, id="one-lost-race-is-held-not-averaged"),
        pytest.param((*WARM, ("c", 0.14), ("c", 0.15)), 0.141, 2, id="two-in-a-row-restart-from-the-bounds"),
        pytest.param((*WARM, ("c", 0.14), ("s", 0.04), ("c", 0.14)), 0.04, 1,
                     id="a-faster-answer-between-clears-the-first"),
        pytest.param((*WARM, ("c", 0.14), ("s", 0.25), ("c", 0.14)), 0.14 * 0.9 + 0.14 * 0.1, 2,
                     id="a-slower-answer-between-confirms-it"),
        pytest.param((*WARM, ("c", 0.14), ("c", 0.14), ("s", 0.25)), 0.14 * 0.9 + 0.25 * 0.1, 2,
                     id="a-demoted-figure-goes-on-from-its-bounds"),
        pytest.param((*WARM, ("c", 0.14), ("c", 0.14), ("s", 0.04)), 0.04, 0,
                     id="an-answer-under-the-bounds-after-a-demotion-gives-back-the-history-they-set-aside"),
        pytest.param((*WARM, ("c", 0.14), ("c", 0.14), ("s", 0.25), ("s", 0.04)),
                     ((0.14 * 0.9 + 0.25 * 0.1) * 0.9 + 0.04 * 0.1), 0,
                     id="once-an-answer-confirmed-the-demotion-that-history-is-gone"),
        pytest.param((*WARM, ("c", 0.14), ("c", 0.14), ("c", 0.16), ("s", 0.04)), 0.04, 0,
                     id="a-second-demotion-sets-aside-nothing-more-the-first-history-comes-back"),
        pytest.param((*((("s", 0.04),) * 9 + (("c", 0.14),)) * 10,), 0.04, 1,
                     id="one-stall-in-ten-never-moves-the-figure"),
        pytest.param((("c", 0.6),), 0.6, 1, id="an-unmeasured-targets-bound-is-its-figure"),
    ],
)
def test_censored_update(steps: tuple[tuple[str, float], ...], figure: float, held: int) -> None:
    tr = Tracker(stale_after=300)
    for i, (kind, secs) in enumerate(steps):
        if kind == "s":
            tr.record(KEY, secs, 100.0 + i)
        else:
            tr.censor(KEY, secs, 100.0 + i)
    now = 100.0 + len(steps)
    assert tr.figure(KEY, Fastest(), now) == pytest.approx(figure, abs=1e-3)
    assert tr.held(KEY) == held
    assert tr.age(KEY, now) == 1.0  # every bound dates the figure, held or not


@pytest.mark.parametrize(
    ("behind", "figure"),
    [
        pytest.param(None, 0.141, id="no-winner-figure-the-bounds-alone"),
        pytest.param(0.10, 0.141, id="a-winner-under-the-bounds-changes-nothing"),
        pytest.param(0.30, 0.315, id="a-winner-slower-on-paper-the-loser-goes-behind-it"),
    ],
)
def test_a_demotion_ranks_the_leader_behind_the_target_it_lost_to(behind: float | None, figure: float) -> None:
    tr = tracker(*(0.04,) * 20)
    tr.censor(KEY, 0.14, 101.0, behind=behind)
    assert tr.censor(KEY, 0.15, 102.0, behind=behind)
    assert tr.figure(KEY, Fastest(), 102.0) == pytest.approx(figure, abs=1e-3)


def test_a_stale_series_forgets_its_held_bounds() -> None:
    tr = tracker(0.04)
    tr.censor(KEY, 0.14, 101.0)
    assert not tr.censor(KEY, 0.14, 1000.0)  # 900 s later: another moment, the bound is its only figure
    assert tr.figure(KEY, Fastest(), 1000.0) == pytest.approx(0.14) and tr.held(KEY) == 1


# -- the ranked window: the newest RECENT samples, sorted, kept as they come (a hedge's pNN) ---------
# Each step: ("s", seconds, ended at) an answer, ("c", seconds, at) a censored bound.


def _steps(count: int, seed: int, reorder: bool) -> list[tuple[str, float, float]]:
    rng = random.Random(seed)
    return [("s", round(rng.uniform(0.01, 0.5), 3), 10.0 + i * (0.01 if reorder else 1.0)) for i in range(count)]


@pytest.mark.parametrize(
    "steps",
    [
        pytest.param([("s", 0.3, 10.0), ("s", 0.1, 11.0), ("s", 0.2, 12.0)], id="a-few-in-order"),
        pytest.param(_steps(3 * RECENT, 1, False), id="past-the-window-each-leaving-one-goes"),
        pytest.param(_steps(3 * RECENT, 2, True), id="calls-ending-out-of-the-order-they-began"),
        pytest.param([("s", 0.2, 10.0)] * (RECENT + 5) + [("s", 0.1, 10.0)], id="equal-samples"),
        pytest.param([*_steps(RECENT + 20, 3, False), ("c", 0.9, 131.0), ("c", 0.9, 132.0), ("s", 0.05, 133.0)],
                     id="a-demotion-restarts-it-from-the-bounds"),
        pytest.param([*_steps(RECENT + 20, 4, False), ("s", 0.3, 1000.0)], id="a-stale-series-restarts-it"),
    ],
)
def test_the_ranked_window_is_the_newest_samples_sorted(steps: list[tuple[str, float, float]]) -> None:
    tr = Tracker(stale_after=300)
    for kind, secs, at in steps:
        if kind == "s":
            tr.record(KEY, secs, at)
        else:
            tr.censor(KEY, secs, at)
        assert list(tr.ranked(KEY, "streamed")) == sorted(tr.recent(KEY, "streamed"))
    assert len(tr.ranked(KEY, "streamed")) == min(RECENT, tr.samples(KEY))

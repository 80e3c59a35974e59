"""The hedge budget's two kinds of extra call and its free first measures: pure tables."""

from __future__ import annotations

import pytest

from proxy.state import State
from proxy.state.budget import RESERVE, HedgeBudget


@pytest.mark.parametrize(
    ("tokens", "hedge", "explore"),
    [
        pytest.param(1.0, True, False, id="the-last-token-is-a-hedges"),
        pytest.param(1.0 + RESERVE, True, True, id="above-the-reserve-an-explore-may-spend"),
        pytest.param(1.9, True, False, id="an-explore-never-dips-into-the-reserve"),
        pytest.param(0.9, False, False, id="empty-for-both"),
    ],
)
def test_an_explore_leaves_a_token_for_a_hedge(tokens: float, hedge: bool, explore: bool) -> None:
    for keep, granted in ((0.0, hedge), (RESERVE, explore)):
        budget = HedgeBudget(0.1)
        budget.tokens = tokens
        assert budget.withdraw(keep=keep) is granted


def test_explores_wanted_on_every_request_leave_the_hedges_their_share() -> None:
    """Every request wants an explore, one in ten stalls and wants a hedge: the hedges get theirs (but
    the one that falls while the first deposits repay the start token), and all of them together stay
    within a tenth of the requests, the start token included."""
    budget = HedgeBudget(0.1)
    hedges = explores = 0
    for n in range(300):
        budget.deposit()
        explores += budget.withdraw(keep=RESERVE)
        if n % 10 == 5:
            hedges += budget.withdraw(count=False)
    assert hedges == 29
    assert explores + hedges <= 300 * 0.1


@pytest.mark.parametrize(
    ("steps", "granted"),
    [
        pytest.param([(1.0, None)], [True], id="the-first-is-free"),
        pytest.param([(1.0, None), (2.0, None), (9.0, None)], [True, False, False],
                     id="a-target-that-never-answered-gets-one"),
        pytest.param([(1.0, None), (3.0, 1.5)], [True, True], id="again-once-a-sample-arrived-since"),
        pytest.param([(1.0, None), (3.0, 0.5)], [True, False], id="a-sample-from-before-does-not-count"),
    ],
)
def test_free_measure(steps: list[tuple[float, float | None]], granted: list[bool]) -> None:
    budget = HedgeBudget(0.1)
    assert [budget.free_measure("a", now, measured_at) for now, measured_at in steps] == granted


def test_free_measures_are_per_target() -> None:
    budget = HedgeBudget(0.1)
    assert [budget.free_measure(key, 1.0, None) for key in ("a", "b", "a")] == [True, True, False]


def test_a_reload_that_changes_max_extra_keeps_the_saved_tokens() -> None:
    state = State()
    budget = state.budget("chat", 0.1)
    budget.tokens = 4.0
    again = state.budget("chat", 0.5)
    assert again is budget and (again.tokens, again.share) == (4.0, 0.5)


@pytest.mark.parametrize(
    ("free", "requests", "tokens"),
    [
        pytest.param(0, 10, 1.0, id="the-first-ten-deposits-repay-the-start-token"),
        pytest.param(0, 20, 2.0, id="then-the-bucket-grows"),
        pytest.param(2, 30, 1.0, id="two-free-measures-take-twenty-more"),
        pytest.param(2, 40, 2.0, id="and-then-it-grows"),
    ],
)
def test_the_start_token_and_free_measures_are_repaid_before_the_bucket_grows(
        free: int, requests: int, tokens: float) -> None:
    budget = HedgeBudget(0.1)
    for key in range(free):
        assert budget.free_measure(key, 1.0, None)
    for _ in range(requests):
        budget.deposit()
    assert budget.tokens == pytest.approx(tokens)


def test_a_cold_route_that_races_all_it_may_stays_within_its_share() -> None:
    """Three targets' free measures, the start token spent at once, then every token as it comes:
    after the repayment the extra calls are at most a tenth of the requests."""
    budget = HedgeBudget(0.1)
    extra = sum(budget.free_measure(key, 1.0, None) for key in "abc")
    for n in range(1, 301):
        budget.deposit()
        extra += budget.withdraw(count=False)
        if n >= 40:
            assert extra <= n * 0.1 + 1e-9, n

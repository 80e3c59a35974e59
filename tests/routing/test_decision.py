"""The ``x-route-decision`` header: exact format, the shipped parser, and what it refuses."""

from __future__ import annotations

import re

import pytest

from proxy.routing.decision import (
    PRICE,
    TOTAL,
    Attempt,
    Decision,
    Excluded,
    HeaderError,
    Racer,
    Ranked,
    duplicate_calls,
    format_header,
    parse_header,
)

FULL = Decision(
    id="7f3a9c",
    route="chat",
    strategy="fastest",
    order=(Ranked("groq", "fastest", 0.31), Ranked("openai", None, 0.82), Ranked("anthropic", "unmeasured")),
    excluded=(Excluded("local", "breaker open 12s"), Excluded("premium", "deny")),
    attempts=(Attempt("groq", "503", 0.04, True), Attempt("openai", "200", 0.79, False, 0.79)),
    served="openai",
)
DESIGN_EXAMPLE = (
    "id=7f3a9c; route=chat; strategy=fastest; order=groq(fastest 0.31s), openai(0.82s), anthropic(unmeasured); "
    "excluded=local(breaker open 12s), premium(deny); attempts=groq(503 0.04s), openai(200 0.79s); served=openai"
)


def test_format_matches_the_design_example() -> None:
    assert format_header(FULL) == FULL.header() == DESIGN_EXAMPLE


@pytest.mark.parametrize(
    "decision",
    [
        pytest.param(FULL, id="every-field"),
        pytest.param(Decision("a1", "chat", "ordered", (Ranked("a", "written"),)), id="order-only"),
        pytest.param(Decision("a1", "chat", "ordered", (), (Excluded("b", "deny"),)), id="empty-order"),
        pytest.param(
            Decision("a1", "gpt/x", "ordered", (Ranked("gpt", "pinned"),),
                     attempts=(Attempt("gpt", "400 context overflow", 0.012),)),
            id="direct-pin-multiword-outcome",
        ),
        pytest.param(
            Decision("a1", "chat", "cheapest", (Ranked("c", "cheapest", 2.0, PRICE), Ranked("b", None, None, PRICE)),
                     attempts=(Attempt("c", "cooldown", 0.0), Attempt("b", "busy", 0.0)), served=None),
            id="cheapest-skipped-and-busy",
        ),
        pytest.param(
            Decision("a1", "chat", "ordered", (Ranked("b", "soonest to reopen"),),
                     (Excluded("a", "breaker open 20s"),)),
            id="health-rescue",
        ),
        pytest.param(
            Decision("a1", "chat", "fastest", (Ranked("a", "fastest", 0.31), Ranked("b", None, 0.82)),
                     attempts=(Attempt("a", "lost", 0.52), Attempt("b", "200", 0.11)), served="b",
                     race=(Racer("a", "leader"), Racer("b", "hedge 0.40s"))),
            id="hedged-race",
        ),
        pytest.param(
            Decision("a1", "chat", "fastest", (Ranked("b", "explore", 0.82), Ranked("a", None, 0.31)),
                     attempts=(Attempt("b", "measuring", 0.31), Attempt("a", "error event overloaded", 0.01),
                               Attempt("c", "200", 0.2)), served="c",
                     race=(Racer("b", "explore"), Racer("a", "leader"), Racer("c", "budget exhausted"))),
            id="explore-race-with-error-event-and-refused-hedge",
        ),
        pytest.param(
            Decision("a1", "chat", "fastest", (Ranked("b", "explore 0.82s"), Ranked("a", "0.31s")),
                     attempts=(Attempt("a", "200", 0.3, ttfc=0.3), Attempt("b", "capped", 1.2)), served="a",
                     race=(Racer("b", "explore"), Racer("a", "leader"))),
            id="explored-loser-cut-at-its-cap",
        ),
    ],
)
def test_round_trip(decision: Decision) -> None:
    parsed = parse_header(decision.header())
    assert (parsed.id, parsed.route, parsed.strategy, parsed.served) == (
        decision.id, decision.route, decision.strategy, decision.served)
    assert parsed.order == tuple((r.name, r.detail) for r in decision.order)
    assert parsed.excluded == tuple((e.name, e.reason) for e in decision.excluded)
    assert parsed.attempt_names == [a.name for a in decision.attempts]
    assert parsed.attempt_outcomes() == [(a.name, a.outcome) for a in decision.attempts]
    assert parsed.first_reason == decision.first_reason
    assert parsed.race == tuple((r.name, r.role) for r in decision.race)


@pytest.mark.parametrize(
    ("race", "extra"),
    [
        pytest.param((), 0, id="no-race"),
        pytest.param((("b", "budget exhausted"),), 0, id="refused-started-nothing"),
        pytest.param((("a", "leader"), ("b", "hedge 0.40s")), 1, id="a-hedge"),
        pytest.param((("b", "explore"), ("a", "leader")), 1, id="an-explore-costs-the-leader-beside-it"),
        pytest.param((("b", "budget exhausted"), ("a", "leader"), ("b", "hedge 0.20s")), 1,
                     id="refused-explore-then-a-paid-hedge"),
    ],
)
def test_duplicate_calls(race: tuple[tuple[str, str], ...], extra: int) -> None:
    assert duplicate_calls(race) == extra


def test_parsed_helpers() -> None:
    parsed = parse_header(DESIGN_EXAMPLE)
    assert parsed.order_names == ["groq", "openai", "anthropic"]
    assert parsed.first_reason == "fastest"
    assert parsed.excluded_reason("local") == "breaker open 12s"
    assert parsed.excluded_reason("groq") is None
    assert FULL.failovers == 1


@pytest.mark.parametrize(
    ("value", "says"),
    [
        pytest.param("", "unexpected field", id="empty"),
        pytest.param("id=1; route=chat; strategy=ordered", "missing field 'order'", id="missing-order"),
        pytest.param("route=chat; strategy=ordered; order=a(written)", "missing field 'id'", id="missing-id"),
        pytest.param("id=1; route=chat; strategy=x; order=a(written); colour=red", "unexpected field",
                     id="unknown-field"),
        pytest.param("id=1; id=2; route=chat; strategy=x; order=a(written)", "appears twice", id="duplicate-field"),
        pytest.param("id=1;route=chat;strategy=x;order=a(written)", "missing field", id="no-space-separator"),
        pytest.param("id=1; route=chat; strategy=x; order=a", "not name(detail)", id="item-without-detail"),
        pytest.param("id=1; route=chat; strategy=x; order=a(written),b(x)", "not name(detail)",
                     id="items-without-space"),
        pytest.param("id=1; route=chat; strategy=x; order=a(b(c))", "not name(detail)", id="nested-parens"),
        pytest.param("id=1; route chat; strategy=x; order=a(w)", "unexpected field", id="field-without-equals"),
    ],
)
def test_malformed_headers_raise(value: str, says: str) -> None:
    with pytest.raises(HeaderError, match=re.escape(says)):
        parse_header(value)


@pytest.mark.parametrize(
    ("ranked", "detail"),
    [
        pytest.param(Ranked("a", "fastest", 0.314), "fastest 0.31s", id="first-with-its-figure"),
        pytest.param(Ranked("a", "written"), "written", id="unmeasured-first-shows-its-reason-alone"),
        pytest.param(Ranked("a", "pinned", 0.5), "pinned 0.50s", id="pinned-with-figure"),
        pytest.param(Ranked("a", None, 0.82), "0.82s", id="behind-the-first-a-figure"),
        pytest.param(Ranked("a"), "unmeasured", id="behind-the-first-unmeasured"),
        pytest.param(Ranked("a", "cheapest", 2.0, PRICE), "cheapest 2/M", id="cheapest-first"),
        pytest.param(Ranked("a", "cheapest", None, PRICE), "cheapest no price", id="cheapest-first-no-price"),
        pytest.param(Ranked("a", None, 0.59, PRICE), "0.59/M", id="price-behind"),
        pytest.param(Ranked("a", "score", 0.714, TOTAL, "speed"), "score speed 0.71", id="score-first"),
        pytest.param(Ranked("a", None, 0.714, TOTAL, "speed"), "speed 0.71", id="score-first-behind-a-pin"),
        pytest.param(Ranked("a", None, 0.5, TOTAL), "0.50", id="score-behind"),
    ],
)
def test_ranked_detail_is_written_from_its_fields(ranked: Ranked, detail: str) -> None:
    assert ranked.detail == detail
    d = Decision("a1", "chat", "ordered", (ranked,))
    assert parse_header(d.header()).order == (("a", detail),)


@pytest.mark.parametrize(
    ("order", "reason"),
    [
        pytest.param((Ranked("a", "explore", 0.8), Ranked("b", None, 0.3)), "explore", id="the-firsts-reason"),
        pytest.param((Ranked("a", "soonest to reopen"),), "soonest", id="first-word-of-a-phrase"),
        pytest.param((), "none", id="empty-order"),
    ],
)
def test_first_reason_reads_the_field(order: tuple[Ranked, ...], reason: str) -> None:
    assert Decision("a1", "chat", "fastest", order).first_reason == reason


def _tried(*attempts: tuple[str, str], served: str | None) -> Decision:
    return Decision("a1", "chat", "fastest", (Ranked("a", "fastest", 0.1),),
                    attempts=tuple(Attempt(name, outcome, 0.1) for name, outcome in attempts), served=served)


@pytest.mark.parametrize(
    ("decision", "failovers"),
    [
        pytest.param(_tried(("a", "503"), ("b", "200"), served="b"), 1, id="a-plain-failover"),
        pytest.param(_tried(("a", "503"), ("a", "503"), ("b", "200"), served="b"), 1, id="retries-are-one"),
        pytest.param(_tried(("a", "503"), ("b", "503"), served=None), 1, id="nobody-served-the-last-was-the-answer"),
        pytest.param(_tried(("a", "200"), ("b", "lost"), served="a"), 0, id="a-hedge-that-lost"),
        pytest.param(_tried(("a", "200"), ("b", "503"), served="a"), 0,
                     id="a-hedge-that-failed-while-the-leader-ran"),
        pytest.param(_tried(("c", "measuring"), ("a", "200"), served="a"), 0, id="an-explored-loser"),
        pytest.param(_tried(("a", "lost"), ("b", "200"), served="b"), 0, id="a-leader-that-lost-the-race"),
        pytest.param(_tried(("a", "503"), ("b", "200"), ("c", "lost"), served="b"), 1,
                     id="a-failed-leader-before-the-winning-hedge"),
    ],
)
def test_failovers_count_targets_moved_past_not_racers(decision: Decision, failovers: int) -> None:
    assert decision.failovers == failovers


@pytest.mark.parametrize(
    ("order", "race", "header_order", "first_reason"),
    [
        pytest.param((Ranked("a", "explore", 0.3), Ranked("b", None, 0.1)), (Racer("a", "budget exhausted"),),
                     "b(fastest 0.10s), a(0.30s)", "fastest", id="a-refused-explore-waited-behind-the-leader"),
        pytest.param((Ranked("a", "unmeasured"), Ranked("b", None, None), Ranked("c", None, 0.2)),
                     (Racer("a", "budget exhausted"),), "b(unmeasured), a(unmeasured), c(0.20s)", "unmeasured",
                     id="a-refused-measure-behind-an-unmeasured-leader"),
        pytest.param((Ranked("a", "unmeasured"), Ranked("b", None, 0.1)), (Racer("b", "budget exhausted"),),
                     "a(unmeasured), b(0.10s)", "unmeasured", id="a-first-being-measured-led-unraced"),
        pytest.param((Ranked("a", "explore", 0.3), Ranked("b", None, 0.1)),
                     (Racer("a", "explore"), Racer("b", "leader")), "a(explore 0.30s), b(0.10s)", "explore",
                     id="it-raced"),
        pytest.param((Ranked("a", "fastest", 0.1),), (), "a(fastest 0.10s)", "fastest", id="no-race"),
    ],
)
def test_the_order_says_how_the_walk_took_it(order: tuple[Ranked, ...], race: tuple[Racer, ...],
                                             header_order: str, first_reason: str) -> None:
    decision = Decision("a1", "chat", "fastest", order).as_tried(race)
    assert decision.header() == f"id=a1; route=chat; strategy=fastest; order={header_order}"
    assert decision.first_reason == first_reason


def test_but_copies_every_field() -> None:
    full = Decision("a1", "chat", "fastest", (Ranked("a", "fastest", 0.1),), (Excluded("x", "deny"),),
                    (Attempt("a", "200", 0.1),), "a", 200, {"prompt_tokens": 1}, 0.5, (Racer("a", "leader"),))
    assert full.but() == full
    assert full.but(status=503) == Decision(*[503 if f == "status" else getattr(full, f)
                                              for f in full.__dataclass_fields__ if f != "_header"])


@pytest.mark.parametrize(
    ("changes", "header"),
    [
        pytest.param({"status": 200, "attempts": (Attempt("a", "200", 0.02),), "served": "a"},
                     "id=a1; route=chat; strategy=fastest; order=a(fastest 0.10s); excluded=x(deny); "
                     "attempts=a(200 0.02s); served=a", id="a-later-field-keeps-the-planned-text"),
        pytest.param({"order": (Ranked("b", "written"),)},
                     "id=a1; route=chat; strategy=fastest; order=b(written); excluded=x(deny)", id="order"),
        pytest.param({"excluded": ()}, "id=a1; route=chat; strategy=fastest; order=a(fastest 0.10s)", id="excluded"),
        pytest.param({"id": "b2", "route": "r", "strategy": "ordered"},
                     "id=b2; route=r; strategy=ordered; order=a(fastest 0.10s); excluded=x(deny)",
                     id="id-route-strategy"),
    ],
)
def test_the_planned_fields_are_formatted_once_and_follow_a_copy_that_changes_them(
        changes: dict[str, object], header: str) -> None:
    """The server formats the plan's part of the header while the upstream thinks (``planned_fields``);
    a copy keeps that text only while the fields it is made of are the same."""
    planned = Decision("a1", "chat", "fastest", (Ranked("a", "fastest", 0.1),), (Excluded("x", "deny"),))
    text = planned.planned_fields()
    assert planned.planned_fields() is text  # formatted once
    copy = planned.but(**changes)
    assert copy.header() == header
    assert (copy.planned_fields() is text) == ("attempts" in changes)

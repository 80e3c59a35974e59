"""The score strategy as tables: relative signals, clamping, neutral 0.5, one cost basis, weights."""

from __future__ import annotations

import math
import random
import sqlite3
from collections.abc import Mapping
from pathlib import Path

import pytest

from proxy.config import Price, Route, ScoreWeights, Target, TargetKey
from proxy.observe.cost_refresher import CostRefresher
from proxy.observe.ledger import SCHEMA
from proxy.routing.ordering import order_targets
from proxy.routing.score import cost_basis, lead_signal, relative, score_targets
from proxy.state import State

from ..conftest import decision_of, openai_provider, route_config


class Snapshot:
    """A state snapshot by hand: figures, success shares and measured costs."""

    def __init__(self, figures: Mapping[str, float] | None = None, shares: Mapping[str, float] | None = None,
                 costs: Mapping[tuple[str, str], float] | None = None) -> None:
        self.figures = dict(figures or {})
        self.shares = dict(shares or {})
        self.costs = dict(costs or {})

    def figure(self, key: TargetKey, policy: object, now: float, mode: str = "streamed") -> float | None:
        return self.figures.get(key[0])

    def success_share(self, key: TargetKey) -> float | None:
        return self.shares.get(key[0])


def t(name: str, price: tuple[float, float] | None = None, quality: float | None = None) -> Target:
    return Target(name=name, provider=name, model="m", quality=quality,
                  price=None if price is None else Price(*price))


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param({"a": 1.0, "b": 1.0}, {"a": 0.5, "b": 0.5}, id="equal-is-neutral"),
        pytest.param({"a": 1.0, "b": 4.0}, {"a": 2 / 3, "b": 1 / 3}, id="geomean-2-both-at-the-clamp"),
        pytest.param({"a": 1.0, "b": 1.21}, {"a": 1 / (1 + 1 / 1.1), "b": 1 / (1 + 1.1)},
                     id="relative-g-over-g-plus-x"),
        pytest.param({"a": 0.1, "b": 100.0}, {"a": 2 / 3, "b": 1 / 3}, id="clamped-a-factor-of-two"),
        pytest.param({"a": 2.0, "b": None}, {"a": 0.5, "b": 0.5}, id="sole-measured-is-neutral"),
        pytest.param({"a": None, "b": None}, {"a": 0.5, "b": 0.5}, id="no-data-is-neutral"),
        pytest.param({"a": 1.0, "b": 1.0, "c": None}, {"a": 0.5, "b": 0.5, "c": 0.5}, id="unmeasured-stays-neutral"),
        pytest.param({"a": 0.0, "b": 1.0}, {"a": 2 / 3, "b": 1 / 3}, id="free-is-clamped-not-infinite"),
    ],
)
def test_relative(values, expected):
    got = relative(values)
    assert got == {k: pytest.approx(v) for k, v in expected.items()}


@pytest.mark.parametrize(
    ("targets", "costs", "basis", "figures"),
    [
        pytest.param([t("a", (1, 2)), t("b", (3, 4))], {("a", "chat"): 0.01, ("b", "chat"): 0.02},
                     "measured", {"a": 0.01, "b": 0.02}, id="all-priced-measured"),
        pytest.param([t("a", (1, 2)), t("b", (3, 4))], {("a", "chat"): 0.01},
                     "declared", {"a": 3.0, "b": 7.0}, id="one-missing-means-declared-for-all"),
        pytest.param([t("a", (1, 2)), t("b", (3, 4))], {("a", "messages"): 0.01, ("b", "messages"): 0.02},
                     "declared", {"a": 3.0, "b": 7.0}, id="other-operation-does-not-count"),
        pytest.param([t("a", (1, 2)), t("b")], {("a", "chat"): 0.01},
                     "measured", {"a": 0.01, "b": None}, id="unpriced-candidate-does-not-block-measured"),
        pytest.param([t("a"), t("b")], {}, "declared", {"a": None, "b": None}, id="nothing-priced"),
    ],
)
def test_cost_basis_is_one_per_decision(targets, costs, basis, figures):
    assert cost_basis(targets, costs, "chat") == (basis, figures)


SPEED_ONLY = ScoreWeights(speed=1, cost=0, health=0, quality=0)
COST_ONLY = ScoreWeights(speed=0, cost=1, health=0, quality=0)


@pytest.mark.parametrize(
    ("weights", "targets", "snapshot", "order", "lead"),
    [
        pytest.param(SPEED_ONLY, [t("slow"), t("fast")], Snapshot({"slow": 2.0, "fast": 0.5}),
                     ["fast", "slow"], "speed", id="speed-weight-picks-the-faster"),
        pytest.param(COST_ONLY, [t("dear", (10, 30)), t("cheap", (1, 2))], Snapshot(),
                     ["cheap", "dear"], "cost", id="cost-weight-picks-the-cheaper-declared"),
        pytest.param(COST_ONLY, [t("a", (1, 2)), t("b", (10, 30))],
                     Snapshot(costs={("a", "chat"): 0.05, ("b", "chat"): 0.01}),
                     ["b", "a"], "cost", id="measured-cost-beats-declared-price"),
        pytest.param(ScoreWeights(0, 0, 1, 0), [t("flaky"), t("steady")],
                     Snapshot(shares={"flaky": 0.4, "steady": 1.0}),
                     ["steady", "flaky"], "health", id="health-share"),
        pytest.param(ScoreWeights(0, 0, 0, 1), [t("unknown"), t("good", quality=0.9)], Snapshot(),
                     ["good", "unknown"], "quality", id="declared-quality-over-unknown"),
        pytest.param(ScoreWeights(0, 0, 0, 1), [t("unknown"), t("poor", quality=0.2)], Snapshot(),
                     ["unknown", "poor"], "quality", id="unknown-quality-is-neutral-not-zero"),
        pytest.param(ScoreWeights(1, 0, 0, 3), [t("fast", quality=0.5), t("slow", quality=0.9)],
                     Snapshot({"fast": 0.5, "slow": 2.0}),
                     ["slow", "fast"], "quality", id="weights-let-quality-outvote-speed"),
        pytest.param(ScoreWeights(3, 0, 0, 1), [t("fast", quality=0.5), t("slow", quality=0.9)],
                     Snapshot({"fast": 0.5, "slow": 2.0}),
                     ["fast", "slow"], "speed", id="weights-let-speed-outvote-quality"),
        pytest.param(ScoreWeights(), [t("a"), t("b"), t("c")], Snapshot(), ["a", "b", "c"], "written",
                     id="no-data-keeps-written-order"),
        pytest.param(SPEED_ONLY, [t("new"), t("known")], Snapshot({"known": 0.1}), ["new", "known"], "written",
                     id="history-alone-neither-promotes-nor-demotes"),
        pytest.param(ScoreWeights(0, 0, 0, 0), [t("a"), t("b", quality=1.0)], Snapshot(), ["a", "b"], "written",
                     id="all-weights-zero-is-written-order"),
        pytest.param(ScoreWeights(), [t("solo")], Snapshot(), ["solo"], "only", id="sole-candidate"),
    ],
)
def test_score_order_and_lead(weights, targets, snapshot, order, lead):
    route = Route(name="r", strategy="score", targets=tuple(targets), score=weights)
    out, ranked = order_targets(route, targets, snapshot, 0.0, random.Random(0))
    assert [x.name for x in out] == order
    word, signal, total = ranked[0].detail.split(" ")
    assert (word, signal) == ("score", lead)
    assert 0.0 <= float(total) <= 1.0
    assert all(" " not in r.detail for r in ranked[1:])


def test_total_is_the_weighted_mean_of_the_signals():
    targets = [t("a", (1, 1), quality=0.8), t("b", (4, 4), quality=None)]
    snap = Snapshot({"a": 1.0, "b": 1.21}, {"a": 0.9})
    scored, basis = score_targets(ScoreWeights(speed=2, cost=1, health=1, quality=0), targets,
                                  {"a": 1.0, "b": 1.21}, snap, "chat")
    a = next(s for s in scored if s.target.name == "a")
    speed, cost = 1 / (1 + 1 / 1.1), 2 / 3  # cost ratio 1/2 -> at the clamp
    assert basis == "declared"
    assert (a.speed, a.cost, a.health, a.quality) == (pytest.approx(speed), pytest.approx(cost), 0.9, 0.8)
    assert a.total == pytest.approx((2 * speed + cost + 0.9) / 4)
    assert lead_signal(ScoreWeights(), scored[0], None) == "only"
    assert math.isclose(scored[0].total, max(s.total for s in scored))


def _ledger_rows(path: Path, now: float, rows: list[tuple[str, str, float, int, int]]) -> None:
    conn = sqlite3.connect(path)
    conn.executescript(SCHEMA)
    for i, (served, op, cost, status, failovers) in enumerate(rows):
        conn.execute(
            'INSERT INTO decisions (id, ts, route, strategy, "order", first_reason, excluded, attempts, served, '
            "status, failovers, ttfc, total, stream, operation, prompt_tokens, completion_tokens, cost_usd) "
            "VALUES (?, ?, 'chat', 'score', '', 'score', '', '', ?, ?, ?, 0.1, 0.2, 0, ?, 1, 1, ?)",
            (str(i), now - 60, served, status, failovers, op, cost),
        )
    conn.commit()
    conn.close()


async def test_refresher_carries_measured_costs_from_the_ledger(tmp_path):
    path = tmp_path / "ledger.db"
    now = 1_700_000_000.0
    clean = [("a", "chat", 0.002, 200, 0)] * 5 + [("b", "chat", 0.010, 200, 0)] * 4
    noisy = [("a", "chat", 9.0, 200, 1), ("a", "chat", 9.0, 503, 0)]  # failover / error: not counted
    _ledger_rows(path, now, clean + noisy)
    state = State()
    await CostRefresher(str(path), state, clock=lambda: now).refresh()
    assert state.costs == {("a", "chat"): pytest.approx(0.002)}  # b has only 4 clean calls

    missing = State()
    await CostRefresher(str(tmp_path / "none.db"), missing).refresh()
    assert missing.costs == {}


async def test_refresher_follows_the_ledger_the_running_config_names(tmp_path):
    path = tmp_path / "ledger.db"
    now = 1_700_000_000.0
    _ledger_rows(path, now, [("a", "chat", 0.002, 200, 0)] * 5)
    current: dict[str, str | None] = {"ledger": None}  # as after a reload that has no ledger yet
    state = State()
    refresher = CostRefresher(lambda: current["ledger"], state, clock=lambda: now)
    await refresher.refresh()
    assert state.costs == {}
    current["ledger"] = str(path)  # a reload names a ledger
    await refresher.refresh()
    assert state.costs == {("a", "chat"): pytest.approx(0.002)}


async def test_header_and_explain_show_the_score(upstreams, proxy):
    from ..conftest import ok_handler

    a = await upstreams({"/v1/chat/completions": ok_handler("a")})
    b = await upstreams({"/v1/chat/completions": ok_handler("b")})
    targets = [{"provider": "a", "model": "m", "quality": 0.3}, {"provider": "b", "model": "m", "quality": 0.9}]
    p = await proxy(route_config(targets, {"a": openai_provider(a.url), "b": openai_provider(b.url)},
                                 strategy="score", score={"speed": 0, "cost": 0, "health": 0, "quality": 1}))
    status, headers, _ = await p.post("/v1/chat/completions", {"model": "chat", "messages": []})
    d = decision_of(headers)
    assert status == 200 and d.order == (("b", "score quality 0.90"), ("a", "0.30")) and d.served == "b"
    status, explained = await p.get("/v1/routes/chat/explain")
    assert explained["cost_basis"] == "declared"
    assert [(o["target"], o["signals"], o["score"]) for o in explained["order"]] == [
        ("b", {"speed": 0.5, "cost": 0.5, "health": 1.0, "quality": 0.9}, 0.9),
        ("a", {"speed": 0.5, "cost": 0.5, "health": 0.5, "quality": 0.3}, 0.3),
    ]

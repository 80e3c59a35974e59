"""The status page's last hour: minute buckets, failures, races, leaders, and its bounds."""

from __future__ import annotations

import pytest

from proxy.config import Config
from proxy.observe import Finished
from proxy.observe.history import BUCKETS, LAST, History
from proxy.routing.decision import Attempt, Decision, Racer, Ranked
from tests.conftest import make_config

T0 = 1_800_000_000.0  # a minute boundary (divisible by 60)


def config(*targets: str) -> Config:
    return make_config({"providers": {t: {"kind": "simulated"} for t in targets},
                        "routes": {"chat": {"targets": [{"provider": t, "model": "m"} for t in targets]}}})


def done(at: float, *attempts: Attempt, status: int = 200, served: str | None = "a", lead: str = "a",
         reason: str = "fastest", race: tuple[Racer, ...] = ()) -> Finished:
    d = Decision("x", "chat", "fastest", (Ranked(lead, reason, 0.1),), attempts=attempts, served=served,
                 status=status, race=race)
    return Finished(d, at, "-", "POST", "/v1/chat/completions", status, "chat", True, 0.1, 0.2, 10)


OK = Attempt("a", "200", 0.2, False, 0.2)


@pytest.mark.parametrize(("attempts", "answered", "ttft", "failures"), [
    pytest.param((OK,), 1, 0.2, 0, id="answered"),
    pytest.param((Attempt("a", "503", 0.1, True), OK), 1, 0.2, 1, id="failed-then-answered"),
    pytest.param((Attempt("a", "cooldown", 0.0, True),), 0, None, 0, id="a-skip-is-no-call"),
    pytest.param((Attempt("a", "400", 0.1, False),), 0, None, 0, id="a-client-error-is-not-the-targets"),
    pytest.param((Attempt("a", "lost", 0.3, False),), 0, None, 0, id="a-lost-racer-is-no-failure"),
])
def test_a_targets_minute(attempts: tuple[Attempt, ...], answered: int, ttft: float | None, failures: int) -> None:
    h = History(config("a"))
    h.on_finished(done(T0 + 5, *attempts))
    (minute,) = h.view(T0 + 30)["targets"]["a"]
    assert minute == {"t": int(T0), "answered": answered, "ttft_s": ttft, "failures": failures}


def test_minutes_are_kept_for_an_hour_and_no_longer() -> None:
    h = History(config("a"))
    for m in range(BUCKETS + 10):
        h.on_finished(done(T0 + 60 * m, OK))
    now = T0 + 60 * (BUCKETS + 9) + 1
    minutes = h.view(now)["targets"]["a"]
    assert len(minutes) == BUCKETS and minutes[0]["t"] == int(T0 + 60 * 10)
    assert all(len(series) <= BUCKETS for series in h.targets.values())
    assert h.view(now + 3600)["targets"]["a"] == []  # an idle hour later, nothing is shown


def test_race_share_duplicates_and_the_leader_since_when() -> None:
    h = History(config("a", "b"))
    h.on_finished(done(T0, OK, lead="a"))
    h.on_finished(done(T0 + 1, OK, lead="b", reason="explore"))  # an explored lead is not the leader
    h.on_finished(done(T0 + 2, OK, lead="b", race=(Racer("b", "leader"), Racer("a", "hedge 0.40s"))))
    h.on_finished(done(T0 + 3, OK, lead="b", race=(Racer("b", "leader"), Racer("a", "budget exhausted"))))
    route = h.view(T0 + 4)["routes"]["chat"]
    assert route["requests"] == 4
    assert route["raced_share"] == 0.25 and route["duplicate_share"] == 0.25
    assert route["leader"] == {"target": "b", "since": T0 + 2}


def test_the_last_decisions_newest_first_bounded_failed_marked() -> None:
    h = History(config("a"))
    for i in range(LAST + 5):
        h.on_finished(done(T0 + i, OK))
    h.on_finished(done(T0 + 100, Attempt("a", "503", 0.1, True), status=503, served=None))
    decisions = h.view(T0 + 101)["decisions"]
    assert len(decisions) == LAST
    assert decisions[0]["failed"] and decisions[0]["status"] == 503 and decisions[0]["at"] == T0 + 100
    assert not decisions[1]["failed"] and decisions[1]["at"] == T0 + LAST + 4
    assert decisions[0]["decision"].startswith("id=x; route=chat;")


def test_a_target_outside_the_config_is_not_kept_and_a_reload_drops_the_gone() -> None:
    h = History(config("a", "b"))
    h.on_finished(done(T0, Attempt("typed/model", "200", 0.1, False, 0.1), OK, Attempt("b", "200", 0.1, False, 0.1)))
    assert set(h.targets) == {"a", "b"}
    h.reconfigure(config("a", "c"))
    assert set(h.targets) == {"a", "c"}
    assert len(h.targets["a"]) == 1 and not h.targets["c"]  # a's hour survives the reload

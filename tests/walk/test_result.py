"""The walk's verdict: which of the four results a trail of attempts ends in."""

from __future__ import annotations

import pytest

from proxy.routing.decision import Attempt
from proxy.walk.classify import classify_status
from proxy.walk.result import Answered, Exhausted, Rejected, Trail
from proxy.walk.walker import UNTRANSLATABLE


def failed_503(trail: Trail) -> None:
    trail.failed(Attempt("a", "503", 0.1, True), classify_status(503, {}, False))


def rejected_400(trail: Trail) -> None:
    trail.ended(Attempt("a", "400", 0.1), classify_status(400, {}, False), 400, {}, b'{"error": {}}')


def untranslatable(trail: Trail) -> None:
    trail.ended(Attempt("a", "untranslatable", 0.0), UNTRANSLATABLE, 400, {}, b'{"error": {}}')


def skipped(trail: Trail) -> None:
    trail.skipped("b", "breaker open")


def answered(trail: Trail) -> None:
    trail.answered(Attempt("b", "200", 0.1, False, 0.1), 200, {}, b"{}")


@pytest.mark.parametrize(("steps", "kind", "status", "word"), [
    pytest.param([failed_503], Exhausted, 503, "503", id="a-failure-is-the-answer"),
    pytest.param([skipped], Exhausted, 503, None, id="only-skipped"),
    pytest.param([failed_503, skipped], Exhausted, 503, "503", id="a-skip-keeps-the-upstream-error"),
    pytest.param([rejected_400], Rejected, 400, "400", id="client-error-as-it-is"),
    pytest.param([untranslatable, skipped], Rejected, 400, "untranslatable", id="untranslatable-then-skip"),
    pytest.param([untranslatable, failed_503], Exhausted, 503, "503", id="a-later-failure-replaces"),
    pytest.param([failed_503, answered], Answered, 200, None, id="failover-then-answer"),
])
def test_a_trail_ends_in_one_verdict(steps, kind, status, word) -> None:
    trail = Trail()
    for step in steps:
        step(trail)
    result = trail.result(tuple(trail.attempts))
    assert type(result) is kind and result.status == status
    assert len(result.attempts) == len(steps)
    if isinstance(result, Answered):
        assert result.served == "b" and result.body == b"{}"
    else:
        assert result.served is None and result.word == word

"""The upstream headers a client may see: the allow-list, the rename, hop-by-hop, and the verdicts
remembered per header name (looked up once per name, bounded)."""

from __future__ import annotations

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from proxy import egress
from proxy.egress import forward_headers
from proxy.scrub import Scrubber

OURS = {"x-route-decision": "chat: a", "x-request-id": "ours"}


def upstream(*pairs: tuple[str, str]) -> CIMultiDictProxy[str]:
    return CIMultiDictProxy(CIMultiDict(pairs))


@pytest.mark.parametrize(
    ("pairs", "forwarded"),
    [
        pytest.param((("Content-Type", "text/event-stream"), ("Content-Length", "12"), ("Server", "x")),
                     {"Content-Type": "text/event-stream"}, id="listed-kept-the-rest-dropped"),
        pytest.param((("x-ratelimit-remaining-requests", "9"), ("Anthropic-RateLimit-Tokens-Limit", "5")),
                     {"x-ratelimit-remaining-requests": "9", "Anthropic-RateLimit-Tokens-Limit": "5"},
                     id="rate-limit-prefixes-however-spelt"),
        pytest.param((("X-Request-Id", "theirs"),), {"x-upstream-request-id": "theirs"},
                     id="their-request-id-renamed"),
        pytest.param((("Set-Cookie", "a=b"), ("X-Debug-Auth", "Bearer sk-1")), {}, id="anything-else-dropped"),
        pytest.param((("Connection", "close, Retry-After"), ("Retry-After", "3"), ("content-type", "a/b")),
                     {"content-type": "a/b"}, id="named-in-connection-dropped-though-listed"),
        pytest.param((("Connection", "keep-alive"), ("Retry-After", "3")), {"Retry-After": "3"},
                     id="a-plain-connection-drops-nothing-more"),
    ],
)
def test_forwarded_headers(pairs: tuple[tuple[str, str], ...], forwarded: dict[str, str]) -> None:
    for _ in range(2):  # the second time from the remembered verdicts: the same answer
        assert forward_headers(upstream(*pairs), OURS) == {**forwarded, **OURS}


def test_ours_win_over_an_upstreams_copy() -> None:
    got = forward_headers(upstream(("x-request-id", "theirs"), ("content-type", "a/b")), OURS)
    assert got["x-request-id"] == "ours" and got["x-upstream-request-id"] == "theirs"


def test_a_value_holding_a_secret_is_scrubbed() -> None:
    got = forward_headers(upstream(("retry-after", "sk-secret-0123456789")), {}, Scrubber(["sk-secret-0123456789"]))
    assert got == {"retry-after": "[redacted]"}


def test_the_remembered_verdicts_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """An upstream chooses its header names: past the bound a name is judged each time, not kept."""
    monkeypatch.setattr(egress, "VERDICTS", {})
    monkeypatch.setattr(egress, "VERDICTS_MAX", 3)
    names = [f"x-made-up-{i}" for i in range(10)] + ["retry-after"]
    got = forward_headers(upstream(*((n, "1") for n in names)), {})
    assert got == {"retry-after": "1"} and len(egress.VERDICTS) == 3


def test_a_long_header_name_is_judged_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """An upstream can send names of up to ~8 KB (the parser's line limit), a few per answer: kept,
    1,024 of them would hold ~8 MB of a worker for good. No header on the list is longer than a few
    dozen characters, so a long name is judged each time (same verdict) and never kept."""
    monkeypatch.setattr(egress, "VERDICTS", {})
    long_names = [f"x-{i}-" + "a" * 8000 for i in range(3)]
    listed = "x-ratelimit-" + "b" * 8000  # a listed prefix, however long: still forwarded
    got = forward_headers(upstream(*((n, "1") for n in long_names), (listed, "2"), ("retry-after", "3")), {})
    assert got == {listed: "2", "retry-after": "3"}
    assert list(egress.VERDICTS) == ["retry-after"]

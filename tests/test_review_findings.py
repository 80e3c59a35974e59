"""Review findings on the first-token commit and the race (issues 12, 13), over real loopback HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import time

from aiohttp import web

from .conftest import decision_of, openai_provider, route_config, status_handler
from .walk.test_race import CHAT, Timed, race_proxy, settle


async def test_a_hedge_that_rejects_the_request_does_not_beat_a_leader_that_answers(upstreams, proxy):
    """A hedge exists because the leader was slow; its client error (a 400 this target alone gives,
    e.g. a parameter its model does not take) must not cancel a leader that would have answered.
    Without hedging the client gets the leader's 200, so hedging made the request worse."""
    a = Timed(first=0.5, text="from-a")
    ups, p = await race_proxy(upstreams, proxy, {"a": a, "b": status_handler(400, "unsupported param")},
                              hedge={"after": 0.1})
    status, headers, body = await p.post("/v1/chat/completions", {**CHAT, "stream": True})
    d = decision_of(headers)
    assert status == 200 and d.served == "a" and b"from-a" in body, (status, headers.get("x-route-decision"))
    await settle(a, want=1)
    assert a.cut == 0


async def test_a_measuring_loser_is_not_retried_after_the_answer(upstreams, proxy):
    """An explored loser runs on only to be measured; once it fails, retrying it (with backoff, after
    the client already has its answer) buys no figure and is upstream calls nobody paid for."""
    calls = 0

    async def slow_503(request: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.1)
        return web.json_response({"error": {"message": "busy", "type": "server_error"}}, status=503)

    a = Timed(first=0.01, text="from-b")
    ua = await upstreams({"/v1/chat/completions": slow_503})
    ub = await upstreams({"/v1/chat/completions": a})
    p = await proxy(route_config([{"provider": "a", "model": "m", "retry": 2}, {"provider": "b", "model": "m"}],
                                 {"a": openai_provider(ua.url), "b": openai_provider(ub.url)}, "fastest",
                                 fastest={"explore": 0}, hedge={"after": 5, "max_extra": 1}))
    # Cold start: "a" (unmeasured, first) is measured by racing "b", which leads and answers at once.
    status, headers, _ = await p.post("/v1/chat/completions", {**CHAT, "stream": True})
    d = decision_of(headers)
    assert status == 200 and d.served == "b" and ("a", "measure") in d.race, headers["x-route-decision"]
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert calls >= 1
    assert calls == 1, f"the measuring loser was called {calls} times after the answer"
    assert sum(ts.in_flight for ts in p.gateway.state.targets.values()) == 0


async def test_a_client_that_leaves_as_a_racer_commits_leaks_no_slot(upstreams, proxy, monkeypatch):
    """The client's departure lands in the same turn of the loop as a racer's commit: the request
    task is cancelled before it can take the winner's lease to the relay. The lease (its upstream
    connection, the target's in_flight and its limiter slot) must be let go, not held until its
    600 s total deadline, which only aborts the read and never gives the slot back."""
    from proxy.walk import race as race_mod
    from proxy.walk.walker import Walker

    races: list[race_mod.Race] = []
    orig_init = race_mod.Race.__init__

    def init(self, *args, **kwargs):
        orig_init(self, *args, **kwargs)
        races.append(self)

    orig_try = Walker.try_target

    async def try_target(self, result, *args, **kwargs):
        over = await orig_try(self, result, *args, **kwargs)
        race = races[-1] if races else None
        if over and result.served and race is not None and asyncio.current_task() is not race.task:
            race.task.cancel()  # the client hangs up in this very turn
        return over

    monkeypatch.setattr(race_mod.Race, "__init__", init)
    monkeypatch.setattr(Walker, "try_target", try_target)
    a, b = Timed(first=1.0), Timed(first=0.05, text="from-b")
    ups, p = await race_proxy(upstreams, proxy, {"a": a, "b": b}, hedge={"after": 0.1})
    with contextlib.suppress(Exception):  # the server drops the request: the client is gone
        await p.post("/v1/chat/completions", {**CHAT, "stream": True})
    assert len(b.starts) == 1
    await settle(a, want=1)
    await asyncio.sleep(0.3)
    left = {key: ts.in_flight for key, ts in p.gateway.state.targets.items() if ts.in_flight}
    assert left == {}, f"in flight after the client left: {left}"


async def test_anthropic_error_after_an_empty_thinking_block_start_fails_over(upstreams, proxy):
    """With extended thinking every Anthropic stream opens a thinking block: message_start, then
    content_block_start of {"type": "thinking", "thinking": ""}. That start carries no token (ADR
    0007 lists only tool_use and non-empty text block starts as committing), so an overloaded_error
    after it must fail over like one after an empty text block's start."""
    from .anthropic_fakes import OVERLOADED, event, messages_handler, text_events
    from .test_commit import sdk_stream, two_targets

    start = text_events(["never"])[0]
    thinking = event("content_block_start", {"index": 0, "content_block": {"type": "thinking", "thinking": ""}})
    a, b, p = await two_targets(upstreams, proxy, messages_handler(events=[start, thinking, OVERLOADED]),
                                path="/v1/messages")
    raw, words = await sdk_stream(p)
    assert "".join(words) == "from-b0from-b1from-b2"
    assert decision_of(dict(raw.headers)).attempt_outcomes() == [("a", "error event overloaded_error"),
                                                                 ("b", "200")]


async def test_a_finish_reason_error_before_any_content_fails_over(upstreams, proxy):
    """OpenRouter ends a failed generation with finish_reason "error". Before any content that is
    no answer (an empty answer that *finishes* is one; an error is not): it must fail over, not be
    committed and relayed as an empty success that feeds the figure."""
    from .conftest import sse
    from .test_commit import ROLE, streamed, two_targets

    error_finish = sse({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "up",
                        "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "error"}]})
    a, b, p = await two_targets(upstreams, proxy, streamed(ROLE, error_finish, b"data: [DONE]\n\n"))
    status, headers, body = await p.post("/v1/chat/completions", {**CHAT, "stream": True})
    assert status == 200 and b"from-b0" in body, headers.get("x-route-decision")
    assert decision_of(headers).served == "b"


async def test_a_stale_target_the_budget_cannot_race_is_not_sent_clients_inline(upstreams, proxy):
    """Staleness exploring exists because, under a race, exploring costs the client nothing. When
    the budget refuses the race, the stale (slow) target must not lead the request alone: that is
    a gamble a route without `hedge` never takes (``explore: 0`` here), so turning hedging on made
    clients wait for the slow target every `refresh` seconds."""
    a, b = Timed(first=0.01, text="fast"), Timed(first=0.3, text="slow")
    ups, p = await race_proxy(upstreams, proxy, {"a": a, "b": b}, strategy="fastest",
                              fastest={"explore": 0}, hedge={"after": 5, "max_extra": 0.01, "refresh": 0.3})
    for _ in range(3):  # cold start: both measured (the bucket's first token pays the first race)
        await p.post("/v1/chat/completions", {**CHAT, "stream": True})
    await settle(a, b, want=2)
    slow = []
    t_end = time.monotonic() + 2.0
    while time.monotonic() < t_end:
        t0 = time.monotonic()
        status, headers, body = await p.post("/v1/chat/completions", {**CHAT, "stream": True})
        if time.monotonic() - t0 > 0.2:
            slow.append(headers["x-route-decision"])
        await asyncio.sleep(0.02)
    assert slow == [], f"{len(slow)} clients waited for the stale target: {slow[:2]}"

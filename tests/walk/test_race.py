"""The race for the first token, over real loopback HTTP (docs/adr/0008)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import aiohttp
import anthropic
import orjson
import pytest
from aiohttp import web

from proxy.config import Fastest, parse_config
from proxy.observe import Finished
from proxy.routing.decision import duplicate_calls

from ..anthropic_fakes import anthropic_provider, text_events
from ..conftest import (
    CHAT,
    Recorder,
    chat_body,
    chunk_event,
    decision_of,
    openai_provider,
    route_config,
    status_handler,
    until,
)


class Timed:
    """An upstream whose headers and first token come when told; it records each call's start and
    whether its connection was closed before it finished."""

    def __init__(self, first: float, headers_at: float = 0.0, text: str = "tok") -> None:
        self.first = first
        self.headers_at = headers_at
        self.text = text
        self.starts: list[float] = []
        self.cut = 0
        self.finished = 0

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        self.starts.append(time.monotonic())
        body = await request.json()
        try:
            if not body.get("stream"):
                await asyncio.sleep(self.first)
                response = web.json_response(chat_body(self.text))
                self.finished += 1
                return response
            response = web.StreamResponse(headers={"content-type": "text/event-stream"})
            await asyncio.sleep(self.headers_at)
            await response.prepare(request)
            await response.write(b": keep-alive\n\n")  # headers and bytes, but no token yet
            await asyncio.sleep(self.first - self.headers_at)
            await response.write(chunk_event(self.text) + chunk_event("", "stop") + b"data: [DONE]\n\n")
            await response.write_eof()
            self.finished += 1
            return response
        except (asyncio.CancelledError, ConnectionResetError):
            self.cut += 1  # firstbyte closed the connection: the racer was cancelled
            raise


async def race_proxy(upstreams, proxy, handlers: dict[str, Any], strategy: str = "ordered",
                     hedge: dict[str, Any] | None = None, observers: list[Any] | None = None, **route: Any):
    ups = {name: await upstreams({"/v1/chat/completions": h}) for name, h in handlers.items()}
    config = route_config([{"provider": n, "model": "m"} for n in handlers],
                          {n: openai_provider(u.url) for n, u in ups.items()}, strategy,
                          hedge={"after": 0.2, **(hedge or {})}, **route)
    return ups, await proxy(config, observers=observers)


async def settle(*handlers: Timed, want: int, secs: float = 3.0) -> None:
    """Wait (bounded) until the upstreams have seen ``want`` calls end one way or the other."""
    deadline = time.monotonic() + secs
    while sum(h.cut + h.finished for h in handlers) < want and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


async def test_a_hedge_starts_after_the_delay_and_the_first_token_wins(upstreams, proxy):
    a, b = Timed(first=1.0), Timed(first=0.05, text="from-b")
    ups, p = await race_proxy(upstreams, proxy, {"a": a, "b": b})
    t0 = time.monotonic()
    status, headers, body = await p.post("/v1/chat/completions", {**CHAT, "stream": True})
    took = time.monotonic() - t0
    assert status == 200 and b"from-b" in body and body.endswith(b"data: [DONE]\n\n")
    d = decision_of(headers)
    assert d.served == "b"
    assert [name for name, _ in d.race] == ["a", "b"]
    assert d.race[0] == ("a", "leader") and d.race[1][1].startswith("hedge 0.2")
    assert [outcome.split()[0] for _, outcome in d.attempt_outcomes()] == ["lost", "200"]
    # Not before `after`, counted from when the client sent (the race starts after that): counted from a's
    # arrival upstream it read 0.198 s on a loaded machine, a's connect being inside the 0.2 s, not before it.
    assert b.starts[0] - t0 >= 0.2
    assert took < 0.6  # the leader's own first token would have come at 1.0 s
    await settle(a, b, want=2)
    assert a.cut == 1  # the loser's upstream saw its connection closed
    assert p.gateway.state.health(("a", "m"), p.gateway.clock()).failures == 0  # and it is not blamed


async def test_the_winner_is_the_first_token_not_the_first_headers(upstreams, proxy):
    a = Timed(first=0.8, headers_at=0.0)  # headers and a keep-alive at once, its token late
    b = Timed(first=0.25, headers_at=0.2, text="from-b")
    ups, p = await race_proxy(upstreams, proxy, {"a": a, "b": b}, hedge={"after": 0.05})
    status, headers, body = await p.post("/v1/chat/completions", {**CHAT, "stream": True})
    assert decision_of(headers).served == "b" and b"from-b" in body


async def test_a_hedge_that_fails_lets_the_leader_win_and_a_failed_leader_lets_the_hedge_win(upstreams, proxy):
    a = Timed(first=0.4)
    ups, p = await race_proxy(upstreams, proxy, {"a": a, "b": status_handler(503), "c": Timed(first=2.0)})
    status, headers, body = await p.post("/v1/chat/completions", {**CHAT, "stream": True})
    d = decision_of(headers)
    assert status == 200 and d.served == "a"
    assert d.attempt_outcomes()[:2] == [("b", "503"), ("a", "200")] or d.attempt_outcomes()[:2] == [
        ("a", "200"), ("b", "503")]
    # The walk goes on after a failed leader: the hedge, already running, answers.
    async def late_503(request: web.Request) -> web.Response:
        await asyncio.sleep(0.3)
        return web.json_response({"error": {"message": "busy", "type": "server_error"}}, status=503)

    # b starts at 0.1 s and has its token at about 0.6 s, well after a's 503 at 0.3 s: with b's token
    # at 0.3 s too the two came within milliseconds and, under load, b could win outright first.
    ups2, p2 = await race_proxy(upstreams, proxy, {"a": late_503, "b": Timed(first=0.5, text="from-b")},
                                hedge={"after": 0.1})
    status, headers, body = await p2.post("/v1/chat/completions", {**CHAT, "stream": True})
    d = decision_of(headers)
    assert status == 200 and d.served == "b" and b"from-b" in body
    assert sorted(d.attempt_outcomes()) == [("a", "503"), ("b", "200")]


async def test_the_budget_stops_hedges_past_max_extra(upstreams, proxy):
    a, b = Timed(first=0.03), Timed(first=0.001)
    ups, p = await race_proxy(upstreams, proxy, {"a": a, "b": b}, hedge={"after": 0.005, "max_extra": 0.1})
    requests = 300
    queue = list(range(requests))
    hedges = refused = 0

    async def worker() -> None:
        nonlocal hedges, refused
        async with aiohttp.ClientSession() as session:
            while queue:
                queue.pop()
                async with session.post(p.url + "/v1/chat/completions", json=CHAT) as resp:
                    assert resp.status == 200
                    roles = [role for _, role in decision_of(dict(resp.headers)).race]
                    hedges += any(role.startswith("hedge") for role in roles)
                    refused += "budget exhausted" in roles

    await asyncio.gather(*(worker() for _ in range(8)))
    assert hedges <= 1 + requests * 0.1  # the bucket's start plus its share
    assert hedges >= requests * 0.1 - 5  # and the budget is spent, not hoarded
    assert refused == requests - hedges
    assert len(b.starts) == hedges  # every hedge is one duplicate upstream call, no more


async def test_an_explored_loser_is_measured_from_its_own_first_token(upstreams, proxy):
    a, b = Timed(first=0.02), Timed(first=0.3, text="slow")
    recorder = Recorder()
    # cap 100: b (0.3 s) is cut only past 2 s, so a loaded machine slows it without making it a lower bound
    ups, p = await race_proxy(upstreams, proxy, {"a": a, "b": b}, strategy="fastest",
                              fastest={"explore": 0}, hedge={"after": 5, "max_extra": 1, "cap": 100},
                              observers=[recorder])
    for _ in range(3):  # cold start: a and b race each other, both get measured; the third repays the advances
        await p.post("/v1/chat/completions", {**CHAT, "stream": True})
    await settle(a, b, want=4)
    fastest = p.gateway.config.routes["chat"].fastest
    key = ("b", "m")
    state = p.gateway.state
    await until(lambda: state.tracker.samples(key) >= 1 and not state.in_flight(key))  # b's cold measure is in
    samples = p.gateway.state.tracker.samples(key)
    route = p.gateway.config.routes["chat"]
    p.gateway.apply(parse_config({**_raw(p), "routes": {"chat": {**_raw_route(route), "fastest": {
        "explore": 1.0, "seed": 1}}}}, {}))  # now every request explores
    t0 = time.monotonic()
    status, headers, body = await p.post("/v1/chat/completions", {**CHAT, "stream": True})
    took = time.monotonic() - t0
    d = decision_of(headers)
    assert d.race == (("b", "explore"), ("a", "leader"))
    assert d.served == "a" and took < 0.25  # the client did not wait for the explored target
    assert ("b", "measuring") in d.attempt_outcomes()
    await settle(a, b, want=5)
    await until(lambda: not state.in_flight(key))  # the explored racer has ended
    assert p.gateway.state.tracker.samples(key) == samples + 1
    figure = p.gateway.state.tracker.recent(key, "streamed")[-1]
    assert 0.28 < figure < 0.6  # its own first token, not the winner's, not a guess
    assert b.finished >= 1 and p.gateway.state.health(key, p.gateway.clock()).failures == 0
    assert fastest.explore == 0
    # The observers' record waited for the explored loser: it says what became of it, the header could not.
    await until(lambda: any(f.decision is not None and f.decision.id == d.id for f in recorder.seen))
    logged = next(f.decision for f in recorder.seen if f.decision is not None and f.decision.id == d.id)
    outcomes = {(x.name, x.outcome): x.seconds for x in logged.attempts}
    assert ("b", "measuring") not in outcomes and 0.28 < outcomes[("b", "measured")] < 0.6
    assert logged.served == "a" and logged.failovers == 0 and logged.race == d.race


def _raw(p) -> dict[str, Any]:
    cfg = p.gateway.config
    return {"providers": {n: {"kind": "openai", "base_url": pr.base_url} for n, pr in cfg.providers.items()}}


def _raw_route(route) -> dict[str, Any]:
    return {"strategy": route.strategy, "targets": [{"provider": t.provider, "model": t.model} for t in route.targets],
            "hedge": {"after": route.hedge.after_secs, "max_extra": route.hedge.max_extra}}


async def test_a_client_that_leaves_cancels_every_racer(upstreams, proxy):
    a, b = Timed(first=3.0), Timed(first=3.0)
    ups, p = await race_proxy(upstreams, proxy, {"a": a, "b": b}, hedge={"after": 0.1})
    finished: list[Any] = []
    p.gateway.outbox.observers.append(_Collect(finished))
    async with aiohttp.ClientSession() as session:
        task = asyncio.create_task(session.post(p.url + "/v1/chat/completions", json={**CHAT, "stream": True}))
        deadline = time.monotonic() + 2
        while len(b.starts) < 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert len(a.starts) == len(b.starts) == 1  # both racing
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    await settle(a, b, want=2)
    assert (a.cut, b.cut) == (1, 1)
    assert sum(ts.in_flight for ts in p.gateway.state.targets.values()) == 0
    await until(lambda: bool(finished))
    # Logged as the client's leaving (nginx's 499), not as firstbyte's 500, with the plan it had.
    [left] = finished
    assert (left.status, left.error) == (499, "client_closed_request")
    assert left.decision is not None and left.decision.route == "chat" and left.decision.status == 499
    # ...and with the racers it had started, so the duplicate call is counted.
    assert [name for name, _ in left.decision.race] == ["a", "b"]
    assert left.decision.race[0].role == "leader" and left.decision.race[1].role.startswith("hedge 0.1")
    assert [(a.name, a.outcome) for a in left.decision.attempts] == [("a", "lost"), ("b", "lost")]
    assert duplicate_calls(left.decision.race) == 1


async def test_a_target_that_fails_every_measure_is_not_raced_for_free(upstreams, proxy):
    # broken answers 404 to everything (a wrong model name, say): it never gets a figure, so it
    # stays unmeasured. Its one free first measure must not become a free race on every request.
    calls = {"broken": 0}

    async def broken(request: web.Request) -> web.StreamResponse:
        calls["broken"] += 1
        return web.json_response({"error": {"message": "no such model", "type": "invalid_request_error",
                                            "param": None, "code": "model_not_found"}}, status=404)

    good = Timed(first=0.01, text="good")
    ups, p = await race_proxy(upstreams, proxy, {"broken": broken, "good": good}, strategy="fastest",
                              fastest={"explore": 0}, hedge={"after": 5, "max_extra": 0.1})
    requests, decisions = 40, []
    for _ in range(requests):
        status, headers, body = await p.post("/v1/chat/completions", {**CHAT, "stream": True})
        assert status == 200 and b"good" in body, body
        decisions.append(decision_of(headers))
    # One free measure, then only what the budget pays for: 1 + 40 x 0.1, less the hedge's reserve.
    assert 1 <= calls["broken"] <= 1 + requests * 0.1, calls
    assert {d.served for d in decisions} == {"good"}
    waited = [d for d in decisions if ("broken", "budget exhausted") in d.race]
    assert waited, [d.race for d in decisions]
    # A learner the budget refused waited behind the leader, and the order says so.
    assert all(d.order_names[0] == "good" for d in waited)


async def test_a_pinned_request_is_not_hedged(upstreams, proxy):
    a, b = Timed(first=0.4, text="from-a"), Timed(first=0.01, text="from-b")
    ups, p = await race_proxy(upstreams, proxy, {"a": a, "b": b}, hedge={"after": 0.05})
    status, headers, body = await p.post("/v1/chat/completions", {**CHAT, "stream": True},
                                         headers={"x-route-provider": "a"})
    d = decision_of(headers)
    assert status == 200 and b"from-a" in body and d.served == "a"
    assert d.race == () and b.starts == []  # the pin is the client's choice; b is its fallback on failure


async def test_a_buffered_call_and_a_messages_client_race_too(upstreams, proxy):
    a, b = Timed(first=1.0), Timed(first=0.05, text="from-b")
    ups, p = await race_proxy(upstreams, proxy, {"a": a, "b": b})
    status, headers, body = await p.post("/v1/chat/completions", CHAT)
    assert orjson.loads(body)["choices"][0]["message"]["content"] == "from-b"
    assert decision_of(headers).served == "b"

    async def slow_messages(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        events = text_events(["late"])
        await response.write(events[0])  # message_start: no token yet
        await asyncio.sleep(1.0)
        for piece in events[1:]:
            await response.write(piece)
        await response.write_eof()
        return response

    claude = await upstreams({"/v1/messages": slow_messages})
    quick = await upstreams({"/v1/chat/completions": Timed(first=0.05, text="quick")})
    config = route_config([{"provider": "claude", "model": "c"}, {"provider": "quick", "model": "q"}],
                          {"claude": anthropic_provider(claude.url), "quick": openai_provider(quick.url)},
                          hedge={"after": 0.2})
    p2 = await proxy(config)
    client = anthropic.AsyncAnthropic(base_url=p2.url, api_key="k", max_retries=0)
    try:
        raw = await client.messages.with_raw_response.create(
            model="chat", max_tokens=20, messages=[{"role": "user", "content": "hi"}])
    finally:
        await client.close()
    assert (await raw.parse()).content[0].text == "quick"
    assert decision_of(dict(raw.headers)).served == "quick"


async def test_a_reload_mid_race_loses_nothing(upstreams, proxy):
    a, b = Timed(first=1.0), Timed(first=0.4, text="from-b")
    ups, p = await race_proxy(upstreams, proxy, {"a": a, "b": b})
    finished: list[Any] = []
    p.gateway.outbox.observers.append(_Collect(finished))
    post = asyncio.create_task(p.post("/v1/chat/completions", {**CHAT, "stream": True}))
    await asyncio.sleep(0.3)  # the hedge is running
    p.gateway.apply(parse_config({**_raw(p), "routes": {"chat": {"strategy": "ordered", "targets": [
        {"provider": "b", "model": "m"}]}}}, {}))
    status, headers, body = await post
    assert status == 200 and b"from-b" in body and body.endswith(b"data: [DONE]\n\n")
    await asyncio.sleep(0.05)
    assert [f.decision.served for f in finished] == ["b"]


class _Collect:
    def __init__(self, into: list[Any]) -> None:
        self.into = into

    def on_finished(self, finished: Any) -> None:
        self.into.append(finished)

    async def close(self) -> None:
        pass


async def burst(url: str, n: int) -> list[Any]:
    """``n`` streamed requests that arrive together (each connection opened first); their decisions."""
    sessions = [aiohttp.ClientSession() for _ in range(n)]
    try:
        for session in sessions:
            async with session.get(url + "/v1/health") as resp:
                await resp.read()

        async def one(session: aiohttp.ClientSession) -> Any:
            async with session.post(url + "/v1/chat/completions", json={**CHAT, "stream": True}) as resp:
                await resp.read()
                return decision_of(dict(resp.headers))

        return list(await asyncio.gather(*(one(s) for s in sessions)))
    finally:
        for session in sessions:
            await session.close()


async def test_a_racer_counts_in_flight_from_its_start_so_a_cold_burst_spreads(upstreams, proxy):
    # Three requests at once on a cold route: the first races a (measured) and b; the next must see
    # them in flight before their racer tasks have run, so it goes to c, not to a again.
    a, b, c = Timed(first=0.3), Timed(first=0.3), Timed(first=0.3)
    ups, p = await race_proxy(upstreams, proxy, {"a": a, "b": b, "c": c}, strategy="fastest",
                              fastest={"explore": 0}, hedge={"after": 5})
    # No token to race with: only the free first measures race (a free measure spends none, so the
    # start's token would let the third request race too and start c a second time).
    p.gateway.state.budget("chat", 0.1).tokens = 0.0
    decisions = await burst(p.url, 3)
    firsts = sorted(d.order_names[0] for d in decisions)
    assert len(c.starts) == 1 and firsts.count("c") == 1  # c, unmeasured and idle, got the second request
    assert len(a.starts) <= 2
    await settle(a, b, c, want=len(a.starts) + len(b.starts) + len(c.starts))
    await asyncio.sleep(0.05)
    assert [p.gateway.state.target((n, "m")).in_flight for n in "abc"] == [0, 0, 0]  # nothing left counted


async def test_an_explored_loser_slower_than_its_cap_is_cut_at_the_cap(upstreams, proxy):
    from proxy.routing.hedge import CAP_FLOOR

    a, b = Timed(first=0.02), Timed(first=2.0, text="slow")
    recorder = Recorder()
    ups, p = await race_proxy(upstreams, proxy, {"a": a, "b": b}, strategy="fastest",
                              fastest={"explore": 0}, hedge={"after": 5, "max_extra": 1}, observers=[recorder])
    await p.post("/v1/chat/completions", {**CHAT, "stream": True})  # a measured beside b: a wins, b lost
    await settle(a, b, want=2)
    assert (b.cut, p.gateway.state.tracker.samples(("b", "m"))) == (1, 0)
    t0 = time.monotonic()
    status, headers, _ = await p.post("/v1/chat/completions", {**CHAT, "stream": True})
    d = decision_of(headers)
    assert status == 200 and d.served == "a" and d.race == (("b", "measure"), ("a", "leader"))
    assert ("b", "measuring") in d.attempt_outcomes()
    await settle(a, b, want=4)
    cut_at = time.monotonic() - t0
    assert b.cut == 2 and b.finished == 0  # its upstream saw the connection closed
    assert CAP_FLOOR <= cut_at < 1.5  # at the cap (4x a's first token is under the floor), not at its 2 s
    key = ("b", "m")
    assert p.gateway.state.health(key, p.gateway.clock()).failures == 0  # not blamed
    recent = p.gateway.state.tracker.recent(key, "streamed")
    assert len(recent) == 1 and CAP_FLOOR - 0.05 < recent[0] < 1.5  # a lower bound, not its first token
    assert sum(ts.in_flight for ts in p.gateway.state.targets.values()) == 0
    await until(lambda: any(f.decision is not None and f.decision.id == d.id for f in recorder.seen))
    logged = next(f.decision for f in recorder.seen if f.decision is not None and f.decision.id == d.id)
    assert [(x.name, x.outcome) for x in logged.attempts] == [("a", "200"), ("b", "capped")]


async def test_a_measuring_losers_late_client_error_keeps_its_word(upstreams, proxy, monkeypatch):
    from proxy.walk import race as race_mod

    races: list[race_mod.Race] = []
    orig_init = race_mod.Race.__init__

    def init(self, *args, **kwargs):
        orig_init(self, *args, **kwargs)
        races.append(self)

    monkeypatch.setattr(race_mod.Race, "__init__", init)

    async def late_400(request: web.Request) -> web.Response:
        await asyncio.sleep(0.2)
        return web.json_response({"error": {"message": "no such param", "type": "invalid_request_error"}},
                                 status=400)

    ups, p = await race_proxy(upstreams, proxy, {"a": late_400, "b": Timed(first=0.01)}, strategy="fastest",
                              fastest={"explore": 0}, hedge={"after": 5, "max_extra": 1})
    status, headers, _ = await p.post("/v1/chat/completions", {**CHAT, "stream": True})
    assert status == 200 and decision_of(headers).race == (("a", "measure"), ("b", "leader"))
    deadline = time.monotonic() + 2
    racer = races[0].racers[0]
    while (racer.task is None or not racer.task.done()) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert [x.outcome for x in racer.trail.attempts] == ["400"]  # what happened, not "measured"


async def test_a_request_is_refused_by_the_budget_at_most_once(upstreams, proxy):
    a, b, c = Timed(first=0.3), Timed(first=0.01), Timed(first=0.01)
    ups, p = await race_proxy(upstreams, proxy, {"a": a, "b": b, "c": c}, strategy="fastest",
                              fastest={"explore": 1.0, "seed": 1}, hedge={"after": 0.05, "max_extra": 0})
    now = p.gateway.clock()
    for name, secs in (("a", 0.01), ("b", 0.5), ("c", 0.5)):  # a leads by its figure, but is slow today
        p.gateway.state.tracker.record((name, "m"), secs, now)
    budget = p.gateway.state.budget("chat", 0)
    budget.tokens = 0.0  # nothing to race with: the explore is refused, then the hedge would be
    status, headers, _ = await p.post("/v1/chat/completions", {**CHAT, "stream": True})
    d = decision_of(headers)
    assert status == 200
    assert [role for _, role in d.race] == ["budget exhausted"], headers["x-route-decision"]
    assert budget.refused == 1


async def test_a_free_first_measure_leaves_the_budget_for_the_next_race(upstreams, proxy):
    # A cold route: the first request measures a beside b for free (nobody is measuring a), so the
    # bucket's one start token is still there for the next race of the cold burst.
    a, b, c = Timed(first=0.05), Timed(first=0.05), Timed(first=0.05)
    ups, p = await race_proxy(upstreams, proxy, {"a": a, "b": b, "c": c}, strategy="fastest",
                              fastest={"explore": 0}, hedge={"after": 5, "max_extra": 0})
    status, headers, _ = await p.post("/v1/chat/completions", {**CHAT, "stream": True})
    d = decision_of(headers)
    assert status == 200
    assert [role for _, role in d.race] == ["measure", "leader"], headers["x-route-decision"]
    assert p.gateway.state.budget("chat", 0).tokens == 1.0  # the start's token, unspent
    await settle(a, b, c, want=2)


async def test_an_idle_leader_whose_figure_a_burst_inflated_is_ranked_by_its_load_line(upstreams, proxy):
    # a answered in 0.02 s idle and 0.10 s with four others in flight (figure about 0.06 s); b takes
    # 0.05 s at any load. Idle now, a is worth 0.02 s: it leads, and /v1/health shows the correction.
    a, b = Timed(first=0.02, text="from-a"), Timed(first=0.05, text="from-b")
    ups, p = await race_proxy(upstreams, proxy, {"a": a, "b": b}, strategy="fastest",
                              fastest={"explore": 0}, hedge={"after": 5})
    now = p.gateway.clock()
    for load, secs_a, secs_b in ((0, 0.02, 0.05), (4, 0.10, 0.05)) * 20:
        p.gateway.state.tracker.record(("a", "m"), secs_a, now, load=load)
        p.gateway.state.tracker.record(("b", "m"), secs_b, now, load=load)
    status, health = await p.get("/v1/health")
    fits = {t["target"]: t["load_fit_s"] for t in health["targets"]}
    assert fits["a"] == pytest.approx(-0.04, abs=0.005) and fits["b"] == 0.0
    status, headers, body = await p.post("/v1/chat/completions", {**CHAT, "stream": True})
    d = decision_of(headers)
    assert status == 200 and d.served == "a" and d.order_names[0] == "a", headers["x-route-decision"]
    assert b"from-a" in body


def _late(status: int, secs: float) -> Any:
    async def handle(request: web.Request) -> web.Response:
        await asyncio.sleep(secs)
        return web.json_response({"error": {"message": "busy", "type": "server_error"}}, status=status)

    return handle


async def test_failovers_count_the_targets_moved_past_in_the_order_they_started(upstreams, proxy):
    # a leads and fails at 0.4 s; the hedge b starts at 0.1 s and fails at 0.3 s; c then leads inline
    # and serves. Both a and b were moved past: two failovers, attempts in the order they started.
    ups, p = await race_proxy(upstreams, proxy, {"a": _late(503, 0.4), "b": _late(503, 0.2),
                                                 "c": Timed(first=0.01, text="from-c")}, hedge={"after": 0.1})
    finished: list[Any] = []
    p.gateway.outbox.observers.append(_Collect(finished))
    status, headers, body = await p.post("/v1/chat/completions", {**CHAT, "stream": True})
    d = decision_of(headers)
    assert status == 200 and d.served == "c" and b"from-c" in body
    assert [name for name, _ in d.attempt_outcomes()] == ["a", "b", "c"]
    await until(lambda: bool(finished))
    assert finished[0].decision.failovers == 2

    # A hedge that fails while the leader it raced serves was not moved past: no failover.
    ups, p2 = await race_proxy(upstreams, proxy, {"a": Timed(first=0.4, text="from-a"), "b": _late(503, 0.05)},
                               hedge={"after": 0.1})
    p2.gateway.outbox.observers.append(_Collect(finished))
    status, headers, body = await p2.post("/v1/chat/completions", {**CHAT, "stream": True})
    assert status == 200 and decision_of(headers).served == "a"
    await until(lambda: len(finished) == 2)
    assert finished[1].decision.failovers == 0


async def test_a_cold_bursts_measure_races_on_a_token_it_has(upstreams, proxy):
    # Three cold targets, three requests at once: a and c are measured for free; the third finds
    # every target in flight and races on the bucket's token (cold starts are when racing pays most).
    a, b, c = Timed(first=0.3), Timed(first=0.3), Timed(first=0.3)
    ups, p = await race_proxy(upstreams, proxy, {"a": a, "b": b, "c": c}, strategy="fastest",
                              fastest={"explore": 0}, hedge={"after": 5, "max_extra": 0.1})
    budget = p.gateway.state.budget("chat", 0.1)
    assert budget.tokens == 1.0  # the start's token
    decisions = await burst(p.url, 3)
    roles = sorted(role for d in decisions for _, role in d.race)
    assert "budget exhausted" not in roles, [d.race for d in decisions]
    assert roles.count("measure") == 3 and budget.refused == 0
    await settle(a, b, c, want=len(a.starts) + len(b.starts) + len(c.starts))


class _Stalls:
    """A leader whose every third call stalls for a second before its first token."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        self.calls += 1
        stall = self.calls % 3 == 0
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await asyncio.sleep(1.0 if stall else 0.005)
        await response.write(chunk_event("lead") + chunk_event("", "stop") + b"data: [DONE]\n\n")
        await response.write_eof()
        return response


async def test_exploring_on_every_request_leaves_the_hedges_their_tokens(upstreams, proxy):
    # Every request wants to explore b (explore 1.0 of two targets); a, the leader by its figure,
    # stalls on every third call. The explores take tokens only above the hedge's reserve, so the
    # stalls find one: no client waits out a stall.
    a, b = _Stalls(), Timed(first=0.05, text="from-b")
    ups, p = await race_proxy(upstreams, proxy, {"a": a, "b": b}, strategy="fastest",
                              fastest={"explore": 1.0, "seed": 3}, hedge={"after": 0.1, "max_extra": 0.4,
                                                                           "refresh": 1000})
    now = p.gateway.clock()
    for _ in range(5):
        p.gateway.state.tracker.record(("a", "m"), 0.005, now)
        p.gateway.state.tracker.record(("b", "m"), 0.05, now)
    slow, hedged = 0, 0
    for _ in range(30):
        t0 = time.monotonic()
        status, headers, _ = await p.post("/v1/chat/completions", {**CHAT, "stream": True})
        assert status == 200
        slow += time.monotonic() - t0 > 0.8
        hedged += any(role.startswith("hedge") for _, role in decision_of(headers).race)
    assert hedged >= 3 and slow == 0, (hedged, slow)


async def test_explain_shows_the_routes_hedge_and_its_budget(upstreams, proxy, capsys):
    from proxy.cli import main

    ups, p = await race_proxy(upstreams, proxy, {"a": Timed(first=0.01), "b": Timed(first=0.01)},
                              hedge={"after": "p90", "max_extra": 0.2})
    status, explained = await p.get("/v1/routes/chat/explain")
    assert status == 200
    assert explained["hedge"] == {"after": "p90", "delay_s": None, "leader": "a", "learner": None, "pays": None,
                                  "refused": None, "max_extra": 0.2,
                                  "budget_tokens": 1.0, "budget_refused": 0, "explore": True,
                                  "refresh_s": 0.3, "cap": 4.0}  # a pNN needs the leader's samples first
    now = p.gateway.clock()
    for secs in (0.1, 0.2, 0.3, 0.4, 0.5):
        p.gateway.state.tracker.record(("a", "m"), secs, now)
    status, explained = await p.get("/v1/routes/chat/explain")
    assert explained["hedge"]["delay_s"] == 0.5  # p90 of the leader's five samples
    assert await asyncio.to_thread(main, ["explain", "chat", "--url", p.url]) == 0
    # (a route without hedge prints no such line: tests/test_policy.py pins that table to the letter)
    assert capsys.readouterr().out.splitlines()[-1] == (
        "hedge after p90 (now 0.500s on a); budget 1.00 tokens, 0 refused, max_extra 0.2; "
        "explore on, refresh 0.3s, cap 4x")


async def test_explain_names_the_leader_behind_a_learner(upstreams, proxy, capsys):
    from proxy.cli import main

    ups, p = await race_proxy(upstreams, proxy, {"a": Timed(first=0.01), "b": Timed(first=0.01)},
                              strategy="fastest", fastest={"explore": 0}, hedge={"after": "p90", "max_extra": 0.2})
    now = p.gateway.clock()
    for secs in (0.1, 0.2, 0.3, 0.4, 0.5):
        p.gateway.state.tracker.record(("b", "m"), secs, now)
    _, explained = await p.get("/v1/routes/chat/explain")
    assert (explained["hedge"]["leader"], explained["hedge"]["learner"], explained["hedge"]["delay_s"]) == (
        "b", "a", None)  # a, unmeasured, races b from the start: no timer is armed then
    assert (explained["hedge"]["pays"], explained["hedge"]["refused"]) == ("free", None)  # its first measure
    assert await asyncio.to_thread(main, ["explain", "chat", "--url", p.url]) == 0
    assert "(a is to be measured beside b, free the first time, else on the budget: no timed hedge then)" \
        in capsys.readouterr().out
    _, headers, _ = await p.post("/v1/chat/completions", {**CHAT, "stream": True})
    assert decision_of(headers).race == (("a", "measure"), ("b", "leader"))


async def test_a_measure_that_fails_while_the_leader_serves_is_no_failover(upstreams, proxy):
    ups, p = await race_proxy(upstreams, proxy, {"a": status_handler(503), "b": Timed(first=0.15, text="from-b")},
                              strategy="fastest", fastest={"explore": 0}, hedge={"after": 5, "max_extra": 1})
    now = p.gateway.clock()
    for _ in range(3):
        p.gateway.state.tracker.record(("b", "m"), 0.15, now)
    finished: list[Any] = []
    p.gateway.outbox.observers.append(_Collect(finished))
    status, headers, _ = await p.post("/v1/chat/completions", {**CHAT, "stream": True})
    assert status == 200 and decision_of(headers).served == "b", headers["x-route-decision"]
    await until(lambda: bool(finished))
    assert finished[0].decision.failovers == 0, finished[0].decision.attempts


async def test_a_failing_pin_fails_over_unraced_and_still_earns_the_budget(upstreams, proxy):
    ups, p = await race_proxy(upstreams, proxy, {"a": status_handler(503), "b": Timed(first=0.01, text="from-b")},
                              hedge={"after": 0.05, "max_extra": 0.5})
    finished: list[Any] = []
    p.gateway.outbox.observers.append(_Collect(finished))
    status, headers, body = await p.post("/v1/chat/completions", {**CHAT, "stream": True},
                                         headers={"x-route-provider": "a"})
    d = decision_of(headers)
    assert status == 200 and d.served == "b" and b"from-b" in body and d.race == ()
    await until(lambda: bool(finished))
    assert finished[0].decision.failovers == 1
    budget = p.gateway.state.budget("chat", 0.5)
    assert (budget.tokens, budget.owed) == (1.0, 0.5)  # the start's token; this request's share repays half of it


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


class Closing:
    """An observer that notes what it is handed after it was closed (a closed access log or ledger)."""

    def __init__(self) -> None:
        self.seen: list[Finished] = []
        self.after_close: list[Finished] = []
        self.closed = False

    def on_finished(self, finished: Finished) -> None:
        (self.after_close if self.closed else self.seen).append(finished)

    async def close(self) -> None:
        self.closed = True


async def _explore_once(upstreams, proxy, b_first: float, observer: Any):
    """A fastest route whose next request explores b (slow now) beside a: a answers, b runs on."""
    a, b = Timed(first=0.02), Timed(first=0.3, text="slow")
    ups, p = await race_proxy(upstreams, proxy, {"a": a, "b": b}, strategy="fastest",
                              fastest={"explore": 0}, hedge={"after": 5, "max_extra": 1, "cap": 100},
                              observers=[observer])
    for _ in range(3):  # a cold start (a and b race), then one request more repays its advances (the budget)
        await p.post("/v1/chat/completions", {**CHAT, "stream": True})
    await settle(a, b, want=4)
    state = p.gateway.state
    await until(lambda: state.tracker.samples(("b", "m")) >= 1 and not state.in_flight(("b", "m")))
    route = p.gateway.config.routes["chat"]
    p.gateway.apply(parse_config({**_raw(p), "routes": {"chat": {**_raw_route(route), "fastest": {
        "explore": 1.0, "seed": 1}}}}, {}))
    b.first = b_first
    status, headers, body = await p.post("/v1/chat/completions", {**CHAT, "stream": True})
    d = decision_of(headers)
    assert d.served == "a" and ("b", "measuring") in d.attempt_outcomes()
    return a, b, p, d


async def test_shutdown_with_a_measuring_loser_keeps_its_record(upstreams, proxy):
    """9cc68bc: the record waits for the explored loser; the gateway's close cancels that loser
    (Background.close). The record must reach the observers before their owner closes them, and
    must still name b (a cancelled racer appends no attempt, and _merged(lost) leaves it out)."""
    observer = Closing()
    a, b, p, d = await _explore_once(upstreams, proxy, 8.0, observer)
    await asyncio.sleep(0.1)
    assert not any(f.decision is not None and f.decision.id == d.id for f in observer.seen)  # still waiting
    gw = p.gateway
    await gw.close()  # what serve() does after the drain...
    await observer.close()  # ...then Hub.close()
    await asyncio.sleep(0.2)
    mine = [f for f in observer.seen + observer.after_close if f.decision is not None and f.decision.id == d.id]
    assert len(mine) == 1, "the record was lost"
    assert not observer.after_close, "the record reached an observer after it was closed"
    names = [x.name for x in mine[0].decision.attempts]
    assert "b" in names, f"the explored racer vanished from the record: {mine[0].decision.attempts}"


# -- a lost race is evidence (docs/adr/0022) ---------------------------------------------------


class Shifting(Timed):
    """A streamed upstream whose first token comes after ``delay(n)`` for its nth call."""

    def __init__(self, delay: Any, text: str) -> None:
        Timed.__init__(self, first=0.0, text=text)
        self.delay = delay

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        self.first = self.delay(len(self.starts))
        return await Timed.__call__(self, request)


async def _leads(p: Any, n: int) -> list[Any]:
    """``n`` requests one after another (each a race the leader may lose): their decisions."""
    out = []
    for _ in range(n):
        status, headers, _ = await p.post("/v1/chat/completions", {**CHAT, "stream": True})
        assert status == 200
        out.append(decision_of(headers))
    return out


async def _pool(upstreams: Any, proxy: Any, a: Timed, b: Timed) -> Any:
    """a leads at 40 ms, b (100 ms) is slower on paper; a p90 hedge, as routes.yaml ships it, with
    a budget that pays for a hedge on each of these sequential requests; no random explore."""
    ups, p = await race_proxy(upstreams, proxy, {"a": a, "b": b}, strategy="fastest",
                              fastest={"explore": 0}, hedge={"after": "p90", "max_extra": 0.5, "refresh": 30})
    for _ in range(12):  # a and b measured, then a leads on its own samples
        await p.post("/v1/chat/completions", {**CHAT, "stream": True})
    await settle(a, b, want=len(a.starts) + len(b.starts))
    assert p.gateway.state.figure(("a", "m"), Fastest(), p.gateway.clock()) < 0.08
    return p


async def test_a_degrading_leader_is_demoted_within_two_lost_races(upstreams, proxy):
    degraded = {"at": None}
    a = Shifting(lambda n: 0.25 if degraded["at"] is not None else 0.04, "from-a")
    b = Timed(first=0.1, text="from-b")
    p = await _pool(upstreams, proxy, a, b)
    degraded["at"] = len(a.starts)  # 40 -> 250 ms
    decisions = await _leads(p, 6)
    # lost races a led: once demoted, a may still race behind b (a hedge or a look) and lose, which is
    # no longer a leader's lost race (a loaded machine makes b slow enough for a p90 hedge)
    lost = [d for d in decisions if d.order_names[0] == "a"
            and ("a", "lost") in [(n, o.split()[0]) for n, o in d.attempt_outcomes()]]
    assert 1 <= len(lost) <= 2, [d.order for d in decisions]
    assert decisions[:len(lost)] == lost, [d.order for d in decisions]  # the first ones, in a row
    after = decisions[len(lost):]
    assert [d.order_names[0] for d in after] == ["b"] * len(after)  # demoted, and it stays so
    assert all(d.served == "b" for d in decisions)  # the hedge answered each lost race
    assert p.gateway.state.figure(("a", "m"), Fastest(), p.gateway.clock()) > \
        p.gateway.state.figure(("b", "m"), Fastest(), p.gateway.clock())


async def test_a_leader_that_stalls_on_one_call_in_ten_keeps_its_place(upstreams, proxy):
    a = Shifting(lambda n: 1.5 if n % 10 == 9 else 0.04, "from-a")
    b = Timed(first=0.1, text="from-b")
    p = await _pool(upstreams, proxy, a, b)
    decisions = await _leads(p, 30)
    stalled = [d for d in decisions if d.served == "b"]
    assert len(stalled) >= 2  # it stalled, and the hedge won those races
    assert all(("a", "lost") in [(n, o.split()[0]) for n, o in d.attempt_outcomes()] for d in stalled)
    # it led every one (a look at b, docs/adr/0023, races b beside it: a leads behind the explore)
    leaders = [d.order_names[1] if d.order[0][1].startswith("explore") else d.order_names[0] for d in decisions]
    assert leaders == ["a"] * len(decisions)


async def _spent(upstreams: Any, proxy: Any, a: Timed, b: Timed, strategy: str = "fastest") -> Any:
    """The pool of ``_pool`` with a budget that pays for no hedge: ``max_extra`` too small to earn a
    token in the test, and the start token spent, as a busy route's looks leave its bucket; a route
    past its cold start (its advances repaid long ago: a cold start's refusals tell no bound)."""
    ups, p = await race_proxy(upstreams, proxy, {"a": a, "b": b}, strategy=strategy,
                              fastest={"explore": 0}, hedge={"after": "p90", "max_extra": 0.001, "refresh": 30})
    for _ in range(12):
        await p.post("/v1/chat/completions", {**CHAT, "stream": True})
    await settle(a, b, want=len(a.starts) + len(b.starts))
    state = p.gateway.state
    assert state.figure(("a", "m"), Fastest(), p.gateway.clock()) < 0.08
    budget = state.budgets["chat"]
    budget.tokens, budget.owed, budget.earned = min(budget.tokens, 0.0), 0.0, True
    return p


async def test_a_degrading_leader_whose_hedges_the_budget_refuses_is_demoted_by_its_overdue_calls(upstreams, proxy):
    """docs/adr/0023, "An overdue leader": two calls of the leader in a row past its p90 with the hedge refused
    are two lower bounds, as two lost races are: a is demoted while its calls still run, so the next
    request leads with b. Before, a's own 250 ms answers reached its EWMA (alpha 0.1) a tenth at a
    time: after two of them a's figure read 80 ms, still ahead of b's 100 ms."""
    degraded = {"at": None}
    a = Shifting(lambda n: 0.25 if degraded["at"] is not None else 0.04, "from-a")
    b = Timed(first=0.1, text="from-b")
    p = await _spent(upstreams, proxy, a, b)
    degraded["at"] = len(a.starts)  # 40 -> 250 ms
    both = await asyncio.gather(*(p.post("/v1/chat/completions", {**CHAT, "stream": True}) for _ in range(2)))
    assert [decision_of(h).order_names[0] for _, h, _ in both] == ["a", "a"]
    after = await _leads(p, 3)
    assert [d.order_names[0] for d in after] == ["b"] * 3, [d.order for d in after]


async def test_requests_waiting_on_a_leader_just_demoted_race_at_once_on_borrowed_tokens(upstreams, proxy):
    """docs/adr/0023, "An overdue leader": the second overdue call demotes a; both calls still waiting on it
    (their hedges refused) then start b, on tokens the route borrows and its next deposits repay.
    Each is served by b at about a's p90 + 100 ms, not by a at 250 ms. Before, both waited for a."""
    degraded = {"at": None}
    a = Shifting(lambda n: 0.25 if degraded["at"] is not None else 0.04, "from-a")
    b = Timed(first=0.1, text="from-b")
    p = await _spent(upstreams, proxy, a, b)
    budget = p.gateway.state.budgets["chat"]
    owed = budget.owed
    degraded["at"] = len(a.starts)
    both = [decision_of(h) for _, h, _ in await asyncio.gather(
        *(p.post("/v1/chat/completions", {**CHAT, "stream": True}) for _ in range(2)))]
    assert [d.served for d in both] == ["b", "b"], [d.race for d in both]
    assert all([n for n, role in d.race if role.startswith("hedge")] == ["b"] for d in both), [d.race for d in both]
    assert budget.owed == pytest.approx(owed + 2)  # two borrowed (the two requests deposited before, owing nothing)
    assert not budget.waiting.get((("a", "m"), "streamed"))  # nobody is left waiting on a
    # One call, one bound: each told its overdue bound, and losing to its re-race later tells no second
    # (a stalled call re-raced a second later would otherwise restart a's figure at a second).
    assert p.gateway.state.tracker.held(("a", "m")) == 2


async def test_an_ordered_route_tells_no_overdue_bound_and_borrows_nothing(upstreams, proxy):
    """The rule is ``fastest``'s: an ordered route's order is not its figures, so a bound would move
    nobody and a re-race would only spend past ``max_extra`` (test_the_budget_stops_hedges_past_max_extra
    counts each request as hedged or refused, never both). Before, a loaded machine's late hedge timers
    made it re-race there too."""
    degraded = {"at": None}
    a = Shifting(lambda n: 0.25 if degraded["at"] is not None else 0.04, "from-a")
    b = Timed(first=0.1, text="from-b")
    p = await _spent(upstreams, proxy, a, b, strategy="ordered")
    for _ in range(3):  # b measured too (pinned), so a bound could be held behind its figure
        await p.post("/v1/chat/completions", {**CHAT, "stream": True}, {"x-route-provider": "b"})
    assert p.gateway.state.figure(("b", "m"), Fastest(), p.gateway.clock()) is not None
    owed = p.gateway.state.budgets["chat"].owed
    degraded["at"] = len(a.starts)
    both = [decision_of(h) for _, h, _ in await asyncio.gather(
        *(p.post("/v1/chat/completions", {**CHAT, "stream": True}) for _ in range(2)))]
    assert [d.served for d in both] == ["a", "a"], [d.race for d in both]
    assert [d.race for d in both] == [(("b", "budget exhausted"),)] * 2
    assert p.gateway.state.tracker.held(("a", "m")) == 0
    assert p.gateway.state.budgets["chat"].owed <= owed


async def test_a_leader_stalling_on_one_call_in_ten_with_its_hedges_refused_keeps_its_place(upstreams, proxy):
    """The same rule, the stall scenario: each stalled call is overdue (a bound held, the hedge
    refused), the next call answers in 40 ms and clears it. a leads every request."""
    a = Shifting(lambda n: 0.4 if n % 10 == 9 else 0.04, "from-a")
    b = Timed(first=0.1, text="from-b")
    p = await _spent(upstreams, proxy, a, b)
    decisions = await _leads(p, 25)
    assert sum(d.served == "a" for d in decisions) == 25
    assert [d.order_names[0] for d in decisions] == ["a"] * 25, [d.order for d in decisions]


def test_a_demoted_leader_goes_behind_the_winner_as_the_order_ranks_it_not_its_stale_average() -> None:
    from proxy.config import Target
    from proxy.state import State
    from proxy.walk.evidence import lower_bound

    state, policy = State(), Fastest()
    a, b = Target("a", "a", "m"), Target("b", "b", "m")
    for i in range(10):
        state.first_token(state.target(a.key), 0.04, float(i), "streamed", 0)
        state.first_token(state.target(b.key), 0.4, float(i), "streamed", 0)
    state.first_token(state.target(b.key), 0.02, 10.0, "streamed", 0)  # b recovered: its EWMA still says 0.36 s
    lower_bound(state, policy, True, a, 10.0, 10.1, b)
    lower_bound(state, policy, True, a, 11.0, 11.1, b)
    assert state.figure(a.key, policy, 11.1) == pytest.approx(0.1008, abs=1e-3)  # behind b's 96 ms, not 0.38 s


# -- exploring where it can pay (docs/adr/0023) -----------------------------------------------


SHIPPED = {"after": "p90", "max_extra": 0.1, "explore": True, "refresh": 30}  # routes.yaml's hedge


@pytest.mark.parametrize(
    ("others", "within"),
    [
        pytest.param({}, 22, id="beside-the-leader-alone"),
        pytest.param({"b": 0.08}, 32, id="beside-a-runner-up-too"),
    ],
)
async def test_a_target_twenty_times_slower_that_recovers_leads_within_about_ten_requests(
        upstreams, proxy, others: dict[str, float], within: int):
    """a leads at 40 ms, c answers in 800 ms (20x; a look at it is cut at its 0.5 s cap); then c
    drops to 10 ms. A look at a target behind the leader costs a token and a token takes the route
    ten requests to earn: c is looked at within ten requests (twenty with b to look at too), and
    two fast samples in a row make it lead (typically 3-12 requests alone, 3-22 beside b); the bound
    allows one hedge's token more on a busy machine. The shipped hedge: no refresh by the clock
    within the test, no random explore. On the code before docs/adr/0023, c never leads."""
    recovered = {"yes": False}
    a = Timed(first=0.04, text="from-a")
    c = Shifting(lambda n: 0.01 if recovered["yes"] else 0.8, "from-c")
    handlers = {"a": a, **{n: Timed(first=s, text=f"from-{n}") for n, s in others.items()}, "c": c}
    _, p = await race_proxy(upstreams, proxy, handlers, strategy="fastest", fastest={"explore": 0}, hedge=SHIPPED)
    warm = await _leads(p, 40)
    await settle(*handlers.values(), want=sum(len(h.starts) for h in handlers.values()))
    assert [d.order[0] for d in warm[-10:] if d.order[0][1].startswith("fastest")], warm[-10:]
    assert all(d.order_names[0] == "a" for d in warm[-10:] if d.order[0][1].startswith("fastest"))
    recovered["yes"] = True
    after = await _leads(p, within + 8)
    ranked = [(n, why.split()[0]) for n, why in (d.order[0] for d in after)]
    leads = [i for i, first in enumerate(ranked) if first == ("c", "fastest")]
    assert leads and leads[0] < within, [(d.order, d.race) for d in after]
    # and mostly keeps it: its figure still carries the old 800 ms for some twenty samples, so on a busy
    # machine one slow sample can hand the lead back to a until c's next look (docs/adr/0023)
    assert len(leads) >= (len(after) - leads[0]) / 2, [(d.order, d.race) for d in after]
    run = warm + after  # within the budget: its start token, a tenth of each request, one free measure each
    assert sum(duplicate_calls(d.race) for d in run) <= 1 + 0.1 * len(run) + len(handlers)


async def test_a_recovery_is_looked_at_while_an_older_look_at_it_is_still_in_flight(upstreams, proxy):
    """a leads at 20 ms; c takes 1.5 s, and a look at it runs that long (cap 100: not cut). c recovers
    (to 2 ms) just after a look at it began: that look tells the old time, so only a new one finds
    the recovery. A look counts from its start (docs/adr/0023, amendment), so the next is due ten or
    so requests on, not when the old one ends some 75 requests later: c leads within 25. Before, a
    target in flight was never looked at again, and c did not lead in the 33 requests after."""
    recovered = {"yes": False}
    a = Timed(first=0.02, text="from-a")
    c = Shifting(lambda n: 0.002 if recovered["yes"] else 1.5, "from-c")
    _, p = await race_proxy(upstreams, proxy, {"a": a, "c": c}, strategy="fastest", fastest={"explore": 0},
                            hedge={"after": 5, "max_extra": 0.1, "explore": True, "refresh": 30, "cap": 100})
    state, key = p.gateway.state, ("c", "m")
    await _leads(p, 3)
    await until(lambda: state.tracker.samples(key) >= 1)  # c's cold measure is in
    for _ in range(60):  # until a look at c begins
        if state.in_flight(key):
            break
        await _leads(p, 1)
    assert state.in_flight(key), "no look at c began in 60 requests"
    recovered["yes"] = True
    after = await _leads(p, 33)
    leads = [i for i, d in enumerate(after) if d.order[0] == ("c", "fastest 0.00s")
             or (d.order_names[0] == "c" and d.order[0][1].startswith("fastest"))]
    assert leads and leads[0] < 25, [(d.order, d.race) for d in after]


async def test_a_hedge_that_wins_is_told_before_the_leader_it_cut_tells_its_bound(upstreams, proxy):
    """A stream's first token reaches the state after the client's first write (``Lease.committed``),
    except a racer's win: the leader it cuts tells its bound behind the winner's figure, so the
    winner's sample is told first, at its commit, as before."""
    degraded = {"at": None}
    a = Shifting(lambda n: 0.25 if degraded["at"] is not None else 0.04, "from-a")
    b = Timed(first=0.1, text="from-b")
    p = await _pool(upstreams, proxy, a, b)
    degraded["at"] = len(a.starts)
    heard: list[tuple[Any, ...]] = []
    p.gateway.state.listener = heard.append  # the one door's events, as the fleet link hears them
    [decision] = await _leads(p, 1)
    assert decision.served == "b" and decision.order_names[0] == "a"
    told = [(event[0], event[1][0]) for event in heard if event[0] in ("s", "c")]
    assert told.index(("s", "b")) < told.index(("c", "a")), told

"""The routing policy end to end: real firstbyte, real loopback upstreams, a hand-moved clock.

Breakers, Retry-After, the health rescue, pins, the concurrency limit, weighted
shares and explain, each checked through the ``x-route-decision`` header and
``/v1/health`` rather than by peeking at internals. No test sleeps to wait for a
cooldown: the injected Clock is advanced instead.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from proxy.cli import main

from .conftest import Clock, Proxy, decision_of, make_config, ok_handler, openai_provider, route_config, status_handler

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
PATH = "/v1/chat/completions"


async def pool(upstreams, proxy, handlers: dict[str, Any], clock: Clock | None = None,
               providers: dict[str, dict[str, Any]] | None = None, strategy: str = "ordered",
               targets: dict[str, dict[str, Any]] | None = None, **route: Any):
    """One fake upstream per name, a route over them in that order; returns (upstreams, proxy)."""
    ups = {name: await upstreams({PATH: h}) for name, h in handlers.items()}
    provs = {n: openai_provider(u.url, **(providers or {}).get(n, {})) for n, u in ups.items()}
    tgts = [{"provider": n, "model": f"model-{n}", **(targets or {}).get(n, {})} for n in ups]
    route.setdefault("cooldown", {"failures": 1, "secs": 30})
    p = await proxy(route_config(tgts, provs, strategy, **route), clock=clock or Clock())
    return ups, p


async def health_of(p: Proxy, target: str) -> dict[str, Any]:
    status, body = await p.get("/v1/health")
    assert status == 200
    return next(t for t in body["targets"] if t["target"] == target)


def gate(inner: Any = None) -> tuple[asyncio.Event, Any]:
    """A handler that holds the call until the event is set, then answers as ``inner`` (200)."""
    release = asyncio.Event()
    inner = inner or ok_handler("held")

    async def handle(request: web.Request) -> web.StreamResponse:
        await release.wait()
        return await inner(request)

    return release, handle


async def until(predicate: Any) -> None:
    for _ in range(500):
        if predicate():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition never held")


async def settled(p: Proxy) -> None:
    """No call of the gateway's still in flight: a learner racing beside the answer (a measure, an explore)
    runs on after it, and its outcome lands when it lands (a loaded full run read it between an explain
    and the request it spoke for)."""
    for _ in range(400):
        status, body = await p.get("/v1/health")
        assert status == 200
        if not any(t["in_flight"] for t in body["targets"]):
            return
        await asyncio.sleep(0.005)
    raise AssertionError("calls still in flight after 2 s")


async def test_breaker_opens_skips_probes_after_cooldown_and_closes(upstreams, proxy):
    clock = Clock()
    ups, p = await pool(upstreams, proxy, {"a": status_handler(503), "b": ok_handler("from-b")}, clock)

    _, headers, _ = await p.post(PATH, CHAT)
    assert decision_of(headers).attempt_outcomes() == [("a", "503"), ("b", "200")]
    h = await health_of(p, "a")
    assert (h["breaker"], h["seconds_left"], h["failures"]) == ("open", 30.0, 1)

    clock.advance(12)
    _, headers, _ = await p.post(PATH, CHAT)
    d = decision_of(headers)
    assert d.excluded_reason("a") == "breaker open 18s"
    assert d.attempt_outcomes() == [("b", "200")]
    assert len(ups["a"].calls) == 1  # skipped: never called while open

    clock.advance(18)
    assert (await health_of(p, "a"))["breaker"] == "half-open"
    ups["a"].handlers[PATH] = ok_handler("from-a")
    status, headers, body = await p.post(PATH, CHAT)
    assert status == 200 and decision_of(headers).served == "a"
    assert orjson.loads(body)["choices"][0]["message"]["content"] == "from-a"
    h = await health_of(p, "a")
    assert (h["breaker"], h["failures"], h["buffered"]["samples"]) == ("closed", 0, 1)


async def test_failed_probe_doubles_the_cooldown(upstreams, proxy):
    clock = Clock()
    ups, p = await pool(upstreams, proxy, {"a": status_handler(500), "b": ok_handler()}, clock)
    await p.post(PATH, CHAT)
    clock.advance(30)
    _, headers, _ = await p.post(PATH, CHAT)
    assert decision_of(headers).attempt_outcomes() == [("a", "500"), ("b", "200")]  # the probe
    h = await health_of(p, "a")
    assert (h["breaker"], h["seconds_left"], h["failures"]) == ("open", 60.0, 2)
    clock.advance(59)
    _, headers, _ = await p.post(PATH, CHAT)
    assert decision_of(headers).excluded_reason("a") == "breaker open 1s"
    assert len(ups["a"].calls) == 2


async def test_client_errors_never_count_against_a_target(upstreams, proxy):
    clock = Clock()
    ups, p = await pool(upstreams, proxy, {"a": status_handler(422, "bad field"), "b": ok_handler()}, clock)
    for _ in range(3):
        status, headers, _ = await p.post(PATH, CHAT)
        assert status == 422  # returned as it is, no failover
        assert decision_of(headers).attempt_outcomes() == [("a", "422")]
    h = await health_of(p, "a")
    assert (h["breaker"], h["failures"]) == ("closed", 0)
    assert ups["b"].calls == []


@pytest.mark.parametrize("status", [401, 403])
async def test_a_providers_auth_failure_fails_over_and_counts_against_its_breaker(upstreams, proxy, status):
    """A revoked or mistyped key at one provider is an outage of that target: the healthy next
    target answers, and the bad one's breaker opens (cooldown.failures: 2) so later requests
    skip it. The client's key never went there, so it is never blamed."""
    clock = Clock()
    ups, p = await pool(upstreams, proxy, {"a": status_handler(status, "Incorrect API key provided"),
                                           "b": ok_handler("from-b")}, clock, cooldown={"failures": 2, "secs": 30})
    for n in (1, 2):
        code, headers, body = await p.post(PATH, CHAT)
        assert code == 200 and b"from-b" in body
        assert decision_of(headers).attempt_outcomes() == [("a", str(status)), ("b", "200")]
        h = await health_of(p, "a")
        assert h["failures"] == n
    assert h["breaker"] == "open"
    code, headers, _ = await p.post(PATH, CHAT)
    assert code == 200 and decision_of(headers).attempt_outcomes() == [("b", "200")]
    assert len(ups["a"].calls) == 2


async def test_a_providers_auth_failure_as_the_last_word_is_a_502_saying_whose_key(upstreams, proxy):
    _, p = await pool(upstreams, proxy, {"a": status_handler(401, "Incorrect API key provided")})
    code, _, body = await p.post(PATH, CHAT)
    error = orjson.loads(body)["error"]
    assert code == 502 and error["type"] != "authentication_error"
    assert "refused firstbyte's key" in error["message"] and "api_key_env or api_key_file" in error["message"]


async def test_fail_over_on_names_more_statuses_to_move_on_from(upstreams, proxy):
    ups, p = await pool(upstreams, proxy, {"a": status_handler(404, "model not found"), "b": ok_handler("from-b")},
                        fail_over_on=[404])
    code, headers, _ = await p.post(PATH, CHAT)
    assert code == 200
    assert decision_of(headers).attempt_outcomes() == [("a", "404"), ("b", "200")]
    assert (await health_of(p, "a"))["failures"] == 1
    # Without it, a 404 is the client's, as it is.
    ups2, plain = await pool(upstreams, proxy, {"a": status_handler(404, "model not found"), "b": ok_handler()})
    code, headers, _ = await plain.post(PATH, CHAT)
    assert code == 404 and decision_of(headers).attempt_outcomes() == [("a", "404")]
    assert ups2["b"].calls == []


async def test_a_client_error_in_plain_text_comes_back_as_json_labelled_json(upstreams, proxy):
    async def too_large(request: web.Request) -> web.Response:
        return web.Response(status=413, text="Request Entity Too Large", headers={"retry-after": "3"})

    ups, p = await pool(upstreams, proxy, {"a": too_large, "b": ok_handler()})
    status, headers, body = await p.post(PATH, CHAT)
    assert status == 413 and {k.lower(): v for k, v in headers.items()}["retry-after"] == "3"
    assert [v for k, v in headers.items() if k.lower() == "content-type"] == ["application/json"]
    assert orjson.loads(body)["error"]["message"]  # the OpenAI shape, as labelled


async def test_client_error_during_probe_lets_the_next_request_probe(upstreams, proxy):
    clock = Clock()
    ups, p = await pool(upstreams, proxy, {"a": status_handler(503), "b": ok_handler()}, clock)
    await p.post(PATH, CHAT)
    clock.advance(30)
    ups["a"].handlers[PATH] = status_handler(400, "bad request")
    status, _, _ = await p.post(PATH, CHAT)
    assert status == 400
    assert (await health_of(p, "a"))["breaker"] == "half-open"  # no verdict: still waiting for a probe


async def test_only_one_probe_goes_through(upstreams, proxy):
    """A request that planned a half-open target does not become a second probe when it gets there."""
    clock = Clock()
    ups, p = await pool(upstreams, proxy, {"c": status_handler(503), "a": status_handler(503), "b": ok_handler()},
                        clock)
    await p.post(PATH, CHAT)  # c and a open, b serves
    clock.advance(30)
    c_release, ups["c"].handlers[PATH] = gate(status_handler(503))
    a_release, ups["a"].handlers[PATH] = gate()
    first = asyncio.create_task(p.post(PATH, CHAT))  # plans c, a (both half-open), b; probes c
    await until(lambda: len(ups["c"].calls) == 2)
    pinned = asyncio.create_task(p.post(PATH, CHAT, {"x-route-provider": "a"}))  # becomes a's probe
    await until(lambda: len(ups["a"].calls) == 2)
    assert (await health_of(p, "a"))["breaker"] == "probing"
    c_release.set()
    _, headers, _ = await first
    assert decision_of(headers).attempt_outcomes() == [("c", "503"), ("a", "cooldown"), ("b", "200")]
    a_release.set()
    _, headers, _ = await pinned
    assert decision_of(headers).served == "a"
    assert len(ups["a"].calls) == 2
    assert (await health_of(p, "a"))["breaker"] == "closed"
    assert (await health_of(p, "c"))["seconds_left"] == 60.0  # c's probe failed: doubled


async def test_retry_after_cools_the_target_down(upstreams, proxy):
    clock = Clock()
    limited = status_handler(429, "slow down", {"retry-after": "7"})
    ups, p = await pool(upstreams, proxy, {"a": limited, "b": ok_handler()}, clock,
                        cooldown={"failures": 3, "secs": 30})
    _, headers, _ = await p.post(PATH, CHAT)
    assert decision_of(headers).attempt_outcomes() == [("a", "429"), ("b", "200")]
    h = await health_of(p, "a")
    assert (h["breaker"], h["cooling_s"]) == ("closed", 7.0)
    clock.advance(5)
    _, headers, _ = await p.post(PATH, CHAT)
    assert decision_of(headers).excluded_reason("a") == "cooling down 2s"
    clock.advance(2)
    ups["a"].handlers[PATH] = ok_handler()
    _, headers, _ = await p.post(PATH, CHAT)
    assert decision_of(headers).served == "a"


async def test_retry_after_is_honoured_on_a_retry_and_a_long_one_abandons(upstreams, proxy):
    ups, p = await pool(upstreams, proxy,
                        {"a": status_handler(503, "busy", {"retry-after": "0"}), "b": ok_handler()},
                        targets={"a": {"retry": 1}}, cooldown={"failures": 5, "secs": 30})
    _, headers, _ = await p.post(PATH, CHAT)
    assert decision_of(headers).attempt_outcomes() == [("a", "503"), ("a", "503"), ("b", "200")]
    ups["a"].handlers[PATH] = status_handler(429, "later", {"retry-after": "120"})
    _, headers, _ = await p.post(PATH, CHAT)
    assert decision_of(headers).attempt_outcomes() == [("a", "429"), ("b", "200")]  # no wait of 120 s
    assert (await health_of(p, "a"))["cooling_s"] == pytest.approx(120, abs=1)


@pytest.mark.parametrize(("value", "cooling"), [
    pytest.param("inf", None, id="inf-is-no-number"),
    pytest.param("1e999", None, id="exponent-is-no-number"),
    pytest.param("1_000", None, id="underscores-are-no-number"),
    pytest.param("-5", None, id="negative-is-no-number"),
    pytest.param("86400", 300.0, id="a-day-is-capped-at-the-longest-cooldown"),
    pytest.param("Fri, 31 Dec 9999 23:59:59 GMT", 300.0, id="a-far-date-is-capped"),
])
async def test_a_hostile_retry_after_never_breaks_the_route_and_never_cools_past_the_cap(
        upstreams, proxy, value, cooling):
    ups, p = await pool(upstreams, proxy, {"a": status_handler(429, "later", {"retry-after": value}),
                                           "b": ok_handler()}, cooldown={"failures": 5, "secs": 30})
    status, headers, _ = await p.post(PATH, CHAT)
    assert status == 200 and decision_of(headers).attempt_outcomes() == [("a", "429"), ("b", "200")]
    h = await health_of(p, "a")
    assert h["cooling_s"] == (pytest.approx(cooling, abs=1) if cooling is not None else 0)
    status, headers, _ = await p.post(PATH, CHAT)  # the next request plans around it, no 500
    assert status == 200 and decision_of(headers).served == "b"
    status, _ = await p.get("/v1/routes/chat/explain")
    assert status == 200


async def test_a_retry_waits_for_no_hint_longer_than_the_first_token_budget(upstreams, proxy):
    ups, p = await pool(upstreams, proxy,
                        {"a": status_handler(429, "later", {"retry-after": "3"}), "b": ok_handler()},
                        providers={"a": {"timeouts": {"first_chunk": 2}}},
                        targets={"a": {"retry": 1}}, cooldown={"failures": 5, "secs": 30})
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    _, headers, _ = await p.post(PATH, CHAT)
    assert loop.time() - t0 < 1.0  # not the 3 s the hint asked for: b was there
    assert decision_of(headers).attempt_outcomes() == [("a", "429"), ("b", "200")]
    assert (await health_of(p, "a"))["cooling_s"] == pytest.approx(3, abs=0.5)


async def test_a_provider_moved_to_another_address_starts_afresh_and_one_left_in_place_does_not(
        upstreams, proxy):
    ups, p = await pool(upstreams, proxy, {"a": status_handler(503), "b": ok_handler()})
    await p.post(PATH, CHAT)  # a's breaker opens (failures: 1)
    assert (await health_of(p, "a"))["breaker"] == "open"
    fixed = await upstreams({PATH: ok_handler("from-fixed-a")})
    raw = route_config([{"provider": n, "model": f"model-{n}"} for n in "ab"],
                       {"a": openai_provider(ups["a"].url), "b": openai_provider(ups["b"].url)}, "ordered",
                       cooldown={"failures": 1, "secs": 30})
    p.gateway.apply(make_config(raw))  # the same addresses: what was learnt stands
    assert (await health_of(p, "a"))["breaker"] == "open"
    raw["providers"]["a"] = openai_provider(fixed.url)
    p.gateway.apply(make_config(raw))  # a now names another upstream: its old breaker is not its own
    assert (await health_of(p, "a"))["breaker"] == "closed"
    _, headers, _ = await p.post(PATH, CHAT)
    assert decision_of(headers).served == "a" and len(fixed.calls) == 1
    assert p.gateway.state.tracker.samples(("b", "model-b"), "buffered") == 1  # b, unmoved, kept its figure


async def test_all_targets_cooling_still_serves_via_the_soonest_to_reopen(upstreams, proxy):
    clock = Clock()
    ups, p = await pool(upstreams, proxy, {"a": status_handler(503), "b": ok_handler()}, clock)
    await p.post(PATH, CHAT)  # a opens at t=0, b serves
    clock.advance(10)
    ups["b"].handlers[PATH] = status_handler(503)
    status, _, _ = await p.post(PATH, CHAT)  # b opens at t=10
    assert status == 503
    ups["a"].handlers[PATH] = ok_handler("from-a")
    status, headers, _ = await p.post(PATH, CHAT)
    d = decision_of(headers)
    assert status == 200
    assert d.order == (("a", "soonest to reopen"),)
    assert d.excluded == (("b", "breaker open 30s"),)
    assert d.served == "a"
    assert (await health_of(p, "a"))["breaker"] == "closed"


async def test_pinned_target_in_cooldown_is_400_and_the_backup_is_not_called(upstreams, proxy):
    clock = Clock()
    ups, p = await pool(upstreams, proxy, {"a": status_handler(503), "b": ok_handler()}, clock)
    await p.post(PATH, CHAT)
    calls = (len(ups["a"].calls), len(ups["b"].calls))
    status, headers, body = await p.post(PATH, CHAT, {"x-route-provider": "a"})
    assert status == 400
    err = orjson.loads(body)["error"]
    assert err["code"] == "pin_unavailable"
    assert "breaker open 30s" in err["message"]
    assert decision_of(headers).excluded == (("a", "breaker open 30s"),)
    assert (len(ups["a"].calls), len(ups["b"].calls)) == calls


async def test_pins_by_header_and_by_model(upstreams, proxy):
    ups, p = await pool(upstreams, proxy, {"a": ok_handler("from-a"), "b": ok_handler("from-b")})
    _, headers, _ = await p.post(PATH, CHAT, {"x-route-provider": "b"})
    assert decision_of(headers).order == (("b", "pinned"), ("a", "unmeasured"))
    _, headers, _ = await p.post(PATH, {**CHAT, "model": "a/some-model"})
    d = decision_of(headers)
    assert (d.route, d.order_names, d.served) == ("a/some-model", ["a"], "a")
    assert ups["a"].calls[-1]["json"]["model"] == "some-model"
    for model, pin in (("chat", "ghost"), ("grok/beta", None)):
        status, _, body = await p.post(PATH, {**CHAT, "model": model}, {"x-route-provider": pin} if pin else {})
        assert (status, orjson.loads(body)["error"]["code"]) == (400, "unknown_pin")


async def test_busy_fails_over_when_the_limit_and_queue_are_full(upstreams, proxy):
    release, held = gate()
    ups, p = await pool(upstreams, proxy, {"a": held, "b": ok_handler("from-b")},
                        providers={"a": {"max_concurrent": 1, "queue": 1}})
    first = asyncio.create_task(p.post(PATH, CHAT))
    await until(lambda: len(ups["a"].calls) == 1)
    queued = asyncio.create_task(p.post(PATH, CHAT))
    await until(lambda: len(p.gateway.limiters.get("a").waiters) == 1)
    h = await health_of(p, "a")
    assert h["in_flight"] == 1
    status, headers, _ = await p.post(PATH, CHAT)
    assert status == 200
    assert decision_of(headers).attempt_outcomes() == [("a", "busy"), ("b", "200")]
    h = await health_of(p, "a")
    assert (h["breaker"], h["failures"]) == ("closed", 0)  # busy is our limit, not a's fault
    release.set()
    for task in (first, queued):
        _, headers, _ = await task
        assert decision_of(headers).served == "a"
    h = await health_of(p, "a")
    assert (h["breaker"], h["failures"], h["in_flight"]) == ("closed", 0, 0)


async def test_weighted_shares_match_the_weights(proxy):
    """400 requests over a 1:3 split; the seeded draw keeps the shares within 0.05 of 0.25/0.75."""
    sim = {"kind": "simulated", "simulate": {"first_chunk_ms": 0, "jitter_ms": 0, "chunk_ms": 0, "chunks": 1}}
    p = await proxy(route_config(
        [{"provider": "light", "model": "m", "weight": 1}, {"provider": "heavy", "model": "m", "weight": 3}],
        {"light": sim, "heavy": sim}, "weighted", fastest={"seed": 3},
    ))
    served: Counter[str] = Counter()
    n = 400
    async with aiohttp.ClientSession() as session:
        for _ in range(n):
            async with session.post(p.url + PATH, json=CHAT) as resp:
                assert resp.status == 200
                await resp.read()
                served[decision_of(dict(resp.headers)).served or "-"] += 1
    assert set(served) == {"light", "heavy"} and served.total() == n
    assert abs(served["heavy"] / n - 0.75) < 0.05, served


def _order_and_exclusions(header: str) -> tuple[Any, ...]:
    d = decision_of({"x-route-decision": header})
    return (d.route, d.strategy, d.order, d.excluded)


@pytest.mark.parametrize(
    ("strategy", "route"),
    [
        pytest.param("weighted", {"fastest": {"seed": 5}}, id="weighted-next-draw"),
        pytest.param("fastest", {"fastest": {"explore": 0.5, "seed": 1}}, id="fastest-without-exploring"),
        pytest.param("cheapest", {}, id="cheapest"),
    ],
)
async def test_explain_is_what_the_next_request_gets(upstreams, proxy, strategy, route):
    clock = Clock()
    handlers = {"a": ok_handler(), "b": ok_handler(), "c": status_handler(503), "d": ok_handler()}
    targets = {"a": {"weight": 2, "price": {"input": 1, "output": 1}}, "b": {"weight": 1},
               "c": {"price": {"input": 0, "output": 1}}, "d": {"price": {"input": 2, "output": 2}}}
    _, p = await pool(upstreams, proxy, handlers, clock, strategy=strategy, targets=targets, deny=["d"], **route)
    for _ in range(3):  # measure everyone, open c's breaker
        await p.post(PATH, CHAT)
        await settled(p)
    compared = 0
    for _ in range(8):
        status, explained = await p.get("/v1/routes/chat/explain?mode=buffered")  # CHAT is buffered
        assert status == 200
        _, headers, _ = await p.post(PATH, CHAT)
        await settled(p)  # a racer measuring c answers its 503 after the answer: before the next explain
        clock.advance(1)
        if decision_of(headers).first_reason == "explore":
            continue  # explain speaks for the requests that do not explore
        got = _order_and_exclusions(headers["x-route-decision"])
        assert _order_and_exclusions(explained["decision"]) == got
        assert [o["target"] for o in explained["order"]] == [name for name, _ in got[2]]
        assert {e["target"]: e["reason"] for e in explained["excluded"]} == dict(got[3])
        compared += 1
    assert compared >= 3


async def test_explain_cli_prints_the_table(upstreams, proxy, capsys):
    clock = Clock()
    _, p = await pool(upstreams, proxy, {"a": status_handler(503), "b": ok_handler(), "c": ok_handler()},
                        clock, deny=["c"])
    await p.post(PATH, CHAT)
    assert await asyncio.to_thread(main, ["explain", "chat", "--url", p.url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "route chat  strategy=ordered  mode=streamed"
    assert lines[1].split() == ["#", "target", "why", "streamed", "samples", "buffered", "samples"]
    assert lines[2].split() == ["1", "b", "written", "-", "0", "0.000s", "1"]  # a buffered call measured b
    assert lines[3:] == ["excluded c: deny", "excluded a: breaker open 30s"]  # hard filters before health
    assert await asyncio.to_thread(main, ["explain", "chat", "--url", p.url, "--mode", "buffered"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "route chat  strategy=ordered  mode=buffered"
    assert lines[2].split() == ["1", "b", "written", "0.00s", "-", "0", "0.000s", "1"]  # ranked by it
    assert await asyncio.to_thread(main, ["explain", "nope", "--url", p.url]) == 1
    assert "error 404" in capsys.readouterr().err


async def test_explain_cli_asks_the_listen_of_the_config_it_is_given(upstreams, proxy, capsys, tmp_path):
    _, p = await pool(upstreams, proxy, {"a": ok_handler()})
    port = p.url.rsplit(":", 1)[1]
    config = tmp_path / "routes.yaml"
    config.write_text(f"listen: 0.0.0.0:{port}\nproviders: {{a: {{kind: simulated}}}}\n"
                      "routes: {chat: {targets: [{provider: a, model: m}]}}\n")
    assert await asyncio.to_thread(main, ["explain", "chat", "--config", str(config)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "route chat  strategy=ordered  mode=streamed"
    config.write_text("listen: [not, valid]\n")
    assert await asyncio.to_thread(main, ["explain", "chat", "--config", str(config)]) == 1
    assert "listen" in capsys.readouterr().err  # the file's problem, named by its path


async def test_health_lists_every_target_with_its_fields(upstreams, proxy):
    clock = Clock()
    _, p = await pool(upstreams, proxy, {"a": status_handler(503), "b": ok_handler()}, clock)
    await p.post(PATH, CHAT)
    clock.advance(4)
    status, body = await p.get("/v1/health")
    assert status == 200
    a, b = body["targets"]
    unmeasured = {"figure_s": None, "samples": 0, "age_s": None}
    last = a.pop("last")  # outside a fleet: no instance named, but what changed the breaker and when
    assert last["figure"] is None and (last["breaker"]["by"], last["breaker"]["what"]) == (None, "opened")
    assert a == {"route": "chat", "target": "a", "provider": "a", "model": "model-a",
                 "streamed": unmeasured, "buffered": unmeasured, "breaker": "open", "seconds_left": 26.0,
                 "cooling_s": 0.0, "failures": 1, "in_flight": 0, "load_penalty": 1.0,
                 "load_fit_s": 0.0}
    assert (b["breaker"], b["failures"]) == ("closed", 0)
    assert b["buffered"] == {"figure_s": 0.0, "samples": 1, "age_s": 4.0}  # the call was buffered
    assert b["streamed"] == unmeasured


async def test_a_call_in_flight_to_the_old_address_does_not_measure_the_new_one(upstreams, proxy):
    """State is dropped for a moved provider, but the tracker is keyed by (provider, model): a
    call to the old address still in flight at the reload records its first token into the
    fresh figure of the new address (the breaker does not: the slot holds the old TargetState)."""
    from .conftest import make_config, ok_handler, openai_provider, route_config

    release, held = gate()
    ups, p = await pool(upstreams, proxy, {"a": held})
    call = asyncio.create_task(p.post(PATH, CHAT))
    await until(lambda: len(ups["a"].calls) == 1)
    moved = await upstreams({PATH: ok_handler("new")})
    raw = route_config([{"provider": "a", "model": "model-a"}], {"a": openai_provider(moved.url)}, "ordered",
                       cooldown={"failures": 1, "secs": 30})
    p.gateway.apply(make_config(raw))  # a now names another upstream: it starts afresh
    assert p.gateway.state.tracker.samples(("a", "model-a"), "buffered") == 0
    release.set()
    status, _, _ = await asyncio.wait_for(call, 5)
    assert status == 200
    assert p.gateway.state.tracker.samples(("a", "model-a"), "buffered") == 0, \
        "the old address's answer became the new address's first sample"

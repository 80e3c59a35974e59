"""Review findings on the first-token commit, the race (issues 12, 13) and the 2026-12-05 changes (the
upstream pool, the drain's cut, the settled race record, Retry-After, reloads, explain), over real
loopback HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest
from aiohttp import web

from proxy.config import parse_config
from proxy.observe import Finished

from .conftest import decision_of, openai_provider, route_config, status_handler
from .walk.test_race import CHAT, Timed, _raw, _raw_route, race_proxy, settle, until


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
    for _ in range(2):
        await p.post("/v1/chat/completions", {**CHAT, "stream": True})
    await settle(a, b, want=3)
    state = p.gateway.state
    await until(lambda: state.tracker.samples(("b", "m")) >= 1 and not state.in_flight(("b", "m")))
    route = p.gateway.config.routes["chat"]
    p.gateway.apply(parse_config({**_raw(p), "routes": {"chat": {**_raw_route(route), "fastest": {
        "explore": 1.0, "seed": 1}}}}, {}))
    b.first = b_first
    status, headers, body = await p.post("/v1/chat/completions", {**CHAT, "stream": True})
    from .conftest import decision_of
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


# --- 6e83732: http1 retries a reused connection that failed "before anything came back" ---------


async def test_http1_does_not_send_a_request_again_that_the_upstream_was_processing() -> None:
    """The retry is meant for a keep-alive that ran out as the request crossed it. An upstream that
    read the request, worked on it (an LLM call: paid tokens) and then dropped the connection
    without a byte (a crash, a proxy's idle cut) also 'sent nothing back': the pool sends the
    whole POST a second time. Go's net/http, urllib3 and aiohttp replay only what was never
    written or is idempotent; firstbyte must not pay twice for one call."""
    from proxy.upstream.http1 import QUIET, Pool

    from .upstream.test_http1 import read_head, reply

    processed: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head, length = await read_head(reader)
                body = await reader.readexactly(length)
                processed.append(body)
                if len(processed) == 1:
                    writer.write(reply(b"{}"))
                    await writer.drain()
                    continue
                await asyncio.sleep(0.3)  # it works on the request... then dies without a word
                return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/"
    pool = Pool()
    try:
        answer = await pool.request("POST", url, {}, b'{"n":1}', 5.0)
        await answer.content.read()
        pool.release(answer)
        await asyncio.sleep(QUIET)  # quiet long enough to be reused
        with pytest.raises(Exception):  # noqa: B017 - any failure: the point is how many calls were made
            await asyncio.wait_for(pool.request("POST", url, {}, b'{"n":2}', 5.0), 5)
        second = processed.count(b'{"n":2}')
        assert second == 1, f"the upstream processed one call {second} times"
    finally:
        pool.close()
        server.close()
        await server.wait_closed()


# --- b9e93b1: the drain's cut ------------------------------------------------------------------


async def test_the_drains_cut_counts_no_stream_whose_client_already_has_the_whole_answer(upstreams, proxy):
    """After [DONE] the lease stays in deadlines.calls while its upstream tail is read in the
    background (finish_after_end). cut_streams() counts it, and serve() logs 'N stream(s) ended
    with an error event' for clients that had their whole answer."""
    from aiohttp import web

    from .conftest import chunk_event, openai_provider, route_config

    async def lingering(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(chunk_event("hi") + chunk_event("", "stop") + b"data: [DONE]\n\n")
        await asyncio.sleep(3)  # the upstream's own end of body comes late
        await response.write_eof()
        return response

    up = await upstreams({"/v1/chat/completions": lingering})
    p = await proxy(route_config([{"provider": "a", "model": "m"}], {"a": openai_provider(up.url)}))
    status, _, body = await asyncio.wait_for(p.post("/v1/chat/completions", {**CHAT, "stream": True}), 5)
    assert status == 200 and body.endswith(b"data: [DONE]\n\n")  # the client has it all
    assert p.gateway.cut_streams() == 0, "a finished answer was counted as a stream cut by the drain"


async def test_the_drains_cut_ends_a_stream_blocked_writing_to_a_client_that_does_not_read(upstreams, proxy):
    """cut_streams() only aborts the upstream read. A relay blocked in response.write() on a client
    that stopped reading never gets to that read: the stream is not ended at the grace, and the
    shutdown waits until aiohttp's own timeout cancels it (no word, logged 'client disconnected')."""
    import socket

    from aiohttp import web

    from proxy.walk.lease import Lease

    from .conftest import chunk_event, openai_provider, route_config

    big = chunk_event("x" * (256 * 1024))

    async def firehose(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        try:
            for _ in range(400):  # 100 MB, far more than the sockets between can hold
                await response.write(big)
            await response.write(chunk_event("", "stop") + b"data: [DONE]\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        return response

    up = await upstreams({"/v1/chat/completions": firehose})
    p = await proxy(route_config([{"provider": "a", "model": "m"}], {"a": openai_provider(up.url)}))
    gw = p.gateway
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", p.port))
    body = b'{"model":"chat","stream":true,"messages":[{"role":"user","content":"hi"}]}'
    await asyncio.get_running_loop().sock_sendall(sock, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                                                  b"Content-Type: application/json\r\n"
                                                  + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    try:  # the client never reads

        def leases() -> list[Lease]:
            return [c for c in gw.deadlines.calls if isinstance(c, Lease)]

        await until(lambda: bool(leases()), 5)
        [lease] = leases()
        await asyncio.sleep(1.0)  # the relay's writes have backed up by now
        assert lease.waiting_since is None  # it is writing to the client, not reading the upstream
        assert gw.cut_streams() == 1
        await until(lambda: lease.finished, 2)
        assert lease.finished, "the drain's cut left the stream running: the relay is blocked writing"
    finally:
        sock.close()


# --- 5539946: explain --config ------------------------------------------------------------------


async def test_explain_config_needs_only_the_listen_not_the_gateways_secrets(upstreams, proxy, capsys, tmp_path,
                                                                            monkeypatch):
    """`firstbyte explain chat --config routes.yaml --key K` loads the whole config to read one
    field: a gateway with client keys (clients.keys_env) refuses to explain from any shell that
    does not hold every client key in its environment (the service's EnvironmentFile does, the
    operator's shell does not), although the key was given with --key."""
    from proxy.cli import main

    from .conftest import ok_handler, openai_provider

    up = await upstreams({"/v1/chat/completions": ok_handler("x")})
    p = await proxy({"clients": {"keys_env": "FB_REVIEW3_KEYS"}, "providers": {"a": openai_provider(up.url)},
                     "routes": {"chat": {"targets": [{"provider": "a", "model": "m"}]}}},
                    env={"FB_REVIEW3_KEYS": "good"})
    monkeypatch.delenv("FB_REVIEW3_KEYS", raising=False)
    config = tmp_path / "routes.yaml"
    config.write_text(f"listen: 127.0.0.1:{p.port}\nclients: {{keys_env: FB_REVIEW3_KEYS}}\n"
                      "providers: {a: {kind: simulated}}\nroutes: {chat: {targets: [{provider: a, model: m}]}}\n")
    code = await asyncio.to_thread(main, ["explain", "chat", "--config", str(config), "--key", "good"])
    err = capsys.readouterr().err
    assert code == 0, err


# --- 26777f2: reload of a moved provider ---------------------------------------------------------


async def test_a_call_in_flight_to_the_old_address_does_not_measure_the_new_one(upstreams, proxy):
    """State is dropped for a moved provider, but the tracker is keyed by (provider, model): a
    call to the old address still in flight at the reload records its first token into the
    fresh figure of the new address (the breaker does not: the slot holds the old TargetState)."""
    from .conftest import make_config, ok_handler, openai_provider, route_config
    from .test_policy import PATH, gate, pool

    release, held = gate()
    ups, p = await pool(upstreams, proxy, {"a": held})
    call = asyncio.create_task(p.post(PATH, CHAT))
    await until(lambda: len(ups["a"].calls) == 1, 5)
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


def test_retry_after_in_the_asctime_form_is_read_as_gmt(monkeypatch):
    """RFC 9110 5.6.7: a recipient must accept asctime dates, which are GMT. parsedate_to_datetime
    gives a naive datetime for it (and for a -0000 zone), and .timestamp() reads that as local time:
    on a gateway whose TZ is east of UTC the hint is lost, west of it the target cools for 300 s."""
    import email.utils

    from proxy.walk.classify import retry_after

    monkeypatch.setenv("TZ", "Asia/Tokyo")  # UTC+9
    time.tzset()
    try:
        now = 2_000_000_000.0
        when = time.strftime("%a %b %d %H:%M:%S %Y", time.gmtime(now + 60))  # asctime, GMT by definition
        assert email.utils.parsedate_to_datetime(when).tzinfo is None
        assert retry_after({"retry-after": when}, now) == pytest.approx(60, abs=1)
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()

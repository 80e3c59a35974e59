"""Idle and total deadlines of committed streams: the sweep rules as a table, and a real stall."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import orjson
import pytest
from aiohttp import web

from proxy.walk.deadlines import Deadlines, sweep

from ..conftest import chunk_event, openai_provider, route_config


@dataclass(eq=False)
class Call:
    started: float
    waiting_since: float | None
    idle: float = 5.0
    total: float = 60.0
    expired: str | None = None

    def expire(self, reason: str) -> None:
        self.expired = reason


@pytest.mark.parametrize(
    ("call", "now", "reason"),
    [
        pytest.param(Call(100.0, 101.0), 103.0, None, id="waiting-within-idle"),
        pytest.param(Call(100.0, 101.0), 106.5, "idle timeout", id="waiting-past-idle"),
        pytest.param(Call(100.0, None), 150.0, None, id="writing-to-a-slow-client-is-not-idle"),
        pytest.param(Call(100.0, None), 161.0, "total timeout", id="past-total-even-while-writing"),
        pytest.param(Call(100.0, 158.0), 170.0, "total timeout", id="total-wins-over-idle"),
    ],
)
def test_sweep_rules(call: Call, now: float, reason: str | None) -> None:
    due = sweep([call], now)
    assert [r for _, r in due] == ([reason] if reason else [])


def test_expire_due_tells_the_call_and_forgets_it() -> None:
    now = [0.0]
    deadlines = Deadlines(lambda: now[0])
    stalled, fresh = Call(0.0, 0.0, idle=1.0), Call(0.0, 0.0, idle=10.0)
    deadlines.calls.add(stalled)
    deadlines.calls.add(fresh)
    now[0] = 2.0
    assert deadlines.expire_due() == 1
    assert (stalled.expired, fresh.expired) == ("idle timeout", None)
    assert deadlines.calls == {fresh}


def test_sweep_interval_follows_the_shortest_deadline() -> None:
    deadlines = Deadlines(lambda: 0.0)
    deadlines.tune([60.0, 0.4])
    assert deadlines.interval == pytest.approx(0.04)
    deadlines.tune([0.01])
    assert deadlines.interval == 0.02
    deadlines.tune([600.0])
    assert deadlines.interval == 1.0


async def test_a_stream_that_stalls_after_commit_ends_with_an_idle_timeout_event(upstreams, proxy) -> None:
    async def stall(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(chunk_event("first"))
        await asyncio.sleep(30)
        return response

    up = await upstreams({"/v1/chat/completions": stall})
    p = await proxy(route_config([{"provider": "up", "model": "m"}],
                                 {"up": openai_provider(up.url, timeouts={"idle": 0.3})}))
    body = {"model": "chat", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    status, _, raw = await p.post("/v1/chat/completions", body)
    assert status == 200
    events = [e for e in raw.split(b"\n\n") if e]
    assert b"first" in events[0]
    error = orjson.loads(events[-1].removeprefix(b"data: "))["error"]
    assert "idle timeout" in error["message"]
    assert p.gateway.state.target(("up", "m")).breaker.failures == 1
    assert p.gateway.deadlines.calls == set()


@pytest.mark.parametrize(
    ("limits", "timers", "interval", "fine"),
    [
        pytest.param([30.0, 60.0], [], 1.0, 1.0, id="no-hedge-one-look-a-second"),
        pytest.param([30.0, 60.0], [0.3], 1.0, 0.03, id="a-percentile-hedge-wakes-finer"),
        pytest.param([0.5], [0.05], 0.05, 0.01, id="fine-never-under-ten-ms"),
        pytest.param([0.5], [5.0], 0.05, 0.05, id="fine-never-coarser-than-interval"),
    ],
)
def test_tune(limits: list[float], timers: list[float], interval: float, fine: float) -> None:
    deadlines = Deadlines(lambda: 0.0)
    deadlines.tune(limits, timers)
    assert (deadlines.interval, deadlines.fine) == pytest.approx((interval, fine))


def test_hedge_timers_fire_apart_from_the_calls() -> None:
    now = [100.0]
    deadlines = Deadlines(lambda: now[0])
    call, timer = Call(100.0, 100.0, idle=5.0), Call(100.0, None, idle=0.2, total=0.2)
    deadlines.calls.add(call)
    deadlines.watch_timer(timer)
    now[0] = 100.3
    assert deadlines.fire_due() == 1 and timer.expired == "total timeout"
    assert call.expired is None and deadlines.timers == set() and deadlines.calls == {call}

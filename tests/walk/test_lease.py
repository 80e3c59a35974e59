"""A committed stream's lease finishes itself: its slot once, a failure counted once, the tail drained."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from proxy.config import Cooldown, Target
from proxy.sim.transport import SimUpstream
from proxy.state import State, TargetState
from proxy.translate.usage_taps import OpenAIUsageTap
from proxy.walk.deadlines import Deadlines
from proxy.walk.lease import Background, Lease
from proxy.walk.limiter import Limiter
from proxy.walk.slot import Slot


async def tail() -> AsyncIterator[bytes]:
    await asyncio.sleep(0.01)
    yield b": the upstream's own end\n\n"


async def leased(stream: AsyncIterator[bytes] | None = None) -> tuple[Lease, TargetState, Limiter, Deadlines]:
    state = State()
    ts, limiter, deadlines = state.target(("p", "m")), Limiter(limit=1, queue=0), Deadlines(lambda: 0.0)
    slot = Slot(state, ts, limiter, probe=False)
    await slot.queue()
    upstream = slot.upstream = SimUpstream(200, {}, None, stream)
    lease = Lease(Target("a", "p", "m"), upstream, b"", OpenAIUsageTap(False), slot, 0.0, 60.0, 600.0,
                  lambda: 5.0, deadlines, Background(), Cooldown(failures=1, secs=30.0))
    deadlines.calls.add(lease)
    return lease, ts, limiter, deadlines


async def test_a_failure_after_commit_counts_once() -> None:
    lease, ts, limiter, deadlines = await leased()
    lease.finish("stream cut")
    lease.finish("stream cut")
    assert ts.in_flight == 0 and limiter.active == 0 and not deadlines.calls
    assert list(ts.history) == [False] and ts.breaker.failures == 1


async def test_a_whole_answer_drains_the_tail_then_lets_go() -> None:
    lease, ts, limiter, _ = await leased(tail())
    lease.finish_after_end()
    assert ts.in_flight == 1 and not lease.finished  # read off the client's path, in a task
    for _ in range(20):
        await asyncio.sleep(0.005)
    assert lease.finished and ts.in_flight == 0 and limiter.active == 0
    assert list(ts.history) == [] and ts.breaker.failures == 0  # the client's answer was whole


async def test_an_upstream_already_at_its_end_lets_go_at_once() -> None:
    lease, ts, limiter, _ = await leased()
    lease.finish_after_end()
    assert lease.finished and ts.in_flight == 0 and limiter.active == 0


async def test_the_state_hears_the_first_token_once_after_the_clients_first_write() -> None:
    """The sample the walker measured at the commit is told when the relay has written the opening
    (``committed``), once, off the client's path; the walker no longer tells it at the commit."""
    lease, ts, _, _ = await leased()
    lease.sample = (0.25, 4.0)
    state = lease.slot.state
    assert state.tracker.samples(ts.key) == 0 and list(ts.history) == []  # not yet: the client waits on nothing
    lease.committed()
    lease.committed()
    lease.finish()
    assert state.tracker.samples(ts.key) == 1 and list(ts.history) == [True]


async def test_a_stream_that_breaks_before_its_first_write_tells_its_first_token_before_the_failure() -> None:
    """A broken opening (or a client gone before the first write) finishes the lease without a write:
    the success is told first, then the failure, in the order the walker used to tell them."""
    lease, ts, _, _ = await leased()
    lease.sample = (0.25, 4.0)
    lease.finish("stream cut")
    assert lease.slot.state.tracker.samples(ts.key) == 1
    assert list(ts.history) == [True, False] and ts.breaker.failures == 1

"""The slot an attempt holds: limiter place, in-flight count and probe go back once, on every path."""

from __future__ import annotations

import asyncio

import pytest

from proxy.config import Cooldown
from proxy.sim.transport import SimUpstream
from proxy.state import State, TargetState
from proxy.state.breaker import PROBE
from proxy.walk.limiter import Limiter
from proxy.walk.slot import Reservation, Slot

STATE = State()  # the slot changes its target only through the state's methods


def probing() -> TargetState:
    ts = STATE.target(("p", "m"))
    STATE.targets.clear()  # a fresh record each time
    STATE.failed(ts, 0.0, Cooldown(failures=1, secs=1.0), "503")
    assert STATE.admit(ts, 2.0) == PROBE
    return ts


@pytest.mark.parametrize("heard", [pytest.param(False, id="no-verdict"), pytest.param(True, id="verdict")])
async def test_a_taken_slot_gives_everything_back_once(heard: bool) -> None:
    ts, limiter = probing(), Limiter(limit=1, queue=0)
    slot = Slot(STATE, ts, limiter, probe=True)
    assert ts.in_flight == 0  # not counted while it waits for its place
    await slot.queue()
    slot.upstream = SimUpstream(200, {}, None, None)
    assert ts.in_flight == 1 and limiter.active == 1 and not slot.queued()
    slot.heard = heard
    for _ in range(3):
        slot.release()
    assert ts.in_flight == 0 and limiter.active == 0
    assert slot.upstream.at_eof()  # closed
    assert ts.breaker.probing is heard  # an unheard probe lets the next request probe


async def test_a_slot_cancelled_while_queued_counts_nothing() -> None:
    ts, limiter = probing(), Limiter(limit=1, queue=1)
    await limiter.acquire()  # someone else holds the only place
    slot = Slot(STATE, ts, limiter, probe=True)
    task = asyncio.create_task(slot.queue())
    await asyncio.sleep(0)
    assert slot.queued() and ts.in_flight == 0
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    slot.release()
    slot.release()
    assert ts.in_flight == 0 and limiter.active == 1 and not limiter.waiters  # the other's place stays
    assert not ts.breaker.probing


async def test_a_slot_never_taken_releases_only_its_probe() -> None:
    ts = probing()
    slot = Slot(STATE, ts, None, probe=True)
    slot.release()
    assert ts.in_flight == 0 and not ts.breaker.probing and not slot.queued()


async def test_a_plain_slot_leaves_someone_elses_probe_alone() -> None:
    ts = probing()
    slot = Slot(STATE, ts, None, probe=False)
    assert ts.in_flight == 1  # no limit to wait for: in flight from its admission
    slot.release()
    slot.release()
    assert ts.in_flight == 0 and ts.breaker.probing


@pytest.mark.parametrize("buffered", [pytest.param(False, id="streamed"), pytest.param(True, id="buffered")])
def test_a_racers_reservation_counts_at_once_and_gives_back_once(buffered: bool) -> None:
    ts = STATE.target(("p", "m"))
    reserved = Reservation(STATE, ts, buffered)
    assert ts.in_flight == 1 and ts.buffering == int(buffered)  # seen by requests planned before its task runs
    for _ in range(3):  # the task's first step and the done-callback both give it back
        reserved.release()
    assert ts.in_flight == 0 and ts.buffering == 0

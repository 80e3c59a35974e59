"""The concurrency limiter: a slot, a bounded queue, and busy at once beyond it."""

from __future__ import annotations

import asyncio

import pytest

from proxy.walk.limiter import Busy, Limiter


async def test_limit_then_queue_then_busy() -> None:
    lim = Limiter(limit=1, queue=1)
    await lim.acquire()
    waiter = asyncio.create_task(lim.acquire())
    await asyncio.sleep(0)
    assert lim.active == 1 and len(lim.waiters) == 1
    with pytest.raises(Busy):
        await lim.acquire()  # never an unbounded wait
    lim.release()  # hands the slot to the waiter
    await waiter
    assert lim.active == 1 and not lim.waiters
    lim.release()
    assert lim.active == 0


async def test_no_queue_means_busy_at_the_limit() -> None:
    lim = Limiter(limit=2, queue=0)
    await lim.acquire()
    await lim.acquire()
    with pytest.raises(Busy):
        await lim.acquire()


async def test_unlimited() -> None:
    lim = Limiter(limit=0, queue=0)
    for _ in range(100):
        await lim.acquire()
    assert lim.active == 100


async def test_cancelled_waiter_gives_its_place_back() -> None:
    lim = Limiter(limit=1, queue=1)
    await lim.acquire()
    waiter = asyncio.create_task(lim.acquire())
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert not lim.waiters
    lim.release()
    assert lim.active == 0
    await lim.acquire()  # the queue place is free again
    assert lim.active == 1


async def test_a_fleet_share_caps_the_calls_and_a_grown_share_wakes_the_queue() -> None:
    part = {"now": 1}
    lim = Limiter(limit=4, queue=4, share=lambda limit: part["now"])  # this instance's part of the fleet's 4
    await lim.acquire()
    waiters = [asyncio.create_task(lim.acquire()) for _ in range(2)]
    await asyncio.sleep(0)
    assert lim.active == 1 and len(lim.waiters) == 2
    part["now"] = 4  # a member left (or the link dropped): the whole limit is this instance's
    lim.wake()
    await asyncio.gather(*waiters)
    assert lim.active == 3 and not lim.waiters
    part["now"] = 2  # a member joined: calls above the new part run out, none is let in meanwhile
    lim.release()
    third = asyncio.create_task(lim.acquire())
    await asyncio.sleep(0)
    assert lim.active == 2 and len(lim.waiters) == 1
    lim.release()
    await third
    assert lim.active == 2


async def test_a_member_with_no_share_of_the_fleets_limit_is_busy_at_once_not_queued() -> None:
    # a limit of 1 split among two members leaves one of them none (docs/adr/0016): with a queue, its
    # callers waited with no bound (a reviewer held them 15 s, until the client gave up); they fail over
    lim = Limiter(limit=1, queue=4, share=lambda limit: 0)
    with pytest.raises(Busy):
        await asyncio.wait_for(lim.acquire(), timeout=1.0)
    assert lim.active == 0 and not lim.waiters


async def test_callers_queued_when_the_share_falls_to_none_fail_over_at_once() -> None:
    # a member joined while this one's callers queued: its share of a limit of 1 is now none, and it
    # stays none while the members stay, so they are told Busy (and fail over), not left waiting
    part = {"now": 1}
    lim = Limiter(limit=1, queue=4, share=lambda limit: part["now"])
    await lim.acquire()
    queued = [asyncio.create_task(lim.acquire()) for _ in range(2)]
    await asyncio.sleep(0)
    assert len(lim.waiters) == 2
    part["now"] = 0
    lim.wake()
    done, _ = await asyncio.wait(queued, timeout=1.0)
    assert len(done) == 2 and all(isinstance(task.exception(), Busy) for task in done)
    assert lim.active == 1 and not lim.waiters  # the call already running keeps its place to its end
    lim.release()
    assert lim.active == 0

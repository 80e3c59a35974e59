"""Slot: what one attempt holds on its target while it runs, given back exactly once.

An attempt takes a place in the provider's limiter (when it has one), counts itself in
the target's ``in_flight``, may be the breaker's half-open probe, and, once sent, holds
the upstream call. All of it goes back in one ``release()``, whichever way the attempt
ends: a failure, a client error, a cancel, or (through its :class:`~proxy.walk.lease.Lease`)
the end of a committed stream. A second call is a no-op, so no path can give twice.
"""

from __future__ import annotations

from ..state import State, TargetState
from ..upstream.transport import Upstream
from .limiter import Limiter

__all__ = ["Reservation", "Slot"]


class Slot:
    __slots__ = ("_buffered", "_counted", "_held", "_probe", "heard", "limiter", "load", "released", "state", "ts",
                 "upstream")

    def __init__(self, state: State, ts: TargetState, limiter: Limiter | None, probe: bool,
                 buffered: bool = False) -> None:
        self.state = state  # every change to the target goes through it
        self.ts = ts
        self._buffered = buffered  # a buffered call also counts in ``buffering`` (its mode's measuring)
        self.limiter = limiter  # the provider's limit, if it has one
        self._held = False  # a place in it is ours
        self._counted = False  # counted in the target's in_flight
        self._probe = probe  # the breaker's half-open probe: let go unless it heard a verdict
        self.heard = False  # the breaker heard this attempt's success or failure
        self.upstream: Upstream | None = None  # the call, once sent
        self.released = False
        self.load = 0  # the target's other attempts in flight when this one was counted (the load fit)
        if limiter is None:  # nothing to wait for: in flight from its admission
            self.load = state.call_admitted(ts, buffered)
            self._counted = True

    async def queue(self) -> None:
        """Wait for a place under the provider's limit (only when it has one: a coroutine per
        attempt is measurable on the hot path), then count in flight."""
        limiter = self.limiter
        assert limiter is not None
        await limiter.acquire()
        self._held = True
        # Counted in flight once it holds its place: a call still queued is not, for the planner
        # must not see it as load on the target.
        self.load = self.state.call_admitted(self.ts, self._buffered)
        self._counted = True

    def queued(self) -> bool:
        """Still waiting for our own limit: a timeout now is ours (busy), not the provider's."""
        return self.limiter is not None and not self._held

    def release(self) -> None:
        """Close the call and give back the count, the limiter place and an unheard probe."""
        if self.released:
            return
        self.released = True
        if self.upstream is not None:
            self.upstream.close()
        if self._counted:
            self.state.call_released(self.ts, self._buffered)
        if self._held and self.limiter is not None:
            self.limiter.release()
        if self._probe and not self.heard:
            self.state.probe_released(self.ts)


class Reservation:
    """A racer counted in flight from the moment it is started, until its attempt counts itself.

    Requests planned between a racer's start and its task's first run (a burst that arrived
    together) must see the target as busy, or they all lead with the same unmeasured target.
    The racer's task gives the count back first thing, before its attempt's Slot takes it with
    no await in between; a task cancelled before it ever ran gives it back in a done-callback.
    Given back once, whichever comes first."""

    __slots__ = ("_buffered", "_state", "_ts")

    def __init__(self, state: State, ts: TargetState, buffered: bool) -> None:
        state.call_admitted(ts, buffered)
        self._state = state
        self._ts: TargetState | None = ts
        self._buffered = buffered

    def release(self) -> None:
        ts = self._ts
        if ts is not None:
            self._ts = None
            self._state.call_released(ts, self._buffered)

"""Another instance's events folded into this one's state, through State's ``heard_*`` methods.

No I/O: the link reads a batch and hands it here with this process's clock. What is heard is
never told back (the ``heard_*`` methods call no listener), so events do not echo round the fleet.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..config import Cooldown, TargetKey
from ..state import State
from ..state.breaker import MAX_COOLDOWN
from .wire import Wire

__all__ = ["Peers", "fold", "split"]

PEER_LOAD_SECS = 3.0  # a peer's in-flight counts stand this long unless renewed (its heartbeat: every second)


def split(limit: int, members: int, rank: int) -> int:
    """The part of a fleet-wide limit for the member at ``rank`` (0-based, in the members' names'
    order): an even split, the first ``limit % members`` one more, so the parts sum to the limit."""
    return limit // members + (rank < limit % members)


class Peers:
    """The calls other instances have in flight, per fleet id, as they last said (and until when)."""

    def __init__(self) -> None:
        self.loads: dict[str, tuple[dict[str, int], float]] = {}  # instance -> (fid -> count, valid until)
        self._members: tuple[str, ...] = ()  # the live ones, sorted; recomputed when they may change
        self._until = -math.inf

    def heard(self, instance: str, loads: Any, now: float, at: float | None = None) -> None:
        """``at``: when the peer told it (this process's clock); it stands PEER_LOAD_SECS from then."""
        if instance not in self.loads:  # a newcomer: forget the instances that went quiet (restarts)
            self.loads = {i: v for i, v in self.loads.items() if v[1] > now - 60.0}
        if isinstance(loads, dict):
            until = (now if at is None else at) + PEER_LOAD_SECS
            old = self.loads.get(instance)
            self.loads[instance] = ({str(k): int(v) for k, v in loads.items() if isinstance(v, int)}, until)
            if (old is None or old[1] <= now) and until > now:
                self._until = -math.inf  # one more live member

    def members(self, now: float) -> tuple[str, ...]:
        """The other instances heard from within PEER_LOAD_SECS (each tells its loads at least every
        second while it is in the fleet; one late beat is forgiven), sorted: what splits a fleet-wide limit."""
        if now >= self._until:
            live = {i: until for i, (_, until) in self.loads.items() if until > now}
            self._members = tuple(sorted(live))
            self._until = min(live.values(), default=math.inf)
        return self._members

    def in_flight(self, fid: str, now: float) -> int:
        return sum(counts.get(fid, 0) for counts, until in self.loads.values() if until > now)


def fold(state: State, instance: str, wires: Sequence[Wire], keys_of: Mapping[str, Sequence[TargetKey]],
         now: float, to_local: Callable[[float], float], peers: Peers, told: float | None = None) -> int:
    """Apply one peer batch (``told``: when its entry was written, on this process's clock; it dates
    the failures, whose events carry no time); returns how many events applied to a target this instance has.

    A peer's word is bounded here as our own would be: a deadline at most the breaker's longest
    cooldown ahead (a peer's clock an hour fast, or a forged entry, cannot open a breaker for
    longer), a sample finite and not negative; an event of any other shape is skipped alone."""
    applied = 0
    for wire in wires:
        try:
            kind = wire[0]
            if kind == "n":  # told at wire[2]: a warm start's old heartbeats are not live members
                peers.heard(instance, wire[1], now, min(now, to_local(_bounded(wire[2], 0.0, math.inf))))
                continue
            keys = keys_of.get(wire[1], ()) if isinstance(wire[1], str) else ()
            if keys:  # read and bounded once, applied to every local target of the fleet id
                _apply(state, [state.target(key) for key in keys], wire, now, to_local, instance, told)
                applied += len(keys)
        except (TypeError, ValueError, KeyError, IndexError):
            continue  # a malformed event from a peer of another version: skipped alone
    return applied


def _apply(state: State, targets: list[Any], wire: Wire, now: float, to_local: Callable[[float], float],
           by: str, told: float | None) -> None:
    kind = wire[0]
    if kind in ("s", "c"):  # a sample from a clock ahead of ours lands now, not in our future
        at = min(now, to_local(_bounded(wire[4], 0.0, math.inf)))
        seconds, mode, censored = _bounded(wire[3], 0.0, 86400.0), str(wire[2]), kind == "c"
        for ts in targets:
            state.heard_sample(ts, seconds, at, mode, censored, by)
    elif kind == "f":
        cooldown = Cooldown(failures=max(1, int(wire[3])), secs=_bounded(wire[4], 0.0, MAX_COOLDOWN))
        for ts in targets:
            state.heard_failure(ts, now, cooldown, by, told)
    elif kind == "o":
        told = to_local(_bounded(wire[2], 0.0, math.inf))
        until = min(told, now + MAX_COOLDOWN)
        cooldown_secs = _bounded(wire[3], 0.0, MAX_COOLDOWN)
        opened = min(now, told - cooldown_secs)  # the opener set until = then + cooldown: when it opened, not heard
        for ts in targets:
            state.heard_open(ts, until, cooldown_secs, by, opened)
    elif kind == "r":
        until = min(to_local(_bounded(wire[2], 0.0, math.inf)), now + MAX_COOLDOWN)
        for ts in targets:
            state.heard_cool(ts, until, by, now)
    else:
        raise ValueError(kind)


def _bounded(value: Any, low: float, high: float) -> float:
    """A number from a peer, finite and within [low, high], or a ValueError (the event is skipped)."""
    number = float(value)
    if not math.isfinite(number) or number < low:
        raise ValueError(value)
    return min(number, high)


def told_at(entry_id: str, offset: float, now: float) -> float | None:
    """When an entry was written (its id's milliseconds, Redis's wall clock), on this process's clock and
    not after ``now``: a failure folded from a warm start or a catch-up is dated then, not when read, so
    a success the same backlog brings later, taken after it, still resets the count."""
    try:
        return min(now, int(entry_id.split("-")[0]) / 1000 + offset)
    except ValueError:
        return None

"""Another instance's events folded into this one's state, through State's ``heard_*`` methods.

No I/O: the link reads a batch and hands it here with this process's clock. What is heard is
never told back (the ``heard_*`` methods call no listener), so events do not echo round the fleet.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..config import Cooldown, TargetKey
from ..state import State
from .wire import Wire

__all__ = ["Peers", "fold"]

PEER_LOAD_SECS = 2.0  # a peer's in-flight counts stand this long unless renewed


class Peers:
    """The calls other instances have in flight, per fleet id, as they last said (and until when)."""

    def __init__(self) -> None:
        self.loads: dict[str, tuple[dict[str, int], float]] = {}  # instance -> (fid -> count, valid until)

    def heard(self, instance: str, loads: Any, now: float) -> None:
        if instance not in self.loads:  # a newcomer: forget the instances that went quiet (restarts)
            self.loads = {i: v for i, v in self.loads.items() if v[1] > now - 60.0}
        if isinstance(loads, dict):
            self.loads[instance] = ({str(k): int(v) for k, v in loads.items() if isinstance(v, int)},
                                    now + PEER_LOAD_SECS)

    def in_flight(self, fid: str, now: float) -> int:
        return sum(counts.get(fid, 0) for counts, until in self.loads.values() if until > now)


def fold(state: State, instance: str, wires: Sequence[Wire], keys_of: Mapping[str, Sequence[TargetKey]],
         now: float, to_local: Callable[[float], float], peers: Peers) -> int:
    """Apply one peer batch; returns how many events applied to a target this instance has."""
    applied = 0
    for wire in wires:
        kind = wire[0]
        if kind == "n":
            peers.heard(instance, wire[1], now)
            continue
        for key in keys_of.get(wire[1], ()):
            ts = state.target(key)
            try:
                if kind in ("s", "c"):  # a sample from a clock ahead of ours lands now, not in our future
                    at = min(now, to_local(float(wire[4])))
                    state.heard_sample(ts, float(wire[3]), at, str(wire[2]), kind == "c")
                elif kind == "f":
                    state.heard_failure(ts, now, Cooldown(failures=int(wire[3]), secs=float(wire[4])))
                elif kind == "o":
                    state.heard_open(ts, to_local(float(wire[2])), float(wire[3]))
                elif kind == "r":
                    state.heard_cool(ts, to_local(float(wire[2])))
            except (TypeError, ValueError, KeyError):
                continue  # a malformed event from a peer of another version: skipped alone
            applied += 1
    return applied

"""What observers read of the state: immutable per-target figures taken at one instant.

The metrics scrape reads these instead of walking the live state, so an observer can neither
decide nor write what the walker owns. One record per target of every route, in written order
(a target two routes share appears under each, with that route's ``fastest`` policy).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

from ..config import Config, Target
from .breaker import Health
from .tracker import MODES

if TYPE_CHECKING:
    from . import State

__all__ = ["ModeFigure", "TargetFigures", "snapshot"]


@dataclass(frozen=True, slots=True)
class ModeFigure:
    """One mode's series (streamed: first token; buffered: whole answer)."""

    figure: float | None  # None: unmeasured or stale
    samples: int
    age: float | None  # seconds since the newest sample


@dataclass(frozen=True, slots=True)
class TargetFigures:
    route: str
    target: Target
    modes: Mapping[str, ModeFigure]  # read-only, by mode
    health: Health
    in_flight: int
    # Who last changed the figure / the breaker: (instance, what, when on this process's clock);
    # the instance is "" for this one outside a fleet.
    figure_by: tuple[str, str, float] | None = None
    breaker_by: tuple[str, str, float] | None = None


def snapshot(state: State, config: Config, now: float) -> tuple[TargetFigures, ...]:
    out = []
    for route in config.routes.values():
        for target in route.targets:
            modes = MappingProxyType({mode: ModeFigure(state.figure(target.key, route.fastest, now, mode),
                                                       state.tracker.samples(target.key, mode),
                                                       state.tracker.age(target.key, now, mode))
                                      for mode in MODES})
            ts = state.targets.get(target.key)
            out.append(TargetFigures(route.name, target, modes, state.health(target.key, now),
                                     state.in_flight(target.key), None if ts is None else ts.figure_by,
                                     None if ts is None else ts.breaker_by))
    return tuple(out)

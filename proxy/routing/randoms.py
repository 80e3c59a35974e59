"""One random generator per route, for the planner's exploration and ties.

A route's generator is seeded from its ``fastest.seed`` and kept across a reload that keeps the
seed, so a reload does not restart a seeded route's sequence; a route that is gone takes its
generator with it. A name no route has shares one unseeded generator.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from ..config import Route

__all__ = ["RouteRandoms"]


class RouteRandoms:
    def __init__(self) -> None:
        self._by_route: dict[str, random.Random] = {}
        self._seeds: dict[str, int | None] = {}
        self._shared = random.Random()

    def apply(self, routes: Mapping[str, Route]) -> None:
        """Adopt a config's routes: keep a generator whose route kept its seed, seed the rest."""
        by_route: dict[str, random.Random] = {}
        for name, route in routes.items():
            prev = self._by_route.get(name)
            same_seed = name in self._seeds and self._seeds[name] == route.fastest.seed
            by_route[name] = prev if prev is not None and same_seed else random.Random(route.fastest.seed)
        self._by_route = by_route
        self._seeds = {name: route.fastest.seed for name, route in routes.items()}

    def of(self, route: str) -> random.Random:
        return self._by_route.get(route) or self._shared

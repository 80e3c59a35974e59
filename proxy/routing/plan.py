"""plan(): config + state snapshot + clock + generator -> Decision. No I/O.

The server calls it for every routed request and the explain endpoint calls the
very same function with ``explore=False``, so what explain shows cannot drift
from what requests get.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Protocol

from ..config import MODEL_IN_PATH, Config, Route, Target, path_segment_problem
from ..errors import ClientError
from ..state.budget import RESERVE
from ..state.tracker import STREAMED
from .decision import Decision, Excluded, Ranked
from .eligibility import HealthView, eligible, hard_reason
from .explore import ExploreView, confirming, due
from .hedge import Opening, RaceView, opening
from .ordering import OrderView, order_targets


class Snapshot(HealthView, OrderView, RaceView, ExploreView, Protocol):
    """What the planner reads of the state."""


@dataclass(slots=True)  # built per request: a frozen init costs about three times as much
class Ask:
    """What routing needs from a request, and nothing more."""

    id: str
    model: str
    pin: str | None = None  # x-route-provider
    tokens: int | None = None  # estimated prompt + max_tokens, when a target declares a window
    op: str = "chat"  # the operation, for the score strategy's measured cost per call
    mode: str = STREAMED  # whose figures rank it: streamed (first token) or buffered (whole answer)


@dataclass(slots=True)  # built per request: a frozen init costs about three times as much
class Plan:
    decision: Decision
    route: Route
    targets: tuple[Target, ...]  # in decision order
    rescued: str | None = None  # kept by health's last resort: the walker tries it although unhealthy
    unservable: str | None = None  # no target left and none ever could be: the 400's code
    together: int = 1  # targets the walk starts at once: 2 when an explored or unmeasured one races
    opening: Opening | None = None  # a hedged route's race, as the walk is to run it (not behind a pin)


class Refused(ClientError):
    """A request routing cannot take (unknown route, bad pin); carries the decision if any."""

    def __init__(self, status: int, message: str, *, code: str, decision: Decision | None = None):
        super().__init__(status, message, code=code, param="model")
        self.decision = decision


def find_route(config: Config, model: str) -> tuple[Route, bool]:
    """The route a model name asks for; ``provider/upstream-model`` makes a one-target route."""
    route = config.routes.get(model)
    if route is not None:
        return route, False
    provider, sep, upstream = model.partition("/")
    if sep and upstream and provider in config.providers:
        kind = config.providers[provider].kind
        problem = path_segment_problem(upstream) if kind in MODEL_IN_PATH else None
        if problem is not None:  # it would leave the provider's path (an Azure deployment's URL)
            raise Refused(400, f"The model '{model}' pins {kind} provider '{provider}' to '{upstream}', "
                               f"which {problem}.", code="invalid_model")
        target = Target(name=provider, provider=provider, model=upstream)
        return Route(name=model, strategy="ordered", targets=(target,)), True
    if sep:  # route names have no '/': this is a pin to a provider firstbyte does not know
        names = ", ".join(sorted(config.providers)) or "none"
        raise Refused(
            400,
            f"The model '{model}' pins provider '{provider}', which is not configured "
            f"(providers: {names}); send provider/upstream-model or a route name.",
            code="unknown_pin",
        )
    known = ", ".join(sorted(config.routes)) or "none"
    raise Refused(
        404,
        f"The model '{model}' does not exist: it is neither a route (routes: {known}) "
        "nor provider/upstream-model with a configured provider.",
        code="model_not_found",
    )


def plan(
    config: Config,
    ask: Ask,
    state: Snapshot,
    now: float,
    rng: random.Random,
    *,
    explore: bool = True,
) -> Plan:
    """The order this request gets: pin check, eligibility, ordering; a blocked pin is a 400."""
    route, direct = find_route(config, ask.model)
    pinned = _pin(route, direct, ask)
    result = eligible(route, config.providers, ask.tokens, state, now)
    if pinned is not None:
        _refuse_blocked(route, pinned, ask, config, state, now, result.excluded)
    rest = list(result.targets) if pinned is None else [t for t in result.targets if t is not pinned]
    # Behind a pin nobody leads, so exploring would only shuffle the fallback.
    out, ranked = order_targets(route, rest, state, now, rng, explore and pinned is None, ask.op, ask.mode)
    if pinned is not None:
        out.insert(0, pinned)
        # Behind a pin nobody is first: each fallback keeps only its figure.
        ranked = [Ranked(pinned.name, "pinned", state.figure(pinned.key, route.fastest, now, ask.mode)),
                  *[r._replace(reason=None) for r in ranked]]
    elif result.rescued is not None and ranked:
        ranked[0] = Ranked(ranked[0].name, "soonest to reopen")
    decision = Decision(ask.id, route.name, route.strategy, tuple(ranked), result.excluded)
    together = 1
    hedge = route.hedge
    if (hedge is not None and hedge.explore and pinned is None and len(out) > 1 and ranked
            and ranked[0].reason in ("explore", "unmeasured")):
        together = 2  # learning races the next target instead of making the client wait for it
    race = None
    if hedge is not None and pinned is None and out:
        looks: frozenset[str] = frozenset()  # not frozenset[str](): calling an alias tries, fails and forgets a setattr
        keep = RESERVE
        if route.strategy == "fastest" and hedge.explore and len(out) > 1:  # alone: nobody to look at
            figures = {r.name: r.figure for r in ranked}
            looks = due(route, out, state, ask.mode, figures)
            if together == 2 and ranked[0].reason == "explore" and confirming(out[0], figures, state, ask.mode):
                keep = 0.0  # a recovery seen once is worth the hedge's reserve token
        race = opening(hedge, route.name, out, decision.first_reason, together, state, now, ask.mode, looks, keep)
    return Plan(decision, route, tuple(out), result.rescued, result.unservable, together, race)


def _pin(route: Route, direct: bool, ask: Ask) -> Target | None:
    """The target the request pins (its model names a provider, or x-route-provider), checked."""
    if direct:
        pinned = route.targets[0]
        if ask.pin is not None and ask.pin != pinned.name:
            raise Refused(
                400,
                f"x-route-provider '{ask.pin}' contradicts the model '{ask.model}', "
                f"which already pins provider '{pinned.name}'.",
                code="unknown_pin",
            )
        return pinned
    if ask.pin is None:
        return None
    found = route.target(ask.pin)
    if found is None:
        names = ", ".join(t.name for t in route.targets)
        raise Refused(
            400,
            f"x-route-provider: route '{route.name}' has no target '{ask.pin}' (targets: {names})",
            code="unknown_pin",
        )
    return found


def _refuse_blocked(route: Route, pinned: Target, ask: Ask, config: Config, state: Snapshot, now: float,
                    excluded: tuple[Excluded, ...]) -> None:
    """A pin a hard filter or its breaker removes is a 400 with the decision: never re-routed."""
    reason = hard_reason(route, pinned, ask.tokens, config.providers)
    if reason is None:
        health = state.health(pinned.key, now)
        if health.usable:
            return
        reason = health.reason
    others = tuple(e for e in excluded if e.name != pinned.name)
    decision = Decision(id=ask.id, route=route.name, strategy=route.strategy, order=(),
                        excluded=(Excluded(pinned.name, reason), *others))
    raise Refused(
        400,
        f"The pinned target '{pinned.name}' of route '{route.name}' cannot serve: "
        f"{reason}. A pin is never re-routed; drop the pin or wait.",
        code="pin_unavailable",
        decision=decision,
    )

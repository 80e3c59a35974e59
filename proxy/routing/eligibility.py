"""Eligibility: which targets may serve this request. It only ever subtracts.

The filters run in a fixed order and each removed target gets exactly one
reason: allow/deny, capability (the request's size, then the declared floors),
credentials, health. (The pin is checked by the
planner around these: a pinned target removed by a hard filter is a 400, not a
silent re-route.) Health never empties a pool by itself: when it alone would
remove every remaining target, the one soonest to reopen is kept. Exclusions
list the hard filters' removals in written order, then health's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from ..config import Provider, Route, Target, TargetKey
from ..state.breaker import Health
from .decision import Excluded


class HealthView(Protocol):
    def health(self, key: TargetKey, now: float) -> Health: ...


@dataclass(slots=True)  # built per request: a frozen init costs about three times as much
class Eligible:
    targets: tuple[Target, ...]
    excluded: tuple[Excluded, ...]
    rescued: str | None = None  # a target kept although health would remove it
    # Nothing left, and only what the request asks (its size) or the route's floors removed
    # it besides allow/deny: no retry can succeed. The code the client's 400 carries.
    unservable: str | None = None


def access_reason(route: Route, target: Target) -> str | None:
    """The route's allow and deny lists; the reason names the list that removed the target."""
    if route.allow and target.name not in route.allow:
        return "not in allow"
    if target.name in route.deny:
        return "deny"
    return None


def capability(route: Route, target: Target, tokens: int | None) -> tuple[str, str] | None:
    """(code, reason) when the target is too small for this request or below a declared floor
    (an undeclared value does not qualify); the code is what a client's 400 carries."""
    if tokens is not None and target.context_window is not None and target.context_window < tokens:
        return "context_length_exceeded", f"context {target.context_window} < {tokens}"
    if route.min_context_window is not None and (
        target.context_window is None or target.context_window < route.min_context_window
    ):
        declared = "undeclared" if target.context_window is None else str(target.context_window)
        return "min_context_window", f"context window {declared} below min {route.min_context_window}"
    if route.min_quality is not None and (target.quality is None or target.quality < route.min_quality):
        declared = "undeclared" if target.quality is None else f"{target.quality:g}"
        return "min_quality", f"quality {declared} below min {route.min_quality:g}"
    return None


def capability_reason(route: Route, target: Target, tokens: int | None) -> str | None:
    found = capability(route, target, tokens)
    return None if found is None else found[1]


def credentials_reason(target: Target, providers: Mapping[str, Provider]) -> str | None:
    """An unset ``api_key_env`` excludes the provider's targets instead of failing the whole file."""
    provider = providers.get(target.provider)
    if provider is None or not provider.has_credentials:
        return "no credentials"
    return None


def hard_reason(
    route: Route, target: Target, tokens: int | None, providers: Mapping[str, Provider]
) -> str | None:
    """The hard filters in their fixed order; the first that removes the target gives the reason.

    With ``tokens=None`` only the load-time ones speak, which is what ``firstbyte check`` shows.
    """
    return (
        access_reason(route, target)
        or capability_reason(route, target, tokens)
        or credentials_reason(target, providers)
    )


class _Hard(NamedTuple):
    """The hard filters' verdict on a route's targets: who passed, who did not and why."""

    route: Route
    providers: Mapping[str, Provider]
    passed: tuple[Target, ...]
    excluded: tuple[Excluded, ...]
    codes: tuple[str, ...]  # capability's codes, in written order
    lifted: bool  # a removal time or an operator can lift: credentials


# Without a request size the hard filters read only the config, so their verdict per route is kept
# (a reload brings new Route objects, hence new entries). Keyed by identity and checked against the
# objects held, so an id reused after a route is gone never matches.
_HARD: dict[int, _Hard] = {}
_HARD_MAX = 512  # a provider/model pin makes a route per request: the memo is cleared, not grown


def _hard_filters(route: Route, providers: Mapping[str, Provider], tokens: int | None) -> _Hard:
    if tokens is None:
        known = _HARD.get(id(route))
        if known is not None and known.route is route and known.providers is providers:
            return known
    passed: list[Target] = []
    excluded: list[Excluded] = []
    codes: list[str] = []
    lifted = False
    for target in route.targets:
        reason = access_reason(route, target)
        if reason is None:
            found = capability(route, target, tokens)
            if found is not None:
                code, reason = found
                codes.append(code)
        if reason is None:
            reason = credentials_reason(target, providers)
            lifted = lifted or reason is not None
        if reason is None:
            passed.append(target)
        else:
            excluded.append(Excluded(target.name, reason))
    hard = _Hard(route, providers, tuple(passed), tuple(excluded), tuple(codes), lifted)
    if tokens is None:
        if len(_HARD) >= _HARD_MAX:
            _HARD.clear()
        _HARD[id(route)] = hard
    return hard


def eligible(
    route: Route,
    providers: Mapping[str, Provider],
    tokens: int | None,
    state: HealthView,
    now: float,
) -> Eligible:
    """What may serve this request, and one reason for every target removed."""
    hard = _hard_filters(route, providers, tokens)
    kept: list[Target] = []
    unhealthy: list[tuple[Target, Health]] = []
    for target in hard.passed:
        health = state.health(target.key, now)
        if health.usable:
            kept.append(target)
        else:
            unhealthy.append((target, health))
    if not unhealthy:  # the common case: health removed nobody, so everyone who passed is kept
        return Eligible(hard.passed, hard.excluded, None, None if kept else _unservable(hard))
    excluded = list(hard.excluded)
    rescued = None
    if not kept and unhealthy:
        # Health alone would empty the pool: keep the one soonest to reopen.
        best = min(unhealthy, key=lambda th: th[1].reopens_in)
        kept.append(best[0])
        rescued = best[0].name
    for target, health in unhealthy:
        if target.name != rescued:
            excluded.append(Excluded(target.name, health.reason))
    return Eligible(tuple(kept), tuple(excluded), rescued, None if kept else _unservable(hard))


def _unservable(hard: _Hard) -> str | None:
    """Nothing left, and only the request's size or the route's floors removed it besides allow/deny."""
    codes = hard.codes
    if not codes or hard.lifted:
        return None
    return "context_length_exceeded" if "context_length_exceeded" in codes else codes[0]

"""Helpers the routing tables share (test_plan, test_hedge): targets, configs and figures at a fixed now."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from proxy.config import Config, parse_config
from proxy.state import State

NOW = 1000.0


Setup = Callable[[State], None]


def t(provider: str, **extra: Any) -> dict[str, Any]:
    return {"provider": provider, "model": "m", **extra}


def config(strategy: str, targets: list[dict[str, Any]], **route: Any) -> Config:
    providers: dict[str, Any] = {p: {"kind": "simulated"} for p in ("a", "b", "c", "d")}
    providers["nokey"] = {"kind": "openai", "base_url": "http://127.0.0.1:9", "api_key_env": "UNSET_KEY"}
    raw = {"providers": providers, "routes": {"chat": {"strategy": strategy, "targets": targets, **route}}}
    return parse_config(raw, env={})


def unraced(targets: list[dict[str, Any]], **route: Any) -> Config:
    """A ``fastest`` route with ``hedge: false``: the walk one target at a time (a ``fastest`` route that
    says nothing races, docs/routing.md "The default")."""
    return config("fastest", targets, hedge=False, **route)


def fig(name: str, *secs: float, ago: float = 0.0) -> Setup:
    """Samples of time to first chunk for target ``name``, the newest ``ago`` seconds before NOW: calls
    one after another, each begun as the one before ended (samples stand in the order calls began)."""

    def setup(s: State) -> None:
        at = NOW - ago - sum(secs[1:])
        for i, x in enumerate(secs):
            at += x if i else 0.0
            s.tracker.record((name, "m"), x, at)

    return setup

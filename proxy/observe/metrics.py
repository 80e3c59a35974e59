"""Prometheus metrics through aioprometheus: counters fed by finished exchanges, gauges on scrape.

Counters and the first-chunk histogram move in :meth:`Metrics.on_finished`.
Per-target state (figure, breaker, in flight) and the ledger's drop count are
pushed by the server just before it calls :meth:`Metrics.render` for
``GET /metrics``, so they are read once per scrape rather than kept in step
with every state change.

Every label value is bounded by the config, never by client input: a route or
target this observer was not told about (a ``provider/model`` pin the client
typed) becomes ``other``; attempt outcomes keep three-digit codes and a fixed
set of failure words; first reasons keep the planner's words. A reload passes
the new names to :meth:`Metrics.reconfigure`, which also drops the gauges of
targets that no longer exist.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

from aioprometheus import Counter, Gauge, Histogram, Registry, render

from ..config import Config
from ..routing.decision import RACE_WORDS, duplicate_calls
from . import Finished
from .histograms import ClientLatency, observe_many

__all__ = [
    "BREAKER_STATES",
    "FIRST_CHUNK_BUCKETS",
    "FIRST_REASONS",
    "OUTCOME_WORDS",
    "Metrics",
    "hedged_from_config",
    "names_from_config",
]

OTHER = "other"
NONE = "none"

FIRST_CHUNK_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0)
FIRST_REASONS = frozenset(
    {"fastest", "explore", "unmeasured", "pinned", "written", "weighted", "cheapest", "score", "soonest", NONE}
)
OUTCOME_WORDS = frozenset(
    {
        "reset",
        "refused",
        "timeout",
        "busy",
        "dns",
        "tls",
        "connect",
        "cooldown",
        "untranslatable",
        "oversized",
        "error",  # an error event or body inside a 2xx, before the first token
        "invalid",  # a buffered 2xx that is not a JSON object
        "empty",  # a stream that ended before any content
        "malformed",
        "interim",  # an interim flood: 1xx answers past the bound, no final one
        "bad",  # a bad upstream status: 101, 3xx, or one HTTP does not define
        *RACE_WORDS,  # a racer's end: lost, measuring, measured, capped
    }
)
MAX_PENDING = 10000  # first-chunk observations held between scrapes before they are applied anyway
BREAKER_STATES = {"closed": 0, "open": 1, "probing": 2, "half_open": 2, "half-open": 2}

_CODE = re.compile(r"^[1-5]\d\d$")

# A finished exchange as counted: route, served, status, first reason, (target, outcome) per attempt,
# failovers.
_Key = tuple[str | None, str | None, int, str | None, tuple[tuple[str, str], ...], int]


def names_from_config(config: Config) -> tuple[set[str], set[str]]:
    """The route and target label values a config allows.

    Targets are known by display name and as ``provider/model`` for each
    declared pair, so a pin to a declared model keeps its own series.
    """
    routes = set(config.routes)
    targets = {t.name for route in config.routes.values() for t in route.targets}
    targets |= {f"{provider}/{model}" for provider, model in config.target_keys()}
    return routes, targets


def hedged_from_config(config: Config) -> dict[str, tuple[str, ...]]:
    """The routes with ``hedge`` and their target names: their race series exist from the start."""
    return {name: tuple(t.name for t in route.targets)
            for name, route in config.routes.items() if route.hedge is not None}


# Every series, in the order /metrics lists them: (attribute, kind, name, help).
_SERIES: tuple[tuple[str, type[Counter | Gauge | Histogram], str, str], ...] = (
    ("target_latency", Gauge, "firstbyte_target_latency_seconds",
     "Each target's current figure per mode: smoothed time to first token (streamed) "
     "or to the whole answer (buffered)."),
    ("requests", Counter, "firstbyte_requests_total", "Finished client requests."),
    ("attempts", Counter, "firstbyte_attempts_total", "Upstream attempts by target and outcome."),
    ("failovers", Counter, "firstbyte_failovers_total", "Targets moved past before one answered."),
    ("first_chunk", Histogram, "firstbyte_first_chunk_seconds", "Upstream time to first chunk of answered attempts."),
    ("breaker_state", Gauge, "firstbyte_breaker_state", "Breaker per target: 0 closed, 1 open, 2 probing."),
    ("in_flight", Gauge, "firstbyte_in_flight", "Upstream calls in flight per target."),
    ("decisions", Counter, "firstbyte_decisions_total", "Routing decisions by why the first target was first."),
    ("tokens", Counter, "firstbyte_tokens_total", "Tokens reported by the serving target."),
    ("cost", Counter, "firstbyte_cost_usd_total", "Cost in USD of served requests."),
    ("ledger_dropped", Counter, "firstbyte_ledger_dropped_total",
     "Decision rows the ledger dropped (writer behind or write failed)."),
    ("hedges", Counter, "firstbyte_hedges_total",
     "Second attempts started because the leader had no first token in time."),
    ("races_won", Counter, "firstbyte_races_won_total",
     "Races (two targets side by side) won, by the winning target."),
    ("duplicates", Counter, "firstbyte_duplicate_calls_total",
     "Upstream calls a route started beyond one per request by racing."),
    ("budget_exhausted", Counter, "firstbyte_hedge_budget_exhausted_total",
     "Hedges or exploring races the route's budget refused."),
    # Named as Prometheus names its own, so the usual "config reload failed" alert fits as it is.
    ("reload_ok", Gauge, "firstbyte_config_last_reload_successful",
     "1 if the last config load (start or SIGHUP reload) was taken, 0 if it was refused."),
    ("reload_at", Gauge, "firstbyte_config_last_reload_success_timestamp_seconds",
     "Epoch seconds of the last config load that was taken."),
    ("reloads", Counter, "firstbyte_config_reloads_total",
     "SIGHUP reloads since start, by result (taken, refused: the running config stayed)."),
    ("route_healthy", Gauge, "firstbyte_route_healthy_targets",
     "Targets of a route whose breaker is closed and that no Retry-After cools down (0: none healthy)."),
    ("connections", Gauge, "firstbyte_connections", "Client connections open now, per listener."),
    ("fleet_connected", Gauge, "firstbyte_fleet_connected", "1 while in the fleet (state.redis), 0 alone."),
    ("fleet_events", Counter, "firstbyte_fleet_events_total", "Fleet events sent (out) and folded in (in)."),
    ("fleet_dropped", Counter, "firstbyte_fleet_dropped_total", "Fleet events dropped (outbox full or send failed)."),
    ("fleet_lag", Gauge, "firstbyte_fleet_lag_seconds", "From a peer's event batch to its fold here, the last."),
    ("connections_closed", Counter, "firstbyte_connections_closed_total",
     "Client connections firstbyte cut itself, per listener and reason (header_timeout, "
     "body_timeout, over_capacity: answered 503, refused: closed unanswered past the margin)."),
)
# The counters on_finished feeds; _apply hands them their sums by name.
_FED = ("requests", "decisions", "failovers", "attempts", "tokens", "cost", "hedges", "races_won", "duplicates",
        "budget_exhausted")


class Metrics:
    """Observer owning an aioprometheus Registry with firstbyte's series."""

    target_latency: Gauge
    requests: Counter
    attempts: Counter
    failovers: Counter
    first_chunk: Histogram
    breaker_state: Gauge
    in_flight: Gauge
    decisions: Counter
    tokens: Counter
    cost: Counter
    ledger_dropped: Counter
    hedges: Counter
    races_won: Counter
    duplicates: Counter
    budget_exhausted: Counter
    reload_ok: Gauge
    reload_at: Gauge
    reloads: Counter
    route_healthy: Gauge
    connections: Gauge
    connections_closed: Counter
    fleet_connected: Gauge
    fleet_events: Counter
    fleet_dropped: Counter
    fleet_lag: Gauge

    def __init__(self, known_routes: Iterable[str] = (), known_targets: Iterable[str] = (),
                 hedged: Mapping[str, Iterable[str]] | None = None) -> None:
        self.routes = frozenset(known_routes)
        self.targets = frozenset(known_targets)
        self.registry = Registry()
        self._counters: dict[str, Counter] = {}  # the series fed per exchange, by their exposition name
        for attr, kind, name, doc in _SERIES:
            if kind is Histogram:
                series: Counter | Gauge | Histogram = Histogram(name, doc, registry=self.registry,
                                                                buckets=FIRST_CHUNK_BUCKETS)
            else:
                series = kind(name, doc, registry=self.registry)
            setattr(self, attr, series)  # the table names the attributes declared above
            if attr in _FED:
                assert isinstance(series, Counter)
                self._counters[name] = series
        self.ledger_dropped.set({}, 0)
        self._races: list[tuple[str, str | None, tuple[tuple[str, str], ...]]] = []
        self._counts: dict[_Key, int] = {}
        self._spent: list[tuple[str, str, dict[str, int], float | None]] = []
        self._observed: list[tuple[str, float]] = []
        self.client = ClientLatency(self.registry)  # what the clients saw, per route and status
        self._expect_races(hedged or {})

    @classmethod
    def from_config(cls, config: Config) -> Metrics:
        return cls(*names_from_config(config), hedged_from_config(config))

    def reconfigure(self, routes: Iterable[str], targets: Iterable[str],
                    hedged: Mapping[str, Iterable[str]] | None = None) -> None:
        """Take a reloaded config's names; gauges of targets that left are removed."""
        self._apply()  # what was counted before the reload keeps the names it had then
        self.routes = frozenset(routes)
        self.targets = frozenset(targets)
        for gauge in (self.target_latency, self.breaker_state, self.in_flight):
            for labels, _ in gauge.get_all():
                if labels.get("target") not in self.targets:
                    del gauge.values[labels]
        for labels, _ in self.route_healthy.get_all():
            if labels.get("route") not in self.routes:
                del self.route_healthy.values[labels]
        self._expect_races(hedged or {})

    def _expect_races(self, hedged: Mapping[str, Iterable[str]]) -> None:
        """A hedged route's race series read 0 before its first race, not absent: ``rate()`` and
        ``increase()`` over a series that does not exist yet give nothing, and an alert on the
        budget running dry would stay silent until the first refusal. A series already counting
        keeps its value."""
        for route, targets in hedged.items():
            by_route = {"route": self._route(route)}
            for counter in (self.hedges, self.duplicates, self.budget_exhausted):
                if by_route not in counter.values:
                    counter.set(by_route, 0)
            for target in targets:
                by_target = {"target": self._target(target)}
                if by_target not in self.races_won.values:
                    self.races_won.set(by_target, 0)

    # -- label bounding ----------------------------------------------------

    def _route(self, route: str | None) -> str:
        if not route:
            return NONE
        return route if route in self.routes else OTHER

    def _target(self, target: str | None) -> str:
        if not target:
            return NONE
        return target if target in self.targets else OTHER

    @staticmethod
    def _outcome(outcome: str) -> str:
        word = outcome.split(" ", 1)[0].lower()
        return word if _CODE.match(word) or word in OUTCOME_WORDS else OTHER

    @staticmethod
    def _status(status: int) -> str:
        text = str(status)
        return text if _CODE.match(text) else OTHER

    # -- the observer --------------------------------------------------------

    def on_finished(self, finished: Finished) -> None:
        """Count the exchange under its raw names; labels are bounded and handed to aioprometheus
        at scrape time (see _apply), once per distinct combination rather than once per request."""
        d = finished.decision
        if finished.operation:  # a routed endpoint: its latency as the client saw it
            self.client.note(d.route if d is not None else finished.asked, finished.status, finished.ttfc,
                             finished.total)
        if d is None:
            key: _Key = (None, None, finished.status, None, (), 0)
        else:
            attempts = d.attempts
            if len(attempts) == 1:
                a = attempts[0]
                tried: tuple[tuple[str, str], ...] = ((a.name, a.outcome),)
                if a.ttfc is not None:
                    self._observed.append((a.name, a.ttfc))
            else:
                tried = tuple((a.name, a.outcome) for a in attempts)
                self._observed.extend((a.name, a.ttfc) for a in attempts if a.ttfc is not None)
            key = (d.route, d.served, finished.status, d.first_reason, tried, d.failovers)
            if d.served and (d.usage or d.cost_usd is not None):
                self._spent.append((d.route, d.served, d.usage, d.cost_usd))
            if d.race:
                self._races.append((d.route, d.served, tuple(d.race)))
        counts = self._counts
        counts[key] = counts.get(key, 0) + 1
        if len(self._observed) >= MAX_PENDING or len(counts) >= MAX_PENDING or len(self._spent) >= MAX_PENDING \
                or len(self._races) >= MAX_PENDING or self.client.pending >= MAX_PENDING:
            self._apply()

    def _apply(self) -> None:
        """Hand what was counted since the last scrape to aioprometheus (its label checks are slow)."""
        pending: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

        def add(metric: Counter, labels: tuple[tuple[str, str], ...], amount: float) -> None:
            k = (metric.name, labels)
            pending[k] = pending.get(k, 0) + amount

        counts, self._counts = self._counts, {}
        for (route_name, served_name, status, reason, tried, failovers), n in counts.items():
            route = self._route(route_name)
            add(self.requests, (("route", route), ("served", self._target(served_name)),
                                ("status", self._status(status))), n)
            if reason is None:
                continue
            add(self.decisions, (("route", route), ("first_reason", reason if reason in FIRST_REASONS else OTHER)), n)
            add(self.failovers, (("route", route),), failovers * n)
            for name, outcome in tried:
                add(self.attempts, (("target", self._target(name)), ("outcome", self._outcome(outcome))), n)
        races, self._races = self._races, []
        for route_name, served_name, race in races:
            by_route = (("route", self._route(route_name)),)
            ran = [name for name, role in race if role != "budget exhausted"]
            hedges = sum(role.startswith("hedge") for _, role in race)
            if hedges:
                add(self.hedges, by_route, hedges)
            if len(ran) > 1:
                add(self.duplicates, by_route, duplicate_calls(race))
                if served_name:
                    add(self.races_won, (("target", self._target(served_name)),), 1)
            if len(ran) < len(race):
                add(self.budget_exhausted, by_route, len(race) - len(ran))
        spent, self._spent = self._spent, []
        for route_name, served_name, usage, cost in spent:
            served = self._target(served_name)
            for kind in ("prompt", "completion"):
                count = usage.get(f"{kind}_tokens")
                if isinstance(count, int) and count > 0:
                    add(self.tokens, (("target", served), ("kind", kind)), count)
            if cost is not None and cost >= 0:
                add(self.cost, (("route", self._route(route_name)), ("target", served)), cost)
        for (name, labels), amount in pending.items():
            self._counters[name].add(dict(labels), amount)
        self._apply_first_chunks()
        self.client.apply(self._route, self._status)

    def _apply_first_chunks(self) -> None:
        """The first-chunk observations since the last scrape, bucketed per target in one batch."""
        observed, self._observed = self._observed, []
        by_target: dict[str, list[float]] = {}
        for target, seconds in observed:
            if seconds >= 0:
                by_target.setdefault(self._target(target), []).append(seconds)
        for target, values in by_target.items():
            observe_many(self.first_chunk, {"target": target}, values)

    async def close(self) -> None:
        """Nothing to flush: the registry lives in memory until the process ends."""

    # -- scrape-time state ------------------------------------------------------

    def set_figure(self, target: str, seconds: float | None, mode: str) -> None:
        """Set a target's figure in one mode; None (unmeasured or stale) removes its series."""
        labels = {"target": self._target(target), "mode": mode}
        if seconds is None:
            self.target_latency.values.pop(labels, None)
        else:
            self.target_latency.set(labels, seconds)

    def set_target_state(self, target: str, breaker_state: str, in_flight: int) -> None:
        """Record a target's breaker (closed, open, probing) and its calls in flight."""
        try:
            state = BREAKER_STATES[breaker_state]
        except KeyError:
            raise ValueError(
                f"unknown breaker state {breaker_state!r} (expected one of "
                f"{', '.join(BREAKER_STATES)})"
            ) from None
        labels = {"target": self._target(target)}
        self.breaker_state.set(labels, state)
        self.in_flight.set(labels, in_flight)

    def set_route_healthy(self, route: str, healthy: int) -> None:
        """How many of a route's targets are healthy now (read at scrape time)."""
        self.route_healthy.set({"route": self._route(route)}, healthy)

    def set_connections(self, listener: str, open_now: int, closed: dict[str, int]) -> None:
        """A listener's open connections and the ones it cut, by reason (read at scrape time)."""
        self.connections.set({"listener": listener}, open_now)
        for reason, count in closed.items():
            self.connections_closed.set({"listener": listener, "reason": reason}, count)

    def set_fleet(self, connected: bool, out: int, in_: int, dropped: int, lag: float) -> None:
        """The fleet link as it stands (read at scrape time; only with state.redis)."""
        self.fleet_connected.set({}, int(connected))
        self.fleet_events.set({"direction": "out"}, out)
        self.fleet_events.set({"direction": "in"}, in_)
        self.fleet_dropped.set({}, dropped)
        self.fleet_lag.set({}, lag)

    def set_ledger_dropped(self, count: int) -> None:
        self.ledger_dropped.set({}, count)

    def set_reload(self, ok: bool, taken_at: float, reloads: Mapping[str, int] | None = None) -> None:
        self.reload_ok.set({}, 1 if ok else 0)
        self.reload_at.set({}, taken_at)
        for result, count in (reloads or {}).items():
            self.reloads.set({"result": result}, count)

    def render(self, accepts: Sequence[str] = ()) -> tuple[bytes, str]:
        """The Prometheus text exposition and its Content-Type for ``GET /metrics``."""
        self._apply()
        body, headers = render(self.registry, list(accepts))
        return body, headers["Content-Type"]

"""The observers a config asks for, built at start, rebuilt on reload, closed on stop.

Access log, metrics, the status page's history, (when ``ledger.path`` is set) the decision
ledger and (when ``tracing`` is set) the span exporter. The
metrics gauges that describe state rather than traffic (figures, breakers, in
flight) are copied from the state's snapshot when /metrics is scraped: the hub reads
records, never the live state.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from ..config import Config
from ..config.loaded import Loaded
from ..fleet import FleetLink, instance_name
from . import Observer
from .accesslog import AccessLog
from .history import History
from .ledger import Ledger
from .metrics import Metrics, hedged_from_config, names_from_config
from .outbox import Outbox
from .tracing import Traces

if TYPE_CHECKING:
    from ..state.snapshot import TargetFigures

log = logging.getLogger("firstbyte")


class Counted(Protocol):
    """A listener's connection guard as /metrics reads it (``server.listener.Guard``)."""

    name: str
    closed: dict[str, int]  # connections cut, by reason

    @property
    def open(self) -> int: ...


class Hub:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.connections: list[Counted] = []  # each listener's guard, registered where it is built
        # In a fleet each log line and ledger row says which instance served (fixed until restart,
        # like state.redis itself).
        self.instance = instance_name() if config.state.redis else None
        self.access_log = AccessLog(config.access_log, instance=self.instance)
        self.metrics = Metrics.from_config(config)
        self.history = History(config)
        self.traces = _traces(config)
        self.ledger: Ledger | None = None
        if config.ledger.path:
            self.ledger = Ledger(config.ledger.path, config.ledger.retention_days, config.ledger.queue,
                                 instance=self.instance or "")

    @property
    def observers(self) -> list[Observer]:
        out: list[Observer] = [self.access_log, self.metrics, self.history]
        if self.ledger is not None:
            out.append(self.ledger)
        if self.traces is not None:
            out.append(self.traces)
        return out

    async def start(self) -> None:
        if self.ledger is not None:
            await self.ledger.start()

    async def reconfigure(self, config: Config, outbox: Outbox) -> None:
        """Adopt a reloaded config: new names for metrics, new log or ledger if they moved.

        The hub alone sets the outbox's observers. New observers are opened first; then, in one
        step with no await, what finished so far goes to the old ones and the outbox's list is
        swapped; only then are the old ones closed. So an exchange that finishes while a log or
        ledger moves lands in one of them, never in a closed one."""
        old = self.config
        self.config = config
        self.metrics.reconfigure(*names_from_config(config), hedged_from_config(config))
        self.history.reconfigure(config)
        retired: list[Observer] = []
        if config.tracing != old.tracing:
            if self.traces is not None:
                retired.append(self.traces)
            self.traces = _traces(config)
        elif self.traces is not None:
            self.traces.reconfigure(config)  # the targets' models and providers, for attempt spans
        if config.access_log != old.access_log:
            retired.append(self.access_log)
            self.access_log = AccessLog(config.access_log, instance=self.instance)
        else:
            self.access_log.reopen()  # after logrotate, SIGHUP reopens the file
        if config.ledger != old.ledger:
            if self.ledger is not None:
                retired.append(self.ledger)
            self.ledger = None
            if config.ledger.path:
                ledger = Ledger(config.ledger.path, config.ledger.retention_days, config.ledger.queue,
                                instance=self.instance or "")
                try:
                    await ledger.start()
                except Exception as exc:
                    log.error("ledger %s cannot open, decisions are not stored: %s", config.ledger.path, exc)
                else:
                    self.ledger = ledger
        outbox.swap(self.observers)  # queued exchanges go to the observers of their time
        for observer in retired:
            try:
                await observer.close()
            except Exception:
                log.exception("observer %s failed to close", type(observer).__name__)

    def scrape(self, snapshot: Iterable[TargetFigures], routes: Iterable[str], loaded: Loaded,
               link: FleetLink | None = None) -> tuple[bytes, str]:
        """Render /metrics after copying the state's ``snapshot`` (per target, and healthy targets
        per one of ``routes``), the config's load and reloads, the fleet ``link`` and the listeners'
        connections into its gauges."""
        seen: set[str] = set()
        healthy = dict.fromkeys(routes, 0)  # per route: breaker closed, no Retry-After cooling
        for figures in snapshot:
            if figures.health.state == "closed" and figures.health.cooling <= 0:
                healthy[figures.route] = healthy.get(figures.route, 0) + 1
            name = figures.target.name
            if name in seen:  # a target two routes share is one series, as its first route sees it
                continue
            seen.add(name)
            for mode, series in figures.modes.items():
                self.metrics.set_figure(name, series.figure, mode)
            self.metrics.set_target_state(name, figures.health.state, figures.in_flight)
        for route, count in healthy.items():
            self.metrics.set_route_healthy(route, count)
        if self.ledger is not None:
            self.metrics.set_ledger_dropped(self.ledger.dropped)
        self.metrics.set_reload(loaded.ok, loaded.at, loaded.counts)
        if link is not None:
            self.metrics.set_fleet(link.connected, link.events_out, link.events_in, link.drops, link.lag)
        for guard in self.connections:
            self.metrics.set_connections(guard.name, guard.open, guard.closed)
        return self.metrics.render()

    async def close(self) -> None:
        for observer in self.observers:
            try:
                await observer.close()
            except Exception:
                log.exception("observer %s failed to close", type(observer).__name__)


def _traces(config: Config) -> Traces | None:
    """The span exporter when ``tracing`` is set."""
    return None if config.tracing is None else Traces(config.tracing, config)


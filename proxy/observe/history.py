"""The last hour in memory, for the status page: an observer like the access log, never asked to decide.

Per target, one bucket a minute for the last hour: answered attempts and their mean time to
first token, and failures. Per route, the same minutes of requests, races and duplicate calls,
and which target has led its decisions since when. And the last 50 decisions themselves, kept
as the records they are (their header is formatted only when the page asks). Everything is
bounded: 60 buckets per name, names from the config (a ``provider/model`` pin a client typed
is not kept), 50 decisions.

``on_finished`` runs after the answer went out, like every observer, and does a few dict
look-ups and additions per exchange: the page costs the request path nothing more.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from ..config import Config
from ..routing.decision import Decision, duplicate_calls
from . import Finished

__all__ = ["BUCKETS", "BUCKET_SECS", "LAST", "History"]

BUCKET_SECS = 60
BUCKETS = 60  # an hour
LAST = 50  # decisions shown

# A target's minute: [minute, answered, sum of first-token seconds, failures];
# a route's minute: [minute, requests, raced, duplicate calls].
Bucket = list[float]


class History:
    """What the status page charts; fed by finished exchanges, read by ``/status/data``."""

    def __init__(self, config: Config) -> None:
        self.decisions: deque[tuple[float, int, Decision]] = deque(maxlen=LAST)
        self.targets: dict[str, deque[Bucket]] = {}
        self.routes: dict[str, deque[Bucket]] = {}
        self.leaders: dict[str, tuple[str, float]] = {}  # route: (leading target, since epoch seconds)
        self.reconfigure(config)

    def reconfigure(self, config: Config) -> None:
        """A reload's names: series of targets and routes that left are dropped, the others kept."""
        names = {t.name for route in config.routes.values() for t in route.targets}
        self.targets = {n: self.targets.get(n) or deque(maxlen=BUCKETS) for n in names}
        self.routes = {n: self.routes.get(n) or deque(maxlen=BUCKETS) for n in config.routes}
        self.leaders = {n: v for n, v in self.leaders.items() if n in self.routes}

    def on_finished(self, finished: Finished) -> None:
        d = finished.decision
        if d is None:
            return
        at = finished.started
        self.decisions.append((at, finished.status, d))
        minute = at // BUCKET_SECS
        series = self.routes.get(d.route)
        if series is not None:
            bucket = _bucket(series, minute)
            bucket[1] += 1
            extra = duplicate_calls(d.race) if d.race else 0
            if extra:
                bucket[2] += 1
                bucket[3] += extra
            if d.order and d.first_reason != "explore":
                leader = d.order[0].name
                if self.leaders.get(d.route, ("",))[0] != leader:
                    self.leaders[d.route] = (leader, at)
        for a in d.attempts:
            series = self.targets.get(a.name)
            if series is None:
                continue
            bucket = _bucket(series, minute)
            if a.ttfc is not None:
                bucket[1] += 1
                bucket[2] += a.ttfc
            elif a.failover and a.outcome != "cooldown":  # a skip is no call
                bucket[3] += 1

    async def close(self) -> None:
        """Nothing to flush: the history lives in memory."""

    def view(self, now: float) -> dict[str, Any]:
        """The last hour, minute by minute (oldest first, a minute with nothing is absent), and
        the last decisions, newest first: the JSON the page draws."""
        since = now // BUCKET_SECS - BUCKETS + 1
        targets = {
            name: [{"t": int(b[0] * BUCKET_SECS), "answered": int(b[1]),
                    "ttft_s": round(b[2] / b[1], 4) if b[1] else None, "failures": int(b[3])}
                   for b in series if b[0] >= since]
            for name, series in self.targets.items()
        }
        routes = {}
        for name, series in self.routes.items():
            recent = [b for b in series if b[0] >= since]
            requests = sum(b[1] for b in recent)
            leader = self.leaders.get(name)
            routes[name] = {
                "requests": int(requests),
                "raced_share": round(sum(b[2] for b in recent) / requests, 4) if requests else 0.0,
                "duplicate_share": round(sum(b[3] for b in recent) / requests, 4) if requests else 0.0,
                "leader": None if leader is None else {"target": leader[0], "since": leader[1]},
            }
        decisions = [{"at": at, "status": status, "failed": status >= 400 or d.served is None,
                      "decision": d.header()} for at, status, d in reversed(self.decisions)]
        return {"bucket_s": BUCKET_SECS, "targets": targets, "routes": routes, "decisions": decisions}


def _bucket(series: deque[Bucket], minute: float) -> Bucket:
    """This minute's bucket, started when the minute is new (the oldest falls off the deque)."""
    if series and series[-1][0] >= minute:
        return series[-1]  # a late exchange (one that settled after its race) joins the current minute
    bucket = [minute, 0.0, 0.0, 0.0]
    series.append(bucket)
    return bucket

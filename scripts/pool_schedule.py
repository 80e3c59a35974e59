"""scripts/simulate-pool's scenarios and the oracle they are measured against: each target's latency
schedule (knobs with steps at fractions of the run), the scheduled-best target at any moment, and what
a served call cost by the schedule. Pure: no processes, no wire."""

from __future__ import annotations

import bisect
from pathlib import Path
from typing import Any

from proxy.routing.decision import duplicate_calls

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench-results"
NAMES = ("A", "B", "C")
GOAL = 1.15
DEFAULT_SECONDS = 6.5
QUICK_SECONDS = 4.0

# Each target: base knobs and optional steps {"at": fraction of the run, knob: value}.
SCENARIOS: dict[str, dict[str, Any]] = {
    "stationary": {"A": {"first_chunk_ms": 30, "jitter_ms": 5},
                   "B": {"first_chunk_ms": 50, "jitter_ms": 5},
                   "C": {"first_chunk_ms": 80, "jitter_ms": 5}},
    "leader-degrades": {"A": {"first_chunk_ms": 25, "jitter_ms": 5, "steps": [{"at": 0.5, "first_chunk_ms": 110}]},
                        "B": {"first_chunk_ms": 45, "jitter_ms": 5},
                        "C": {"first_chunk_ms": 70, "jitter_ms": 5}},
    "slow-recovers": {"A": {"first_chunk_ms": 40, "jitter_ms": 5},
                      "B": {"first_chunk_ms": 55, "jitter_ms": 5},
                      "C": {"first_chunk_ms": 120, "jitter_ms": 5, "steps": [{"at": 0.5, "first_chunk_ms": 15}]}},
    "heavy-jitter": {"A": {"first_chunk_ms": 40, "jitter_ms": 35},
                     "B": {"first_chunk_ms": 50, "jitter_ms": 5},
                     "C": {"first_chunk_ms": 70, "jitter_ms": 60}},
    "leader-fails": {"A": {"first_chunk_ms": 25, "jitter_ms": 5, "steps": [{"at": 0.5, "fail_rate": 0.6}]},
                     "B": {"first_chunk_ms": 45, "jitter_ms": 5},
                     "C": {"first_chunk_ms": 70, "jitter_ms": 5}},
    # The race's scenarios (issue 13). "run" overrides the run's length and concurrency.
    # A cold start counted from the first request: a short run, 12 requests at once, the written-first
    # target the slowest.
    "cold-start": {"A": {"first_chunk_ms": 120, "jitter_ms": 5},
                   "B": {"first_chunk_ms": 50, "jitter_ms": 5},
                   "C": {"first_chunk_ms": 20, "jitter_ms": 5},
                   "run": {"seconds": 1.5, "concurrency": 12}},
    # A target several times slower than the others becomes the fastest after a third of a short run
    # (a few hundred requests at concurrency 4).
    "slow-becomes-fastest": {"A": {"first_chunk_ms": 40, "jitter_ms": 5},
                             "B": {"first_chunk_ms": 55, "jitter_ms": 5},
                             "C": {"first_chunk_ms": 200, "jitter_ms": 5,
                                   "steps": [{"at": 1 / 3, "first_chunk_ms": 15}]},
                             "run": {"seconds": 3.5, "concurrency": 4}},
    # The leader stalls 1.5 s on 3 % of its calls (the tail); by its expected time (65 ms) B is best.
    "stall": {"A": {"first_chunk_ms": 20, "jitter_ms": 3, "stall_rate": 0.03, "stall_ms": 1500},
              "B": {"first_chunk_ms": 40, "jitter_ms": 5},
              "C": {"first_chunk_ms": 60, "jitter_ms": 5}},
    # The leader's first token slows by 8 ms for each earlier call still waiting for its own.
    "load": {"A": {"first_chunk_ms": 15, "jitter_ms": 3, "load_ms": 8},
             "B": {"first_chunk_ms": 40, "jitter_ms": 5},
             "C": {"first_chunk_ms": 60, "jitter_ms": 5}},
    # Issue 28's abrupt degradation: the leader goes from 40 to 250 ms half-way through a short run at
    # concurrency 4; B (100 ms) is slower on paper until then. A leader that keeps losing hedged races
    # must be demoted (docs/adr/0022), not waited on until the budget runs dry.
    "leader-degrades-abrupt": {"A": {"first_chunk_ms": 40, "jitter_ms": 5,
                                     "steps": [{"at": 0.5, "first_chunk_ms": 250}]},
                               "B": {"first_chunk_ms": 100, "jitter_ms": 5},
                               "C": {"first_chunk_ms": 400, "jitter_ms": 5},
                               "run": {"seconds": 3.0, "concurrency": 4}},
    # Issue 28's other two pools (scripts/simulate-pool --direct): the same targets held steady, and the
    # slowest (400 ms, 10x the leader) dropping to 20 ms a third of the way in: found only by measuring it.
    "steady": {"A": {"first_chunk_ms": 40, "jitter_ms": 5},
               "B": {"first_chunk_ms": 100, "jitter_ms": 5},
               "C": {"first_chunk_ms": 400, "jitter_ms": 5},
               "run": {"seconds": 3.0, "concurrency": 4}},
    "slowest-drops-abrupt": {"A": {"first_chunk_ms": 40, "jitter_ms": 5},
                             "B": {"first_chunk_ms": 100, "jitter_ms": 5},
                             "C": {"first_chunk_ms": 400, "jitter_ms": 5,
                                   "steps": [{"at": 1 / 3, "first_chunk_ms": 20}]},
                             "run": {"seconds": 3.0, "concurrency": 4}},
}
ABRUPT_SCENARIOS = ("steady", "leader-degrades-abrupt", "slowest-drops-abrupt")
RACE_SCENARIOS = ("cold-start", "slow-becomes-fastest", "stall", "load", "leader-degrades-abrupt")
ORACLE = "oracle"  # the reference run: every request pinned to the scheduled-best target
STRATEGIES: dict[str, dict[str, Any]] = {
    "ordered": {"strategy": "ordered"},
    "weighted": {"strategy": "weighted"},
    # hedge off (a fastest route that says nothing about hedge races: docs/routing.md "The default")
    "fastest-ewma": {"strategy": "fastest", "fastest": {"signal": "ewma"}, "hedge": False},
    "fastest-p50": {"strategy": "fastest", "fastest": {"signal": "p50"}, "hedge": False},
    # hedge on: firstbyte's defaults for a route that sets ``hedge: {}`` unless flags override them
    "fastest-hedge": {"strategy": "fastest", "fastest": {"signal": "ewma"}, "hedge": {}},
    "fastest-hedge-load": {"strategy": "fastest", "fastest": {"signal": "ewma", "load_aware": True},
                           "hedge": {}},
    "fastest-load": {"strategy": "fastest", "fastest": {"signal": "ewma", "load_aware": True}, "hedge": False},
    # fastest-ewma served by the code before the race (``--today DIR``: a copy of proxy/ at that commit)
    "today-ewma": {"strategy": "fastest", "fastest": {"signal": "ewma"}},
    # fastest-hedge served by that copy: a change and its base side by side in one run
    "today-hedge": {"strategy": "fastest", "fastest": {"signal": "ewma"}, "hedge": {}},
}
HEDGE_OFF, HEDGE_ON = "fastest-ewma", "fastest-hedge"
DEFAULT_STRATEGIES = ("ordered", "weighted", "fastest-ewma", "fastest-p50", "fastest-hedge")
RACE_STRATEGIES = ("fastest-ewma", "fastest-hedge")
RACE_GOAL = 1.05  # hedge on: mean within this of the measured oracle's
DUP_GOAL = 0.10  # hedge on: at most this share of duplicate upstream calls
STALL_P99_GOAL = 2.0  # hedge on, stall scenario: p99 within this of the oracle's p99


def targets(scenario: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n: scenario[n] for n in NAMES}


def knobs_at(spec: dict[str, Any], elapsed: float, span: float) -> dict[str, float]:
    """A target's knobs ``elapsed`` seconds into its schedule (steps are fractions of ``span``)."""
    knobs = {"first_chunk_ms": spec["first_chunk_ms"], "fail_rate": spec.get("fail_rate", 0.0),
             "stall_rate": spec.get("stall_rate", 0.0), "stall_ms": spec.get("stall_ms", 0.0),
             "load_ms": spec.get("load_ms", 0.0)}
    for step in spec.get("steps", []):
        if elapsed >= step["at"] * span:
            knobs.update({k: v for k, v in step.items() if k != "at"})
    return knobs


def expected_ms(k: dict[str, float], waiting: int = 0) -> float:
    """A target's expected first-chunk time by its knobs: a stall share counts at its mean; a loaded
    target counts ``load_ms`` for each call of ours still waiting there for its first chunk."""
    return k["first_chunk_ms"] + k["stall_rate"] * k["stall_ms"] + k["load_ms"] * waiting


def oracle(scenario: dict[str, Any], elapsed: dict[str, float], span: float,
           waiting: dict[str, int] | None = None) -> tuple[str, float]:
    """The fastest healthy target and its scheduled (expected) first-chunk time (ms) at this moment;
    with ``waiting`` (the oracle run's own calls still waiting at each target), a loaded target's
    expected time counts them."""
    best = ("-", float("inf"))
    for name in NAMES:
        k = knobs_at(scenario[name], elapsed[name], span)
        ms = expected_ms(k, waiting[name] if waiting else 0)
        if k["fail_rate"] == 0 and ms < best[1]:
            best = (name, ms)
    return best


def served_ms(k: dict[str, float], ttfc_ms: float, role: str) -> float:
    """What the served target cost by the schedule: its ``first_chunk_ms``, plus its stall when this
    call plainly stalled (its first chunk came after ``stall_ms``), plus the hedge delay when it was
    a hedge (it started that much after the request)."""
    ms = k["first_chunk_ms"]
    if k["stall_rate"] and ttfc_ms >= k["stall_ms"]:
        ms += k["stall_ms"]
    if role.startswith("hedge "):
        ms += float(role.split()[1].rstrip("s")) * 1000
    return ms


def loaded_choice(calls: list[dict[str, Any]], scenario: dict[str, Any], offsets: dict[str, float],
                  span: float) -> None:
    """Under load, each served call's scheduled time counting the calls still waiting at its target
    when it started, reconstructed from the client's records: every attempt on a loaded target (its
    start, a hedge's delay after the request's, and its seconds, from race= and attempts=) is a span,
    and a call's waiting count is the spans begun before it and not yet answered. Sets ``served_ms``:
    ``x choice`` for a loaded scenario, which CPU contention moves no more than elsewhere."""
    loaded = {n for n in NAMES if scenario[n].get("load_ms")}
    spans: dict[str, list[tuple[float, float]]] = {n: [] for n in loaded}

    def start(c: dict[str, Any], name: str) -> float:  # ms since load began
        role = dict(c.get("race") or ()).get(name, "")
        return c["t"] * 1000 + (float(role.split()[1].rstrip("s")) * 1000 if role.startswith("hedge ") else 0.0)

    for c in calls:
        for name, detail in c.get("attempts") or ():
            if name in loaded:
                begun = start(c, name)
                spans[name].append((begun, begun + float(detail.split()[-1].rstrip("s")) * 1000))
    for name in loaded:
        spans[name].sort()
    for c in calls:
        served = c.get("served")
        if not c.get("ok") or served not in NAMES:
            continue
        at = start(c, served)
        waiting = 0
        if served in loaded:
            mine = spans[served]
            i = bisect.bisect_left(mine, (at, -1.0))
            while i > 0 and mine[i - 1][0] > at - 10_000:
                i -= 1
                waiting += mine[i][1] > at
        k = knobs_at(scenario[served], c["t"] + offsets[served], span)
        c["served_ms"] = expected_ms(k, waiting) + at - c["t"] * 1000


def extra_calls(race: tuple[tuple[str, str], ...]) -> int:
    """Upstream calls a request started beside its first (``race=``), counted as the metric counts them."""
    return duplicate_calls(race)


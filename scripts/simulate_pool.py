"""scripts/simulate-pool: how well each routing strategy picks, against the oracle.

For each scenario, three ``firstbyte simulate`` upstreams (A, B, C) follow
latency schedules (``--schedule``) over real HTTP, and firstbyte serves one
route over them with each strategy in turn (``ordered``, ``weighted``,
``fastest`` with ``ewma``, ``fastest`` with ``p50``); upstreams and firstbyte
are restarted for every run so each starts cold on the same schedule. A closed
loop of streamed calls measures time to first chunk at the client and reads
``served=`` from ``x-route-decision``.

The *oracle* is the fastest healthy target at each moment, known from the
schedule: the smallest scheduled ``first_chunk_ms`` among targets whose
``fail_rate`` is 0 when the request was sent (the mean of a jittered target,
not its luckiest draw). It is measured: each scenario first gets an ``oracle``
run, the same fresh upstreams and a fresh firstbyte, where every request is
pinned (``x-route-provider``) to the scheduled-best target at the moment it is
sent. So the oracle pays the same proxy and HTTP cost as every strategy, and a
strategy's ratio to it (``x oracle``, the goal) measures the routing alone;
``x sched`` is the ratio to the scheduled ``first_chunk_ms`` and includes that
cost (``scripts/bench`` measures it). ``x choice`` is the served targets'
scheduled ``first_chunk_ms`` over the best's: the routing's cost by the schedule
alone, which CPU contention on the machine does not move (``x oracle`` compares
two runs that may not see the same contention). Reported per run: mean and p95
time to first chunk, the three ratios, each target's share, and how many
requests it took after a shift until 80 % of 20 requests in a row went to the
new best. A PNG
per scenario shows each target's scheduled latency and firstbyte's figure for
it (from ``GET /v1/health``), and each run's share over time.

The race's scenarios (issue 13) run the oracle, ``fastest-ewma`` (hedge off) and ``fastest-hedge``
(the same with ``hedge: {}``, firstbyte's hedge defaults unless ``--hedge-after``, ``--max-extra`` or
``--refresh`` say otherwise): a cold start (1.5 s, 12 at once, the written-first target the slowest),
a slow target that becomes the fastest a third into a short run at concurrency 4, a leader that stalls
1.5 s on 3 % of its calls (the oracle ranks targets by expected time, so it is the steady runner-up),
and a leader whose first token slows with its own concurrency (the oracle pins to the target with the
least expected time counting its own calls still waiting there). Also reported: p99, duplicate
upstream calls per request (racers beside the first, read from ``race=``; cross-checked by the
simulators' own counts of calls begun), and the cold-start flood (calls each simulator had begun when
its first first chunk went out). ``today-ewma`` and ``today-hedge`` with ``--today DIR`` serve
``fastest-ewma`` and ``fastest-hedge`` from an earlier copy of ``proxy/`` (a change and its base in
one run); ``--proxy-dir DIR`` serves every run but the oracle from a variant.

    scripts/simulate-pool [--quick] [--race-only] [--scenarios ...] [--strategies ...] [--seconds S]
                          [--concurrency N] [--explore 0.03] [--hedge-after p90] [--refresh 0.3] [--tag T]
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # the process helpers are shared with scripts/bench

from proxy.config import Fastest, Hedge
from proxy.routing.decision import duplicate_calls, parse_header

ROOT = bench.ROOT
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
}
RACE_SCENARIOS = ("cold-start", "slow-becomes-fastest", "stall", "load", "leader-degrades-abrupt")
ORACLE = "oracle"  # the reference run: every request pinned to the scheduled-best target
STRATEGIES: dict[str, dict[str, Any]] = {
    "ordered": {"strategy": "ordered"},
    "weighted": {"strategy": "weighted"},
    "fastest-ewma": {"strategy": "fastest", "fastest": {"signal": "ewma"}},
    "fastest-p50": {"strategy": "fastest", "fastest": {"signal": "p50"}},
    # hedge on: firstbyte's defaults for a route that sets ``hedge: {}`` unless flags override them
    "fastest-hedge": {"strategy": "fastest", "fastest": {"signal": "ewma"}, "hedge": {}},
    "fastest-hedge-load": {"strategy": "fastest", "fastest": {"signal": "ewma", "load_aware": True},
                           "hedge": {}},
    "fastest-load": {"strategy": "fastest", "fastest": {"signal": "ewma", "load_aware": True}},
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


async def sim_offsets(ports: dict[str, int]) -> dict[str, float]:
    """Each simulator's schedule start on this process's monotonic clock."""
    starts = {}
    async with aiohttp.ClientSession() as session:
        for name, port in ports.items():
            t0 = time.monotonic()
            async with session.get(f"http://127.0.0.1:{port}/sim/stats") as resp:
                stats = await resp.json()
            t1 = time.monotonic()
            starts[name] = (t0 + t1) / 2 - stats["elapsed_s"]
    return starts


async def load(url: str, concurrency: int, until: float, starts: dict[str, float],
               scenario: dict[str, Any], span: float, health_url: str, pin: bool = False) -> dict[str, Any]:
    """Closed-loop streamed calls until ``until``; every call with its oracle; figures polled.

    With ``pin`` every call carries ``x-route-provider`` naming the scheduled-best target when it
    is sent: the measured oracle."""
    body = orjson.dumps({"model": "pool", "messages": [{"role": "user", "content": "hi"}], "stream": True})
    plain = {"content-type": "application/json"}
    pinned = {n: {**plain, "x-route-provider": n} for n in NAMES}
    calls: list[dict[str, Any]] = []
    figures: list[dict[str, Any]] = []
    loaded = any(scenario[n].get("load_ms") for n in NAMES)
    waiting = {n: 0 for n in NAMES}  # the pinned oracle's calls still waiting for a first chunk, per target
    t_load = time.monotonic()

    async def worker(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < until:
            sent = time.monotonic()
            elapsed = {n: sent - starts[n] for n in NAMES}
            best, best_ms = oracle(scenario, elapsed, span, waiting if pin and loaded else None)
            record: dict[str, Any] = {"t": sent - t_load, "oracle": best, "oracle_ms": best_ms}
            headers = pinned[best] if pin and best in pinned else plain
            if pin and best in waiting:
                waiting[best] += 1
            try:
                async with session.post(url, data=body, headers=headers) as resp:
                    first = await resp.content.readany()
                    record["ttfc_ms"] = (time.monotonic() - sent) * 1000
                    if pin and best in waiting:
                        waiting[best] -= 1
                        best = ""
                    await resp.read()
                    record["ok"] = resp.status == 200 and bool(first)
                    decision = parse_header(resp.headers["x-route-decision"])
                    record["served"] = served = decision.served
                    record["attempts"] = decision.attempts
                    record["race"] = decision.race
                    record["extra"] = extra_calls(decision.race)
                    if served in NAMES and not loaded:  # this choice's cost by the schedule, without the wire
                        record["served_ms"] = served_ms(knobs_at(scenario[served], elapsed[served], span),
                                                        record["ttfc_ms"], dict(decision.race).get(served, ""))
            except (aiohttp.ClientError, KeyError, ValueError):
                record["ok"] = False
            finally:
                if pin and best in waiting:
                    waiting[best] -= 1
            calls.append(record)

    async def poll(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < until:
            async with session.get(health_url) as resp:
                targets = (await resp.json())["targets"]
            figures.append({"t": time.monotonic() - t_load,
                            **{t["target"]: t["streamed"]["figure_s"] for t in targets}})
            await asyncio.sleep(0.25)

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(poll(session), *(worker(session) for _ in range(concurrency)))
    # Where each simulator was in its schedule when load began: chart and shift times use it.
    return {"calls": calls, "figures": figures, "offsets": {n: t_load - starts[n] for n in NAMES}}


async def sim_stats(ports: dict[str, int]) -> dict[str, dict[str, Any]]:
    """Each simulator's own counts: ``served`` counts every call it began answering (a cancelled racer
    too, a failure not)."""
    out = {}
    async with aiohttp.ClientSession() as session:
        for name, port in ports.items():
            async with session.get(f"http://127.0.0.1:{port}/sim/stats") as resp:
                out[name] = await resp.json()
    return out


def cold_flood(calls: list[dict[str, Any]]) -> dict[str, int]:
    """Per target, how many requests were sent to it (any attempt, a racer's included) before its first
    answer reached the client: the requests a cold start sends a target before it is measured."""
    first: dict[str, float] = {}
    for c in calls:
        for name, detail in c.get("attempts", ()):
            word, _, secs = detail.rpartition(" ")
            if word.isdigit() and word.startswith("2"):
                at = c["t"] + float(secs.rstrip("s"))
                first[name] = min(first.get(name, at), at)
    return {n: sum(1 for c in calls if c["t"] < first.get(n, float("inf"))
                   and any(a == n for a, _ in c.get("attempts", ()))) for n in NAMES}


def follow(calls: list[dict[str, Any]], shift_t: float) -> int | None:
    """Requests after the shift until 80 % of the next 20 went to the new oracle target."""
    after = [c for c in calls if c["t"] >= shift_t and c.get("ok")]
    for i in range(len(after) - 20):
        window = after[i:i + 20]
        if sum(c.get("served") == c["oracle"] for c in window) >= 16:
            return i
    return None


def summarise(calls: list[dict[str, Any]], shift_t: float | None,
              oracle_run: dict[str, Any] | None = None, loaded: bool = False) -> dict[str, Any]:
    """One run's figures; ``oracle_run`` is the measured oracle's summary (None for the oracle itself).

    ``vs_oracle`` is the mean over the measured oracle's mean (the goal); ``vs_sched`` is the mean
    over the scheduled ``first_chunk_ms`` of the best target at each request (it includes the
    proxy's and HTTP's own cost). ``loaded``: ``x choice`` is over the measured oracle's expected
    time (its own calls waiting counted), since a request's best depends on who else is waiting."""
    ok = [c for c in calls if c.get("ok")]
    ttfc = sorted(c["ttfc_ms"] for c in ok)
    sched_mean = statistics.fmean(c["oracle_ms"] for c in ok)
    share = {n: sum(c.get("served") == n for c in ok) / len(ok) for n in NAMES}
    out: dict[str, Any] = {"requests": len(calls), "errors": len(calls) - len(ok),
                           "mean_ms": statistics.fmean(ttfc), "p95_ms": ttfc[int(0.95 * (len(ttfc) - 1))],
                           "p99_ms": ttfc[int(0.99 * (len(ttfc) - 1))],
                           "sched_mean_ms": sched_mean, "share": share,
                           "on_oracle": sum(c.get("served") == c["oracle"] for c in ok) / len(ok)}
    reference = out if oracle_run is None else oracle_run
    out["oracle_mean_ms"] = reference["mean_ms"]
    out["vs_oracle"] = out["mean_ms"] / reference["mean_ms"]
    out["p95_vs_oracle"] = out["p95_ms"] / reference["p95_ms"]
    out["p99_vs_oracle"] = out["p99_ms"] / reference["p99_ms"]
    # Duplicate upstream calls: racers beside the first, by each answer's race= field.
    out["extra_calls"] = sum(c.get("extra", 0) for c in calls)
    out["dup_share"] = out["extra_calls"] / len(calls)
    out["hedged_share"] = sum(any(r.startswith("hedge") for _, r in c.get("race", ())) for c in calls) / len(calls)
    out["raced_share"] = sum(c.get("extra", 0) > 0 for c in calls) / len(calls)
    out["cold_flood"] = cold_flood(calls)  # by the client's view; the simulators' own count replaces it
    out["vs_sched"] = out["mean_ms"] / sched_mean
    chosen = [c["served_ms"] for c in ok if "served_ms" in c]  # a loaded scenario's: loaded_choice
    # The served targets' scheduled first_chunk_ms over the oracle's: the routing's cost by the schedule
    # alone, free of CPU noise (it does not count the time of failed attempts before a failover).
    best = reference["sched_mean_ms"] if loaded else sched_mean
    out["choice_vs_sched"] = statistics.fmean(chosen) / best if chosen else None
    out["follow_requests"] = follow(calls, shift_t) if shift_t is not None else None
    return out


def pooled(reps: list[dict[str, Any]], oracle_summary: dict[str, Any] | None, loaded: bool) -> dict[str, Any]:
    """Several repeats of one run as one: means and percentiles over all their calls (the oracle's
    too, so one lucky or unlucky oracle run cannot decide a ratio), follow as the median of the
    repeats' own (each has its shift), and each repeat's ``x oracle`` against the pooled oracle."""
    calls = [c for r in reps for c in r["calls"]]
    summary = summarise(calls, None, oracle_summary, loaded)
    each = [summarise(r["calls"], r["shift_t"], oracle_summary or summary, loaded) for r in reps]
    follows = [e["follow_requests"] for e in each if e["follow_requests"] is not None]
    summary["follow_requests"] = round(statistics.median(follows)) if follows else None
    summary["repeats_vs_oracle"] = [e["vs_oracle"] for e in each]
    summary["cold_flood"] = each[0]["cold_flood"]
    return {**reps[0], "calls": calls, "summary": summary}


def run_length(args: argparse.Namespace, scenario: dict[str, Any]) -> tuple[float, int]:
    """Seconds of load and concurrency: the scenario's own (``run``) unless given on the command line."""
    run = scenario.get("run", {})
    seconds = args.seconds if args.seconds is not None else run.get("seconds", DEFAULT_SECONDS)
    if args.quick:
        seconds = min(seconds, QUICK_SECONDS)
    concurrency = args.concurrency if args.concurrency is not None else run.get("concurrency", 12)
    return seconds, concurrency


def hedge_of(args: argparse.Namespace) -> dict[str, Any]:
    hedge: dict[str, Any] = {}
    if args.hedge_after is not None:
        hedge["after"] = float(args.hedge_after) if args.hedge_after[0].isdigit() else args.hedge_after
    if args.max_extra is not None:
        hedge["max_extra"] = args.max_extra
    if args.refresh is not None:
        hedge["refresh"] = args.refresh
    return hedge


def route_of(args: argparse.Namespace, strategy: str) -> dict[str, Any]:
    """The pool route for a strategy, with the command line's overrides of fastest and hedge."""
    route = {**({"strategy": "ordered"} if strategy == ORACLE else STRATEGIES[strategy]),
             "targets": [{"provider": n, "model": "sim"} for n in NAMES]}
    if "fastest" in route:
        route["fastest"] = {**route["fastest"], "seed": 7}
        if args.explore is not None:
            route["fastest"]["explore"] = args.explore
        if args.alpha is not None:
            route["fastest"]["alpha"] = args.alpha
        if args.load_weight is not None and route["fastest"].get("load_aware"):
            route["fastest"]["load_weight"] = args.load_weight
    if "hedge" in route:
        route["hedge"] = {**route["hedge"], **hedge_of(args)}
    return route


def run_one(args: argparse.Namespace, tmp: Path, scenario_name: str, strategy: str) -> dict[str, Any]:
    """``run_once``, again with fresh ports when a process could not start (on a shared machine another
    process may take a port between ``free_port`` and the bind)."""
    try:
        return run_once(args, tmp, scenario_name, strategy)
    except RuntimeError as exc:
        print(f"  retrying: {exc}", file=sys.stderr, flush=True)
        return run_once(args, tmp, scenario_name, strategy)


def run_once(args: argparse.Namespace, tmp: Path, scenario_name: str, strategy: str) -> dict[str, Any]:
    """Fresh upstreams and a fresh firstbyte; load for the scenario's seconds; the raw calls.

    ``strategy`` ``oracle`` serves the route ``ordered`` and pins every request to the scheduled
    best target (a pin never explores), so it measures the oracle over the same wire."""
    scenario = SCENARIOS[scenario_name]
    seconds, concurrency = run_length(args, scenario)
    span = seconds + args.lead
    procs = bench.Procs(tmp)
    try:
        ports = {name: bench.free_port() for name in NAMES}
        fb_port = bench.free_port()
        commands: dict[str, tuple[list[str], int]] = {}
        for i, name in enumerate(NAMES):
            spec = scenario[name]
            steps = [{**s, "at": s["at"] * span} for s in spec.get("steps", [])]
            schedule = tmp / f"{scenario_name}-{name}.json"
            schedule.write_text(json.dumps(steps))
            commands[f"sim-{name}"] = ([str(bench.BIN / "firstbyte"), "simulate", "--port", str(ports[name]),
                                        "--first-chunk-ms", str(spec["first_chunk_ms"]),
                                        "--jitter-ms", str(spec.get("jitter_ms", 0)), "--chunk-ms", "1",
                                        "--chunks", "2", "--fail-rate", str(spec.get("fail_rate", 0.0)),
                                        "--stall-rate", str(spec.get("stall_rate", 0.0)),
                                        "--stall-ms", str(spec.get("stall_ms", 0.0)),
                                        "--load-ms", str(spec.get("load_ms", 0.0)),
                                        "--seed", str(i + 1), "--schedule", str(schedule)], ports[name])
        pin = strategy == ORACLE
        config = {"listen": f"127.0.0.1:{fb_port}", "access_log": {"path": "/dev/null"},
                  "providers": {n: {"kind": "openai", "base_url": f"http://127.0.0.1:{p}/v1"}
                                for n, p in ports.items()},
                  "routes": {"pool": route_of(args, strategy)}}
        path = tmp / "pool.json"
        path.write_text(json.dumps(config))
        serve = [str(bench.BIN / "firstbyte"), "serve", "--config", str(path)]
        if args.proxy_dir is not None and strategy != ORACLE:  # a variant of proxy/ (a proposed change)
            serve = ["env", f"PYTHONPATH={args.proxy_dir}", sys.executable, "-P", "-m", "proxy.cli", "serve",
                     "--config", str(path)]
        if strategy.startswith("today-"):  # the same firstbyte command, run from a copy of an earlier proxy/
            if args.today is None:
                raise SystemExit(f"{strategy} needs --today DIR (a directory holding proxy/ at that commit)")
            serve = ["env", f"PYTHONPATH={args.today}", sys.executable, "-P", "-m", "proxy.cli", "serve",
                     "--config", str(path)]
        # -P: the working directory (this checkout) is not put before PYTHONPATH's copy of proxy/.
        commands["firstbyte"] = (serve, fb_port)
        procs.start_many(commands)
        starts = asyncio.run(sim_offsets(ports))
        until = min(starts.values()) + span
        url = f"http://127.0.0.1:{fb_port}/v1/chat/completions"
        result = asyncio.run(load(url, concurrency, until, starts, scenario, span,
                                  f"http://127.0.0.1:{fb_port}/v1/health", pin=pin))
        time.sleep(0.05)  # explored losers still being measured finish (their calls began already)
        result["sims"] = asyncio.run(sim_stats(ports))
        shifts = [step["at"] * span - result["offsets"][n] for n in NAMES for step in scenario[n].get("steps", [])]
        result["shift_t"] = min(shifts) if shifts else None  # in seconds since load began
        return result
    finally:
        procs.stop_all()


def chart(name: str, scenario: dict[str, Any], runs: dict[str, dict[str, Any]], span: float, tag: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"A": "tab:blue", "B": "tab:orange", "C": "tab:green"}
    fig, axes = plt.subplots(1 + len(runs), 1, figsize=(10, 2.2 * (1 + len(runs))), sharex=True)
    ax = axes[0]
    t_end = max(c["t"] for r in runs.values() for c in r["calls"])
    grid = [i * t_end / 200 for i in range(201)]
    shown = [r for r in (HEDGE_OFF, HEDGE_ON) if r in runs] or [next(r for r in runs if r != ORACLE)]
    offsets = runs[shown[0]]["offsets"]
    for n in NAMES:
        ax.plot(grid, [expected_ms(knobs_at(scenario[n], t + offsets[n], span)) for t in grid], "--",
                color=colors[n], lw=1, label=f"{n} scheduled")
        for run_name, style in zip(shown, ("-", ":"), strict=False):
            figs = runs[run_name]["figures"]
            pts = [(f["t"], f[n] * 1000) for f in figs if f.get(n) is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), style, color=colors[n], lw=1.5, label=f"{n} figure ({run_name})")
        failing = [t for t in grid if knobs_at(scenario[n], t + offsets[n], span)["fail_rate"] > 0]
        if failing:
            ax.axvspan(min(failing), max(failing), color=colors[n], alpha=0.08, label=f"{n} failing")
    ax.set_ylabel("first chunk ms")
    ax.set_title(f"{name}: scheduled (expected) latency and firstbyte's figure ({', '.join(shown)})")
    ax.legend(fontsize=7, ncol=4, loc="upper right")
    for ax, (strategy, run) in zip(axes[1:], runs.items(), strict=True):
        bins = 40
        width = t_end / bins
        shares: dict[str, list[float]] = {n: [] for n in NAMES}
        xs = []
        for b in range(bins):  # a bin after this run's last call (runs end a little apart) is left out
            inside = [c for c in run["calls"] if b * width <= c["t"] < (b + 1) * width and c.get("ok")]
            if inside:
                xs.append((b + 0.5) * width)
                for n in NAMES:
                    shares[n].append(sum(c.get("served") == n for c in inside) / len(inside))
        ax.stackplot(xs, *(shares[n] for n in NAMES), colors=[colors[n] for n in NAMES], labels=NAMES, alpha=0.8)
        s = run["summary"]
        ax.set_ylabel("share")
        ax.set_ylim(0, 1)
        ax.set_title(f"{strategy}: mean {s['mean_ms']:.1f} ms = x{s['vs_oracle']:.2f} the measured oracle, "
                     f"p99 x{s['p99_vs_oracle']:.2f}, duplicate calls {s['dup_share'] * 100:.1f} %", fontsize=9)
    axes[-1].set_xlabel("seconds since load began")
    axes[1].legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    path = OUT / f"simulate-pool{tag}-{name}.png"
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def spread(values: list[float], spec: str) -> str:
    """The median of runs and, when there are several, their range."""
    if not values:
        return "-"
    mid = format(statistics.median(values), spec)
    return mid if len(values) == 1 else f"{mid} [{format(min(values), spec)}-{format(max(values), spec)}]"


def summarise_runs(paths: list[str]) -> int:
    """``--summarise A.json B.json…``: per scenario and run, the median and range over the files of the
    mean and p99 ratios, x choice, duplicate share and follow; the cold-start flood of each file."""
    files = [orjson.loads(Path(path).read_bytes()) for path in paths]
    rows: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for data in files:
        for scenario, res in data["results"].items():
            for strategy, s in res["runs"].items():
                rows.setdefault((scenario, strategy), []).append(s)
    print(f"{len(files)} runs: median [range]")
    print("| scenario | run | x oracle mean | x oracle p99 | x choice | duplicate calls % (sim %) | follow "
          "| cold A/B/C |")
    print("|---|---|---|---|---|---|---|---|")
    for (scenario, strategy), runs in rows.items():
        if strategy == ORACLE:
            continue
        choice = [s["choice_vs_sched"] for s in runs if s["choice_vs_sched"] is not None]
        follow = [s["follow_requests"] for s in runs if s["follow_requests"] is not None]
        cold = ", ".join("/".join(str(s["cold_flood"][n]) for n in NAMES) for s in runs)
        dup = (f"{spread([s['dup_share'] * 100 for s in runs], '.1f')} "
               f"({spread([s['sim_dup_share'] * 100 for s in runs], '.1f')})")
        print(f"| {scenario} | {strategy} | {spread([s['vs_oracle'] for s in runs], '.2f')} | "
              f"{spread([s['p99_vs_oracle'] for s in runs], '.2f')} | {spread(choice, '.2f')} | {dup} | "
              f"{spread(follow, '.0f')} | {cold} |")
    return 0


def main() -> int:
    if sys.argv[1:2] == ["--summarise"]:
        return summarise_runs(sys.argv[2:])
    p = argparse.ArgumentParser(description="routing quality of each strategy against the oracle")
    p.add_argument("--quick", action="store_true", help=f"runs of at most {QUICK_SECONDS:g} s")
    p.add_argument("--seconds", type=float, default=None,
                   help=f"load per run (default {DEFAULT_SECONDS:g}, or the scenario's own: cold-start 1.5, "
                        "slow-becomes-fastest 3.5)")
    p.add_argument("--lead", type=float, default=0.2,
                   help="schedule seconds taken by start-up before load begins (estimate)")
    p.add_argument("--concurrency", type=int, default=None,
                   help="concurrent calls (default 12, or the scenario's own: slow-becomes-fastest 4)")
    p.add_argument("--explore", type=float, default=None, help="override fastest.explore (default: firstbyte's)")
    p.add_argument("--alpha", type=float, default=None, help="override fastest.alpha (default: firstbyte's)")
    p.add_argument("--load-weight", type=float, default=None, help="override fastest.load_weight (load-aware runs)")
    p.add_argument("--hedge-after", default=None, help="hedge.after of the hedge runs: seconds or pNN (default p90)")
    p.add_argument("--max-extra", type=float, default=None, help="hedge.max_extra of the hedge runs (default 0.1)")
    p.add_argument("--refresh", type=float, default=None,
                   help="hedge.refresh of the hedge runs (default firstbyte's)")
    p.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    p.add_argument("--race-only", action="store_true",
                   help=f"only the race's scenarios ({', '.join(RACE_SCENARIOS)})")
    p.add_argument("--strategies", nargs="+", default=None, choices=list(STRATEGIES),
                   help="the oracle run always comes first: every ratio is to it (default: "
                        f"{' '.join(DEFAULT_STRATEGIES)}; in the race's scenarios {' '.join(RACE_STRATEGIES)})")
    p.add_argument("--today", default=None,
                   help="a directory holding an earlier proxy/, for the today-ewma and today-hedge strategies")
    p.add_argument("--proxy-dir", default=None,
                   help="a directory holding a variant of proxy/ to serve every run but the oracle (to measure "
                        "a proposed routing change without editing proxy/)")
    p.add_argument("--repeats", type=int, default=1,
                   help="runs per strategy, interleaved with as many oracle runs; ratios over all of them pooled")
    p.add_argument("--dump-calls", action="store_true", help="keep every call's record in the JSON")
    p.add_argument("--tag", default="", help="suffix of the output files (simulate-pool-TAG.json)")
    args = p.parse_args()
    if args.race_only:
        args.scenarios = [s for s in args.scenarios if s in RACE_SCENARIOS]
    tag = f"-{args.tag}" if args.tag else ""
    explore = Fastest().explore if args.explore is None else args.explore
    alpha = Fastest().alpha if args.alpha is None else args.alpha
    # firstbyte's hedge defaults, for the header line (the runs send hedge: {} and the flags)
    defaults = Hedge()
    hedge = {"after": f"p{defaults.after_percentile}" if defaults.after_percentile is not None else defaults.after_secs,
             "max_extra": defaults.max_extra, "refresh": defaults.refresh_secs, **hedge_of(args)}
    OUT.mkdir(exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="firstbyte-pool-"))
    started = time.monotonic()
    results: dict[str, Any] = {}
    for scenario in args.scenarios:
        strategies = args.strategies or (RACE_STRATEGIES if scenario in RACE_SCENARIOS else DEFAULT_STRATEGIES)
        seconds, concurrency = run_length(args, SCENARIOS[scenario])
        loaded = any(SCENARIOS[scenario][n].get("load_ms") for n in NAMES)
        repeats: dict[str, list[dict[str, Any]]] = {}
        for rep in range(args.repeats):  # oracle, strategies, oracle, strategies…: each meets the same machine
            for strategy in (ORACLE, *strategies):
                print(f"{scenario} / {strategy}" + (f" ({rep + 1}/{args.repeats})" if args.repeats > 1 else "")
                      + "…", file=sys.stderr, flush=True)
                run = run_one(args, tmp, scenario, strategy)
                if loaded:
                    loaded_choice(run["calls"], SCENARIOS[scenario], run["offsets"], seconds + args.lead)
                repeats.setdefault(strategy, []).append(run)
        runs = {}
        for strategy in (ORACLE, *strategies):
            reps = repeats[strategy]
            oracle_summary = None if strategy == ORACLE else runs[ORACLE]["summary"]
            if len(reps) == 1:
                run = reps[0]
                run["summary"] = summarise(run["calls"], run["shift_t"], oracle_summary, loaded)
            else:
                run = pooled(reps, oracle_summary, loaded)
            ok = sum(len(r["calls"]) for r in reps) - run["summary"]["errors"]
            requests = sum(len(r["calls"]) for r in reps)
            # The simulators' side: calls each began answering, beyond one per answered request.
            served = {n: sum(r["sims"][n]["served"] for r in reps) for n in NAMES}
            run["summary"]["sim_served"] = served
            run["summary"]["sim_dup_share"] = (sum(served.values()) - ok) / requests
            run["summary"]["stalled"] = sum(r["sims"][n].get("stalled", 0) for r in reps for n in NAMES)
            # Calls each simulator had begun when its first first chunk went out: the cold start's flood
            # (the first repeat's: each repeat starts cold).
            run["summary"]["cold_flood"] = {n: reps[0]["sims"][n].get("cold") or 0 for n in NAMES}
            run["summary"]["seconds"], run["summary"]["concurrency"] = seconds, concurrency
            runs[strategy] = run
        span = seconds + args.lead
        png = chart(scenario, SCENARIOS[scenario], runs, span, tag) if len(runs) > 1 else None
        results[scenario] = {"png": str(png) if png else None, "seconds": seconds, "concurrency": concurrency,
                             "runs": {s: r["summary"] for s, r in runs.items()}}
        if args.dump_calls:
            results[scenario]["calls"] = {s: r["calls"] for s, r in runs.items()}
            results[scenario]["shift_t"] = {s: r["shift_t"] for s, r in runs.items()}
    print(f"\nsimulate-pool — 3 simulated upstreams over HTTP, streamed calls, fastest: explore {explore:g}, "
          f"alpha {alpha:g}; hedge runs: after {hedge['after']}, max_extra {hedge['max_extra']:g}, "
          f"refresh {hedge['refresh']:g} s; time to first chunk at the client (includes the proxy)")
    print("  oracle    the measured oracle: the same upstreams and firstbyte, every request pinned to the "
          "scheduled-best healthy target (by expected time: a stall share counts at its mean; under load, "
          "counting the oracle's own calls waiting there)")
    print("  x oracle  mean / the measured oracle's mean: the routing alone (the goal)")
    print("  x sched   mean / the scheduled first_chunk_ms of the best target: routing plus the proxy's and "
          "HTTP's own cost")
    print("  x choice  the served target's scheduled first_chunk_ms / the best's: the routing by the schedule alone, "
          "free of CPU noise (a hedge counts from the request's start: its delay plus its target's time; a "
          "stalled call its stall; failed attempts not counted; under load the calls still waiting at the target, "
          "reconstructed from the client's records, over the oracle's expected time)")
    print("  p95 x, p99 x  p95, p99 / the measured oracle's;  on best: share of requests served by the scheduled best")
    print("  dup       duplicate upstream calls per request, by race= (sim: by the simulators' served counts)")
    print("  cold      calls each simulator (A/B/C) had begun when its first first chunk went out: the cold "
          "start's flood")
    print("  follow    requests after the shift until 16 of 20 in a row went to the new best\n")
    head = (f"{'scenario':<21}{'run':<19}{'c':>3}{'reqs':>6}{'err':>4}{'mean ms':>8}{'p99 ms':>8}{'x oracle':>9}"
            f"{'x sched':>8}{'x choice':>9}{'p95 x':>6}{'p99 x':>7}{'on best':>8}{'share A/B/C':>12}"
            f"{'dup %':>6}{'sim %':>6}{'cold':>9}{'follow':>7}")
    print(head)
    print("-" * len(head))
    for scenario, res in results.items():
        for strategy, s in res["runs"].items():
            share = "/".join(f"{s['share'][n] * 100:.0f}" for n in NAMES)
            cold = "/".join(str(s["cold_flood"][n]) for n in NAMES)
            print(f"{scenario:<21}{strategy:<19}{res['concurrency']:>3}{s['requests']:>6}{s['errors']:>4}"
                  f"{s['mean_ms']:>8.1f}{s['p99_ms']:>8.1f}{s['vs_oracle']:>9.2f}{s['vs_sched']:>8.2f}"
                  f"{fmt(s['choice_vs_sched'], '.2f'):>9}{s['p95_vs_oracle']:>6.2f}{s['p99_vs_oracle']:>7.2f}"
                  f"{s['on_oracle'] * 100:>7.0f}%{share:>12}{s['dup_share'] * 100:>6.1f}"
                  f"{s['sim_dup_share'] * 100:>6.1f}{cold:>9}{fmt(s['follow_requests'], 'd'):>7}")
    print(f"\ngoals: fastest within x{GOAL} of the measured oracle's mean in every scenario (issue 6); "
          f"with hedge on (issue 13): within x{RACE_GOAL}, at most {DUP_GOAL * 100:.0f} % duplicate calls, "
          f"stall p99 within x{STALL_P99_GOAL} of the oracle's")
    for scenario, res in results.items():
        for strategy, s in res["runs"].items():
            if not strategy.startswith("fastest"):
                continue
            hedged = "hedge" in STRATEGIES[strategy]
            goal = RACE_GOAL if hedged else GOAL
            missed = []
            if s["vs_oracle"] > goal:
                missed.append(f"mean x{s['vs_oracle']:.2f} > x{goal}")
            if hedged and s["dup_share"] > DUP_GOAL:
                missed.append(f"duplicates {s['dup_share'] * 100:.1f} %")
            if hedged and scenario == "stall" and s["p99_vs_oracle"] > STALL_P99_GOAL:
                missed.append(f"p99 x{s['p99_vs_oracle']:.2f}")
            print(f"  {scenario:<21}{strategy:<19}x{s['vs_oracle']:.2f}  p99 x{s['p99_vs_oracle']:.2f}  "
                  f"dup {s['dup_share'] * 100:.1f} %  {'MET' if not missed else 'MISSED: ' + ', '.join(missed)}"
                  f"  (x{fmt(s['choice_vs_sched'], '.2f')} choice"
                  + ("; repeats " + " ".join(f"x{r:.2f}" for r in s["repeats_vs_oracle"])
                     if "repeats_vs_oracle" in s else "") + ")")
    (OUT / f"simulate-pool{tag}.json").write_bytes(orjson.dumps(
        {"explore": explore, "alpha": alpha, "hedge": hedge,
         "goal": {"ratio": GOAL, "race_ratio": RACE_GOAL, "dup_share": DUP_GOAL, "stall_p99": STALL_P99_GOAL,
                  "against": "the measured oracle (vs_oracle, p99_vs_oracle)"},
         "results": results},
        option=orjson.OPT_INDENT_2))
    print(f"\nwrote {OUT / f'simulate-pool{tag}.json'} and a PNG per scenario in "
          f"{time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

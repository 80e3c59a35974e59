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

``--direct`` (scripts/pool_direct.py) measures against a client that calls the fastest upstream itself,
in the same run as every strategy (issue 28's abrupt pools).

    scripts/simulate-pool [--quick] [--race-only] [--scenarios ...] [--strategies ...] [--seconds S]
                          [--concurrency N] [--explore 0.03] [--hedge-after p90] [--refresh 0.3] [--tag T]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # the process helpers are shared with scripts/bench
import pool_direct
from pool_measure import follow, load, pooled, restart, sim_command, sim_offsets, sim_stats, start_all, summarise
from pool_report import chart, print_results, summarise_runs
from pool_schedule import (
    DEFAULT_SECONDS,
    DEFAULT_STRATEGIES,
    DUP_GOAL,
    GOAL,
    NAMES,
    ORACLE,
    OUT,
    QUICK_SECONDS,
    RACE_GOAL,
    RACE_SCENARIOS,
    RACE_STRATEGIES,
    SCENARIOS,
    STALL_P99_GOAL,
    STRATEGIES,
    expected_ms,
    extra_calls,
    knobs_at,
    loaded_choice,
    oracle,
    served_ms,
)

from proxy.config import Fastest, Hedge

# What the tests read from this module (tests/test_simulate_pool.py).
__all__ = ["expected_ms", "extra_calls", "follow", "knobs_at", "load", "loaded_choice", "oracle", "pooled",
           "served_ms", "summarise"]


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
    if route.get("hedge") is not None and route["hedge"] is not False:
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
        picked = (pool_direct.free_ports(args.port_base, len(NAMES) + 1) if args.port_base
                  else [bench.free_port() for _ in range(len(NAMES) + 1)])
        ports, fb_port = dict(zip(NAMES, picked, strict=False)), picked[-1]
        commands: dict[str, tuple[list[str], int]] = {}
        for i, name in enumerate(NAMES):
            spec = scenario[name]
            steps = [{**s, "at": s["at"] * span} for s in spec.get("steps", [])]
            schedule = tmp / f"{scenario_name}-{name}.json"
            schedule.write_text(json.dumps(steps))
            commands[f"sim-{name}"] = (sim_command(spec, ports[name], schedule, i + 1), ports[name])
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
        start_all(procs, commands)
        asyncio.run(restart(ports))
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



def parse_args() -> argparse.Namespace:
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
    p.add_argument("--port-base", type=int, default=None,
                   help="pick each run's loopback ports from here to here + 99 (default: any free port)")
    args = p.parse_args()
    if args.race_only:
        args.scenarios = [s for s in args.scenarios if s in RACE_SCENARIOS]
    return args


def finish(strategy: str, reps: list[dict[str, Any]], oracle_summary: dict[str, Any] | None, loaded: bool,
           seconds: float, concurrency: int) -> dict[str, Any]:
    """One strategy's repeats as one run, with the simulators' own counts beside the client's."""
    if len(reps) == 1:
        run = reps[0]
        run["summary"] = summarise(run["calls"], run["shift_t"], oracle_summary, loaded)
    else:
        run = pooled(reps, oracle_summary, loaded)
    requests = sum(len(r["calls"]) for r in reps)
    ok = requests - run["summary"]["errors"]
    # The simulators' side: calls each began answering, beyond one per answered request.
    served = {n: sum(r["sims"][n]["served"] for r in reps) for n in NAMES}
    run["summary"]["sim_served"] = served
    run["summary"]["sim_dup_share"] = (sum(served.values()) - ok) / requests
    run["summary"]["stalled"] = sum(r["sims"][n].get("stalled", 0) for r in reps for n in NAMES)
    # Calls each simulator had begun when its first first chunk went out: the cold start's flood
    # (the first repeat's: each repeat starts cold).
    run["summary"]["cold_flood"] = {n: reps[0]["sims"][n].get("cold") or 0 for n in NAMES}
    run["summary"]["seconds"], run["summary"]["concurrency"] = seconds, concurrency
    return run


def run_scenario(args: argparse.Namespace, tmp: Path, scenario: str, tag: str) -> dict[str, Any]:
    """The oracle and each strategy, ``--repeats`` times interleaved; the scenario's result and chart."""
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
    runs: dict[str, dict[str, Any]] = {}
    for strategy in (ORACLE, *strategies):
        oracle_summary = None if strategy == ORACLE else runs[ORACLE]["summary"]
        runs[strategy] = finish(strategy, repeats[strategy], oracle_summary, loaded, seconds, concurrency)
    span = seconds + args.lead
    png = chart(scenario, SCENARIOS[scenario], runs, span, tag) if len(runs) > 1 else None
    result = {"png": str(png) if png else None, "seconds": seconds, "concurrency": concurrency,
              "runs": {s: r["summary"] for s, r in runs.items()}}
    if args.dump_calls:
        result["calls"] = {s: r["calls"] for s, r in runs.items()}
        result["shift_t"] = {s: r["shift_t"] for s, r in runs.items()}
    return result


def main() -> int:
    if sys.argv[1:2] == ["--summarise"]:
        return summarise_runs(sys.argv[2:])
    if sys.argv[1:2] == ["--direct"]:  # issue 28's abrupt pools, every strategy and the direct client at once
        return pool_direct.main(sys.argv[2:])
    args = parse_args()
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
    results = {scenario: run_scenario(args, tmp, scenario, tag) for scenario in args.scenarios}
    print_results(results, explore, alpha, hedge)
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

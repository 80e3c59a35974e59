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

    scripts/simulate-pool [--quick] [--seconds 6.5] [--concurrency 12] [--explore 0.03]
"""

from __future__ import annotations

import argparse
import asyncio
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

from proxy.config import Fastest
from proxy.routing.decision import parse_header

ROOT = bench.ROOT
OUT = ROOT / "bench-results"
NAMES = ("A", "B", "C")
GOAL = 1.15

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
}
ORACLE = "oracle"  # the reference run: every request pinned to the scheduled-best target
STRATEGIES: dict[str, dict[str, Any]] = {
    "ordered": {"strategy": "ordered"},
    "weighted": {"strategy": "weighted"},
    "fastest-ewma": {"strategy": "fastest", "fastest": {"signal": "ewma"}},
    "fastest-p50": {"strategy": "fastest", "fastest": {"signal": "p50"}},
}


def knobs_at(spec: dict[str, Any], elapsed: float, span: float) -> dict[str, float]:
    """A target's knobs ``elapsed`` seconds into its schedule (steps are fractions of ``span``)."""
    knobs = {"first_chunk_ms": spec["first_chunk_ms"], "fail_rate": spec.get("fail_rate", 0.0)}
    for step in spec.get("steps", []):
        if elapsed >= step["at"] * span:
            knobs.update({k: v for k, v in step.items() if k != "at"})
    return knobs


def oracle(scenario: dict[str, Any], elapsed: dict[str, float], span: float) -> tuple[str, float]:
    """The fastest healthy target and its scheduled first-chunk time (ms) at this moment."""
    best = ("-", float("inf"))
    for name in NAMES:
        k = knobs_at(scenario[name], elapsed[name], span)
        if k["fail_rate"] == 0 and k["first_chunk_ms"] < best[1]:
            best = (name, k["first_chunk_ms"])
    return best


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
    t_load = time.monotonic()

    async def worker(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < until:
            sent = time.monotonic()
            elapsed = {n: sent - starts[n] for n in NAMES}
            best, best_ms = oracle(scenario, elapsed, span)
            record: dict[str, Any] = {"t": sent - t_load, "oracle": best, "oracle_ms": best_ms}
            headers = pinned[best] if pin and best in pinned else plain
            try:
                async with session.post(url, data=body, headers=headers) as resp:
                    first = await resp.content.readany()
                    record["ttfc_ms"] = (time.monotonic() - sent) * 1000
                    await resp.read()
                    record["ok"] = resp.status == 200 and bool(first)
                    record["served"] = served = parse_header(resp.headers["x-route-decision"]).served
                    if served in scenario:  # what this choice costs by the schedule, without the wire
                        record["served_ms"] = knobs_at(scenario[served], elapsed[served], span)["first_chunk_ms"]
            except (aiohttp.ClientError, KeyError, ValueError):
                record["ok"] = False
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


def follow(calls: list[dict[str, Any]], shift_t: float) -> int | None:
    """Requests after the shift until 80 % of the next 20 went to the new oracle target."""
    after = [c for c in calls if c["t"] >= shift_t and c.get("ok")]
    for i in range(len(after) - 20):
        window = after[i:i + 20]
        if sum(c.get("served") == c["oracle"] for c in window) >= 16:
            return i
    return None


def summarise(calls: list[dict[str, Any]], shift_t: float | None,
              oracle_run: dict[str, Any] | None = None) -> dict[str, Any]:
    """One run's figures; ``oracle_run`` is the measured oracle's summary (None for the oracle itself).

    ``vs_oracle`` is the mean over the measured oracle's mean (the goal); ``vs_sched`` is the mean
    over the scheduled ``first_chunk_ms`` of the best target at each request (it includes the
    proxy's and HTTP's own cost)."""
    ok = [c for c in calls if c.get("ok")]
    ttfc = sorted(c["ttfc_ms"] for c in ok)
    sched_mean = statistics.fmean(c["oracle_ms"] for c in ok)
    share = {n: sum(c.get("served") == n for c in ok) / len(ok) for n in NAMES}
    out: dict[str, Any] = {"requests": len(calls), "errors": len(calls) - len(ok),
                           "mean_ms": statistics.fmean(ttfc), "p95_ms": ttfc[int(0.95 * (len(ttfc) - 1))],
                           "sched_mean_ms": sched_mean, "share": share,
                           "on_oracle": sum(c.get("served") == c["oracle"] for c in ok) / len(ok)}
    reference = out if oracle_run is None else oracle_run
    out["oracle_mean_ms"] = reference["mean_ms"]
    out["vs_oracle"] = out["mean_ms"] / reference["mean_ms"]
    out["p95_vs_oracle"] = out["p95_ms"] / reference["p95_ms"]
    out["vs_sched"] = out["mean_ms"] / sched_mean
    chosen = [c["served_ms"] for c in ok if "served_ms" in c]
    # The served targets' scheduled first_chunk_ms over the oracle's: the routing's cost by the schedule
    # alone, free of CPU noise (it does not count the time of failed attempts before a failover).
    out["choice_vs_sched"] = statistics.fmean(chosen) / sched_mean if chosen else None
    out["follow_requests"] = follow(calls, shift_t) if shift_t is not None else None
    return out


def run_one(args: argparse.Namespace, tmp: Path, scenario_name: str, strategy: str) -> dict[str, Any]:
    """Fresh upstreams and a fresh firstbyte; load for ``args.seconds``; the raw calls.

    ``strategy`` ``oracle`` serves the route ``ordered`` and pins every request to the scheduled
    best target (a pin never explores), so it measures the oracle over the same wire."""
    scenario = SCENARIOS[scenario_name]
    span = args.seconds + args.lead
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
                                        "--seed", str(i + 1), "--schedule", str(schedule)], ports[name])
        pin = strategy == ORACLE
        route = {**({"strategy": "ordered"} if pin else STRATEGIES[strategy]),
                 "targets": [{"provider": n, "model": "sim"} for n in NAMES]}
        if "fastest" in route:
            route["fastest"] = {**route["fastest"], "seed": 7}
            if args.explore is not None:
                route["fastest"]["explore"] = args.explore
            if args.alpha is not None:
                route["fastest"]["alpha"] = args.alpha
        config = {"listen": f"127.0.0.1:{fb_port}", "access_log": {"path": "/dev/null"},
                  "providers": {n: {"kind": "openai", "base_url": f"http://127.0.0.1:{p}/v1"}
                                for n, p in ports.items()},
                  "routes": {"pool": route}}
        path = tmp / "pool.json"
        path.write_text(json.dumps(config))
        commands["firstbyte"] = ([str(bench.BIN / "firstbyte"), "serve", "--config", str(path)], fb_port)
        procs.start_many(commands)
        starts = asyncio.run(sim_offsets(ports))
        until = min(starts.values()) + span
        url = f"http://127.0.0.1:{fb_port}/v1/chat/completions"
        result = asyncio.run(load(url, args.concurrency, until, starts, scenario, span,
                                  f"http://127.0.0.1:{fb_port}/v1/health", pin=pin))
        shifts = [step["at"] * span - result["offsets"][n] for n in NAMES for step in scenario[n].get("steps", [])]
        result["shift_t"] = min(shifts) if shifts else None  # in seconds since load began
        return result
    finally:
        procs.stop_all()


def chart(name: str, scenario: dict[str, Any], runs: dict[str, dict[str, Any]], span: float) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"A": "tab:blue", "B": "tab:orange", "C": "tab:green"}
    fig, axes = plt.subplots(1 + len(runs), 1, figsize=(10, 2.2 * (1 + len(runs))), sharex=True)
    ax = axes[0]
    t_end = max(c["t"] for r in runs.values() for c in r["calls"])
    grid = [i * t_end / 200 for i in range(201)]
    offsets = runs["fastest-ewma"]["offsets"]
    for n in NAMES:
        ax.plot(grid, [knobs_at(scenario[n], t + offsets[n], span)["first_chunk_ms"] for t in grid], "--",
                color=colors[n], lw=1, label=f"{n} scheduled")
        figs = runs["fastest-ewma"]["figures"]
        pts = [(f["t"], f[n] * 1000) for f in figs if f.get(n) is not None]
        if pts:
            ax.plot(*zip(*pts, strict=True), color=colors[n], lw=1.5, label=f"{n} figure (ewma)")
        failing = [t for t in grid if knobs_at(scenario[n], t + offsets[n], span)["fail_rate"] > 0]
        if failing:
            ax.axvspan(min(failing), max(failing), color=colors[n], alpha=0.08, label=f"{n} failing")
    ax.set_ylabel("first chunk ms")
    ax.set_title(f"{name}: scheduled latency and firstbyte's figure (fastest-ewma run)")
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
                     f"x{s['vs_sched']:.2f} the scheduled", fontsize=9)
    axes[-1].set_xlabel("seconds since load began")
    axes[1].legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    path = OUT / f"simulate-pool-{name}.png"
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def main() -> int:
    p = argparse.ArgumentParser(description="routing quality of each strategy against the oracle")
    p.add_argument("--quick", action="store_true", help="shorter runs")
    p.add_argument("--seconds", type=float, default=6.5, help="load per run")
    p.add_argument("--lead", type=float, default=0.2,
                   help="schedule seconds taken by start-up before load begins (estimate)")
    p.add_argument("--concurrency", type=int, default=12)
    p.add_argument("--explore", type=float, default=None, help="override fastest.explore (default: firstbyte's)")
    p.add_argument("--alpha", type=float, default=None, help="override fastest.alpha (default: firstbyte's)")
    p.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    p.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=list(STRATEGIES),
                   help="the oracle run always comes first: every ratio is to it")
    args = p.parse_args()
    if args.quick:
        args.seconds = 4.0
    explore = Fastest().explore if args.explore is None else args.explore
    alpha = Fastest().alpha if args.alpha is None else args.alpha
    OUT.mkdir(exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="firstbyte-pool-"))
    started = time.monotonic()
    results: dict[str, Any] = {}
    for scenario in args.scenarios:
        runs = {}
        for strategy in (ORACLE, *args.strategies):
            print(f"{scenario} / {strategy}…", file=sys.stderr, flush=True)
            run = run_one(args, tmp, scenario, strategy)
            run["summary"] = summarise(run["calls"], run["shift_t"],
                                       None if strategy == ORACLE else runs[ORACLE]["summary"])
            runs[strategy] = run
        span = args.seconds + args.lead
        png = chart(scenario, SCENARIOS[scenario], runs, span) if "fastest-ewma" in runs else None
        results[scenario] = {"png": str(png) if png else None,
                             "runs": {s: r["summary"] for s, r in runs.items()}}
    print(f"\nsimulate-pool — 3 simulated upstreams over HTTP, {args.concurrency} concurrent streamed calls, "
          f"{args.seconds:g} s per run, fastest: explore {explore:g}, alpha {alpha:g}; time to first chunk at "
          f"the client (includes the proxy)")
    print("  oracle    the measured oracle: the same upstreams and firstbyte, every request pinned to the "
          "scheduled-best healthy target")
    print("  x oracle  mean / the measured oracle's mean: the routing alone (the goal)")
    print("  x sched   mean / the scheduled first_chunk_ms of the best target: routing plus the proxy's and "
          "HTTP's own cost")
    print("  x choice  the served target's scheduled first_chunk_ms / the best's: the routing by the schedule alone, "
          "free of CPU noise (failed attempts before a failover not counted)")
    print("  p95 x     p95 / the measured oracle's p95;  on best: share of requests served by the scheduled best")
    print("  follow    requests after the shift until 16 of 20 in a row went to the new best\n")
    head = (f"{'scenario':<16}{'run':<14}{'reqs':>6}{'err':>5}{'mean ms':>9}{'p95 ms':>8}{'x oracle':>9}"
            f"{'x sched':>8}{'x choice':>9}{'p95 x':>7}{'on best':>8}{'share A/B/C':>13}{'follow':>7}")
    print(head)
    print("-" * len(head))
    verdicts = []
    for scenario, res in results.items():
        for strategy, s in res["runs"].items():
            share = "/".join(f"{s['share'][n] * 100:.0f}" for n in NAMES)
            follow_n = "-" if s["follow_requests"] is None else str(s["follow_requests"])
            print(f"{scenario:<16}{strategy:<14}{s['requests']:>6}{s['errors']:>5}{s['mean_ms']:>9.1f}"
                  f"{s['p95_ms']:>8.1f}{s['vs_oracle']:>9.2f}{s['vs_sched']:>8.2f}{s['choice_vs_sched']:>9.2f}"
                  f"{s['p95_vs_oracle']:>7.2f}"
                  f"{s['on_oracle'] * 100:>7.0f}%{share:>13}{follow_n:>7}")
            if strategy.startswith("fastest"):
                verdicts.append((scenario, strategy, s["vs_oracle"], s["vs_sched"], s["choice_vs_sched"]))
    print(f"\ngoal: fastest within x{GOAL} of the measured oracle's mean in every scenario "
          f"(x oracle; x sched and x choice shown for reference)")
    for scenario, strategy, ratio, sched, choice in verdicts:
        print(f"  {scenario:<16}{strategy:<14}x{ratio:.2f}  {'MET' if ratio <= GOAL else 'MISSED':<7}"
              f"(x{sched:.2f} sched, x{choice:.2f} choice)")
    (OUT / "simulate-pool.json").write_bytes(orjson.dumps(
        {"seconds": args.seconds, "concurrency": args.concurrency, "explore": explore, "alpha": alpha,
         "goal": {"ratio": GOAL, "against": "the measured oracle's mean (vs_oracle)"},
         "results": results},
        option=orjson.OPT_INDENT_2))
    print(f"\nwrote {OUT / 'simulate-pool.json'} and a PNG per scenario in "
          f"{time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

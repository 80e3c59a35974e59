"""scripts/fleet_pool.py: a fleet's time to first chunk on simulate-pool's scenarios, against one instance's.

Issue 26's goal: a fleet (``--instances`` real ``firstbyte serve`` processes sharing one real
``redis-server``, a client sending round-robin over them) answers within 5 % of one instance's mean
time to first chunk, on the same scenarios. For each scenario and repeat it runs ``one`` (one
``firstbyte serve``, no ``state``: exactly as today), ``fleet``, and ``alone`` (as many instances as
the fleet, each on its own: what more processes on the same cores cost without Redis), interleaved in
the same run (one, fleet, alone, then alone, fleet, one: each meets the machine as the others do),
each with fresh simulators on the scenario's schedule (``scripts/pool_schedule.py``'s ``SCENARIOS``,
imported, not copied) and fresh firstbyte processes, so each starts cold; a fleet run's Redis stream is
its own (a fleet name per run).

The firstbyte processes start and report ready (``/readyz``: the fleet's warm start is done) before
the simulators start, so both modes begin load at the same point of the schedule however long three
processes take to start on a busy machine. A closed loop of streamed calls (``--concurrency``, the
scenario's own by default) measures time to first chunk at the client; ``x sched choice`` is the
served target's scheduled ``first_chunk_ms`` (simulate-pool's ``served_ms``): what the routing chose,
free of the CPU noise a 2-core machine adds to the wire figure (not computed for the ``load``
scenario, whose cost depends on the calls waiting). Ports: ``--port-base`` takes consecutive free
ports from there (manual runs on a shared machine keep to their range); 0 lets the kernel choose.

    .venv/bin/python scripts/fleet_pool.py [--instances 3] [--strategy fastest-ewma] [--repeats 2]
                                           [--scenarios ...] [--quick] [--port-base 42310]

Writes ``bench-results/fleet-pool.json``. Not run by the test suite (it is a measurement).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench
import simulate_pool as pool

from proxy.routing.decision import parse_header

OUT = bench.ROOT / "bench-results"
GOAL = 1.05  # the fleet's mean time to first chunk within this of one instance's
# one: one instance, as today; fleet: --instances sharing Redis; alone: as many instances, each on its own (no
# state): the fleet's cost beside what running more processes on the same cores costs anyway.
MODES = ("one", "fleet", "alone")


class Ports:
    """Free loopback ports taken in turn from ``base`` to ``base + span - 1``, then from ``base`` again
    (a finished run's processes are gone by then); ``base`` 0: the kernel's choice each time."""

    def __init__(self, base: int, span: int = 100) -> None:
        self.base, self.span, self.turn = base, span, 0

    def take(self) -> int:
        if not self.base:
            return int(bench.free_port())
        for _ in range(self.span):
            port, self.turn = self.base + self.turn, (self.turn + 1) % self.span
            with socket.socket() as s, contextlib.suppress(OSError):
                s.bind(("127.0.0.1", port))
                return port
        raise RuntimeError(f"no free port in {self.base}-{self.base + self.span - 1}")


def start_redis(ports: Ports, tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    binary = shutil.which("redis-server") or sys.exit("redis-server is not installed")
    port = ports.take()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(tmp), "--loglevel", "warning"], stdout=subprocess.DEVNULL)
    bench.wait_port(port, proc)
    return proc, f"redis://127.0.0.1:{port}/0"


def sim_command(scenario: dict[str, Any], name: str, seed: int, port: int, span: float, schedule: Path) -> list[str]:
    """One simulator on its schedule, as simulate-pool starts it (steps in seconds of ``span``)."""
    spec = scenario[name]
    schedule.write_text(json.dumps([{**s, "at": s["at"] * span} for s in spec.get("steps", [])]))
    return [str(bench.BIN / "firstbyte"), "simulate", "--port", str(port),
            "--first-chunk-ms", str(spec["first_chunk_ms"]), "--jitter-ms", str(spec.get("jitter_ms", 0)),
            "--chunk-ms", "1", "--chunks", "2", "--fail-rate", str(spec.get("fail_rate", 0.0)),
            "--stall-rate", str(spec.get("stall_rate", 0.0)), "--stall-ms", str(spec.get("stall_ms", 0.0)),
            "--load-ms", str(spec.get("load_ms", 0.0)), "--seed", str(seed), "--schedule", str(schedule)]


async def ready(urls: list[str]) -> None:
    """Every instance answers ``/readyz`` 200 (a fleet member has finished its warm start)."""
    async with aiohttp.ClientSession() as session:
        for url in urls:
            for _ in range(1200):
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(url + "/readyz") as resp:
                        if resp.status == 200:
                            break
                await asyncio.sleep(0.025)
            else:
                raise RuntimeError(f"{url} never became ready")


async def round_robin(urls: list[str], concurrency: int, until: float, starts: dict[str, float],
                      scenario: dict[str, Any], span: float) -> list[dict[str, Any]]:
    """Closed-loop streamed calls until ``until``, each to the next instance in turn (one counter for
    every worker: a round-robin balancer); time to first chunk, the served target, its scheduled cost."""
    body = orjson.dumps({"model": "pool", "messages": [{"role": "user", "content": "hi"}], "stream": True})
    headers = {"content-type": "application/json"}
    turn = itertools.count()
    loaded = any(scenario[n].get("load_ms") for n in pool.NAMES)
    calls: list[dict[str, Any]] = []

    async def worker(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < until:
            sent = time.monotonic()
            instance = next(turn) % len(urls)
            record: dict[str, Any] = {"ok": False, "at": sent - min(starts.values()), "instance": instance,
                                      "wall": time.time()}
            try:
                async with session.post(urls[instance] + "/v1/chat/completions", data=body,
                                        headers=headers) as resp:
                    first = await resp.content.readany()
                    record["ttfc_ms"] = (time.monotonic() - sent) * 1000
                    await resp.read()
                    record["ok"] = resp.status == 200 and bool(first)
                    record["header"] = resp.headers["x-route-decision"]
                    decision = parse_header(record["header"])
                    record["served"] = served = decision.served
                    if record["ok"] and served in pool.NAMES and not loaded:
                        knobs = pool.knobs_at(scenario[served], sent - starts[served], span)
                        role = dict(decision.race).get(served, "")
                        record["sched_ms"] = pool.served_ms(knobs, record["ttfc_ms"], role)
            except (aiohttp.ClientError, KeyError, ValueError):
                record["ok"] = False
            calls.append(record)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return calls


async def load(urls: list[str], concurrency: int, sims: dict[str, int], scenario: dict[str, Any], seconds: float,
               span: float) -> list[dict[str, Any]]:
    """The simulators' schedules start again now (``POST /sim/restart``), then the calls: every mode
    begins its load at the same point of the schedule, however long its processes took to come up (a
    fleet's three took longer, so its load began up to 0.3 s later in the schedule than one instance's
    and had fewer calls before a scheduled step: a bias against the fleet of about 2 % on leader-fails)."""
    await pool.restart(sims)
    starts = await pool.sim_offsets(sims)
    until = min(starts.values()) + span
    if not any(scenario[n].get("steps") for n in pool.NAMES):  # no schedule to keep in step with
        until = max(until, time.monotonic() + seconds)
    return await round_robin(urls, concurrency, until, starts, scenario, span)


def redis_commands(url: str) -> dict[str, int]:
    """Commands Redis has served so far, by name (``INFO commandstats``): a fleet run's cost in Redis."""
    client = redis.Redis.from_url(url)
    try:
        stats: Any = client.info("commandstats")
    finally:
        client.close()
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}


def start_many(procs: bench.Procs, commands: dict[str, tuple[list[str], int]]) -> None:
    """``Procs.start_many`` with a minute for each port: three processes starting at once on a machine
    shared by several engineers' test runs can take longer than the bench's 20 s."""
    started = [(procs.spawn(name, args), port) for name, (args, port) in commands.items()]
    for proc, port in started:
        bench.wait_port(port, proc, timeout=60)


def seeded(route: dict[str, Any], rep: int, instance: int) -> dict[str, Any]:
    """The route with a seed of its own per repeat and instance. One seed everywhere (simulate-pool's 7)
    gave each of a fleet's instances the first third of the draws one instance makes, so the two
    explored a different, fixed mix of targets in every repeat: on cold-start (about 230 calls an
    instance) the fleet explored the 120 ms target as often as the 50 ms one, one instance half as
    often, a bias of up to 1 % against the fleet that no number of repeats averaged out
    (docs/operations.md, "The cold start, call by call"). Seeds that differ leave the same explore
    rate and an unbiased mix, at the cost of some spread between repeats."""
    if "fastest" not in route:
        return route
    return {**route, "fastest": {**route["fastest"], "seed": 7 + 1000 * rep + instance}}


def run_one(args: argparse.Namespace, ports: Ports, tmp: Path, redis: str, scenario_name: str, mode: str,
            rep: int) -> dict[str, Any]:
    """``run_once``, once more with fresh ports when a process could not start (as simulate-pool does)."""
    try:
        return run_once(args, ports, tmp, redis, scenario_name, mode, rep)
    except RuntimeError as exc:
        print(f"  retrying: {exc}", file=sys.stderr, flush=True)
        return run_once(args, ports, tmp, redis, scenario_name, mode, rep)


def run_once(args: argparse.Namespace, ports: Ports, tmp: Path, redis: str, scenario_name: str, mode: str,
             rep: int) -> dict[str, Any]:
    """Fresh firstbyte process(es), ready; then fresh simulators; load for the scenario's seconds; the
    calls and the CPU every firstbyte process spent during the load, per call."""
    scenario = pool.SCENARIOS[scenario_name]
    seconds, concurrency = pool.run_length(args, scenario)
    span = seconds + args.lead
    procs = bench.Procs(tmp)
    try:
        sims = {n: ports.take() for n in pool.NAMES}
        route = pool.route_of(args, args.strategy)
        count = 1 if mode == "one" else args.instances
        providers = {n: {"kind": "openai", "base_url": f"http://127.0.0.1:{p}/v1"} for n, p in sims.items()}
        state = {"state": {"redis": redis, "fleet": f"pool-{scenario_name}-{rep}"}} if mode == "fleet" else {}
        commands: dict[str, tuple[list[str], int]] = {}
        urls = []
        for i in range(count):
            port = ports.take()
            config = {"listen": f"127.0.0.1:{port}", "access_log": {"path": "/dev/null"}, **state,
                      "providers": providers, "routes": {"pool": seeded(route, rep, i)}}
            path = tmp / f"fb{i}.json"
            path.write_text(json.dumps(config))
            commands[f"firstbyte-{i}"] = ([str(bench.BIN / "firstbyte"), "serve", "--config", str(path)], port)
            urls.append(f"http://127.0.0.1:{port}")
        start_many(procs, commands)
        pids = [proc.pid for proc in procs.procs]
        asyncio.run(ready(urls))
        start_many(procs, {f"sim-{n}": (sim_command(scenario, n, i + 1, sims[n], span, tmp / f"{n}.json"), sims[n])
                           for i, n in enumerate(pool.NAMES)})
        before = redis_commands(redis) if mode == "fleet" else {}
        cpu = sum(bench.cpu_secs(pid) for pid in pids)
        calls = asyncio.run(load(urls, concurrency, sims, scenario, seconds, span))
        used = sum(bench.cpu_secs(pid) for pid in pids) - cpu
        sent = {k: v - before.get(k, 0) for k, v in redis_commands(redis).items()} if mode == "fleet" else {}
        if not any(c["ok"] for c in calls):
            raise RuntimeError(f"{scenario_name} / {mode}: no call answered within the run")
        return {"calls": calls, "cpu_ms_per_call": used * 1000 / max(len(calls), 1), "load": os.getloadavg()[0],
                "redis_per_call": {k: v / max(len(calls), 1) for k, v in sent.items() if v}}
    finally:
        procs.stop_all()


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Pooled over runs: mean, p50 and p99 time to first chunk, scheduled cost, shares, CPU per call."""
    calls = [c for r in runs for c in r["calls"]]
    ok = [c for c in calls if c["ok"]]
    ttfc = sorted(c["ttfc_ms"] for c in ok)
    sched = [c["sched_ms"] for c in ok if "sched_ms" in c]
    return {"requests": len(calls), "errors": len(calls) - len(ok), "mean_ms": statistics.fmean(ttfc),
            "p99_ms": ttfc[int(0.99 * (len(ttfc) - 1))], "sched_ms": statistics.fmean(sched) if sched else None,
            "p50_ms": ttfc[len(ttfc) // 2], "cpu_ms_per_call": statistics.fmean(r["cpu_ms_per_call"] for r in runs),
            "share": {n: sum(c.get("served") == n for c in ok) / len(ok) for n in pool.NAMES}}


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a / b


T90 = (6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812)  # Student's t, 90 % two-sided


def paired(base: list[dict[str, Any]], other: list[dict[str, Any]]) -> dict[str, Any]:
    """Each repeat's ratio of means (the two runs met the machine side by side), their geometric mean
    and its 90 % interval (Student's t over the log ratios): a claim of 5 % holds when the interval's
    top is under the goal, and is refuted when its bottom is over it."""
    ratios = [summary([o])["mean_ms"] / summary([b])["mean_ms"] for b, o in zip(base, other, strict=True)]
    logs = [math.log(r) for r in ratios]
    mid = statistics.fmean(logs)
    half = (T90[min(len(logs) - 2, len(T90) - 1)] * statistics.stdev(logs) / math.sqrt(len(logs))
            if len(logs) > 1 else math.inf)
    return {"ratios": ratios, "gmean": math.exp(mid), "lo": math.exp(mid - half), "hi": math.exp(mid + half)}


def verdict(p: dict[str, Any]) -> str:
    if p["hi"] <= GOAL:
        return "met"
    return "missed" if p["lo"] > GOAL else "not shown"


def shares(s: dict[str, Any]) -> str:
    return "/".join(f"{s['share'][n] * 100:.0f}" for n in pool.NAMES)


def report(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    modes = args.modes
    print(f"\nfleet-pool: modes {'|'.join(modes)} (one: one instance, no state; fleet: {args.instances} instances "
          f"sharing a redis-server; alone: {args.instances} each on its own); round-robin client; strategy "
          f"{args.strategy}; {args.repeats} interleaved repeat(s)")
    head = (f"{'scenario':<17}{'c':>3}{'mean ms ' + '|'.join(modes):>25}{'fleet/one [90 %]':>24}{'verdict':>10}"
            f"{'fleet/alone':>12}{'sched f/o':>10}{'CPU ms/call':>18}{'share A/B/C':>27}{'load':>10}")
    print(head)
    print("-" * len(head))
    for name, res in results.items():
        rows = [res[m] for m in modes]

        def cells(key: str, spec: str, rows: list[dict[str, Any]] = rows) -> str:
            return "|".join("-" if r[key] is None else format(r[key], spec) for r in rows)

        pr = res["paired"]
        alone = f"{res['x_alone']:.3f}" if "x_alone" in res else "-"
        sched = "-" if res["x_one_sched"] is None else f"{res['x_one_sched']:.3f}"
        print(f"{name:<17}{res['concurrency']:>3}{cells('mean_ms', '.1f'):>25}"
              f"{pr['gmean']:>8.3f} [{pr['lo']:.3f}-{pr['hi']:.3f}]{verdict(pr):>10}{alone:>12}{sched:>10}"
              f"{cells('cpu_ms_per_call', '.2f'):>18}{'|'.join(shares(r) for r in rows):>27}"
              f"{res['load'][0]:>5.1f}-{res['load'][1]:.1f}")
        print(f"{'':<20}repeats fleet/one: {' '.join(f'{r:.3f}' for r in pr['ratios'])}; Redis commands per fleet "
              f"call: {', '.join(f'{k} {v:.3f}' for k, v in sorted(res['redis_per_call'].items())) or '-'}")
    print(f"\nfleet/one: the geometric mean over repeats of each repeat's fleet mean time to first chunk / one "
          f"instance's, with its 90 % interval (goal <= {GOAL}: met when the interval's top is under it, missed "
          "when its bottom is over it). fleet/alone: pooled, the same number of processes without Redis. sched f/o: "
          "the served targets' scheduled first_chunk_ms, fleet / one (the routing's choice, without the machine's "
          "noise). CPU: all firstbyte processes' CPU during the load / calls. load: the 1-minute load average "
          "over the scenario's runs (2 cores: figures under a load much over 1 are loaded).")


def save(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> Path:
    """The JSON so far (after every scenario: a run stopped part-way keeps what it measured)."""
    OUT.mkdir(exist_ok=True)
    out = OUT / f"fleet-pool{'-' + args.tag if args.tag else ''}.json"
    out.write_bytes(orjson.dumps({"instances": args.instances, "strategy": args.strategy, "repeats": args.repeats,
                                  "goal": GOAL, "results": results}, option=orjson.OPT_INDENT_2))
    return out


def scenario_result(args: argparse.Namespace, name: str, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    pooled = {m: summary(runs[m]) for m in args.modes}
    loads = [r["load"] for rs in runs.values() for r in rs]
    fleet_calls = sum(len(r["calls"]) for r in runs["fleet"])
    commands: dict[str, float] = {}
    for r in runs["fleet"]:
        for k, v in r["redis_per_call"].items():
            commands[k] = commands.get(k, 0.0) + v * len(r["calls"]) / fleet_calls
    return {**pooled, "concurrency": pool.run_length(args, pool.SCENARIOS[name])[1],
            "x_one": pooled["fleet"]["mean_ms"] / pooled["one"]["mean_ms"],
            **({"x_alone": pooled["fleet"]["mean_ms"] / pooled["alone"]["mean_ms"]} if "alone" in pooled else {}),
            "x_one_sched": ratio(pooled["fleet"]["sched_ms"], pooled["one"]["sched_ms"]),
            "paired": paired(runs["one"], runs["fleet"]), "load": [min(loads), max(loads)],
            "redis_per_call": commands}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--instances", type=int, default=3)
    p.add_argument("--strategy", default="fastest-ewma", choices=list(pool.STRATEGIES))
    p.add_argument("--scenarios", nargs="+", default=list(pool.SCENARIOS), choices=list(pool.SCENARIOS))
    p.add_argument("--repeats", type=int, default=2,
                   help="runs of each mode per scenario, order reversed every other repeat")
    p.add_argument("--quick", action="store_true", help=f"runs of at most {pool.QUICK_SECONDS:g} s")
    p.add_argument("--seconds", type=float, default=None)
    p.add_argument("--concurrency", type=int, default=None)
    p.add_argument("--lead", type=float, default=0.2)
    p.add_argument("--port-base", type=int, default=0,
                   help="take ports from here to here + 99, in turn (0: the kernel's choice)")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES,
                   help="one and fleet at least; alone shows what more processes cost without Redis")
    p.add_argument("--tag", default="")
    p.add_argument("--dump-calls", action="store_true",
                   help="also write every call (instance, time, first chunk, x-route-decision) per run")
    args = p.parse_args()
    if not {"one", "fleet"} <= set(args.modes):
        p.error("--modes needs one and fleet")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped run still stops its processes
    for knob in ("explore", "alpha", "load_weight", "hedge_after", "max_extra", "refresh"):
        setattr(args, knob, None)  # simulate-pool's overrides, none: firstbyte's defaults
    ports = Ports(args.port_base)
    tmp = Path(tempfile.mkdtemp(prefix="fleet-pool-"))
    redis_proc, redis = start_redis(ports, tmp)
    started = time.monotonic()
    results: dict[str, dict[str, Any]] = {}
    dumped: dict[str, Any] = {}
    try:
        for name in args.scenarios:
            runs: dict[str, list[dict[str, Any]]] = {m: [] for m in args.modes}
            for rep in range(args.repeats):
                for mode in args.modes if rep % 2 == 0 else args.modes[::-1]:
                    print(f"{name} / {mode} ({rep + 1}/{args.repeats})…", file=sys.stderr, flush=True)
                    runs[mode].append(run_one(args, ports, tmp, redis, name, mode, rep))
            results[name] = res = scenario_result(args, name, runs)
            pr = res["paired"]
            print(f"{name}: fleet/one {pr['gmean']:.3f} [{pr['lo']:.3f}-{pr['hi']:.3f}] (repeats "
                  + " ".join(f"{r:.3f}" for r in pr["ratios"]) + "), means (ms) "
                  + ", ".join(f"{m} {res[m]['mean_ms']:.1f}" for m in args.modes)
                  + f", load {res['load'][0]:.1f}-{res['load'][1]:.1f}", file=sys.stderr, flush=True)
            save(results, args)
            if args.dump_calls:
                dumped[name] = runs
                (OUT / f"fleet-pool-calls{'-' + args.tag if args.tag else ''}.json").write_bytes(orjson.dumps(dumped))
    finally:
        redis_proc.terminate()
        redis_proc.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    report(results, args)
    print(f"wrote {save(results, args)} in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""scripts/simulate-pool --direct: firstbyte against a client that calls the fastest target itself (issue 28).

The oracle of the other modes is a separate run (or the configured delay); here each strategy runs in
the *same* run as a direct client, side by side: three ``firstbyte simulate`` upstreams follow a
scenario's schedule, a fresh firstbyte serves the pool from a cold start, and at the same moment its
``concurrency`` workers and the *direct* client's call it with streamed requests, closed loop. The
direct client sends each request straight to the upstream that is fastest by the schedule when it is
sent (same loopback, same upstream processes, no proxy). So the machine's noise (two shared cores)
falls on both alike, and ``x direct`` (a strategy's mean time to first token over the direct client's)
is what firstbyte costs a caller who could not know which target is fastest, the proxy's own hop
included. The strategies of a repeat take turns (each firstbyte idle, so cold, until its own; the
upstreams' schedules restarted for each; the order rotated between repeats): with every client at
once (``--together``, as before 2026-12-06) three gateways and sixteen workers shared the two cores,
which a gateway in service does not, and that doubled the pinned firstbyte's gap to the direct
client (docs/simulate-pool-race.md). ``x sched`` is the mean over the configured delay of the best
target (the other modes' oracle). Duplicates: upstream calls beside the first, by each answer's
``race=``. Follow: each repeat's requests after the shift until 16 of 20 in a row went to the new best.

Strategies (each a route over A, B, C; ``fastest`` and ``hedge`` as the shipped routes.yaml's ``chat``
route sets them): ``shipped`` (with its ``hedge``), ``unset`` (the same route saying nothing about
``hedge``: the default), ``off`` (``hedge: false``), ``defaults`` (``hedge: {}``: firstbyte's own hedge
settings), ``measure`` (the shipped hedge with ``after: 600``:
races to measure, never hedges by time), ``oracle`` (firstbyte pinned to the scheduled best), ``floor``
(``scripts/floor.py --pick``, the smallest aiohttp relay that commits at the first chunk, pinned alike: what
any Python hop costs here, so ``x oracle`` below 1 is what firstbyte adds over it), ``nginx`` (nginx, from
Debian's ``nginx-light``, streaming to the upstream the pin names: what a relay in C costs; ``scripts/hop.py``).
Each repeat starts every process afresh (a cold start); the table pools repeats and gives their range.

    scripts/simulate-pool --direct [--scenarios ...] [--strategies ...] [--repeats 3] [--port-base P] [--tag T]
                                   [--together]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import bench
import orjson
from pool_measure import follow, restart, sim_command, sim_offsets, start_all
from pool_schedule import ABRUPT_SCENARIOS, NAMES, OUT, ROOT, SCENARIOS, extra_calls, oracle

from proxy.config import read_yaml
from proxy.routing.decision import parse_header

DIRECT = "direct"
FLOOR = "floor"  # scripts/floor.py --pick: the smallest committed aiohttp relay, pinned to the scheduled best
NGINX = "nginx"  # nginx streaming to the upstream the pin names: what a relay in C costs here (scripts/hop.py)
PINNED = ("oracle", FLOOR, NGINX)
NGINX_CONF = """worker_processes 1;
error_log {tmp}/nginx-error.log;
pid {tmp}/nginx-{port}.pid;
events {{ worker_connections 1024; }}
http {{
  access_log off;
{upstreams}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://$http_x_route_provider;  # the pin names an upstream group below
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
    }}
  }}
}}
"""
GOAL_SHIPPED = 1.05  # x direct, hedging as shipped
GOAL_UNSET = 1.10  # x direct, a route saying nothing about hedge
DUP_GOAL = 0.10
LEAD = 0.05  # schedule seconds between the simulators' restart and the load's first call


def shipped_route() -> dict[str, Any]:
    """``fastest`` and ``hedge`` of routes.yaml's ``chat`` route, as a new user gets them."""
    chat = read_yaml((ROOT / "routes.yaml").read_text(), "routes.yaml")["routes"]["chat"]
    return {"fastest": dict(chat["fastest"]), "hedge": dict(chat["hedge"])}


def routes(shipped: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each strategy's route over the pool (the seed fixed so repeats explore alike)."""
    fastest = {**shipped["fastest"], "seed": 7}
    base = {"strategy": "fastest", "fastest": fastest, "targets": [{"provider": n, "model": "sim"} for n in NAMES]}
    return {"shipped": {**base, "hedge": shipped["hedge"]},
            "unset": base,
            "off": {**base, "hedge": False},
            "defaults": {**base, "hedge": {}},
            "measure": {**base, "hedge": {**shipped["hedge"], "after": 600}},
            "oracle": {"strategy": "ordered", "targets": base["targets"]}}


def free_ports(base: int, count: int) -> list[int]:
    """``count`` ports of ``base`` to ``base + 99`` that bind now, picked at random: the range lies inside
    the ephemeral one, so any port may be some connection's local end for a while."""
    found = []
    for port in random.sample(range(base, base + 100), 100):
        with contextlib.suppress(OSError), socket.socket() as s:
            s.bind(("127.0.0.1", port))
            found.append(port)
            if len(found) == count:
                return found
    raise RuntimeError(f"fewer than {count} free ports from {base}")


async def client(strategy: str, urls: dict[str, str], concurrency: int, until: float,
                 starts: dict[str, float], scenario: dict[str, Any], span: float) -> list[dict[str, Any]]:
    """One strategy's closed loop: ``concurrency`` workers of streamed calls until ``until``. ``direct``
    sends each call to the scheduled-best upstream itself; ``oracle`` pins firstbyte to it."""
    body = orjson.dumps({"model": "pool" if strategy != DIRECT else "sim",
                         "messages": [{"role": "user", "content": "hi"}], "stream": True})
    calls: list[dict[str, Any]] = []

    async def worker(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < until:
            sent = time.monotonic()
            best, best_ms = oracle(scenario, {n: sent - starts[n] for n in NAMES}, span)
            headers = {"content-type": "application/json"}
            if strategy in PINNED:
                headers["x-route-provider"] = best
            url = urls[best] if strategy == DIRECT else urls["firstbyte"]
            record: dict[str, Any] = {"t": sent, "oracle": best, "oracle_ms": best_ms, "ok": False}
            try:
                async with session.post(url, data=body, headers=headers) as resp:
                    first = await resp.content.readany()
                    record["ttfc_ms"] = (time.monotonic() - sent) * 1000
                    await resp.read()
                    record["ok"] = resp.status == 200 and bool(first)
                    if strategy in (DIRECT, FLOOR, NGINX):
                        record["served"], record["extra"] = best, 0
                    else:
                        decision = parse_header(resp.headers["x-route-decision"])
                        record["served"], record["extra"] = decision.served, extra_calls(decision.race)
                        record["header"] = resp.headers["x-route-decision"]
            except (aiohttp.ClientError, KeyError, ValueError):
                record["ok"] = False
            calls.append(record)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return calls


async def side_by_side(strategies: list[str], urls: dict[str, dict[str, str]], concurrency: int, until: float,
                       starts: dict[str, float], scenario: dict[str, Any], span: float) -> dict[str, Any]:
    lists = await asyncio.gather(*(client(s, urls[s], concurrency, until, starts, scenario, span)
                                   for s in strategies))
    return dict(zip(strategies, lists, strict=True))


def run_once(args: argparse.Namespace, tmp: Path, name: str, strategies: list[str],
             configs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Fresh upstreams and a fresh firstbyte per strategy, then the load: by default each strategy in
    turn beside a direct client of its own (its firstbyte cold until its turn, the upstreams' schedules
    restarted for it), with ``--together`` every client at once. Each client's calls, and each
    strategy's direct calls and shift (seconds since its load began)."""
    scenario = SCENARIOS[name]
    run = scenario.get("run", {})
    seconds, concurrency = args.seconds or run.get("seconds", 3.0), args.concurrency or run.get("concurrency", 4)
    span = seconds + LEAD
    proxied = [s for s in strategies if s != DIRECT]
    count = len(NAMES) + len(proxied)
    ports = free_ports(args.port_base, count) if args.port_base else [bench.free_port() for _ in range(count)]
    sim_ports = dict(zip(NAMES, ports, strict=False))
    fb_ports = dict(zip(proxied, ports[len(NAMES):], strict=True))
    procs = bench.Procs(tmp)
    try:
        start_all(procs, commands(args, tmp, name, span, sim_ports, fb_ports, configs))
        urls = {s: {"firstbyte": f"http://127.0.0.1:{p}/v1/chat/completions"} for s, p in fb_ports.items()}
        urls[DIRECT] = {n: f"http://127.0.0.1:{p}/v1/chat/completions" for n, p in sim_ports.items()}
        turns = [proxied] if getattr(args, "together", False) else [[s] for s in proxied]
        out: dict[str, Any] = {"calls": {}, "direct": {}, "shifts": {}, "seconds": seconds,
                               "concurrency": concurrency}
        for turn in turns:
            asyncio.run(restart(sim_ports))  # the schedules start now, not when each process came up
            starts = asyncio.run(sim_offsets(sim_ports))
            calls = asyncio.run(side_by_side([DIRECT, *turn], urls, concurrency, min(starts.values()) + span,
                                             starts, scenario, span))
            t0 = min(c["t"] for cs in calls.values() for c in cs)
            shifts = [step["at"] * span + starts[n] - t0 for n in NAMES for step in scenario[n].get("steps", [])]
            for cs in calls.values():
                for c in cs:
                    c["t"] -= t0
            for s in turn:
                out["calls"][s], out["direct"][s] = calls[s], calls[DIRECT]
                out["shifts"][s] = min(shifts) if shifts else None
        out["calls"][DIRECT] = [c for s in proxied for c in out["direct"][s]]
        out["shift_t"] = next(iter(out["shifts"].values()), None)
        return out
    finally:
        procs.stop_all()


def commands(args: argparse.Namespace, tmp: Path, name: str, span: float, sim_ports: dict[str, int],
             fb_ports: dict[str, int], configs: dict[str, dict[str, Any]]) -> dict[str, tuple[list[str], int]]:
    """The upstreams' and each strategy's firstbyte's command lines, with their ports."""
    scenario = SCENARIOS[name]
    out: dict[str, tuple[list[str], int]] = {}
    for i, n in enumerate(NAMES):
        schedule = tmp / f"{name}-{n}.json"
        schedule.write_text(json.dumps([{**s, "at": s["at"] * span} for s in scenario[n].get("steps", [])]))
        out[f"sim-{n}"] = (sim_command(scenario[n], sim_ports[n], schedule, i + 1), sim_ports[n])
    providers = {n: {"kind": "openai", "base_url": f"http://127.0.0.1:{p}/v1"} for n, p in sim_ports.items()}
    for s, port in fb_ports.items():
        if s == FLOOR:
            picks = [f"--pick={n}=http://127.0.0.1:{p}" for n, p in sim_ports.items()]
            out[FLOOR] = ([sys.executable, str(ROOT / "scripts" / "floor.py"), "--port", str(port), "--upstream",
                           "http://127.0.0.1:1", *picks], port)
            continue
        if s == NGINX:
            out[NGINX] = (nginx_command(tmp, name, port, sim_ports), port)
            continue
        path = tmp / f"pool-{s}.json"
        path.write_text(json.dumps({"listen": f"127.0.0.1:{port}", "access_log": {"path": "/dev/null"},
                                    "providers": providers, "routes": {"pool": configs[s]}}))
        serve = [str(bench.BIN / "firstbyte"), "serve", "--config", str(path)]
        if args.proxy_dir:  # a variant of proxy/ (-P: this checkout's is not put before it)
            serve = ["env", f"PYTHONPATH={args.proxy_dir}", sys.executable, "-P", "-m", "proxy.cli", *serve[1:]]
        out[f"firstbyte-{s}"] = (serve, port)
    return out


def nginx_command(tmp: Path, name: str, port: int, sim_ports: dict[str, int]) -> list[str]:
    """nginx in the foreground, an upstream group per target named as the pin names it."""
    groups = "\n".join(f"  upstream {n} {{ server 127.0.0.1:{p}; keepalive 16; }}" for n, p in sim_ports.items())
    conf = tmp / f"nginx-{name}.conf"
    conf.write_text(NGINX_CONF.format(tmp=tmp, port=port, upstreams=groups))
    return [shutil.which("nginx") or "nginx", "-p", str(tmp), "-c", str(conf), "-g", "daemon off;"]


def figures(calls: list[dict[str, Any]], direct: list[dict[str, Any]], shift_t: float | None) -> dict[str, Any]:
    """One strategy's calls against the direct client's of the same run(s)."""
    ok, dok = [c for c in calls if c["ok"]], [c for c in direct if c["ok"]]
    mean, dmean = statistics.fmean(c["ttfc_ms"] for c in ok), statistics.fmean(c["ttfc_ms"] for c in dok)
    out = {"requests": len(calls), "errors": len(calls) - len(ok), "mean_ms": mean, "x_direct": mean / dmean,
           "x_sched": mean / statistics.fmean(c["oracle_ms"] for c in ok),
           "dup_share": sum(c.get("extra", 0) for c in calls) / len(calls),
           "on_best": sum(c.get("served") == c["oracle"] for c in ok) / len(ok)}
    if shift_t is not None:  # requests after the shift until 16 of 20 in a row went to the new best
        out["follow"] = follow(calls, shift_t)
    if shift_t is not None:  # after the shift alone: where an abrupt scenario's cost is
        after, dafter = [c for c in ok if c["t"] >= shift_t], [c for c in dok if c["t"] >= shift_t]
        if after and dafter:
            out["x_direct_after"] = (statistics.fmean(c["ttfc_ms"] for c in after)
                                     / statistics.fmean(c["ttfc_ms"] for c in dafter))
    return out


def pool(reps: list[dict[str, Any]], strategies: list[str]) -> dict[str, Any]:
    """Each repeat's figures, and the repeats' calls pooled; each strategy against the direct client
    that ran beside it, and after the shift each repeat from its own."""
    def mine(r: dict[str, Any], s: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]], float | None]:
        direct = r["calls"][DIRECT] if s == DIRECT else r.get("direct", {}).get(s, r["calls"][DIRECT])
        return r["calls"][s], direct, r.get("shifts", {}).get(s, r["shift_t"])

    def calls(s: str, after: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        own: list[dict[str, Any]] = []
        direct: list[dict[str, Any]] = []
        for r in reps:
            cs, ds, shift = mine(r, s)
            if after and shift is None:
                continue
            own += [c for c in cs if not after or c["t"] >= shift]
            direct += [c for c in ds if not after or c["t"] >= shift]
        return own, direct

    pooled = {s: figures(*calls(s, False), None) for s in strategies}
    for s in strategies:
        after = calls(s, True)
        if after[0] and after[1]:
            pooled[s]["x_direct_after"] = figures(*after, None)["x_direct"]
    return {"repeats": [{s: figures(*mine(r, s)) for s in strategies} for r in reps], "pooled": pooled,
            "shifted": any(r["shift_t"] is not None for r in reps)}


def spread(values: list[float], spec: str = ".2f") -> str:
    return f"[{format(min(values), spec)}-{format(max(values), spec)}]" if len(values) > 1 else ""


def table(results: dict[str, Any], strategies: list[str]) -> list[str]:
    """Markdown rows: pooled over the repeats, each repeat's range in brackets, and the goal's verdict."""
    rows = ["| scenario | strategy | reqs | x direct (mean) | x direct after the shift | x oracle | x sched | dup % | "
            "on best % | follow | goal |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, res in results.items():
        for s in strategies:
            if s == DIRECT:
                continue
            p, reps = res["pooled"][s], [r[s] for r in res["repeats"]]
            goal = {"shipped": GOAL_SHIPPED, "unset": GOAL_UNSET}.get(s)
            verdict = "-"
            if goal is not None:
                met = p["x_direct"] <= goal and (s != "shipped" or p["dup_share"] <= DUP_GOAL)
                verdict = f"{'met' if met else 'MISSED'} (<= {goal})"
            after = [r["x_direct_after"] for r in reps if "x_direct_after" in r]
            after_s = f"{p['x_direct_after']:.2f} {spread(after)}" if "x_direct_after" in p else "-"
            ratio = f"{p['x_direct']:.2f} {spread([r['x_direct'] for r in reps])}"
            dup = f"{p['dup_share'] * 100:.1f} {spread([r['dup_share'] * 100 for r in reps], '.1f')}"
            oracle = res["pooled"].get("oracle")  # the pinned firstbyte: the proxy's hop alone
            x_oracle = "-" if oracle is None else (  # over x direct: each against the direct client beside it
                f"{p['x_direct'] / oracle['x_direct']:.2f} "
                f"{spread([r[s]['x_direct'] / r['oracle']['x_direct'] for r in res['repeats']])}")
            follows = " ".join("-" if r.get("follow") is None else str(r["follow"]) for r in reps)
            rows.append(f"| {name} | {s} | {p['requests']} | {ratio} | {after_s} | {x_oracle} | {p['x_sched']:.2f} "
                        f"| {dup} | {p['on_best'] * 100:.0f} | {follows if res['shifted'] else '-'} | {verdict} |")
    return rows


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="simulate-pool --direct", description=__doc__.split("\n")[0])
    p.add_argument("--scenarios", nargs="+", default=list(ABRUPT_SCENARIOS), choices=list(SCENARIOS))
    p.add_argument("--strategies", nargs="+", default=["shipped", "unset", "oracle"],
                   choices=["shipped", "unset", "off", "defaults", "measure", "oracle", FLOOR, NGINX])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seconds", type=float, default=None, help="load per run (default: the scenario's, 3 s)")
    p.add_argument("--concurrency", type=int, default=None, help="workers per client (default: the scenario's, 4)")
    p.add_argument("--port-base", type=int, default=None, help="consecutive loopback ports from here (default: free)")
    p.add_argument("--proxy-dir", default=None, help="a directory holding a variant of proxy/ to serve every firstbyte")
    p.add_argument("--together", action="store_true",
                   help="every client at once (as before 2026-12-06), not each strategy in turn beside its own")
    p.add_argument("--tag", default="direct")
    p.add_argument("--dump-calls", action="store_true",
                   help="keep every call (time, served, its x-route-decision header) in the JSON")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse(argv)
    strategies = [DIRECT, *args.strategies]
    shipped = shipped_route()
    configs = routes(shipped)
    tmp = Path(tempfile.mkdtemp(prefix="firstbyte-direct-"))
    started = time.monotonic()
    results: dict[str, Any] = {}
    for name in args.scenarios:
        reps = []
        for rep in range(args.repeats):
            turn = rep % len(args.strategies)  # the order the strategies take turns in, rotated
            order = [DIRECT, *args.strategies[turn:], *args.strategies[:turn]]
            print(f"{name} ({rep + 1}/{args.repeats}): {', '.join(order[1:])}, each beside a direct client"
                  f"{' (together)' if args.together else ''}…", file=sys.stderr, flush=True)
            try:
                reps.append(run_once(args, tmp, name, order, configs))
            except RuntimeError as exc:  # a port taken between the pick and the bind: once more, fresh ports
                print(f"  retrying: {exc}", file=sys.stderr, flush=True)
                reps.append(run_once(args, tmp, name, order, configs))
        results[name] = pool(reps, strategies)
        if args.dump_calls:  # per-request evidence: where a strategy lost time against the direct client
            results[name]["calls"] = [{"calls": r["calls"], "shifts": r["shifts"]} for r in reps]
    apart = "every client at once" if args.together else "each strategy in turn beside a direct client of its own"
    print(f"\nsimulate-pool --direct: {len(args.scenarios)} scenarios x {args.repeats} repeats, {apart} (cold start "
          f"each repeat), concurrency per client as the scenario's; routes.yaml's chat route: fastest "
          f"{shipped['fastest']}, hedge {shipped['hedge']}")
    print("x direct: mean time to first token / the direct client's beside it, pooled [range of the repeats]; "
          "x oracle: x direct / the pinned firstbyte's (oracle) x direct, the routing alone; x sched: / the "
          "configured delay of the best target\n")
    print("\n".join(table(results, strategies)))
    path = OUT / f"simulate-pool-{args.tag}.json"
    OUT.mkdir(exist_ok=True)
    path.write_bytes(orjson.dumps({"shipped": shipped, "results": results}, option=orjson.OPT_INDENT_2))
    print(f"\nwrote {path} in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0

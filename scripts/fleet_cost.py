"""scripts/fleet_cost.py: what a fleet's link costs per call, counted (issue 26: within 5 % of alone).

Starts ``--instances`` real ``firstbyte serve`` processes (``scripts/bench.py``'s one-target route on one
simulator), as a fleet on ``--redis`` or, with ``--alone``, each on its own; warms them up, then sends
``--calls`` calls round-robin over them at ``--concurrency`` and prints, per call: the CPU of all the
firstbyte processes, the Redis commands the fleet sent (``INFO commandstats`` before and after: XADD,
XREAD, ...; the Redis is the fleet's alone while it runs), the stream entries written and the events
they carry by kind (``s`` sample, ``n`` in-flight counts and heartbeat, ...). ``--code DIR`` runs the
``proxy`` package in DIR (put first on PYTHONPATH), to compare two versions on the same machine.

    .venv/bin/python scripts/fleet_cost.py --redis redis://127.0.0.1:43000/0 [--alone] [--code DIR]
                                           [--instances 3] [--calls 3000] [--concurrency 12] [--stream]
                                           [--idle 10]

``--idle SECS`` then counts the same per second of an idle fleet (2 s after the calls, for SECS):
what the link does per second and not per call (its heartbeat, measuring claims).

A measurement, not a test: on a shared machine CPU per call moves by 10 % or more between runs;
the counts of commands and entries do not depend on the machine much.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench
from fleet_pool import Ports, ready, start_many


async def load(urls: list[str], calls: int, concurrency: int, stream: bool) -> int:
    """``calls`` calls, round-robin over ``urls``, ``concurrency`` at a time; returns the answered ones."""
    body = orjson.dumps({"model": "one", "messages": [{"role": "user", "content": "hi"}], "stream": stream})
    turn, left, ok = itertools.count(), [calls], [0]

    async def worker(session: aiohttp.ClientSession) -> None:
        while left[0] > 0:
            left[0] -= 1
            url = urls[next(turn) % len(urls)] + bench.PATH
            async with session.post(url, data=body, headers={"content-type": "application/json"}) as resp:
                await resp.read()
                ok[0] += resp.status == 200

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        await asyncio.wait_for(asyncio.gather(*(worker(session) for _ in range(concurrency))), 600)
    return ok[0]


def commands(client: redis.Redis) -> Counter[str]:
    stats = client.info("commandstats")
    return Counter({k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()})


def idle(client: redis.Redis, pids: list[int], secs: float) -> tuple[Counter[str], float]:
    """Redis commands and the instances' CPU seconds over ``secs`` of idle, 2 s after the calls."""
    time.sleep(2.0)
    before, cpu = commands(client), sum(bench.cpu_secs(pid) for pid in pids)
    time.sleep(secs)
    return commands(client) - before, sum(bench.cpu_secs(pid) for pid in pids) - cpu


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--redis", required=True, metavar="URL")
    p.add_argument("--alone", action="store_true", help="the same processes without state.redis")
    p.add_argument("--code", default=None, metavar="DIR", help="run the proxy package in DIR")
    p.add_argument("--instances", type=int, default=3)
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--concurrency", type=int, default=12)
    p.add_argument("--stream", action="store_true", help="streamed calls (buffered by default)")
    p.add_argument("--port-base", type=int, default=0)
    p.add_argument("--idle", type=float, default=0.0, metavar="SECS", help="then count SECS of idle, per second")
    p.add_argument("--profile", default=None, metavar="DIR", help="run each instance under cProfile, "
                   "writing DIR/firstbyte-N.prof at its end (CPU figures then include the profiler's)")
    args = p.parse_args()
    if args.code:
        os.environ["PYTHONPATH"] = args.code
    ports, tmp = Ports(args.port_base), Path(tempfile.mkdtemp(prefix="firstbyte-fleet-cost-"))
    procs = bench.Procs(tmp)
    client = redis.Redis.from_url(args.redis, decode_responses=True)
    fleet = f"cost-{uuid.uuid4().hex[:8]}"
    try:
        sim = ports.take()
        bench.simulate(procs, "sim", sim, 2.0, 0, 8)
        urls, cmds = [], {}
        for i in range(args.instances):
            port = ports.take()
            config = bench.firstbyte_config(port, sim)
            if not args.alone:
                config["state"] = {"redis": args.redis, "fleet": fleet}
            (tmp / f"fb{i}.json").write_text(json.dumps(config))
            profiler = ([sys.executable, "-m", "cProfile", "-o", str(Path(args.profile) / f"firstbyte-{i}.prof")]
                        if args.profile else [])
            cmds[f"firstbyte-{i}"] = ([*profiler, str(bench.BIN / "firstbyte"), "serve", "--config",
                                       str(tmp / f"fb{i}.json")], port)
            urls.append(f"http://127.0.0.1:{port}")
        start_many(procs, cmds)
        pids = [proc.pid for proc in procs.procs[1:]]
        asyncio.run(ready(urls))
        asyncio.run(load(urls, 200, args.concurrency, args.stream))  # warm: every target measured
        stream = f"firstbyte:{fleet}:events"
        tail: Any = client.xrevrange(stream, count=1)
        last = str(tail[0][0]) if tail else "0-0"
        before, cpu, started = commands(client), [bench.cpu_secs(pid) for pid in pids], time.monotonic()
        answered = asyncio.run(load(urls, args.calls, args.concurrency, args.stream))
        used = [bench.cpu_secs(pid) - c for pid, c in zip(pids, cpu, strict=True)]
        elapsed, sent = time.monotonic() - started, commands(client) - before
        entries: Any = [] if args.alone else client.xrange(stream, min=f"({last}")
        quiet = idle(client, pids, args.idle) if args.idle else None
    finally:
        procs.stop_all()
        client.close()
    events = Counter(e[0] for _, fields in entries for e in orjson.loads(fields["e"]))
    n = max(answered, 1)
    print(f"{'alone' if args.alone else 'fleet'} of {args.instances}, {answered}/{args.calls} calls "
          f"{'streamed' if args.stream else 'buffered'} at concurrency {args.concurrency} in {elapsed:.1f} s "
          f"({args.code or 'this code'})")
    print(f"  CPU per call, all instances: {sum(used) * 1000 / n:.3f} ms  (each: "
          f"{', '.join(f'{u:.2f}' for u in used)} s)")
    print("  Redis commands per call: " + ", ".join(f"{k} {v / n:.3f}" for k, v in sent.most_common()))
    print(f"  stream entries per call: {len(entries) / n:.3f}; events per call: "
          + ", ".join(f"{k} {v / n:.3f}" for k, v in events.most_common()))
    if quiet is not None:
        print(f"  idle, per second over {args.idle:g} s: CPU, all instances, {quiet[1] * 1000 / args.idle:.2f} ms; "
              "Redis commands " + ", ".join(f"{k} {v / args.idle:.2f}" for k, v in quiet[0].most_common()))
    return 0 if answered == args.calls else 1


if __name__ == "__main__":
    sys.exit(main())

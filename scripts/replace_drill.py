"""How fast a box replaces a worker killed by SIGKILL, and where the time goes.

Starts a real redis-server, a fake upstream and ``firstbyte serve`` with ``workers: 2`` (all on
loopback, free ports), keeps a light load on the box, then kills worker 0 ``--kills`` times (a few
seconds apart) and prints, per kill, milliseconds from the SIGKILL to: the supervisor's start of the
new worker, its fleet link joined (warm start folded), its listening socket, its first answered
request (a fresh connection whose /v1/health names its pid); and whether the new worker's figure of
the target (ms) and the older worker's, asked just after (the load goes on: close, not equal).

    .venv/bin/python scripts/replace_drill.py --kills 5
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fleet.conftest import PATH, Box, answering, box_config, call, fresh, target, worker_pids  # noqa: E402
from tests.redis_server import RedisServer  # noqa: E402


def stamp(line: str) -> float:
    """A log line's wall time (``2026-12-05 20:30:01,123 ...``)."""
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def phases(log: str, pid: int, killed_wall: float) -> dict[str, float]:
    """Milliseconds from the kill to the new worker's start, joined and listening, from its log lines."""
    out: dict[str, float] = {}
    lines = log.splitlines()
    for i, line in enumerate(lines):
        if f"started (pid {pid})" in line:
            out["started"] = (stamp(line) - killed_wall) * 1000
            rest = lines[i + 1:]
            for key, needle in (("joined", "joined as"), ("listening", "listening on http")):
                hit = next((ln for ln in rest if needle in ln and (key != "joined" or f"-{pid}-" in ln)), None)
                if hit is not None:
                    out[key] = (stamp(hit) - killed_wall) * 1000
    return out


async def answered_by(box: Box, pid: int, deadline: float) -> tuple[float, dict[str, Any]]:
    while time.monotonic() < deadline:
        try:
            _, health = await fresh(box, "/v1/health")
            if health["fleet"]["instance"].split("-")[-2] == str(pid):
                return time.monotonic(), health
        except (aiohttp.ClientError, OSError):
            pass
        await asyncio.sleep(0.002)
    raise AssertionError(f"worker {pid} never answered")


async def older(box: Box, pid: int) -> dict[str, Any]:
    for _ in range(100):
        _, health = await fresh(box, "/v1/health")
        if health["fleet"]["instance"].split("-")[-2] != str(pid):
            return health
    raise AssertionError("the older worker never answered")


async def drill(kills: int, gap: float) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="replace-drill-"))
    redis = RedisServer(tmp).start()
    app = web.Application()
    _, ok = answering(0.005)
    app.router.add_post(PATH, ok)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    up = f"http://127.0.0.1:{runner.addresses[0][1]}"
    box = await Box(tmp, box_config(redis, {"up": up})).start()
    stop = asyncio.Event()

    async def load() -> None:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
            while not stop.is_set():
                with contextlib.suppress(aiohttp.ClientError):
                    await call(session, box)
                await asyncio.sleep(0.01)

    loaders = [asyncio.create_task(load()) for _ in range(2)]
    rows = []
    try:
        await asyncio.sleep(1.0)
        for _ in range(kills):
            victim = worker_pids(box)[0][-1]
            killed, killed_wall = time.monotonic(), time.time()
            os.kill(victim, signal.SIGKILL)
            while len(worker_pids(box)[0]) < 2 + len(rows):
                await asyncio.sleep(0.002)
            new = worker_pids(box)[0][-1]
            first, health = await answered_by(box, new, killed + 60)
            other = await older(box, new)
            row = {**phases(box.log.read_text(), new, killed_wall), "answered": (first - killed) * 1000,
                   "figure_new": target(health, "up")["buffered"]["figure_s"] * 1000,
                   "figure_older": target(other, "up")["buffered"]["figure_s"] * 1000}
            rows.append(row)
            print(" ".join(f"{k}={v:.0f}ms" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
                  flush=True)
            await asyncio.sleep(gap)
    finally:
        stop.set()
        await asyncio.gather(*loaders, return_exceptions=True)
        log = box.stop()
        redis.kill()
        if os.environ.get('DRILL_LOG'):
            print(log[log.rindex('killed by SIGKILL') - 200:][:3000])
        await runner.cleanup()
    for key in ("started", "joined", "listening", "answered"):
        values = [r[key] for r in rows if key in r]
        if values:
            print(f"{key}: median {statistics.median(values):.0f} ms, max {max(values):.0f} ms")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--gap", type=float, default=6.0, help="seconds between kills (a worker dying young backs off)")
    args = ap.parse_args()
    asyncio.run(drill(args.kills, args.gap))


if __name__ == "__main__":
    main()

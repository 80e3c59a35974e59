"""The load generator for ``scripts/bench``: a separate process, driven over stdin/stdout.

It runs in its own process so its CPU never counts as the proxy's; on a 2-core
machine it still competes with the proxy and the upstream for the same cores,
which the bench report says. Each stdin line is one JSON command, each answer
one JSON line on stdout:

``{"op": "run", "url", "body", "stream", "concurrency", "requests" | "duration", "warmup"}``
    closed-loop load: ``concurrency`` workers each send a request as soon as
    their last one finished. Answers every latency and time to first chunk
    (seconds) of the requests that finished after ``warmup``.
``{"op": "rounds", "urls": {name: url}, "bodies": {name: body}, "stream", "requests", "warmup", "seed"}``
    concurrency 1, interleaved: each round calls every url once, in a shuffled
    order, so every target meets the same machine (CPU wake-ups, caches,
    neighbours) instead of each getting its own stretch of time. Answers
    ``{name: run result}``.
``{"op": "hold", "url", "body", "streams", "ramp"}``
    opens ``streams`` streamed calls within ``ramp`` seconds, prints
    ``{"event": "held"}`` once every stream has its first chunk, then answers
    when all have ended.
``{"op": "quit"}``
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from typing import Any

import aiohttp
import orjson
import uvloop


async def one(session: aiohttp.ClientSession, url: str, data: bytes, stream: bool) -> tuple[float, float, int]:
    """One call read to its end: (latency, time to first chunk, server-sent events relayed)."""
    t0 = time.perf_counter()
    events = 0
    async with session.post(url, data=data, headers={"content-type": "application/json"}) as resp:
        if resp.status != 200:
            await resp.read()
            raise RuntimeError(f"status {resp.status}")
        first = 0.0
        if stream:
            async for piece in resp.content.iter_any():
                events += piece.count(b"\n\n")
                if not first:
                    first = time.perf_counter() - t0
        else:
            await resp.read()
            first = time.perf_counter() - t0
    return time.perf_counter() - t0, first, events


async def run(session: aiohttp.ClientSession, cmd: dict[str, Any]) -> dict[str, Any]:
    url, stream = cmd["url"], bool(cmd["stream"])
    data = orjson.dumps({**cmd["body"], "stream": stream})
    requests = cmd.get("requests")
    duration = cmd.get("duration")
    warmup = float(cmd.get("warmup", 0.0))
    lat: list[float] = []
    ttfc: list[float] = []
    errors = 0
    events = [0]  # server-sent events read in the measured window (streamed: chunks relayed)
    left = [int(requests)] if requests else [1 << 62]
    start = time.perf_counter()
    measure_from = start + warmup
    deadline = start + warmup + float(duration) if duration else float("inf")

    async def worker() -> None:
        nonlocal errors
        while left[0] > 0 and time.perf_counter() < deadline:
            left[0] -= 1
            try:
                latency, first, relayed = await one(session, url, data, stream)
            except Exception:
                errors += 1
                continue
            if time.perf_counter() >= measure_from:
                events[0] += relayed
                lat.append(latency)
                ttfc.append(first)

    if requests and warmup:
        measure_from = start  # counted runs warm up with a few extra calls instead
        for _ in range(int(warmup)):
            await one(session, url, data, stream)
        start = measure_from = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(int(cmd["concurrency"]))))
    elapsed = time.perf_counter() - measure_from
    return {"lat": lat, "ttfc": ttfc, "errors": errors, "elapsed": elapsed, "events": events[0]}


async def rounds(session: aiohttp.ClientSession, cmd: dict[str, Any]) -> dict[str, Any]:
    urls: dict[str, str] = cmd["urls"]
    stream = bool(cmd["stream"])
    data = {name: orjson.dumps({**cmd["bodies"][name], "stream": stream}) for name in urls}
    out: dict[str, Any] = {name: {"lat": [], "ttfc": [], "errors": 0, "elapsed": 0.0} for name in urls}
    rng = random.Random(cmd.get("seed", 1))
    names = list(urls)
    warmup = int(cmd.get("warmup", 0))
    for i in range(warmup + int(cmd["requests"])):
        rng.shuffle(names)
        for name in names:
            try:
                latency, first, _ = await one(session, urls[name], data[name], stream)
            except Exception:
                out[name]["errors"] += 1
                continue
            if i >= warmup:
                out[name]["lat"].append(latency)
                out[name]["ttfc"].append(first)
                out[name]["elapsed"] += latency  # the target's own time, for its calls per second
    return out


async def hold(session: aiohttp.ClientSession, cmd: dict[str, Any]) -> dict[str, Any]:
    url, n, ramp = cmd["url"], int(cmd["streams"]), float(cmd.get("ramp", 1.0))
    data = orjson.dumps({**cmd["body"], "stream": True})
    firsts = 0
    all_first = asyncio.Event()
    chunks = 0
    errors = 0

    async def stream(i: int) -> None:
        nonlocal firsts, chunks, errors
        await asyncio.sleep(ramp * i / n)
        got_first = False
        try:
            async with session.post(url, data=data, headers={"content-type": "application/json"}) as resp:
                async for piece in resp.content.iter_any():
                    if not got_first:
                        got_first = True
                        firsts += 1
                        if firsts == n:
                            all_first.set()
                    chunks += piece.count(b"\n\n")
        except Exception:
            errors += 1
        if not got_first:
            firsts += 1  # a stream that failed counts as settled, not held
            if firsts == n:
                all_first.set()

    t0 = time.perf_counter()
    tasks = [asyncio.create_task(stream(i)) for i in range(n)]
    await all_first.wait()
    held_at = time.perf_counter() - t0
    emit({"event": "held", "after": held_at})
    await asyncio.gather(*tasks)
    return {"streams": n, "errors": errors, "events": chunks, "elapsed": time.perf_counter() - t0,
            "held_after": held_at}


OPS = {"run": run, "rounds": rounds, "hold": hold}


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.buffer.write(orjson.dumps(obj) + b"\n")
    sys.stdout.buffer.flush()


async def main() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 24)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        emit({"event": "ready"})
        while line := await reader.readline():
            cmd = orjson.loads(line)
            if cmd["op"] == "quit":
                break
            result = await OPS[cmd["op"]](session, cmd)
            emit(result)


if __name__ == "__main__":
    uvloop.run(main())

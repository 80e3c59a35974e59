"""What a quiet period before reuse costs and buys (the measurement behind docs/adr/0015).

Runs a loopback upstream written by hand (it echoes each request's ``n`` back, after ``--answer-ms``)
and ``--clients`` callers that call it one after another through ``proxy.upstream.http1.Pool``, once
per quiet period given. With ``--stray-ms`` the upstream writes one unsolicited extra answer that
long after each answer, as a broken or hostile upstream does. It prints, per quiet period: calls per
second, connections the upstream accepted, answers that reached the wrong caller, and the cost of
the readiness check made at each reuse.

    .venv/bin/python scripts/pool_reuse.py --calls 3000 --clients 16 --quiet 0 0.005 0.02 0.05
    .venv/bin/python scripts/pool_reuse.py --calls 600 --clients 16 --stray-ms 20 --quiet 0 0.05

Bounded: ``--calls`` per quiet period, each call at most 5 s.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy.upstream.connection import quiet as readiness
from proxy.upstream.http1 import Pool


def reply(n: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(n), n)


async def upstream(answer_ms: float, stray_ms: float | None) -> tuple[asyncio.Server, list[asyncio.Task[None]]]:
    accepted: list[asyncio.Task[None]] = []  # one task per connection, cancelled at the end

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(asyncio.current_task())  # type: ignore[arg-type]
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                n = await reader.readexactly(length)
                if answer_ms:
                    await asyncio.sleep(answer_ms / 1000)
                writer.write(reply(n))
                if stray_ms is not None:
                    await asyncio.sleep(stray_ms / 1000)
                    writer.write(reply(n))  # the same answer again: nobody asked for it
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
    return server, accepted


async def run(quiet: float, args: argparse.Namespace) -> str:
    server, accepted = await upstream(args.answer_ms, args.stray_ms)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/"
    pool = Pool(quiet=quiet)
    left = list(range(args.calls))
    wrong = failed = 0

    async def caller() -> None:
        nonlocal wrong, failed
        while left:
            n = str(left.pop()).encode()
            try:
                async with asyncio.timeout(5):
                    answer = await pool.request("POST", url, {}, n, 5.0)
                    got = await answer.content.read()
                    pool.release(answer)
            except Exception:  # counted, not raised: a failed call is a figure here
                failed += 1
                continue
            wrong += got != n

    t0 = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(args.clients)))
    took = time.perf_counter() - t0
    check = await check_cost(pool, url)
    pool.close()
    server.close()
    for task in accepted:
        task.cancel()
    await asyncio.gather(*accepted, return_exceptions=True)
    await server.wait_closed()
    return (f"quiet {quiet * 1000:5.1f} ms: {args.calls / took:7.0f} calls/s, {len(accepted):4d} connections, "
            f"{wrong:4d} wrong answers, {failed:3d} failed; readiness check {check:.2f} us")


async def check_cost(pool: Pool, url: str) -> float:
    """Microseconds per readiness check on one idle connection."""
    answer = await pool.request("POST", url, {}, b"x", 5.0)
    await answer.content.read()
    rounds = 20000
    t0 = time.perf_counter()
    for _ in range(rounds):
        readiness(answer.protocol)
    cost = (time.perf_counter() - t0) / rounds * 1e6
    pool.release(answer)
    return cost


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--answer-ms", type=float, default=0.0)
    parser.add_argument("--stray-ms", type=float, default=None)
    parser.add_argument("--quiet", type=float, nargs="+", default=[0.0, 0.005, 0.02, 0.05])
    args = parser.parse_args()
    args.calls = min(args.calls, 100_000)
    for quiet in args.quiet:
        print(asyncio.run(run(quiet, args)), flush=True)


if __name__ == "__main__":
    main()

"""scripts/hop.py: what one relay hop costs on this machine, by kind of relay, in one run.

Issue 28's goal reads firstbyte against a client calling the fastest target itself, at targets of 20-40 ms,
so a relay's own hop is part of every figure. This measures the hop alone: one ``firstbyte simulate``
upstream (first chunk after ``--first-chunk-ms``, no jitter), and in front of it, each on its own port:

- ``firstbyte``: a one-target ``ordered`` route (no routing to speak of: the gateway's hop);
- ``floor``: ``scripts/floor.py --commit``, the smallest aiohttp relay that commits at the first chunk;
- ``pipe``: a TCP byte pipe on uvloop (this file, ``--pipe``): Python's own floor, no HTTP at all;
- ``nginx``: nginx as a streaming reverse proxy (``proxy_buffering off``, upstream keep-alive), when an
  ``nginx`` binary is on PATH (Debian's ``nginx-light``): what a relay in C costs on the same machine.

One client calls direct and every relay in turn, at concurrency 1, streamed, ``--rounds`` times per repeat,
and reports each relay's mean time to first chunk minus the direct call's (added ms) and over it (x direct),
with each relay process's CPU per call (from /proc). Loopback only; bounded by ``--rounds`` and a timeout.

    .venv/bin/python scripts/hop.py [--rounds 300] [--repeats 3] [--first-chunk-ms 20] [--port-base P]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import bench
import orjson
import uvloop

PATH = "/v1/chat/completions"
NGINX_CONF = """worker_processes 1;
error_log {tmp}/nginx-error.log;
pid {tmp}/nginx.pid;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  upstream sim {{ server 127.0.0.1:{upstream}; keepalive 16; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://sim;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
    }}
  }}
}}
"""


class _Up(asyncio.Protocol):
    def __init__(self, down: _Down) -> None:
        self.down = down

    def data_received(self, data: bytes) -> None:
        self.down.transport.write(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.down.transport.close()


class _Down(asyncio.Protocol):
    """One client connection piped to one upstream connection of its own, bytes as they come."""

    upstream: tuple[str, int] = ("127.0.0.1", 0)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]
        self.up: asyncio.Transport | None = None
        self.held: list[bytes] = []
        self.opening = asyncio.ensure_future(self._open())  # held: a task nobody holds may be collected

    async def _open(self) -> None:
        self.up, _ = await asyncio.get_running_loop().create_connection(lambda: _Up(self), *self.upstream)
        for data in self.held:
            self.up.write(data)

    def data_received(self, data: bytes) -> None:
        if self.up is None:
            self.held.append(data)
        else:
            self.up.write(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.up is not None:
            self.up.close()


async def pipe(port: int, upstream: int) -> None:
    _Down.upstream = ("127.0.0.1", upstream)
    server = await asyncio.get_running_loop().create_server(_Down, "127.0.0.1", port)
    await server.serve_forever()


async def one(session: aiohttp.ClientSession, url: str, body: bytes) -> float:
    sent = time.perf_counter()
    async with session.post(url, data=body, headers={"content-type": "application/json"}) as resp:
        first = await resp.content.readany()
        took = (time.perf_counter() - sent) * 1000
        await resp.read()
    if resp.status != 200 or not first:
        raise RuntimeError(f"{url}: status {resp.status}")
    return took


async def rounds(urls: dict[str, str], count: int) -> dict[str, list[float]]:
    """Every relay in turn, ``count`` times, after five calls each to warm connections and caches."""
    body = orjson.dumps({"model": "sim", "messages": [{"role": "user", "content": "hi"}], "stream": True})
    out: dict[str, list[float]] = {name: [] for name in urls}
    async with aiohttp.ClientSession() as session:
        for url in urls.values():
            for _ in range(5):
                await one(session, url, body)
        for _ in range(count):
            for name, url in urls.items():
                out[name].append(await one(session, url, body))
    return out


def start(procs: bench.Procs, tmp: Path, ports: dict[str, int], first_ms: float) -> dict[str, int]:
    """The upstream and every relay; returns the relays' pids (for CPU per call)."""
    up = ports["direct"]
    bench.simulate(procs, "sim", up, first_ms, 1, 2)
    config = {"listen": f"127.0.0.1:{ports['firstbyte']}", "access_log": {"path": "/dev/null"},
              "providers": {"sim": {"kind": "openai", "base_url": f"http://127.0.0.1:{up}/v1"}},
              "routes": {"sim": {"strategy": "ordered", "targets": [{"provider": "sim", "model": "sim"}]}}}
    (tmp / "firstbyte.json").write_text(json.dumps(config))
    pids = {"firstbyte": procs.start("firstbyte", [str(bench.BIN / "firstbyte"), "serve", "--config",
                                                   str(tmp / "firstbyte.json")], ports["firstbyte"]).pid,
            "floor": bench.floor(procs, "floor", ports["floor"], up, commit=True).pid,
            "pipe": procs.start("pipe", [sys.executable, __file__, "--pipe", str(ports["pipe"]), str(up)],
                                ports["pipe"]).pid}
    if "nginx" in ports:
        (tmp / "nginx.conf").write_text(NGINX_CONF.format(tmp=tmp, upstream=up, port=ports["nginx"]))
        master = procs.start("nginx", [shutil.which("nginx") or "nginx", "-p", str(tmp), "-c",
                                       str(tmp / "nginx.conf"), "-g", "daemon off;"], ports["nginx"])
        pids["nginx"] = master.pid  # CPU of the master's children is not counted: the worker's is below
        children = Path(f"/proc/{master.pid}/task/{master.pid}/children").read_text().split()
        pids["nginx"] = int(children[0]) if children else master.pid
    return pids


def report(times: dict[str, list[float]], cpu: dict[str, float], calls: int) -> list[str]:
    direct = statistics.fmean(times["direct"])
    rows = ["| relay | mean ms | median ms | added ms (mean) | x direct | CPU ms a call |", "|---|---|---|---|---|---|"]
    for name, values in times.items():
        mean = statistics.fmean(values)
        per_call = f"{cpu[name] * 1000 / calls:.2f}" if name in cpu else "-"
        rows.append(f"| {name} | {mean:.2f} | {statistics.median(values):.2f} | {mean - direct:+.2f} | "
                    f"{mean / direct:.3f} | {per_call} |")
    return rows


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="scripts/hop.py", description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=300)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--first-chunk-ms", type=float, default=20.0)
    p.add_argument("--port-base", type=int, default=None)
    p.add_argument("--pipe", nargs=2, type=int, metavar=("PORT", "UPSTREAM"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.pipe:
        uvloop.run(pipe(*args.pipe))
        return 0
    names = ["direct", "firstbyte", "floor", "pipe", *(["nginx"] if shutil.which("nginx") else [])]
    if "nginx" not in names:
        print("nginx not on PATH (apt-get install nginx-light): measuring without it", file=sys.stderr)
    base = args.port_base
    ports = {n: (base + i if base else bench.free_port()) for i, n in enumerate(names)}
    tmp = Path(tempfile.mkdtemp(prefix="firstbyte-hop-"))
    procs = bench.Procs(tmp)
    try:
        pids = start(procs, tmp, ports, args.first_chunk_ms)
        urls = {n: f"http://127.0.0.1:{port}{PATH}" for n, port in ports.items()}
        for rep in range(args.repeats):
            before = {n: bench.cpu_secs(pid) for n, pid in pids.items()}
            times = asyncio.run(asyncio.wait_for(rounds(urls, args.rounds), 600))
            cpu = {n: bench.cpu_secs(pid) - before[n] for n, pid in pids.items()}
            print(f"\nrepeat {rep + 1}/{args.repeats}: {args.rounds} calls each, concurrency 1, streamed, "
                  f"upstream first chunk {args.first_chunk_ms:g} ms")
            print("\n".join(report(times, cpu, args.rounds + 5)))
    finally:
        procs.stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

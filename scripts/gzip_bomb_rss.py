"""What refused gzip bombs leave in firstbyte's memory: its RSS after a warm-up, after N bombs, after N more.

Starts ``firstbyte serve`` (the checkout at ``--root``, on a one-route config with the simulated provider: no
network) on a loopback port and posts gzip bodies that inflate to 8 MiB, past the default 4 MiB
``max_body_bytes`` (each a 413), ``--concurrency`` at a time. A refusal that leaves a cycle keeps each bomb's
request, connection and inflater until the collector runs (+0.77 MB a bomb before the fix); flat is right.

    .venv/bin/python scripts/gzip_bomb_rss.py --port 21000 [--root /path/to/checkout] [--bombs 60]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import zlib

import aiohttp

CONFIG = """listen: 127.0.0.1:{port}
providers:
  sim: {{kind: simulated}}
routes:
  chat: {{strategy: ordered, targets: [{{provider: sim, model: sim-1}}]}}
"""


def bomb() -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    return packer.compress(b'{"model": "chat", "messages": [], "pad": "' + b" " * (8 * 2**20) + b'"}') + packer.flush()


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024


async def post_all(url: str, body: bytes, count: int, concurrency: int) -> set[int]:
    gate = asyncio.Semaphore(concurrency)
    headers = {"content-encoding": "gzip", "content-type": "application/json"}
    async with aiohttp.ClientSession() as session:
        async def one() -> int:
            async with gate, session.post(url + "/v1/chat/completions", data=body, headers=headers) as resp:
                await resp.read()
                return resp.status

        return set(await asyncio.gather(*(one() for _ in range(count))))


async def measure(url: str, pid: int, count: int, concurrency: int) -> list[float]:
    async with aiohttp.ClientSession() as session:
        for _ in range(200):
            try:
                async with session.get(url + "/healthz"):
                    break
            except aiohttp.ClientError:
                await asyncio.sleep(0.1)
    body = bomb()
    figures = []
    for _ in range(3):  # the warm-up, the bombs, as many again
        statuses = await post_all(url, body, count, concurrency)
        assert statuses == {413}, statuses
        await asyncio.sleep(1.0)
        figures.append(rss_mb(pid))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--root", default=".", help="the checkout whose proxy/ runs")
    parser.add_argument("--bombs", type=int, default=60)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = os.path.join(tmp, "routes.yaml")
        with open(config, "w") as f:
            f.write(CONFIG.format(port=args.port))
        server = subprocess.Popen([sys.executable, "-c", "import sys; from proxy.cli import main; sys.exit(main())",
                                   "serve", "--config", config], cwd=args.root, stderr=subprocess.DEVNULL)
        try:
            warm, first, second = asyncio.run(measure(f"http://127.0.0.1:{args.port}", server.pid, args.bombs,
                                                      args.concurrency))
        finally:
            server.terminate()
            server.wait(10)
    print(f"RSS after a warm-up {warm:.1f} MB, after {args.bombs} bombs {first:.1f}, after {args.bombs} more "
          f"{second:.1f} ({(second - warm) / (2 * args.bombs):+.2f} MB a bomb)")


if __name__ == "__main__":
    main()

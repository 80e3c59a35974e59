"""scripts/paced: CPU instructions per relayed event of a token-paced stream, firstbyte against the floor.

``scripts/instructions`` counts whole calls whose stream arrives in one or two reads; a real
model writes one event per token, and each event is then its own read through the relay loop
and the passthrough tap. This counts that per-event cost under valgrind's callgrind (collection
off until the counted windows, as scripts/instructions.py does): a paced upstream of its own
(this file with ``--serve``) writes every event in its own write with ``--gap-ms`` between writes,
so the proxy reads them one by one, for OpenAI chat (``/v1/chat/completions``, an ``openai``
provider) and Anthropic messages (``/v1/messages``, an ``anthropic`` provider), both passthrough.

For each proxy (the floor, ``scripts/floor.py``; firstbyte; each ``--other NAME=DIR``) and each
API, ``--calls`` calls of ``--short`` events are counted, then ``--calls`` calls of ``--long``
events: the difference over the extra events is the cost of one event, with everything a call
costs once (routing, the first-token gate, the access log) cancelled. The idle background (what
a process spends per second of wall clock doing nothing: timers, a fleet link) is counted apart
for ``--idle`` seconds and its share of the extra events' wall time taken off (``net``); the raw
figure is printed too. The client counts the chunks it reads: one per event shows the proxy
relayed each event in its own write, so each was its own read (``reads/event`` ~1.0).

Every proxy runs at once and each round counts each in turn (``--rounds``, the median printed): what
a process does per second during its calls moves with the machine's load, and sequential runs of
one proxy after another differed by 3-5k instructions an event; interleaved, they share the moment.

``--tap`` counts the passthrough taps alone instead (``tap.feed`` of one text event, 2,000 times
less none, in a process of their own): no server and no background, so it repeats to the instruction.

    scripts/paced --tap [--other NAME=DIR ...]
    scripts/paced [--calls 20] [--short 4] [--long 44] [--gap-ms 5] [--rounds 3] [--other NAME=DIR ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import aiohttp
import orjson
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench
from instructions import callgrind, control, total_instructions

APIS = {"openai": ("/v1/chat/completions", "one"), "anthropic": ("/v1/messages", "claude")}


# --- the paced upstream (--serve) ---------------------------------------------------------------


def openai_events(n: int, usage: bool) -> list[bytes]:
    def chunk(delta: dict[str, object], finish: str | None = None, **extra: object) -> bytes:
        body = {"id": "chatcmpl-paced", "object": "chat.completion.chunk", "created": 1, "model": "sim",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
        return b"data: " + orjson.dumps(body) + b"\n\n"

    out = [chunk({"role": "assistant", "content": ""})]
    out += [chunk({"content": f" word{i}"}) for i in range(n)]
    out.append(chunk({}, "stop"))
    if usage:
        out.append(b"data: " + orjson.dumps({"id": "chatcmpl-paced", "object": "chat.completion.chunk", "created": 1,
                                             "model": "sim", "choices": [], "usage": {
                                                 "prompt_tokens": 5, "completion_tokens": n,
                                                 "total_tokens": n + 5}}) + b"\n\n")
    return [*out, b"data: [DONE]\n\n"]


def anthropic_events(n: int) -> list[bytes]:
    def event(name: str, body: dict[str, object]) -> bytes:
        return b"event: " + name.encode() + b"\ndata: " + orjson.dumps({"type": name, **body}) + b"\n\n"

    out = [event("message_start", {"message": {
        "id": "msg_paced", "type": "message", "role": "assistant", "model": "sim", "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 5, "output_tokens": 1}}}),
        event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})]
    out += [event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": f" word{i}"}})
            for i in range(n)]
    out += [event("content_block_stop", {"index": 0}),
            event("message_delta", {"delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                    "usage": {"output_tokens": n}}),
            event("message_stop", {})]
    return out


def serve(port: int, gap: float) -> None:
    async def answer(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        n = int(body["max_tokens"])
        if request.path.endswith("/messages"):
            events = anthropic_events(n)
        else:
            events = openai_events(n, bool((body.get("stream_options") or {}).get("include_usage")))
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for event in events:
            await response.write(event)
            await asyncio.sleep(gap)  # its own write, and the proxy's own read
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/{tail:.*}", answer)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


# --- the client -----------------------------------------------------------------------------------


async def calls(url: str, model: str, events: int, count: int) -> tuple[float, int]:
    """``count`` streamed calls one after another: their wall time and the chunks read."""
    body = orjson.dumps({"model": model, "max_tokens": events, "stream": True,
                         "messages": [{"role": "user", "content": "Say hello."}]})
    chunks = 0
    async with aiohttp.ClientSession() as session:
        start = time.monotonic()
        for _ in range(count):
            async with session.post(url, data=body, headers={"content-type": "application/json"}) as resp:
                if resp.status != 200:
                    raise RuntimeError(f"{url}: status {resp.status}: {await resp.text()}")
                async for _piece in resp.content.iter_any():
                    chunks += 1
        return time.monotonic() - start, chunks


class PerEvent(NamedTuple):
    raw: float  # instructions per extra event
    net: float  # less the idle background of the extra events' wall time
    reads: float  # chunks the client read per extra event (1.0: each event its own write)


class Counted:
    """One proxy under callgrind, counted window by window (each window its own dump)."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], port: int, tmp: Path) -> None:
        self.name, self.port, self.parts = name, port, 0
        self.out = tmp / f"callgrind-{name}.out"
        self.proc = callgrind(cmd, self.out, env, tmp / f"{name}.log")
        self.idle = 0.0  # instructions per second of wall clock, idle

    def ready(self, args: argparse.Namespace) -> None:
        bench.wait_port(self.port, self.proc, timeout=300)
        for path, model in APIS.values():  # warm-up: every path taken once before counting
            asyncio.run(calls(f"http://127.0.0.1:{self.port}{path}", model, args.short, 5))

    def window(self, api: str, events: int, count: int) -> tuple[int, float, int]:
        """Instructions, wall time and chunks read of ``count`` calls of ``events`` events."""
        path, model = APIS[api]
        control(self.proc.pid, "-i", "on")
        secs, chunks = asyncio.run(calls(f"http://127.0.0.1:{self.port}{path}", model, events, count))
        return self._dump(), secs, chunks

    def count_idle(self, secs: float) -> None:
        control(self.proc.pid, "-i", "on")
        time.sleep(secs)
        self.idle = self._dump() / secs

    def _dump(self) -> int:
        control(self.proc.pid, "-i", "off")
        control(self.proc.pid, "--dump")
        self.parts += 1
        return total_instructions(self.out.with_name(f"{self.out.name}.{self.parts}"))

    def per_event(self, api: str, args: argparse.Namespace) -> PerEvent:
        short, s_secs, s_chunks = self.window(api, args.short, args.calls)
        long, l_secs, l_chunks = self.window(api, args.long, args.calls)
        extra = args.calls * (args.long - args.short)
        net = ((long - self.idle * l_secs) - (short - self.idle * s_secs)) / extra
        print(f"{self.name} {api}: short {short / args.calls / 1000:.0f}k/call ({s_secs:.1f}s), long "
              f"{long / args.calls / 1000:.0f}k/call ({l_secs:.1f}s), idle {self.idle / 1000:.0f}k/s", file=sys.stderr)
        return PerEvent((long - short) / extra, net, (l_chunks - s_chunks) / extra)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def median(found: list[PerEvent]) -> PerEvent:
    return PerEvent(*(statistics.median(f[i] for f in found) for i in range(3)))


# --tap: the passthrough taps alone, in a process of their own (no server, no background): exact.
TAP_FEED = """
import sys
from proxy.translate.usage_taps import AnthropicUsageTap, OpenAIUsageTap
sys.path.insert(0, {scripts!r})
from paced import anthropic_events, openai_events
tap = OpenAIUsageTap(False) if {api!r} == "openai" else AnthropicUsageTap()
events = openai_events(4, False)[:-2] if {api!r} == "openai" else anthropic_events(4)[:-3]
for event in events:
    tap.feed(event)
reads = [bytes(bytearray(events[-1])) for _ in range({n})]
feed = tap.feed
for read in reads:
    feed(read)
"""


def tap_cost(api: str, path: str | None, tmp: Path) -> float:
    """Instructions per ``feed`` of one text event read on its own: 2,000 feeds less none."""
    totals = []
    for n in (0, 2000):
        out = tmp / f"tap-{api}-{n}.out"
        code = TAP_FEED.format(scripts=str(Path(__file__).resolve().parent), api=api, n=n)
        env = dict(os.environ, PYTHONPATH=path or str(bench.ROOT), PYTHONHASHSEED="0")  # the same every run
        subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, "-c", code],
                       env=env, check=True, capture_output=True, cwd=tmp)  # not ROOT: its proxy/ would come first
        totals.append(total_instructions(out))
    return (totals[1] - totals[0]) / 2000


def config(port: int, upstream: int) -> dict[str, object]:
    base = f"http://127.0.0.1:{upstream}/v1"
    return {"listen": f"127.0.0.1:{port}", "access_log": {"format": "text", "path": "/dev/null"},
            "providers": {"p": {"kind": "openai", "base_url": base}, "c": {"kind": "anthropic", "base_url": base}},
            "routes": {"one": {"strategy": "fastest", "targets": [{"provider": "p", "model": "sim"}]},
                       "claude": {"strategy": "fastest", "targets": [{"provider": "c", "model": "sim"}]}}}


def main() -> int:
    p = argparse.ArgumentParser(description="instructions per relayed event of a paced stream")
    p.add_argument("--calls", type=int, default=20, help="calls per counted window")
    p.add_argument("--short", type=int, default=4, help="text events of a short call")
    p.add_argument("--long", type=int, default=44, help="text events of a long call")
    p.add_argument("--gap-ms", type=float, default=5.0, help="the upstream's pause after each event")
    p.add_argument("--idle", type=float, default=3.0, help="seconds of idle background counted")
    p.add_argument("--rounds", type=int, default=3, help="rounds over every proxy; the median is printed")
    p.add_argument("--other", nargs="*", default=[], metavar="NAME=DIR",
                   help="another firstbyte whose proxy package is in DIR")
    p.add_argument("--tap", action="store_true", help="count the passthrough taps alone, in a process of "
                   "their own: no server, no background, exact to a few instructions")
    p.add_argument("--serve", type=int, default=None, metavar="PORT", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve is not None:
        serve(args.serve, args.gap_ms / 1000)
        return 0
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("scripts/paced needs valgrind (apt-get install valgrind)", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="firstbyte-paced-"))
    if args.tap:
        print("instructions per tap.feed of one text event read on its own (callgrind, 2,000 feeds less none)\n")
        print(f"{'':<16}{'openai':>8}{'anthropic':>11}")
        for name, path in {"firstbyte": None, **dict(o.split("=", 1) for o in args.other)}.items():
            print(f"{name:<16}{tap_cost('openai', path, tmp):>8.0f}{tap_cost('anthropic', path, tmp):>11.0f}")
        return 0
    procs = bench.Procs(tmp)
    counted: list[Counted] = []
    found: dict[str, dict[str, list[PerEvent]]] = {}
    try:
        up = bench.free_port()
        procs.start("upstream", [sys.executable, __file__, "--serve", str(up), "--gap-ms", str(args.gap_ms)], up)
        port = bench.free_port()
        floor = [sys.executable, str(bench.ROOT / "scripts" / "floor.py"), "--port", str(port),
                 "--upstream", f"http://127.0.0.1:{up}"]
        counted.append(Counted("floor", floor, dict(os.environ), port, tmp))
        for name, path in {"firstbyte": None, **dict(o.split("=", 1) for o in args.other)}.items():
            port = bench.free_port()
            config_path = tmp / f"{name}.json"  # JSON is YAML
            config_path.write_text(json.dumps(config(port, up)))
            env = dict(os.environ, **({"PYTHONPATH": path} if path else {}))
            cmd = [sys.executable, str(bench.BIN / "firstbyte"), "serve", "--config", str(config_path)]
            counted.append(Counted(name, cmd, env, port, tmp))
        for proxy in counted:  # all up at once: every round meets each in turn, on the same machine
            proxy.ready(args)
        time.sleep(2.0)
        for proxy in counted:
            proxy.count_idle(args.idle)
        for _ in range(args.rounds):
            for proxy in counted:
                for api in APIS:
                    found.setdefault(proxy.name, {}).setdefault(api, []).append(proxy.per_event(api, args))
    finally:
        for proxy in counted:
            proxy.stop()
        procs.stop_all()
    rows = {name: {api: median(runs) for api, runs in apis.items()} for name, apis in found.items()}
    print(f"instructions per relayed event (callgrind; {args.calls} calls of {args.long} text events less "
          f"{args.calls} of {args.short}, one event a write, {args.gap_ms:g} ms apart; median of {args.rounds} "
          "rounds over every proxy), thousands\n")
    print(f"{'':<16}{'openai raw':>11}{'net':>7}{'x floor':>8}{'anthropic raw':>15}{'net':>7}{'x floor':>8}"
          f"{'reads/event':>13}")
    for name, row in rows.items():
        o, a = row["openai"], row["anthropic"]
        print(f"{name:<16}{o.raw / 1000:>11.1f}{o.net / 1000:>7.1f}{o.net / rows['floor']['openai'].net:>8.2f}"
              f"{a.raw / 1000:>15.1f}{a.net / 1000:>7.1f}{a.net / rows['floor']['anthropic'].net:>8.2f}"
              f"{o.reads:>7.2f}{a.reads:>6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""scripts/bench: what firstbyte adds, measured against a direct connection and the floor.

One invocation starts, on loopback: a ``firstbyte simulate`` upstream with a
small first-chunk delay (so overhead is visible), the floor
(``scripts/floor.py``: the smallest aiohttp relay), the floor committing at
the first chunk (``floor.py --commit``: headers held until the upstream's
first chunk, as firstbyte must hold them to fail over), firstbyte serving a
one-target and a five-target route, both ``fastest``, and a load generator in
its own process (``scripts/loadgen.py``). For each repeat every phase runs
against all five in turn (direct, floor, floor-commit, firstbyte-1, firstbyte-5):

- buffered and streamed calls at concurrency 1, 64 and 512: latency p50/p99,
  time to first chunk, requests per second (closed loop);
- long streams: ``--streams`` calls of ``--stream-chunks`` chunks at
  ``--chunk-rate`` chunks/s held at once through a freshly started floor and
  firstbyte, with each proxy's CPU share and memory per held stream (RSS delta
  / streams, from /proc). This phase takes about a minute and its figures moved
  by under 0.1x between repeats, so by default only the first repeat runs it
  (``--hold-repeats``); that keeps bench and simulate-pool within 10 minutes.

"Added" figures are the proxy's minus the direct connection's from the same
repeat; the report gives the median over repeats and every firstbyte figure as
a ratio to the floor's (the goals), and firstbyte-1's also to the committing
floor's: a streamed call's first chunk through the plain floor has its headers
already delivered, so part of the gap is the commit point, not firstbyte's
code, and the second ratio reads that part apart. All processes share the machine's cores (2 here), so
the load generator competes with the proxy: read ratios, not absolutes.
Results go to stdout as a table and to ``bench-results/bench.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bench_box
import orjson

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
BODY = {"model": "one", "messages": [{"role": "user", "content": "Say hello in eight words."}],
        "max_tokens": 16}
PATH = "/v1/chat/completions"
TARGETS = ("direct", "floor", "floorc", "fb1", "fb5")
GOALS = {"added_c1": 1.25, "rps_c64": 0.8, "mem_per_stream": 1.5}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"port {port} never opened")


class Procs:
    """Child processes started by the bench, all stopped at the end."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.procs: list[subprocess.Popen[bytes]] = []

    def spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        """Start a process without waiting for it; its output goes to ``name``.log."""
        with open(self.logdir / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        self.procs.append(proc)
        return proc

    def start(self, name: str, args: list[str], port: int) -> subprocess.Popen[bytes]:
        proc = self.spawn(name, args)
        wait_port(port, proc)
        return proc

    def start_many(self, commands: dict[str, tuple[list[str], int]]) -> None:
        """Start every process at once, then wait for each port: start-ups overlap."""
        started = [(self.spawn(name, args), port) for name, (args, port) in commands.items()]
        for proc, port in started:
            wait_port(port, proc)

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        proc.terminate()
        _reap(proc)
        self.procs.remove(proc)

    def stop_all(self) -> None:
        """Signal every process, then wait for each: shut-downs overlap."""
        procs, self.procs = self.procs, []
        for proc in procs:
            proc.terminate()
        for proc in procs:
            _reap(proc)


def _reap(proc: subprocess.Popen[bytes]) -> None:
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def simulate(procs: Procs, name: str, port: int, first_ms: float, chunk_ms: float, chunks: int) -> None:
    procs.start(name, [str(BIN / "firstbyte"), "simulate", "--port", str(port),
                       "--first-chunk-ms", str(first_ms), "--jitter-ms", "0",
                       "--chunk-ms", str(chunk_ms), "--chunks", str(chunks), "--seed", "1"], port)


def floor(procs: Procs, name: str, port: int, upstream: int, commit: bool = False) -> subprocess.Popen[bytes]:
    return procs.start(name, [sys.executable, str(ROOT / "scripts" / "floor.py"), "--port", str(port),
                              "--upstream", f"http://127.0.0.1:{upstream}", *(["--commit"] if commit else [])], port)


HEDGE = {"after": "p90", "max_extra": 0.1, "explore": True}


WORKERS = 1  # --workers: firstbyte as a supervisor of this many workers (needs --redis)
FB_PID: int | None = None  # firstbyte's process (the supervisor with --workers): CPU per call is its tree's
REDIS: str | None = None  # --redis: the firstbyte processes run as a fleet of one on this Redis


def firstbyte_config(port: int, upstream: int, otlp: str | None = None, sample: float | None = 1.0,
                     export_every: float | None = None) -> dict[str, Any]:
    """Route ``one`` (one target) and ``five`` (five providers), both ``fastest`` with ``hedge`` on (as
    routes.yaml has it: issue 13 asks the goals to hold with hedging configured), all on ``upstream``;
    with ``otlp``, requests traced to that collector (``sample`` of them, every one by default; None:
    firstbyte's own default)."""
    providers = {f"p{i}": {"kind": "openai", "base_url": f"http://127.0.0.1:{upstream}/v1"} for i in range(1, 6)}
    tracing: dict[str, Any] = {"otlp": otlp, **({"sample": sample} if sample is not None else {})}
    if export_every is not None:
        tracing["export_every"] = export_every
    return {
        **({"tracing": tracing} if otlp else {}),
        "listen": f"127.0.0.1:{port}",
        "access_log": {"format": "text", "path": "/dev/null"},
        **({"state": {"redis": REDIS, "fleet": f"bench-{port}"}} if REDIS else {}),
        **({"workers": WORKERS} if WORKERS > 1 else {}),
        "providers": providers,
        "routes": {
            "one": {"strategy": "fastest", "targets": [{"provider": "p1", "model": "sim"}], "hedge": HEDGE},
            "five": {"strategy": "fastest", "hedge": HEDGE,
                     "targets": [{"provider": p, "model": "sim"} for p in providers]},
        },
    }


def firstbyte(procs: Procs, name: str, port: int, upstream: int, tmp: Path,
              otlp: str | None = None, sample: float | None = None) -> subprocess.Popen[bytes]:
    path = tmp / f"{name}.json"  # JSON is YAML
    path.write_text(json.dumps(firstbyte_config(port, upstream, otlp, sample)))
    if WORKERS == 1:
        return procs.start(name, [str(BIN / "firstbyte"), "serve", "--config", str(path)], port)
    proc = procs.spawn(name, [str(BIN / "firstbyte"), "serve", "--config", str(path)])
    bench_box.wait_box(port, WORKERS)  # every worker answering, not just the first to listen
    return proc


class Seeing:
    """``--see``: an OTLP/HTTP sink that takes every span batch (a thread of this process), and a
    status page held open on firstbyte (its data polled every second, as an open page would, at
    twice the page's own rate), for as long as the bench runs."""

    def __init__(self) -> None:
        import http.server

        seen = self.seen = {"batches": 0, "bytes": 0, "polls": 0, "poll_errors": 0}

        class Sink(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as a collector's is: one connection for every export

            def do_POST(self) -> None:
                seen["bytes"] += len(self.rfile.read(int(self.headers.get("content-length", 0))))
                seen["batches"] += 1
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.sink = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sink)
        # a stopped firstbyte resets the connection it kept: no traceback for that
        self.sink.handle_error = lambda request, address: None  # type: ignore[method-assign]
        self.otlp = f"http://127.0.0.1:{self.sink.server_address[1]}/v1/traces"
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.sink.serve_forever, daemon=True)]

    def watch(self, port: int, poll: bool = True) -> None:
        """Start the sink and (``poll``) the status page's poller."""
        import urllib.request

        def polling() -> None:
            while not self.stop.wait(1.0):
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status/data", timeout=5) as r:
                        r.read()
                    self.seen["polls"] += 1
                except OSError:
                    self.seen["poll_errors"] += 1

        if poll:
            self.threads.append(threading.Thread(target=polling, daemon=True))
        for t in self.threads:
            t.start()

    def close(self) -> dict[str, int]:
        self.stop.set()
        self.sink.shutdown()
        return self.seen


class Loadgen:
    """The load generator process, one JSON command at a time."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "loadgen.py")],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT)
        assert self.read()["event"] == "ready"

    def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("load generator died")
        return orjson.loads(line)

    def send(self, cmd: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(orjson.dumps(cmd) + b"\n")
        self.proc.stdin.flush()

    def call(self, cmd: dict[str, Any]) -> dict[str, Any]:
        self.send(cmd)
        return self.read()

    def close(self) -> None:
        with contextlib.suppress(BrokenPipeError):
            self.send({"op": "quit"})
        self.proc.wait(10)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


def cpu_secs(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def rss_bytes(pid: int) -> int:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarise(raw: dict[str, Any]) -> dict[str, float]:
    lat, ttfc = raw["lat"], raw["ttfc"]
    return {"p50_ms": pct(lat, 0.5) * 1e3, "p99_ms": pct(lat, 0.99) * 1e3,
            "ttfc_p50_ms": pct(ttfc, 0.5) * 1e3, "rps": len(lat) / raw["elapsed"] if raw["elapsed"] else 0.0,
            "n": len(lat), "errors": raw["errors"],
            "events_per_s": raw.get("events", 0) / raw["elapsed"] if raw["elapsed"] else 0.0}


def latency_phases(args: argparse.Namespace, gen: Loadgen, ports: dict[str, int]) -> dict[str, Any]:
    """Every (mode, concurrency) phase against every target, interleaved so drift hits all alike.

    At concurrency 1 the targets take turns call by call: a call's time there is mostly the
    machine waking processes, which drifts over seconds, so separate stretches per target
    moved the floor's added latency by +-0.3 ms between phases and the ratios with it.
    """
    out: dict[str, Any] = {}
    urls = {target: f"http://127.0.0.1:{ports[target]}{PATH}" for target in TARGETS}
    bodies = {target: {**BODY, "model": "five" if target == "fb5" else "one"} for target in TARGETS}
    for stream in (False, True):
        mode = "streamed" if stream else "buffered"
        for conc in args.concurrency:
            phase = out.setdefault(f"{mode}/c{conc}", {})
            if conc == 1:  # one call at a time: interleaved per call, see loadgen's "rounds"
                each = gen.call({"op": "rounds", "urls": urls, "bodies": bodies, "stream": stream,
                                 "requests": args.c1_requests, "warmup": 20})
                phase.update((target, summarise(each[target])) for target in TARGETS)
                continue
            for target in TARGETS:
                cpu = bench_box.tree_cpu(FB_PID, TICK) if FB_PID is not None else 0.0
                phase[target] = summarise(gen.call({"op": "run", "url": urls[target], "body": bodies[target],
                                                    "stream": stream, "concurrency": conc,
                                                    "duration": args.duration, "warmup": args.warmup}))
                if target == "fb1" and FB_PID is not None:  # warm-up calls estimated at the measured rate
                    calls = phase[target]["rps"] * (args.duration + args.warmup)
                    used = bench_box.tree_cpu(FB_PID, TICK) - cpu
                    out.setdefault("cpu_ms_per_call", {})[f"{mode}/c{conc}"] = used * 1e3 / max(calls, 1)
    return out


@contextlib.contextmanager
def sampler(pids: dict[str, int]) -> Iterator[dict[str, list[int]]]:
    """RSS of each process every 0.2 s, in a thread, while the block runs."""
    samples: dict[str, list[int]] = {name: [] for name in pids}
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(0.2):
            for name, pid in pids.items():
                with contextlib.suppress(OSError):
                    samples[name].append(rss_bytes(pid))

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join()


def hold_phase(args: argparse.Namespace, procs: Procs, gen: Loadgen, long_port: int,
               tmp: Path) -> dict[str, Any]:
    """Long streams through a fresh floor and a fresh firstbyte: CPU share, memory per stream."""
    out: dict[str, Any] = {}
    for target in ("floor", "fb1"):
        port = free_port()
        proc = (floor(procs, "hold-floor", port, long_port) if target == "floor"
                else firstbyte(procs, "hold-fb", port, long_port, tmp))
        url = f"http://127.0.0.1:{port}{PATH}"
        # The simulator honours max_tokens (a model would): a long stream asks for all its chunks.
        body = {**BODY, "max_tokens": args.stream_chunks + 8}
        gen.call({"op": "run", "url": url, "body": body, "stream": True, "concurrency": 4, "requests": 8})
        time.sleep(0.3)
        base = rss_bytes(proc.pid)
        pids = {"proxy": proc.pid, "loadgen": gen.proc.pid}
        gen.send({"op": "hold", "url": url, "body": body, "streams": args.streams, "ramp": args.ramp})
        with sampler(pids) as samples:
            held = gen.read()
            assert held["event"] == "held"
            t0, cpu0 = time.monotonic(), {n: cpu_secs(p) for n, p in pids.items()}
            during = len(samples["proxy"])
            done = gen.read()
            t1, cpu1 = time.monotonic(), {n: cpu_secs(p) for n, p in pids.items()}
        window = samples["proxy"][during:] or [rss_bytes(proc.pid)]
        peak = statistics.median(window)  # RSS while every stream is held, median of samples
        wall = max(t1 - t0, 1e-9)
        ok = args.streams - done["errors"]
        expected = (args.stream_chunks + 2) * args.streams  # chunks + stop + [DONE]
        out[target] = {
            "streams": args.streams, "errors": done["errors"], "held_after_s": held["after"],
            "elapsed_s": done["elapsed"], "events_share": done["events"] / expected,
            "rss_base_mb": base / 2**20, "rss_held_mb": peak / 2**20,
            "kb_per_stream": (peak - base) / 1024 / max(ok, 1),
            "cpu_share": (cpu1["proxy"] - cpu0["proxy"]) / wall,
            "loadgen_cpu_share": (cpu1["loadgen"] - cpu0["loadgen"]) / wall,
        }
        procs.stop(proc)
    return out


def median_of(runs: list[dict[str, Any]], *path: str) -> float:
    values = []
    for run in runs:
        node: Any = run
        for key in path:
            node = node[key]
        values.append(node)
    return statistics.median(values)


def report(runs: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Medians over repeats: added latency over direct, ratios to the floor, goals."""
    rows: dict[str, Any] = {}
    for phase in runs[0]["latency"]:
        row: dict[str, Any] = {}
        for target in TARGETS:
            m = {k: median_of(runs, "latency", phase, target, k) for k in ("p50_ms", "p99_ms", "ttfc_p50_ms", "rps")}
            if target != "direct":
                for k in ("p50_ms", "p99_ms", "ttfc_p50_ms"):
                    added = [r["latency"][phase][target][k] - r["latency"][phase]["direct"][k] for r in runs]
                    m[f"added_{k}"] = statistics.median(added)
            row[target] = m
        for target in ("fb1", "fb5"):
            ratios = {}
            for k in ("added_p50_ms", "added_p99_ms", "added_ttfc_p50_ms", "rps"):
                floor_value = row["floor"][k]
                ratios[k] = row[target][k] / floor_value if floor_value > 0 else float("nan")
            row[target]["vs_floor"] = ratios
        committed = row["floorc"]["added_p50_ms"]
        row["fb1"]["vs_floor_commit"] = {"added_p50_ms": row["fb1"]["added_p50_ms"] / committed
                                         if committed > 0 else float("nan")}
        rows[phase] = row
    hold: dict[str, Any] = {}
    held = [run for run in runs if run.get("hold")]
    if held:
        for target in ("floor", "fb1"):
            hold[target] = {k: median_of(held, "hold", target, k) for k in held[0]["hold"][target]}
        hold["fb1"]["vs_floor"] = {
            k: hold["fb1"][k] / hold["floor"][k] if hold["floor"][k] else float("nan")
            for k in ("kb_per_stream", "cpu_share")
        }
    c = args.concurrency
    mid = 64 if 64 in c else c[len(c) // 2]
    goals = {
        "added_c1_buffered": rows["buffered/c1"]["fb1"]["vs_floor"]["added_p50_ms"] if 1 in c else None,
        "added_c1_streamed": rows["streamed/c1"]["fb1"]["vs_floor"]["added_p50_ms"] if 1 in c else None,
        f"rps_c{mid}": rows[f"buffered/c{mid}"]["fb1"]["vs_floor"]["rps"],
        "mem_per_stream": hold["fb1"]["vs_floor"]["kb_per_stream"] if hold else None,
    }
    limits = {"added_c1_buffered": ("<=", GOALS["added_c1"]), "added_c1_streamed": ("<=", GOALS["added_c1"]),
              f"rps_c{mid}": (">=", GOALS["rps_c64"]), "mem_per_stream": ("<=", GOALS["mem_per_stream"])}
    verdict = {}
    for k, v in goals.items():
        op, lim = limits[k]
        verdict[k] = {"ratio": v, "goal": f"{op} {lim}",
                      "met": None if v is None else (v <= lim if op == "<=" else v >= lim)}
    return {"phases": rows, "hold": hold, "goals": verdict}


def fmt(v: float | None, spec: str = ".2f") -> str:
    return "-" if v is None or v != v else format(v, spec)


def print_table(summary: dict[str, Any], meta: dict[str, Any]) -> None:
    print(f"\nfirstbyte bench — {meta['repeats']} repeats, medians; {meta['cores']} cores shared by "
          "upstream, proxy and load generator (separate processes); added = proxy - direct, same repeat\n")
    head = (f"{'phase':<14}{'direct p50':>11}{'floor +p50':>11}{'fb1 +p50':>10}{'xfloor':>8}{'fb5 +p50':>10}"
            f"{'xfloor':>8}{'floor +p99':>11}{'fb1 +p99':>10}{'xfloor':>8}{'+ttfc fl':>10}{'+ttfc fb1':>10}"
            f"{'rps dir':>9}{'rps fl':>8}{'rps fb1':>8}{'xfloor':>8}{'rps fb5':>8}")
    print(head)
    print("-" * len(head))
    for phase, row in summary["phases"].items():
        fb1, fb5, fl = row["fb1"], row["fb5"], row["floor"]
        print(f"{phase:<14}{fmt(row['direct']['p50_ms']):>11}{fmt(fl['added_p50_ms']):>11}"
              f"{fmt(fb1['added_p50_ms']):>10}{fmt(fb1['vs_floor']['added_p50_ms']):>8}"
              f"{fmt(fb5['added_p50_ms']):>10}{fmt(fb5['vs_floor']['added_p50_ms']):>8}"
              f"{fmt(fl['added_p99_ms']):>11}{fmt(fb1['added_p99_ms']):>10}{fmt(fb1['vs_floor']['added_p99_ms']):>8}"
              f"{fmt(fl['added_ttfc_p50_ms']):>10}{fmt(fb1['added_ttfc_p50_ms']):>10}"
              f"{fmt(row['direct']['rps'], '.0f'):>9}{fmt(fl['rps'], '.0f'):>8}{fmt(fb1['rps'], '.0f'):>8}"
              f"{fmt(fb1['vs_floor']['rps']):>8}{fmt(fb5['rps'], '.0f'):>8}")
    print("(latencies in ms; +p50 = added over direct; xfloor = firstbyte's figure / the floor's)")
    print("\nthe floor committing at the first chunk (floor.py --commit), added p50 and fb1's ratio to it:")
    for phase, row in summary["phases"].items():
        print(f"  {phase:<14}floor-commit +p50 {fmt(row['floorc']['added_p50_ms'])}  "
              f"fb1 x{fmt(row['fb1']['vs_floor_commit']['added_p50_ms'])}")
    hold = summary["hold"]
    if hold:
        print(f"\nlong streams: {meta['streams']} streams x {meta['stream_chunks']} chunks at "
              f"{meta['chunk_rate']:g} chunks/s, held at once (median of {meta['hold_repeats']} repeat(s))")
        print(f"{'proxy':<8}{'held after s':>13}{'took s':>8}{'events':>8}{'errors':>7}{'RSS base MB':>12}"
              f"{'RSS held MB':>12}{'KB/stream':>10}{'CPU share':>10}{'loadgen CPU':>12}")
        for target in ("floor", "fb1"):
            h = hold[target]
            print(f"{target:<8}{fmt(h['held_after_s']):>13}{fmt(h['elapsed_s'], '.1f'):>8}"
                  f"{fmt(h['events_share'] * 100, '.0f'):>7}%{h['errors']:>7.0f}{fmt(h['rss_base_mb'], '.1f'):>12}"
                  f"{fmt(h['rss_held_mb'], '.1f'):>12}{fmt(h['kb_per_stream'], '.1f'):>10}"
                  f"{fmt(h['cpu_share'] * 100, '.0f'):>9}%{fmt(h['loadgen_cpu_share'] * 100, '.0f'):>11}%")
        v = hold["fb1"]["vs_floor"]
        print(f"fb1 / floor: memory per stream x{fmt(v['kb_per_stream'])}, CPU share x{fmt(v['cpu_share'])}")
    print("\ngoals (firstbyte one-target vs floor):")
    for name, g in summary["goals"].items():
        met = "n/a" if g["met"] is None else ("MET" if g["met"] else "MISSED")
        print(f"  {name:<20} x{fmt(g['ratio']):<6} goal {g['goal']:<7} {met}")


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, 65536) if hard != resource.RLIM_INFINITY else 65536
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def main() -> int:
    p = argparse.ArgumentParser(description="firstbyte vs a direct connection and the aiohttp floor")
    p.add_argument("--quick", action="store_true", help="a short run: 1 repeat, fewer requests and streams")
    p.add_argument("--redis", default=None, help="run firstbyte with state.redis at this URL (the fleet link on)")
    p.add_argument("--workers", type=int, default=1, help="firstbyte with this many workers (needs --redis)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 64, 512])
    p.add_argument("--c1-requests", type=int, default=300)
    p.add_argument("--duration", type=float, default=1.0, help="seconds per concurrent phase")
    p.add_argument("--warmup", type=float, default=0.25)
    p.add_argument("--first-chunk-ms", type=float, default=2.0)
    p.add_argument("--chunks", type=int, default=8, help="chunks per answer in the latency phases")
    p.add_argument("--streams", type=int, default=2000)
    p.add_argument("--stream-chunks", type=int, default=200)
    p.add_argument("--chunk-rate", type=float, default=20.0)
    p.add_argument("--ramp", type=float, default=2.0, help="seconds over which long streams open")
    p.add_argument("--no-hold", action="store_true", help="skip the long-stream phase")
    p.add_argument("--hold-repeats", type=int, default=1,
                   help="repeats that also hold the long streams (about a minute each; memory per stream "
                        "moved by under 0.1x between repeats)")
    p.add_argument("--see", action="store_true",
                   help="firstbyte tracing to a loopback OTLP sink (--see-sample of the requests) and its "
                        "status page polled once a second")
    p.add_argument("--see-sample", type=float, default=None,
                   help="with --see: tracing.sample (default: firstbyte's own, 0.1; 1.0 traces every request)")
    p.add_argument("--out", default=str(ROOT / "bench-results" / "bench.json"))
    args = p.parse_args()
    global REDIS, WORKERS, FB_PID
    REDIS, WORKERS = args.redis, args.workers
    if WORKERS > 1 and not REDIS:
        p.error("--workers more than 1 needs --redis URL: workers share what they learn through it")
    if args.quick:
        args.repeats, args.c1_requests, args.duration, args.warmup = 1, 150, 1.0, 0.3
        args.streams, args.stream_chunks = 300, 40
    raise_fd_limit()
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="firstbyte-bench-"))
    procs = Procs(tmp)
    gen: Loadgen | None = None
    seeing = Seeing() if args.see else None
    seen: dict[str, int] = {}
    runs: list[dict[str, Any]] = []
    try:
        sim, sim_long = free_port(), free_port()
        simulate(procs, "sim", sim, args.first_chunk_ms, 0, args.chunks)
        simulate(procs, "sim-long", sim_long, 0, 1000.0 / args.chunk_rate, args.stream_chunks)
        ports = {"direct": sim, "floor": free_port(), "floorc": free_port(), "fb1": free_port()}
        floor(procs, "floor", ports["floor"], sim)
        floor(procs, "floor-commit", ports["floorc"], sim, commit=True)
        FB_PID = firstbyte(procs, "firstbyte", ports["fb1"], sim, tmp, seeing.otlp if seeing else None,
                            args.see_sample).pid
        spread = {}
        if WORKERS > 1:
            spread = bench_box.spread(ports["fb1"])
        if seeing is not None:
            seeing.watch(ports["fb1"])
        ports["fb5"] = ports["fb1"]  # the same firstbyte; route "five" instead of "one"
        gen = Loadgen()
        for i in range(args.repeats):
            print(f"repeat {i + 1}/{args.repeats}: latency phases…", file=sys.stderr, flush=True)
            latency = latency_phases(args, gen, ports)
            run = {"latency": latency, "cpu_ms_per_call": latency.pop("cpu_ms_per_call", {})}
            if not args.no_hold and i < args.hold_repeats:
                print(f"repeat {i + 1}/{args.repeats}: long streams…", file=sys.stderr, flush=True)
                run["hold"] = hold_phase(args, procs, gen, sim_long, tmp)
            runs.append(run)
    finally:
        if gen is not None:
            gen.close()
        if seeing is not None:
            seen = seeing.close()
        procs.stop_all()
    meta = {"repeats": args.repeats, "hold_repeats": 0 if args.no_hold else min(args.hold_repeats, args.repeats),
            "cores": os.cpu_count(), "streams": args.streams,
            "stream_chunks": args.stream_chunks, "chunk_rate": args.chunk_rate,
            "first_chunk_ms": args.first_chunk_ms, "chunks": args.chunks, "quick": args.quick,
            "seconds": round(time.monotonic() - started, 1), "logs": str(tmp), "see": seen or None,
            "workers": WORKERS, "spread": spread,
            "cpu_ms_per_call": {phase: statistics.median(r["cpu_ms_per_call"][phase] for r in runs)
                                for phase in runs[0]["cpu_ms_per_call"]} if runs else {},
            # streamed phases above concurrency 1: server-sent events the load generator read from firstbyte
            "chunks_per_s": {phase: statistics.median(r["latency"][phase]["fb1"]["events_per_s"] for r in runs)
                             for phase in (runs[0]["latency"] if runs else {})
                             if phase.startswith("streamed/") and phase != "streamed/c1"}}
    summary = report(runs, args)
    print_table(summary, meta)
    print(f"\nfirstbyte with {WORKERS} worker(s): CPU ms per call (whole box, warm-up estimated) "
          + ", ".join(f"{k} {v:.2f}" for k, v in meta["cpu_ms_per_call"].items()))
    print(f"firstbyte with {WORKERS} worker(s): chunks relayed per second, streamed ({args.chunks} chunks, a stop "
          "chunk and [DONE] per answer) " + ", ".join(f"{k} {v:.0f}" for k, v in meta["chunks_per_s"].items()))
    if spread:
        print(f"new connections per worker (of {sum(spread.values())}): {spread}")
    if seen:
        print(f"\n--see: {seen['batches']} span batches ({seen['bytes']} bytes) exported, status page polled "
              f"{seen['polls']} times ({seen['poll_errors']} failed)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps({"meta": meta, "summary": summary, "runs": runs},
                                 option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    print(f"\nwrote {out} in {meta['seconds']} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

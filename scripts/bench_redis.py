"""scripts/bench_redis.py: a request's added latency with the fleet link and without, call by call.

Issue 26's goal: a request's added latency with ``state.redis`` configured stays within 5 % of
without. One run starts, on loopback: ``scripts/bench``'s upstream (``firstbyte simulate``, a small
first-chunk delay), one ``firstbyte serve`` without ``state`` (``off``), one with ``state.redis`` on a
``redis-server`` of its own (``on``: a fleet of one, its link's tasks running), a second without
(``off2``: the A/A control, the same code in another process), all with bench's routes, and bench's
load generator in its own process. At concurrency 1 the four (``direct``, ``off``, ``on``, ``off2``)
take turns call by call, in a shuffled order each round (``loadgen``'s ``rounds``), so the
machine's drift over seconds (other engineers' runs on a shared 2-core box, CPU frequency, the
scheduler) meets all four alike. Added latency is the p50 of firstbyte's calls less the p50 of the
direct calls of the same rounds; the figure is ``on`` / ``off`` with a 90 % interval from resampling
the blocks and their rounds (bootstrap; a round's calls go together), printed beside ``off2`` / ``off``
with its own interval: the same code's ratio says what this measure can tell apart.

Why not two ``scripts/bench`` runs side by side (what this script did before 2026-12-06): each run
met the machine in its own stretch of tens of seconds, and two runs of the same code differed by
more than the 5 % asked (added p50 on / off 0.79 and 1.02 buffered, 1.43 and 0.89 streamed, in two
runs of three pairs each), so such pairs could neither show nor refute the goal.

    .venv/bin/python scripts/bench_redis.py [--blocks 4] [--requests 500] [--port-base 42300]

``--blocks``: fresh processes for each block (a process's own luck, where its memory landed, is
another source of spread: the blocks' figures are printed apart too). Writes
``bench-results/bench-redis.json``. Not run by the test suite (it is a measurement).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench

OUT = bench.ROOT / "bench-results"
GOAL = 1.05
NAMES = ("direct", "off", "on", "off2")  # off2: a second process without Redis, the A/A control
RESAMPLES = 400


def p50(values: list[float]) -> float:
    return statistics.median(values)


def added_ratio(rounds: dict[str, list[float]], than: str = "on", picks: list[int] | None = None
                ) -> tuple[float, float, float]:
    """(added p50 of off ms, of ``than`` ms, ``than`` / off) over the rounds ``picks`` (all by default)."""
    pick = (lambda xs: xs) if picks is None else (lambda xs: [xs[i] for i in picks])
    direct = p50(pick(rounds["direct"]))
    off, other = p50(pick(rounds["off"])) - direct, p50(pick(rounds[than])) - direct
    return off * 1e3, other * 1e3, other / off if off > 0 else float("nan")


def interval(blocks: list[dict[str, list[float]]], than: str, seed: int = 7) -> tuple[float, float]:
    """90 % bootstrap interval of ``than`` / off: the blocks resampled with replacement, then each
    chosen block's rounds (a round's calls together: they met the same moment of the machine), so the
    spread between fresh processes counts as well as the spread between calls."""
    rng = random.Random(seed)
    sizes = [min(len(b[name]) for name in NAMES) for b in blocks]  # a failed call shortens its list
    ratios = []
    for _ in range(RESAMPLES):
        pooled: dict[str, list[float]] = {name: [] for name in NAMES}
        for i in rng.choices(range(len(blocks)), k=len(blocks)):
            picks = rng.choices(range(sizes[i]), k=sizes[i])
            for name in NAMES:
                pooled[name].extend(blocks[i][name][j] for j in picks)
        ratios.append(added_ratio(pooled, than)[2])
    ratios.sort()
    return ratios[int(0.05 * RESAMPLES)], ratios[int(0.95 * RESAMPLES) - 1]


def block(args: argparse.Namespace, redis: str, index: int) -> dict[str, Any]:
    """Fresh upstream and firstbyte processes; buffered then streamed rounds at concurrency 1."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-redis-"))
    procs = bench.Procs(tmp)
    gen: bench.Loadgen | None = None
    ports = iter(range(args.port_base + 10 * index + 1, args.port_base + 10 * index + 10))
    try:
        sim = next(ports)
        bench.simulate(procs, "sim", sim, args.first_chunk_ms, 0, args.chunks)
        urls = {"direct": sim, "off": next(ports), "on": next(ports), "off2": next(ports)}
        pids = {}
        for name in ("off", "on", "off2") if index % 2 == 0 else ("off2", "on", "off"):  # start order alternates
            bench.REDIS = redis if name == "on" else None
            pids[name] = bench.firstbyte(procs, f"fb-{name}", urls[name], sim, tmp).pid
        bench.REDIS = None
        gen = bench.Loadgen()
        out: dict[str, Any] = {"load": os.getloadavg()[0]}
        for stream in (False, True):
            cpu = {name: bench.cpu_secs(pid) for name, pid in pids.items()}
            raw = gen.call({"op": "rounds", "stream": stream, "requests": args.requests, "warmup": 20,
                            "seed": index + 1, "bodies": {name: bench.BODY for name in NAMES},
                            "urls": {name: f"http://127.0.0.1:{port}{bench.PATH}" for name, port in urls.items()}})
            out["streamed" if stream else "buffered"] = {
                "lat": {name: raw[name]["lat"] for name in NAMES},
                "ttfc": {name: raw[name]["ttfc"] for name in NAMES},
                "errors": {name: raw[name]["errors"] for name in NAMES},
                "cpu_ms_per_call": {name: (bench.cpu_secs(pid) - cpu[name]) * 1e3 / (args.requests + 20)
                                    for name, pid in pids.items()}}
        out["load_after"] = os.getloadavg()[0]
        return out
    finally:
        if gen is not None:
            gen.close()
        procs.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)


def report(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """Per mode and figure (whole latency; streamed also first chunk): pooled over blocks, and each block;
    on / off beside off2 / off (the same code in two processes: what the measure itself can tell)."""
    summary: dict[str, Any] = {}
    print(f"\nadded p50 at concurrency 1 (firstbyte less direct, the same rounds); on: with state.redis, off and "
          f"off2: two processes without; {len(blocks)} block(s) of fresh processes; goal on / off <= {GOAL}: met "
          "when the 90 % interval's top is under it")
    print(f"{'figure':<21}{'off|on|off2 ms':>22}{'on/off':>8}{'90 % interval':>17}{'verdict':>11}"
          f"{'off2/off [90 %]':>24}{'on/off each block':>26}{'CPU ms/call off|on':>20}")
    for mode in ("buffered", "streamed"):
        for figure in ("lat", "ttfc") if mode == "streamed" else ("lat",):
            each = [b[mode][figure] for b in blocks]
            pooled = {name: [x for b in each for x in b[name]] for name in NAMES}
            off, on, ratio = added_ratio(pooled)
            off2, control = added_ratio(pooled, "off2")[1:]
            lo, hi = interval(each, "on")
            clo, chi = interval(each, "off2")
            per = " ".join(f"{added_ratio(b)[2]:.3f}" for b in each)
            cpu = [statistics.fmean(b[mode]["cpu_ms_per_call"][n] for b in blocks) for n in ("off", "on")]
            verdict = "met" if hi <= GOAL else "missed" if lo > GOAL else "not shown"
            name = f"{mode} {'latency' if figure == 'lat' else 'first chunk'}"
            cells = (f"{off:.3f}|{on:.3f}|{off2:.3f}", f"[{lo:.3f}-{hi:.3f}]", f"{control:.3f} [{clo:.3f}-{chi:.3f}]",
                     f"{cpu[0]:.2f}|{cpu[1]:.2f}")
            print(f"{name:<21}{cells[0]:>22}{ratio:>8.3f}{cells[1]:>17}{verdict:>11}{cells[2]:>24}{per:>26}"
                  f"{cells[3]:>20}")
            summary[name] = {"added_off_ms": off, "added_on_ms": on, "added_off2_ms": off2, "ratio": ratio,
                             "lo": lo, "hi": hi, "verdict": verdict, "control": control, "control_lo": clo,
                             "control_hi": chi, "cpu_ms_per_call": cpu}
    loads = [b[k] for b in blocks for k in ("load", "load_after")]
    print(f"load average (1 min) during the run: {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} cores")
    return summary


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=4, help="fresh processes this many times")
    p.add_argument("--requests", type=int, default=500, help="rounds per mode and block (one call to each)")
    p.add_argument("--first-chunk-ms", type=float, default=2.0)
    p.add_argument("--chunks", type=int, default=8)
    p.add_argument("--port-base", type=int, default=42300,
                   help="Redis here, each block's processes from here + 10 * block + 1 (loopback)")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped run still stops its processes
    binary = shutil.which("redis-server") or sys.exit("redis-server is not installed")
    tmp = tempfile.mkdtemp(prefix="bench-redis-")
    redis_proc = subprocess.Popen([binary, "--port", str(args.port_base), "--bind", "127.0.0.1", "--save", "",
                                   "--appendonly", "no", "--dir", tmp], stdout=subprocess.DEVNULL)
    redis = f"redis://127.0.0.1:{args.port_base}/0"
    started = time.monotonic()
    blocks = []
    try:
        for i in range(args.blocks):
            print(f"block {i + 1}/{args.blocks}…", file=sys.stderr, flush=True)
            blocks.append(block(args, redis, i))
    finally:
        redis_proc.terminate()
        redis_proc.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    summary = report(blocks)
    OUT.mkdir(exist_ok=True)
    out = OUT / "bench-redis.json"
    out.write_bytes(orjson.dumps({"summary": summary, "blocks": blocks, "requests": args.requests,
                                  "seconds": round(time.monotonic() - started, 1)}))
    print(f"wrote {out} in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
